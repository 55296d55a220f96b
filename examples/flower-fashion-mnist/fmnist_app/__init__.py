"""Federated softmax regression on Fashion-MNIST with compressed updates (rpsagg-flower)."""
