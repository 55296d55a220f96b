"""rpsagg aggregation client: :class:`AggregationClient` and the ``rpsagg-client`` command."""

from rpsagg_client.client import AggregationClient

__all__ = ["AggregationClient"]
