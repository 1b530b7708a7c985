"""What a run logs: Accelerate trackers (W&B, TensorBoard), RUN/metrics.jsonl, gradient norms, a residual scheme's
measurements, throughput, MFU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn

from pretrain.common.atomic import write_text
from pretrain.config import PretrainConfig, flatten, to_dict
from pretrain.residual_streams import RESIDUAL_MODULES, ResidualStats
from pretrain.run_folder.layout import METRICS_FILE, read_metrics
from pretrain.tracking.wandb_logging import (
    SUMMARY_LINES,
    define_pretrain_metrics,
    pretrain_group,
    read_run_file,
    recipe,
    run_identity,
    set_summary,
    short_hash,
    snapshot_alias,
    snapshot_artifact,
    wandb_mode,
)


def derived_config(cfg: PretrainConfig, model: nn.Module, num_processes: int) -> dict[str, Any]:
    """Values a user filters and groups runs on that the config only implies."""
    global_batch = cfg.train.global_batch_size(num_processes)
    return {
        "global_batch_size": global_batch,
        "warmup_steps": cfg.optim.resolved_warmup_steps(cfg.train.max_steps),
        "parameters": sum(p.numel() for p in model.parameters()),
        # Sequence slots per optimizer step (instances may be shorter than max_seq_length; tokens_seen counts real ones).
        "tokens_per_step": global_batch * cfg.data.max_seq_length,
        "num_processes": num_processes,
    }


def init_trackers(
    accelerator: Accelerator,
    cfg: PretrainConfig,
    resolved: dict[str, Any],
    model: nn.Module,
    resume_from: Path | None = None,
) -> None:
    """Start the configured tracker (no-op for backend none).

    W&B gets the resolved config as native nested values plus ``norm_placement``, ``comparison`` and the
    derived values at the top level, a group that pools only seeds, and the run id kept in RUN/ (resumed, so a
    preempted run stays one W&B run); see pretrain/tracking/wandb_logging.py. TensorBoard's hparams take scalars and
    strings only, so there lists become JSON strings.
    """
    tracking = cfg.tracking
    if tracking.backend == "none":
        return
    name = tracking.run_name or cfg.train.run_name
    derived = derived_config(cfg, accelerator.unwrap_model(model, keep_torch_compile=False), accelerator.num_processes)
    if tracking.backend == "tensorboard":
        flat = flatten({**resolved, **derived})
        config = {k: v if isinstance(v, (int, float, str, bool)) else json.dumps(v) for k, v in flat.items()}
        accelerator.init_trackers(name, config)
        return
    recipe_hash = short_hash(recipe(resolved, derived["global_batch_size"]))
    group = pretrain_group(to_dict(tracking), cfg.model.variant, recipe_hash)
    identity = {}
    if accelerator.is_main_process:  # Accelerate starts W&B on the main process only
        identity = run_identity(Path(cfg.train.output_dir), resume_from, group, tracking.project)
    config = {
        **resolved,
        **derived,
        "norm_placement": cfg.model.norm_placement,
        "norm_type": cfg.model.norm_type,
        "variant": cfg.model.variant,
        "comparison": tracking.comparison,
        "recipe_hash": recipe_hash,
    }
    if identity.get("continued_from"):
        config["continued_from"] = identity["continued_from"]  # the run folder whose checkpoint this run continued
    wandb_kwargs: dict[str, Any] = {
        "name": name,
        "id": identity.get("id"),
        "resume": "allow",
        "group": identity.get("group", group),
        "job_type": "pretrain",
        "tags": sorted({cfg.model.norm_placement, cfg.model.variant, *tracking.tags} | ({tracking.comparison} - {""})),
        "dir": str(Path(cfg.train.output_dir)),  # offline runs land in RUN/wandb/ for `wandb sync`
        "mode": wandb_mode(tracking.wandb_mode),
        "settings": {"max_end_of_run_summary_metrics": SUMMARY_LINES},
    }
    accelerator.init_trackers(tracking.project, config, {"wandb": wandb_kwargs})
    run = wandb_run(accelerator)
    if run is not None:
        define_pretrain_metrics(run)


def wandb_run(accelerator: Accelerator) -> Any:
    """The W&B run Accelerate started on this process, or None (another tracker, or not the main process)."""
    if not accelerator.is_main_process:
        return None
    for tracker in accelerator.trackers:
        if tracker.name == "wandb":
            return tracker.tracker
    return None


def record_outcome(accelerator: Accelerator, status: str, step: int, diverged_at: int | None = None) -> None:
    """Put the run's status.json outcome into the W&B summary (the runs table's outcome columns)."""
    run = wandb_run(accelerator)
    if run is not None:
        set_summary(run, status=status, step=step, diverged_at_step=diverged_at)


def log_snapshot(accelerator: Accelerator, run_dir: Path, snapshot_dir: Path | None, step: int) -> None:
    """Log a written snapshot as a version of the run's model artifact (by reference), aliased step-N."""
    run = wandb_run(accelerator)
    if run is None or snapshot_dir is None:
        return
    identity = read_run_file(run_dir)
    run.log_artifact(snapshot_artifact(snapshot_dir, identity["id"]), aliases=[snapshot_alias(step)])


