"""The names ``rpsagg_server.live`` had before it was split by idea (kept for callers).

The round in memory is :mod:`rpsagg_server.liveround`, its row :mod:`rpsagg_server.rowcodec`,
its view :mod:`rpsagg_server.roundview`, the checks of a request
:mod:`rpsagg_server.requestchecks`; the domain's refusals are :mod:`rpsagg_server.errors`.
"""

from __future__ import annotations

from rpsagg_server.errors import DomainError
from rpsagg_server.requestchecks import check_bound, check_client_id

__all__ = ["Rejected", "check_bound", "check_client_id"]

#: the name the domain's refusals had before :mod:`rpsagg_server.errors` (kept for callers)
Rejected = DomainError
