"""What the hardware offers: a GPU's data-sheet peak FLOP/s (for ``train/mfu``), whether a CPU computes bf16
natively (without it, bf16 autocast is emulated and several times slower than fp32), and which CPU this is."""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class GpuPeak:
    """Dense (no sparsity) peak TFLOP/s of one card from its vendor's data sheet. ``model`` and ``variant`` are
    whole words of ``torch.cuda.get_device_name()`` (variant None: any other name with that model word)."""

    model: str
    variant: str | None
    label: str
    bf16: float  # bf16/fp16 tensor cores (the same dense figure on these cards)
    tf32: float
    fp32: float | None  # plain fp32 (no TF32); None: not on the data sheet


# First match wins: a card's variants (NVL, PCIe) come before its SXM entry. Names are matched by whole words, so
# "NVIDIA H200 NVL" does not take the SXM figure and "NVIDIA GH200 480GB" is not an "H200".
GPU_PEAKS: tuple[GpuPeak, ...] = (
    GpuPeak("H200", "NVL", "H200 NVL", 835.0, 418.0, 60.0),
    GpuPeak("H200", None, "H200 SXM", 989.0, 494.7, 67.0),
    GpuPeak("GH200", None, "GH200", 989.0, 494.7, 67.0),
    GpuPeak("H100", "NVL", "H100 NVL", 835.0, 418.0, 60.0),
    GpuPeak("H100", "PCIE", "H100 PCIe", 756.0, 378.0, 51.0),
    GpuPeak("H100", None, "H100 SXM", 989.0, 494.7, 67.0),
    GpuPeak("H800", None, "H800 SXM", 989.0, 494.7, 67.0),
    GpuPeak("A100", None, "A100", 312.0, 156.0, 19.5),
    GpuPeak("A800", None, "A800", 312.0, 156.0, 19.5),
    GpuPeak("L40S", None, "L40S", 362.0, 183.0, 91.6),
    GpuPeak("A10G", None, "A10G", 70.0, 35.0, None),
    GpuPeak("A10", None, "A10", 125.0, 62.5, 31.2),
    GpuPeak("L4", None, "L4", 121.0, 60.0, 30.3),
)


def gpu_peak(device_name: str) -> GpuPeak | None:
    """The table entry of a ``torch.cuda.get_device_name()``, or None for a card not in the table."""
    words = set(re.split(r"[^A-Z0-9]+", device_name.upper()))
    for entry in GPU_PEAKS:
        if entry.model in words and (entry.variant is None or entry.variant in words):
            return entry
    return None


def mfu_peak(configured: float | None, device: torch.device, mixed_precision: str) -> tuple[float, str]:
    """(peak FLOP/s of one device for ``train/mfu``, where it came from). ``configured`` (train.peak_flops_per_device)
    wins (0 disables MFU); None looks the device up in GPU_PEAKS at the precision the matmuls run in."""
    if configured == 0:
        return 0.0, "train/mfu is not measured (train.peak_flops_per_device=0); set it to one device's peak FLOP/s"
    if configured is not None:
        return configured, (f"train/mfu: model FLOP/s per device as a share of train.peak_flops_per_device="
                            f"{configured:g} FLOP/s")
    if device.type != "cuda":
        return 0.0, "train/mfu is 0: no data-sheet peak for a CPU (set train.peak_flops_per_device to choose one)"
    name = torch.cuda.get_device_name(device)
    entry = gpu_peak(name)
    if entry is None:
        return 0.0, f"train/mfu is 0: {name!r} is not in pretrain/common/hardware.py; set train.peak_flops_per_device"
    if mixed_precision in ("bf16", "fp16"):
        kind, tflops = f"{mixed_precision} dense", entry.bf16
    elif torch.backends.cuda.matmul.allow_tf32:
        kind, tflops = "TF32 dense", entry.tf32
    else:
        kind, tflops = "fp32 (TF32 off)", entry.fp32
    if tflops is None:
        return 0.0, f"train/mfu is 0: no {kind} figure for {entry.label}; set train.peak_flops_per_device"
    return tflops * 1e12, f"train/mfu against {tflops:g} TFLOP/s per device ({name!r} matched {entry.label}, {kind})"


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name with its family and model numbers where ``cpuinfo`` gives them: a virtual machine may name
    every generation alike ("AMD EPYC" for Zen 3 and Zen 4), and generations run other kernels (AVX2 or AVX-512),
    which move the last bits of every result. Elsewhere, platform's word for the processor."""
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    fields: dict[str, str] = {}
    for key, _, value in (line.partition(":") for line in lines):
        fields.setdefault(key.strip(), value.strip())  # the first processor's
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


def device_name(device: torch.device) -> str:
    """What computes, as a fine-tuning result and a study cell's provenance record it: a GPU's name, or the CPU's
    model with the vector instructions torch's kernels use there (AVX2, AVX512, ...)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return f"{cpu_model()}, {torch.backends.cpu.get_cpu_capability()}"
    return device.type


def cpu_has_native_bf16() -> bool | None:
    """Whether this x86 CPU has AVX512-BF16 or AMX-BF16 (native bf16 in oneDNN); None when torch cannot tell."""
    try:
        flags = torch._C._cpu._get_cpu_capability()
    except AttributeError:
        return None
    if not isinstance(flags, dict) or flags.get("architecture") != "x86_64":
        return None
    return bool(flags.get("avx512_bf16") or flags.get("amx_bf16"))


def cpu_bf16_warning(fp32_setting: str) -> str:
    """A warning naming ``fp32_setting`` when bf16 autocast is emulated on this CPU (several times slower), else ""."""
    if cpu_has_native_bf16() is not False:
        return ""
    return (
        f"this CPU has no native bf16 (no AVX512-BF16, no AMX; torch's CPU capability: "
        f"{torch.backends.cpu.get_cpu_capability()}), so bf16 autocast is emulated and several times slower than "
        f"fp32 (BENCHMARKS.md); for fp32 use {fp32_setting}"
    )


def auto_mixed_precision(on_cpu: bool) -> tuple[str, str]:
    """(no or bf16, why) for mixed_precision=auto: bf16 where the device computes it natively. On a GPU that is
    compute capability 8.0 (Ampere) on; ``torch.cuda.is_bf16_supported()`` also counts the emulation of older cards
    (V100: 7.0, T4: 7.5), several times slower than fp32."""
    if not on_cpu:
        capability = torch.cuda.get_device_capability()
        if capability >= (8, 0):
            return "bf16", f"this GPU computes bf16 natively (compute capability {capability[0]}.{capability[1]})"
        return "no", (f"this GPU (compute capability {capability[0]}.{capability[1]}) has no native bf16: it would be "
                      "emulated, slower than fp32")
    if cpu_has_native_bf16():
        return "bf16", "this CPU has AVX512-BF16 or AMX"
    return "no", f"this CPU has no native bf16 (torch's CPU capability: {torch.backends.cpu.get_cpu_capability()})"
