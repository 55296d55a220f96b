"""What a running server shows: the snapshot types (:mod:`.views`), the domain events and
their bus (:mod:`.events`), the metrics ledger (:mod:`.ledger`), the read model the
dashboard and metrics read (:mod:`.state`) and per-client activity (:mod:`.activity`).
"""
