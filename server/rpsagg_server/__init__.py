"""rpsagg aggregation server (see the aggregation-service issue)."""
