"""The one rule for choosing the torch device of a command that does not run under Accelerate (fine-tuning, the
benchmarks), the device Accelerate will choose for pretraining, and the size of torch's CPU thread pool."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions: the commands name DEVICE_CHOICES while they check their options, before
# torch's seconds of import.
DEVICE_CHOICES: tuple[str, ...] = ("auto", "cpu", "cuda")


def pick_device(name: str, *, flag: str = "--device") -> torch.device:
    """``"auto"``: CUDA when available, else CPU; ``"cpu"``/``"cuda"`` as given (``"cuda"`` must exist).
    ``flag`` is how the user spells the setting (e.g. ``recipe.device``), which the message names."""
    import torch

    if name not in DEVICE_CHOICES:
        raise ValueError(f"{flag}={name!r} is not a valid choice; valid choices: {', '.join(DEVICE_CHOICES)}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{flag}=cuda but torch.cuda.is_available() is False; use {flag}=auto or cpu")
    return torch.device(name)


def env_flag(name: str) -> bool:
    """An environment variable set to 1, true or yes (as Accelerate's launcher sets ACCELERATE_USE_CPU ...)."""
    return os.environ.get(name, "").lower() in ("1", "true", "yes")


FP16_NEEDS_A_GPU = "train.mixed_precision=fp16 needs a GPU (its loss scaler is CUDA-only); use bf16 or no on CPU"


def surely_no_cuda() -> bool:
    """True when this process surely sees no CUDA GPU, known without importing torch: ``accelerate launch --cpu``,
    CUDA_VISIBLE_DEVICES empty or -1, or on Linux no NVIDIA device node (False: torch decides later)."""
    if env_flag("ACCELERATE_USE_CPU") or os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return True
    return sys.platform == "linux" and not Path("/dev/nvidiactl").exists()


def accelerate_uses_cpu() -> bool:
    """Whether Accelerate runs this process on the CPU: no CUDA GPU, or ACCELERATE_USE_CPU (launch --cpu)."""
    import torch

    return not torch.cuda.is_available() or env_flag("ACCELERATE_USE_CPU")


def passive_cpu_threads() -> None:
    """Let torch's idle OpenMP threads sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE``) unless the user chose a
    policy: spinning threads fight other jobs for the cores (1.6-1.8x slower, docs/pretraining.md). OpenMP reads it when
    torch loads, so ``cli.run_cli`` sets it; the benchmarks import torch first and keep OpenMP's default."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def choose_cpu_threads() -> str:
    """Size torch's CPU thread pool and say how: OMP_NUM_THREADS wins; otherwise half of this process's share of the
    cores (torch's every-core default made the tiny run 4-10x slower on a shared 2-core machine)."""
    import torch

    if os.environ.get("OMP_NUM_THREADS"):
        return f"{torch.get_num_threads()} CPU thread(s) per process (OMP_NUM_THREADS)"
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(max(1, cores // local_processes // 2))
    return f"{torch.get_num_threads()} CPU thread(s) per process (half of {cores} cores; set OMP_NUM_THREADS to change)"
