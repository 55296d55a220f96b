"""The run config's ``model``: ``softmax`` (numpy, :mod:`fmnist_app.task`, d = 7,850), or a
PyTorch model sent as its ``state_dict``: ``cnn`` (:mod:`fmnist_app.cnn`, d = 20,586 with
BatchNorm's statistics beside) or ``mlp`` (:mod:`fmnist_app.mlp`, d = 203,530)."""

from __future__ import annotations

import importlib
from types import ModuleType

MODELS = ("softmax", "cnn", "mlp")


def torch_model(name: str) -> ModuleType | None:
    """The module of the PyTorch model ``name`` (imported here: PyTorch only where a
    PyTorch model is asked for), or None for ``softmax``; ``ValueError`` for another name."""
    if name not in MODELS:
        raise ValueError(f"model must be one of {', '.join(MODELS)}; got {name!r}")
    return None if name == "softmax" else importlib.import_module(f"fmnist_app.{name}")
