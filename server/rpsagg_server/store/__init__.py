"""A job's durable state in SQLite: the database (:mod:`.database`), its rows (:mod:`.rows`,
:mod:`.rowinfo`), its schema version and migrations (:mod:`.migrations`) and the job's
number kept in it (:mod:`.jobnumber`).
"""
