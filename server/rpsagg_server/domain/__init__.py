"""The domain's words: its refusals (:mod:`.errors`) and a job's named states
(:mod:`.jobstate`). Imports nothing else of the server.
"""
