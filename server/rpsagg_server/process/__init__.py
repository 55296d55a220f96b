"""The ``rpsagg-server`` process: start-up checks (:mod:`.startup`), the event loop
(:mod:`.eventloop`), the gRPC server's construction (:mod:`.grpcserver`), the serve loop
(:mod:`.serving`) and the command (:mod:`.main`).
"""
