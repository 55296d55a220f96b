"""Reproduction of the paper's experiments (``rpsagg-experiments <name>``).

One module per experiment:

- :mod:`~rpsagg_experiments.full_correlation`: identical vectors against the closed forms
  of :mod:`~rpsagg_experiments.closed_forms`.
- :mod:`~rpsagg_experiments.varying_correlation`: canonical basis vectors shared by groups of
  clients, the paper's Figure "various degrees of correlation".
- :mod:`~rpsagg_experiments.rank`: how often ``S = sum_i G_i^T G_i`` has rank ``nk``.
- :mod:`~rpsagg_experiments.optimization`: power iteration, k-means and linear regression on
  Fashion-MNIST and UJIIndoorLoc (splits in :mod:`~rpsagg_experiments.splits`), in-process or
  through the gRPC service (:mod:`~rpsagg_experiments.service`).
- :mod:`~rpsagg_experiments.timing`: encode and decode wall-clock.

Shared machinery (seeds, the process pool, CSV) is in :mod:`~rpsagg_experiments.runtime`,
the figures in :mod:`~rpsagg_experiments.plotting`, the command line in
:mod:`~rpsagg_experiments.cli`.
"""
