"""Shared pieces of the benchmarks: device and machine description, timing, GEMM peak, result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from pretrain.common.cli import run_cli
from pretrain.common.device import pick_device
from pretrain.common.hardware import cpu_bf16_warning, cpu_model, gpu_peak

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def configure_device(device: torch.device) -> None:
    """TF32 for fp32 matmuls on CUDA (what anyone training on Ampere+ does); nothing to do on CPU."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def start_device(name: str, threads: int | None, bf16: bool, fp32_setting: str) -> torch.device:
    """The ``--device`` to run on, configured (``--threads``, TF32); a warning when ``bf16`` is emulated there."""
    if threads:
        torch.set_num_threads(threads)
    device = pick_device(name)
    configure_device(device)
    if device.type == "cpu" and bf16 and (warning := cpu_bf16_warning(fp32_setting)):
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    return device


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Wall-clock seconds of one call, with the device queue drained before and after."""
    return timed_with_cpu(fn, device)[0]


def timed_with_cpu(fn: Callable[[], Any], device: torch.device) -> tuple[float, float]:
    """(wall-clock seconds, CPU seconds of this process, all threads) of one call.

    On a shared, oversubscribed CPU the wall clock also counts time spent waiting for a core; the process's
    CPU time counts only the work done (plus OpenMP spinning), so ratios of CPU time are the steadier measure.
    """
    synchronize(device)
    cpu, start = time.process_time(), time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start, time.process_time() - cpu


def spread(values: list[float]) -> dict[str, float]:
    """Median and the noise around it: interquartile range and min/max, relative to the median."""
    med = statistics.median(values)
    q1, _, q3 = statistics.quantiles(values, n=4) if len(values) >= 4 else (min(values), med, max(values))
    return {"median": med, "min": min(values), "max": max(values), "iqr_rel": (q3 - q1) / med if med else 0.0,
            "range_rel": (max(values) - min(values)) / med if med else 0.0, "n": len(values)}  # fmt: skip


def paired_speedup(times: list[float], reference: list[float]) -> dict[str, float]:
    """``spread`` of reference / time per repetition: both timed in the same one, so shared-machine drift cancels."""
    return spread([r / t for t, r in zip(times, reference, strict=True)])


def machine_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "device": str(device), "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "transformers": version("transformers"),
    }  # fmt: skip
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def table_peak_tflops(gpu_name: str) -> dict[str, float] | None:
    """Data-sheet dense peak of a known card (pretrain/common/hardware.py), ``{"bf16": ..., "fp32": ...}`` (fp32 means
    TF32, which configure_device enables), else None."""
    entry = gpu_peak(gpu_name)
    return {"bf16": entry.bf16, "fp32": entry.tf32} if entry else None


def measured_gemm(dtype: torch.dtype, device: torch.device, size: int, reps: int = 5) -> tuple[float, float]:
    """Best-of-``reps`` (TFLOP/s of wall-clock time, TFLOP per CPU-second of this process) of a square matmul."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    for _ in range(2):  # warm-up: oneDNN/cuBLAS pick and cache their kernels on the first calls
        torch.mm(a, b)
    runs = [timed_with_cpu(lambda: torch.mm(a, b), device) for _ in range(reps)]
    flops = 2 * size**3
    return flops / min(w for w, _ in runs) / 1e12, flops / max(min(c for _, c in runs), 1e-9) / 1e12


GEMM_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def gemm_peaks(device: torch.device, size: int | None = None, earlier: dict[str, Any] | None = None,
               precisions: tuple[str, ...] | list[str] = ("fp32", "bf16")) -> dict[str, Any]:  # fmt: skip
    """Measured GEMM TFLOP/s of each of ``precisions`` (fp32, bf16), plus the data-sheet figures on a known GPU.

    Only the precisions asked for: on a CPU without native bf16 one 2048^3 bf16 GEMM takes minutes (emulated).
    ``reference`` is what MFU is computed against: the data sheet on a known GPU, the measured GEMM otherwise.
    Pass the result of an ``earlier`` call to keep the best of both (on a shared machine, a busy spell during
    one measurement would otherwise flatter every MFU figure).
    """
    size = size or (8192 if device.type == "cuda" else 2048)
    both = {name: measured_gemm(GEMM_DTYPES[name], device, size) for name in precisions}
    measured = {k: v[0] for k, v in both.items()}
    per_cpu_s = {k: v[1] for k, v in both.items()}
    if earlier is not None:
        measured = {k: max(v, earlier["measured_tflops"][k]) for k, v in measured.items()}
        per_cpu_s = {k: max(v, earlier["measured_tflop_per_cpu_s"][k]) for k, v in per_cpu_s.items()}
    table = table_peak_tflops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    return {
        "gemm_size": size,
        "measured_tflops": measured,
        # Work per CPU-second is what a GEMM gets done when it runs, however busy the machine is: the steadier
        # reference for MFU on a shared CPU (compare with the step's FLOPs per CPU-second).
        "measured_tflop_per_cpu_s": per_cpu_s,
        "datasheet_tflops": table,
        "reference": "datasheet" if table else "measured",
        "reference_tflops": table or measured,
    }


def write_results(name: str, payload: dict[str, Any], out: str | Path | None = None) -> Path:
    """Write ``payload`` as JSON to ``out`` or ``benchmarks/results/<name>-<UTC time>.json``."""
    if not out:
        out = RESULTS_DIR / f"{name}-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.json"
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return out


def command(main: Callable[[], object]) -> Callable[[], int]:
    """A benchmark's ``main`` for the command line: bad options end with their message and exit code 2."""

    def run() -> int:
        main()
        return 0

    return lambda: run_cli(run)
