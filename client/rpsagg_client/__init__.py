"""rpsagg aggregation client (see the aggregation-service issue)."""
