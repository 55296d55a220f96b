"""The ``rpsagg-server`` process: start-up checks (:mod:`.startup`), the event loop
(:mod:`.eventloop`), and the server's construction and serve loop (:mod:`.main`).
"""
