"""Where a joint decode runs: the decode device and the optional PyTorch backend.

A decode runs on the CPU with numpy and scipy unless a device is named
(``make_estimator(..., device="cuda")``, ``rpsagg-server --decode-device``); the device
backend (:class:`TorchJointSRHT`, :func:`joint_solve_torch`) needs the ``rpsagg[torch]``
extra. PyTorch is imported only when a device is used, never by importing this module.
``docs/scaling.md`` describes the backend.
"""

from rpsagg._device import import_torch, resolve_device
from rpsagg._torch import TorchJointSRHT, fwht_torch, joint_solve_torch

__all__ = ["TorchJointSRHT", "fwht_torch", "import_torch", "joint_solve_torch",
           "resolve_device"]
