"""The one rule for choosing the torch device of a command that does not run under Accelerate (fine-tuning, the
benchmarks; pretraining leaves the choice to Accelerate)."""

from __future__ import annotations

import torch

DEVICE_CHOICES: tuple[str, ...] = ("auto", "cpu", "cuda")


def pick_device(name: str, *, flag: str = "--device") -> torch.device:
    """``"auto"``: CUDA when available, else CPU; ``"cpu"``/``"cuda"`` as given (``"cuda"`` must exist).

    ``flag`` is how the user spells the setting, so the message names what to change (e.g. ``recipe.device``).
    """
    if name not in DEVICE_CHOICES:
        raise ValueError(f"{flag}={name!r} is not a valid choice; valid choices: {', '.join(DEVICE_CHOICES)}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{flag}=cuda but torch.cuda.is_available() is False; use {flag}=auto or cpu")
    return torch.device(name)
