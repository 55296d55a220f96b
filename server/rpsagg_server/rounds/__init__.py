"""One job's rounds: the engine (:mod:`.engine`) over membership, admission
(:mod:`.submissions`, :mod:`.requestchecks`), results, the planner, the deadline, recovery
from the store, and a round in memory and in its row (:mod:`.liveround`, :mod:`.rowcodec`,
:mod:`.archive`, :mod:`.roundview`).
"""
