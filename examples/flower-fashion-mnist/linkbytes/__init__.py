"""The parts of ``link_bytes.py`` (the command line): :mod:`linkbytes.httpstream` (the
HTTP/1.1 splitter, :class:`~linkbytes.httpstream.Exchange`), :mod:`linkbytes.proxy` (the
counting TCP proxy), :mod:`linkbytes.rounds` (rounds cut, bytes sorted by what they carry),
:mod:`linkbytes.wideapp` (the 2,002,001-parameter model's Flower app),
:mod:`linkbytes.runs` (the federation behind proxies, the configurations, one run) and
:mod:`linkbytes.report` (the tables and the JSON).

Imported with the example's folder on ``sys.path`` (``linkbytes.runs`` imports the
example's ``federation`` module).
"""
