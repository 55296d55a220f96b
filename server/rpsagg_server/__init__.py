"""rpsagg aggregation server, in layers (each imports only the ones below it; the table is
``tests/unit/test_layers.py``'s ``SERVER_LAYERS``):

- :mod:`~rpsagg_server.process`: the ``rpsagg-server`` command, start-up, the event loop;
- :mod:`~rpsagg_server.rpc` and :mod:`~rpsagg_server.http`: the gRPC and HTTP edges;
- :mod:`~rpsagg_server.jobs`: every job of a server, in one catalog;
- :mod:`~rpsagg_server.rounds`: one job's rounds;
- :mod:`~rpsagg_server.decode`: decoding closed rounds;
- :mod:`~rpsagg_server.store`: a job's database;
- :mod:`~rpsagg_server.readmodel`: what a running server shows;
- :mod:`~rpsagg_server.settings`: the configuration of the server and its jobs;
- :mod:`~rpsagg_server.domain`: the refusals and the named states.
"""
