"""rpsagg's wire protocol, apart from the math library.

:mod:`rpsagg_wire.v1` holds the code generated from ``proto/rpsagg/v1/aggregation.proto`` and
:mod:`rpsagg_wire.v1.serde`, the only module that touches it: protobuf bytes in and out,
frozen dataclasses to the client and the server. The math library :mod:`rpsagg` never
imports protobuf or gRPC.
"""