def log_metrics(
    accelerator: Accelerator, run_dir: Path, metrics: dict[str, Any], step: int, file_only: dict[str, Any] | None = None
) -> None:
    """Send ``metrics`` to the trackers and append them, with ``file_only`` (values that are no scalars, kept out
    of the trackers), to RUN/metrics.jsonl (main process only)."""
    metrics = {"step": step, **metrics}
    accelerator.log(metrics, step=step)
    run = wandb_run(accelerator)
    if run is not None and "val/mlm_loss" in metrics:
        # W&B's end-of-run printout skips summaries that are dicts ({min, last}): flat copies of the latest values.
        set_summary(run, **{k.replace("/", "_"): v for k, v in metrics.items() if k.startswith("val/")})
    if accelerator.is_main_process:
        with open(Path(run_dir) / METRICS_FILE, "a") as f:
            f.write(json.dumps({**metrics, **(file_only or {})}, sort_keys=True) + "\n")


def rewind_metrics(run_dir: Path, step: int) -> dict[str, float]:
    """On resume from ``step``: drop the lines a killed run logged after its checkpoint (they are logged again),
    and return the latest validation metrics up to ``step``. Main process only."""
    path = Path(run_dir) / METRICS_FILE
    rows = [row for row in read_metrics(run_dir) if row.get("step", 0) <= step]
    if path.is_file():
        write_text(path, "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
    evaluations = [row for row in rows if any(k.startswith("val/") for k in row)]
    return {k: v for k, v in evaluations[-1].items() if k.startswith("val/")} if evaluations else {}


# --------------------------------------------------------------------------------------------------
# Gradient norms
# --------------------------------------------------------------------------------------------------


def layer_grad_norms(model: nn.Module, clip_factor: float = 1.0) -> dict[str, float]:
    """L2 norm of the gradient of each layer's attention weights (Q, K, V, output) and FFN weights (in, out)
    (``grad_norm/layer_NN/attn``, ``.../ffn``), and of a residual scheme's modules: every parameter of the
    layer's two (``.../residual``) and AttnRes's output aggregation (``grad_norm/output_residual``).

    ``model`` is the unwrapped LNBertForPreTraining; ``clip_factor`` undoes gradient clipping (the norms are
    read after clipping, so they are divided by the clip coefficient to report the raw gradient).
    """
    groups: dict[str, list[nn.Parameter]] = {}
    encoder = model.bert.encoder
    for index, layer in enumerate(encoder.layer):
        attention = (layer.attention.self.query, layer.attention.self.key, layer.attention.self.value,
                     layer.attention.output.dense)  # fmt: skip
        groups[f"grad_norm/layer_{index:02d}/attn"] = [linear.weight for linear in attention]
        groups[f"grad_norm/layer_{index:02d}/ffn"] = [layer.intermediate.dense.weight, layer.output.dense.weight]
        groups[f"grad_norm/layer_{index:02d}/residual"] = _residual_parameters(layer)
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
    return [p for child in module.children() if isinstance(child, RESIDUAL_MODULES) for p in child.parameters()]


def clip_coefficient(total_norm: float, max_norm: float) -> float:
    """The factor torch.nn.utils.clip_grad_norm_ multiplied the gradients by (1 when not clipped)."""
    if max_norm <= 0:
        return 1.0
    return min(1.0, max_norm / (total_norm + 1e-6))


# --------------------------------------------------------------------------------------------------
# A residual scheme's measurements (pretrain.residual_streams.ResidualStats)
# --------------------------------------------------------------------------------------------------

RESIDUAL_PREFIX = "residual/"
SIGNIFICANT_DIGITS = 4  # of the matrices' entries in metrics.jsonl: a fifth digit is below a step's noise


def residual_scalars(stats: ResidualStats) -> dict[str, float]:
    """The measurements a tracker draws, as scalars: ``residual/output_norm/KK`` (every sub-layer's output norm,
    mean over real tokens) and, for HC and mHC, ``residual/composite_gain/row`` and ``.../col`` (the max absolute
    row and column sums of the product of H_res over the whole depth)."""
    return {RESIDUAL_PREFIX + key: value for key, value in stats.scalars().items()}


def residual_matrices(stats: ResidualStats) -> dict[str, list]:
    """The small matrices, each as one nested list for RUN/metrics.jsonl (not for the trackers: 24 sub-layers of
    4 x 4 would be hundreds of charts), rounded to ``SIGNIFICANT_DIGITS``: ``residual/h_pre``, ``.../h_post``
    (N x n), ``.../h_res`` (N x n x n) and ``.../composite_gain/per_sublayer`` (N x 2: the gain of the product up to each
    sub-layer) for HC and mHC; ``residual/depth_weights`` ((N + 1) x K) for AttnRes (``ResidualStats``)."""
    found = {
        "h_pre": stats.pre,
        "h_post": stats.post,
        "h_res": stats.res,
        "composite_gain/per_sublayer": stats.composite_gain,
        "depth_weights": stats.depth_weights,
    }
    return {RESIDUAL_PREFIX + name: _rounded(value.tolist()) for name, value in found.items() if value is not None}


def _rounded(values: Any) -> Any:
    if isinstance(values, list):
        return [_rounded(v) for v in values]
    return float(f"{values:.{SIGNIFICANT_DIGITS}g}")


# --------------------------------------------------------------------------------------------------
# Throughput and model FLOPs utilisation
# --------------------------------------------------------------------------------------------------


def model_flops_utilisation(tokens_per_s: float, flops_per_tok: float, peak_per_device: float, devices: int) -> float:
    """Achieved model FLOP/s over the peak of all devices; 0 when the peak is not configured."""
    if peak_per_device <= 0:
        return 0.0
    return tokens_per_s * flops_per_tok / (peak_per_device * devices)
