"""Decoding closed rounds: the decode itself (:mod:`.decoding`), on a Ray cluster
(:mod:`.raydecode`), and the workers the jobs share (:mod:`.decodepool`).
"""
