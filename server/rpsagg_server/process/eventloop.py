"""The event loop the server runs on, and the garbage collector around it.

``--event-loop auto`` (the default) runs the server on uvloop when it is installed (it is a
dependency of rpsagg-server on Linux and macOS) and on asyncio's own loop otherwise. grpc.aio
runs on any asyncio loop; on uvloop a burst of 1,000 submissions costs the server less CPU
per call (docs/reliability.md, "Load").

After start-up, :func:`freeze_startup_heap` moves everything allocated so far (modules, the
task's data, the dashboard's routes) into the garbage collector's permanent generation, so
the collections that the per-call objects of a burst trigger no longer walk it.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def resolve(choice: str) -> str:
    """``uvloop`` or ``asyncio`` for ``--event-loop`` (``auto``: uvloop where installed)."""
    if choice == "auto":
        return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"
    if choice not in ("uvloop", "asyncio"):
        raise ValueError(f"--event-loop must be auto, uvloop or asyncio; got {choice!r}")
    return choice


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of new loops for ``choice`` (None: asyncio's default)."""
    if resolve(choice) == "uvloop":
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    return None


def run(main: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """``asyncio.run(main)`` on the loop ``choice`` names.

    Parameters
    ----------
    main : coroutine
    choice : {"auto", "uvloop", "asyncio"}

    Returns
    -------
    The coroutine's result.
    """
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main)


def freeze_startup_heap() -> None:
    """Collect once, then exclude every surviving object from later collections."""
    gc.collect()
    gc.freeze()


def running_name() -> str:
    """``uvloop`` or ``asyncio``: the kind of the running loop (for the log)."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") \
        else "asyncio"
