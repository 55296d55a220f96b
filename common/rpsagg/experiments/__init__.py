"""Reproduction of the paper's experiments (``rpsagg-experiments <name>``).

One module per experiment:

- :mod:`~rpsagg.experiments.full_correlation`: identical vectors against the closed forms
  of :mod:`~rpsagg.experiments.closed_forms`.
- :mod:`~rpsagg.experiments.varying_correlation`: canonical basis vectors shared by groups of
  clients, the paper's Figure "various degrees of correlation".
- :mod:`~rpsagg.experiments.rank`: how often ``S = sum_i G_i^T G_i`` has rank ``nk``.
- :mod:`~rpsagg.experiments.optimization`: power iteration, k-means and linear regression on
  Fashion-MNIST and UJIIndoorLoc (splits in :mod:`~rpsagg.experiments.splits`), in-process or
  through the gRPC service (:mod:`~rpsagg.experiments.service`).
- :mod:`~rpsagg.experiments.timing`: encode and decode wall-clock.

Shared machinery (seeds, the process pool, CSV) is in :mod:`~rpsagg.experiments.runtime`,
the figures in :mod:`~rpsagg.experiments.plotting`, the command line in
:mod:`~rpsagg.experiments.cli`.
"""
