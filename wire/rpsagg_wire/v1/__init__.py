"""Version 1 of the aggregation protocol (``proto/rpsagg/v1/aggregation.proto``).

Generated code (``aggregation_pb2*``) is committed and regenerated only by
``scripts/gen-proto.sh``; everything else goes through :mod:`rpsagg_wire.v1.serde`.
"""
