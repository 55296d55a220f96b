"""``python -m rpsagg_server``: the ``rpsagg-server`` command."""

from rpsagg_server.process.main import main

if __name__ == "__main__":
    raise SystemExit(main())
