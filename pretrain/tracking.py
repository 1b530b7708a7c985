"""What a run logs: Accelerate trackers (W&B, TensorBoard), RUN/metrics.jsonl, gradient norms, throughput, MFU."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn

from pretrain.config import PretrainConfig, flatten
from pretrain.layout import METRICS_FILE, read_metrics


def init_trackers(accelerator: Accelerator, cfg: PretrainConfig, resolved: dict[str, Any]) -> None:
    """Start the configured tracker (no-op for backend none) with the resolved config as the run config."""
    tracking = cfg.tracking
    if tracking.backend == "none":
        return
    name = tracking.run_name or cfg.train.run_name
    init_kwargs: dict[str, Any] = {}
    if tracking.backend == "wandb":
        wandb_kwargs: dict[str, Any] = {
            "name": name,
            "tags": [cfg.model.norm_placement, *tracking.tags],
            "dir": str(Path(cfg.train.output_dir)),  # offline runs land in RUN/wandb/ for `wandb sync`
            # The environment wins so that WANDB_MODE=offline works for any preset.
            "mode": os.environ.get("WANDB_MODE", tracking.wandb_mode),
        }
        if tracking.group:
            wandb_kwargs["group"] = tracking.group
        init_kwargs["wandb"] = wandb_kwargs
    # TensorBoard's hparams take scalars and strings only, so lists become strings.
    config = {k: v if isinstance(v, (int, float, str, bool)) else json.dumps(v) for k, v in flatten(resolved).items()}
    accelerator.init_trackers(tracking.project if tracking.backend == "wandb" else name, config, init_kwargs)


def log_metrics(accelerator: Accelerator, run_dir: Path, metrics: dict[str, Any], step: int) -> None:
    """Send ``metrics`` to the trackers and append them to RUN/metrics.jsonl (main process only)."""
    metrics = {"step": step, **metrics}
    accelerator.log(metrics, step=step)
    if accelerator.is_main_process:
        with open(Path(run_dir) / METRICS_FILE, "a") as f:
            f.write(json.dumps(metrics, sort_keys=True) + "\n")


def rewind_metrics(run_dir: Path, step: int) -> dict[str, float]:
    """On resume from ``step``: drop the lines a killed run logged after its checkpoint (they are logged again),
    and return the latest validation metrics up to ``step``. Main process only."""
    path = Path(run_dir) / METRICS_FILE
    rows = [row for row in read_metrics(run_dir) if row.get("step", 0) <= step]
    if path.is_file():
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
        os.replace(tmp, path)
    evaluations = [row for row in rows if any(k.startswith("val/") for k in row)]
    return {k: v for k, v in evaluations[-1].items() if k.startswith("val/")} if evaluations else {}


# --------------------------------------------------------------------------------------------------
# Gradient norms
# --------------------------------------------------------------------------------------------------


def layer_grad_norms(model: nn.Module, clip_factor: float = 1.0) -> dict[str, float]:
    """L2 norm of the gradient of each layer's attention weights (Q, K, V, output) and FFN weights (in, out).

    ``model`` is the unwrapped LNBertForPreTraining; ``clip_factor`` undoes gradient clipping (the norms are
    read after clipping, so they are divided by the clip coefficient to report the raw gradient).
    """
    norms = {}
    for index, layer in enumerate(model.bert.encoder.layer):
        groups = {
            "attn": [layer.attention.self.query, layer.attention.self.key, layer.attention.self.value,
                     layer.attention.output.dense],
            "ffn": [layer.intermediate.dense, layer.output.dense],
        }
        for name, linears in groups.items():
            grads = [lin.weight.grad for lin in linears if lin.weight.grad is not None]
            if grads:
                norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
                norms[f"grad_norm/layer_{index:02d}/{name}"] = norm.item() * clip_factor
    return norms


def clip_coefficient(total_norm: float, max_norm: float) -> float:
    """The factor torch.nn.utils.clip_grad_norm_ multiplied the gradients by (1 when not clipped)."""
    if max_norm <= 0:
        return 1.0
    return min(1.0, max_norm / (total_norm + 1e-6))


# --------------------------------------------------------------------------------------------------
# Throughput and model FLOPs utilisation
# --------------------------------------------------------------------------------------------------


def model_flops_utilisation(tokens_per_s: float, flops_per_tok: float, peak_per_device: float, devices: int) -> float:
    """Achieved model FLOP/s over the peak of all devices; 0 when the peak is not configured."""
    if peak_per_device <= 0:
        return 0.0
    return tokens_per_s * flops_per_tok / (peak_per_device * devices)
