"""The version of rpsagg: one number for all its distributions (rpsagg, rpsagg-wire,
rpsagg-server, rpsagg-client, rpsagg-flower, rpsagg-experiments), kept in the repository's
``VERSION`` file, which each distribution's ``pyproject.toml`` reads when it is built.

An installed distribution says it in its metadata; a source tree on ``sys.path`` that was
never installed reads the file.
"""

from __future__ import annotations

import argparse
from importlib import metadata
from pathlib import Path

#: the repository's file, from this module (common/rpsagg/_version.py)
_FILE = Path(__file__).resolve().parents[2] / "VERSION"


def _version() -> str:
    try:
        return metadata.version("rpsagg")
    except metadata.PackageNotFoundError:
        return _FILE.read_text().strip() if _FILE.is_file() else "0+unknown"


__version__ = _version()


def version_line(prog: str, *more: str) -> str:
    """What every command's ``--version`` prints: ``PROG 1.0.0 (seed spec rpsagg-seed-v5)``,
    the release and the newest seed spec it reads and writes, then ``more`` (a command that
    speaks gRPC adds its protocol: ``protocol rpsagg.v1``)."""
    from rpsagg.spec import SPEC_VERSION

    return f"{prog} {__version__} ({', '.join((f'seed spec {SPEC_VERSION}', *more))})"


def add_version_flag(parser: argparse.ArgumentParser, *more: str) -> None:
    """Give a command's parser ``--version`` (:func:`version_line` of its ``prog``)."""
    parser.add_argument("--version", action="version", version=version_line(parser.prog, *more),
                        help="print the version and the specs it speaks, then exit")
