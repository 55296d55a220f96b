"""What a server and its jobs are configured with: a job's settings (:mod:`.jobspec`), the
process's (:mod:`.process`), each field's rule (:mod:`.rules`, :mod:`.bounds`), the checks
between fields (:mod:`.crosschecks`), the running server's configuration
(:mod:`.serverconfig`), where it comes from (:mod:`.flags`), the token files
(:mod:`.tokenfiles`) and the file-descriptor budget (:mod:`.descriptors`).
"""
