"""What a run logs: Accelerate trackers (TensorBoard; W&B's run: wandb_logging.py), RUN/metrics.jsonl, gradient
norms, a residual scheme's measurements, throughput, MFU."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn

from pretrain.common.atomic import write_text
from pretrain.common.cli import flatten
from pretrain.config import PretrainConfig
from pretrain.norms import SeeDNorm
from pretrain.residual_streams import ResidualStats
from pretrain.run_folder.layout import METRICS_FILE, metrics_and_damage
from pretrain.run_folder.repair import keep_damaged
from pretrain.tracking.wandb_logging import start_pretraining_run


def derived_config(cfg: PretrainConfig, model: nn.Module, num_processes: int) -> dict[str, Any]:
    """Values a user filters and groups runs on that the config only implies."""
    global_batch = cfg.train.global_batch_size(num_processes)
    return {
        "global_batch_size": global_batch,
        "warmup_steps": cfg.optim.resolved_warmup_steps(cfg.train.max_steps),
        "parameters": sum(p.numel() for p in model.parameters()),
        # Sequence slots per optimizer step (instances may be shorter; tokens_seen counts the real tokens).
        "tokens_per_step": global_batch * cfg.data.max_seq_length,
        "num_processes": num_processes,
    }


def init_trackers(accelerator: Accelerator, cfg: PretrainConfig, resolved: dict[str, Any], model: nn.Module,
                  resume_from: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """Start the configured tracker (no-op for backend none): W&B's run (``wandb_logging.start_pretraining_run``), or
    TensorBoard, whose hparams get lists as JSON strings. Returns the W&B run's identity ({} without one)."""
    if cfg.tracking.backend == "none":
        return {}
    derived = derived_config(cfg, accelerator.unwrap_model(model, keep_torch_compile=False), accelerator.num_processes)
    try:
        if cfg.tracking.backend == "wandb":
            return start_pretraining_run(accelerator, cfg, resolved, derived, resume_from)
        flat = flatten({**resolved, **derived})
        config = {k: v if isinstance(v, (int, float, str, bool)) else json.dumps(v) for k, v in flat.items()}
        accelerator.init_trackers(cfg.tracking.run_name or cfg.train.run_name, config)
        return {}
    except BaseException:
        # Accelerate keeps a tracker whose start failed, with no run behind it: the failure's own handling (the
        # outcome in the W&B summary, end_training) would fail on it in turn and hide this error.
        accelerator.trackers.clear()
        raise


def log_metrics(accelerator: Accelerator, run_dir: Path, metrics: dict[str, Any], step: int,
                file_only: dict[str, Any] | None = None) -> None:  # fmt: skip
    """Send ``metrics`` to the trackers; append them and ``file_only`` (no scalars) to RUN/metrics.jsonl."""
    metrics = {"step": step, **metrics}
    accelerator.log(metrics, step=step)
    if accelerator.is_main_process:
        with open(Path(run_dir) / METRICS_FILE, "a") as f:
            f.write(json.dumps({**metrics, **(file_only or {})}, sort_keys=True) + "\n")


