"""Fixtures of the Flower tests (run in .venv-flower; test.sh's second pytest run).

Flower stamps a new instruction message with the identity of the process that creates it
(``TaskIdentity``, set by Flower's ServerApp runtime); these tests create the strategy's
messages in the test process, so they set it as the ServerApp runtime would.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flwr.supercore.task_identity import TaskIdentity


@pytest.fixture(autouse=True)
def _serverapp_identity() -> Iterator[None]:
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved
