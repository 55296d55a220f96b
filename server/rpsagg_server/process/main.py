"""The ``rpsagg-server`` command: its configuration read, logging set up, the server served
(:func:`~rpsagg_server.process.serving.serve`, with the standing service's dashboard) on
the chosen event loop, and a user's error as one line and exit status 2."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from rpsagg_server.domain.errors import StartupError
from rpsagg_server.http.service import create_standing_app
from rpsagg_server.process import eventloop
from rpsagg_server.process.serving import serve
from rpsagg_server.settings.flags import load_config


def configure_logging() -> None:
    """The project's log handler, level from ``RPSAGG_LOG_LEVEL`` (default INFO)."""
    level = os.environ.get("RPSAGG_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rpsagg-server``: a user error is one line on stderr and exit 2."""
    try:
        cfg = load_config(argv)
    except (ValueError, OSError) as exc:
        return _user_error(exc)
    configure_logging()
    try:
        eventloop.run(serve(cfg, http_app_factory=create_standing_app), cfg.event_loop)
    except (StartupError, ValueError) as exc:
        return _user_error(exc)
    return 0


def _user_error(exc: BaseException) -> int:
    print(f"rpsagg-server: {exc}", file=sys.stderr)
    return 2