def rewind_metrics(run_dir: Path, step: int, logged: int) -> tuple[dict[str, float], int]:
    """On resume from ``step``: drop the lines logged after it (logged again); return the latest validation metrics
    and how many lines are kept. ``logged``: how many lines the checkpoint counted up to ``step``; fewer kept (the
    file cut short or removed since) is said in a warning. Lines that are no JSON object were damaged since (but a
    last one a kill cut short): they are left out with a warning, and the file as it was is kept under RUN/damaged/."""
    path = Path(run_dir) / METRICS_FILE
    readable, damaged = metrics_and_damage(run_dir)
    if damaged:
        kept = keep_damaged(Path(run_dir), path)
        print(f"warning: {damaged} line(s) of {path} cannot be read (damaged since): left out; the file as it was is "
              f"kept as {kept}", file=sys.stderr, flush=True)  # fmt: skip
    rows = [row for row in readable if row.get("step", 0) <= step]
    if len(rows) < logged:
        print(f"warning: {path} holds {len(rows)} of the {logged} lines the run logged up to step {step} (cut short, "
              "damaged or removed since): its curves have a gap there", file=sys.stderr, flush=True)  # fmt: skip
    if path.is_file():
        write_text(path, "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
    evaluations = [row for row in rows if any(k.startswith("val/") for k in row)]
    return ({k: v for k, v in evaluations[-1].items() if k.startswith("val/")} if evaluations else {}), len(rows)


def layer_grad_norms(model: nn.Module, clip_factor: float = 1.0) -> dict[str, float]:
    """L2 norm of the gradient of each layer's attention weights (Q, K, V, output), FFN weights
    (``grad_norm/layer_NN/attn``, ``.../ffn``) and residual scheme's modules (``.../residual``), of SeeDNorm's beta per
    sub-layer (``grad_norm/seednorm_beta/KK``: its paper flags it as unstable) and of AttnRes's output aggregation
    (``grad_norm/output_residual``); ``clip_factor`` undoes the clipping applied before they are read."""
    groups: dict[str, list[nn.Parameter]] = {}
    encoder = model.bert.encoder
    for index, layer in enumerate(encoder.layer):
        attention = (layer.attention.self.query, layer.attention.self.key, layer.attention.self.value,
                     layer.attention.output.dense)  # fmt: skip
        groups[f"grad_norm/layer_{index:02d}/attn"] = [linear.weight for linear in attention]
        groups[f"grad_norm/layer_{index:02d}/ffn"] = [layer.intermediate.dense.weight, layer.output.dense.weight]
        groups[f"grad_norm/layer_{index:02d}/residual"] = _residual_parameters(layer)
        for k, norm in ((2 * index, getattr(layer, "norm_a", None)), (2 * index + 1, getattr(layer, "norm_f", None))):
            if isinstance(norm, SeeDNorm):  # nGPT's layers have no norm_a
                groups[f"grad_norm/seednorm_beta/{k:02d}"] = [norm.beta]
    groups["grad_norm/output_residual"] = _residual_parameters(encoder)
    norms = {}
    for key, parameters in groups.items():
        grads = [p.grad for p in parameters if p.grad is not None]
        if grads:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
            norms[key] = norm.item() * clip_factor
    return norms


def _residual_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters of ``module``'s children that are a residual scheme's modules (none for the standard one)."""
    return [p for child in module.children() if hasattr(child, "recorder") for p in child.parameters()]


def clip_coefficient(total_norm: float, max_norm: float) -> float:
    """The factor torch.nn.utils.clip_grad_norm_ multiplied the gradients by (1 when not clipped)."""
    if max_norm <= 0:
        return 1.0
    return min(1.0, max_norm / (total_norm + 1e-6))


RESIDUAL_PREFIX = "residual/"
SIGNIFICANT_DIGITS = 4  # of the lists' entries in metrics.jsonl: a fifth digit is below a step's noise


def residual_scalars(stats: ResidualStats) -> dict[str, float]:
    """The measurements a tracker draws, as scalars: ``residual/output_norm/KK`` (each sub-layer's output norm) and,
    for the HC family (HC, mHC, mHC-lite, Frac-Connections), ``residual/composite_gain/row`` and ``.../col`` (of the
    product of H_res over the whole depth: 1 where H_res is doubly stochastic)."""
    return {RESIDUAL_PREFIX + key: value for key, value in stats.scalars().items()}


def residual_matrices(stats: ResidualStats | None) -> dict[str, list]:
    """The small matrices as nested lists for RUN/metrics.jsonl only (as charts they would be hundreds), rounded to
    ``SIGNIFICANT_DIGITS``: for the HC family ``residual/h_pre``, ``.../h_post`` (N x n), ``.../h_res`` (N x n x n)
    and ``.../composite_gain/per_sublayer`` (N x 2); for AttnRes ``residual/depth_weights`` ((N + 1) x K), for
    DenseFormer its DWA weights (a row per average); none for the standard scheme (``stats`` None)."""
    if stats is None:
        return {}
    found = {"h_pre": stats.pre, "h_post": stats.post, "h_res": stats.res,
             "composite_gain/per_sublayer": stats.composite_gain, "depth_weights": stats.depth_weights}
    return rounded({RESIDUAL_PREFIX + name: value.tolist() for name, value in found.items() if value is not None})


def rounded(values: Any) -> Any:
    """Numbers, nested in lists and dicts, to ``SIGNIFICANT_DIGITS``: what metrics.jsonl keeps of a list."""
    if isinstance(values, dict):
        return {key: rounded(v) for key, v in values.items()}
    if isinstance(values, list):
        return [rounded(v) for v in values]
    return float(f"{values:.{SIGNIFICANT_DIGITS}g}")
