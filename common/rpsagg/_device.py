"""The decode device: PyTorch imported on demand, and a device name checked.

PyTorch (the ``rpsagg[torch]`` extra) is imported only when a device is asked for, never by
importing :mod:`rpsagg`. Public as :mod:`rpsagg.device`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def import_torch() -> Any:
    """The ``torch`` module.

    Returns
    -------
    module
        PyTorch, imported on first use.

    Raises
    ------
    ImportError
        When PyTorch is not installed (the message names the ``rpsagg[torch]`` extra).
    """
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - the test set-up installs it
        raise ImportError(
            "a decode device needs PyTorch: pip install 'rpsagg[torch]'"
        ) from exc
    return torch


def resolve_device(device: str | torch.device) -> torch.device:
    """The ``torch.device`` for ``device``, checked to be usable on this machine.

    Parameters
    ----------
    device : str or torch.device
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.

    Returns
    -------
    torch.device

    Raises
    ------
    ValueError
        If the name is unknown, not a CPU or CUDA device, or CUDA is unavailable here.
    ImportError
        If PyTorch is not installed.
    """
    torch = import_torch()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"unknown decode device {device!r}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"decode device {device!r}: CUDA is not available on this machine")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"decode device must be 'cpu' or 'cuda[:N]'; got {device!r}")
    return dev

