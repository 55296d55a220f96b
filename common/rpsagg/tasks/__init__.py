"""Tasks driven by rounds of distributed mean estimation, shared by client and server.

- ``mean``: one round per call; vectors supplied by the caller (synthetic in the CLI, or the
  user's own with ``rpsagg-client --vectors``); ``m = params["vectors"]`` (default 1).
- ``power-iteration``: top eigenvector; the server normalizes the estimate.
- ``kmeans``: Lloyd's algorithm; ``m`` = number of centroids vectors per submission.
- ``linreg``: least squares by SGD; the server steps with learning rate ``lr``.

Data sources (:mod:`rpsagg.tasks.data`): ``synthetic`` (controllable correlation R),
``fashion-mnist`` (Debian package) and ``ujiindoorloc`` (zip path); ``external``: the
clients' own vectors (``rpsagg-client --vectors``), which only the clients read.
"""

from rpsagg.tasks.base import Shard, Task
from rpsagg.tasks.builtin import (
    TASKS,
    KMeansTask,
    LinRegTask,
    MeanTask,
    PowerIterationTask,
    make_task,
)
from rpsagg.tasks.data import (
    DATA_SOURCES,
    EXTERNAL_DATA,
    DataUnavailable,
    load_shard,
    synthetic_shard,
)

__all__ = [
    "DATA_SOURCES",
    "EXTERNAL_DATA",
    "TASKS",
    "DataUnavailable",
    "KMeansTask",
    "LinRegTask",
    "MeanTask",
    "PowerIterationTask",
    "Shard",
    "Task",
    "load_shard",
    "make_task",
    "synthetic_shard",
]
