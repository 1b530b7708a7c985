"""W&B runs of fine-tuning: one run per job (snapshot x task x lr x seed), when tracking is on.

Each job's run carries what a W&B scatter or line plot needs to draw Figure 5 with the seed spread natively:
config ``pretrain_step``, ``norm_placement``, ``norm_type``, ``task``, ``lr``, ``seed``, ``recipe_hash`` and the pretraining
run's W&B id; summary ``accuracy``/``f1``/``dev_loss`` (and the same under ``{task}/``, so one panel per task
needs no filter); history ``train/loss`` and ``train/lr`` against ``train_step``. Its group holds the jobs
that pool (one pretraining group, step, task, lr and recipe: the seeds), so W&B's mean line is a mean over
seeds. The run id is derived from the job's identity: a retried job continues the same W&B run.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.manifest import JobSpec, recipe_hash
from pretrain.run_folder.layout import RUN_CONFIG_FILE
from pretrain.tracking.wandb_logging import (
    check_credentials,
    read_run_file,
    short_hash,
    snapshot_alias,
    snapshot_artifact,
    snapshot_artifact_name,
    wandb_mode,
)


@dataclass(frozen=True, kw_only=True)
class WandbSettings:
    """Where a worker's job runs go (passed to workers with their settings)."""

    project: str | None = None
    """W&B project; None: the pretraining run's tracking.project (else lnbert)."""
    dir: str = "outputs/finetune"
    """Folder under which W&B writes its run folders (wandb/offline-run-* when offline)."""


def check_wandb(settings: WandbSettings | None) -> None:
    """Before any job: W&B must have credentials unless WANDB_MODE=offline (exit 2 with the fix otherwise)."""
    if settings is not None:
        check_credentials(wandb_mode(), Path(settings.dir))


def pretraining_run(run_dir: str) -> dict[str, Any]:
    """W&B id, group, project and comparison of the pretraining run a job's snapshot comes from ({} for a Hub
    model or a run that never logged to W&B)."""
    path = Path(run_dir)
    identity = read_run_file(path) if path.is_dir() else {}
    config_path = path / RUN_CONFIG_FILE
    tracking = json.loads(config_path.read_text()).get("tracking", {}) if config_path.is_file() else {}
    return {
        "id": identity.get("id"),
        "group": identity.get("group"),
        "project": identity.get("project") or tracking.get("project"),
        "comparison": tracking.get("comparison") or "",
    }


def job_run_id(spec: JobSpec) -> str:
    """Deterministic: the same job (its key: run id, snapshot content, task, lr, seed, recipe) always logs to the
    same run; two runs of one name with equal weights do not share one."""
    return f"ft-{short_hash(spec.key, 16)}"


def job_group(spec: JobSpec, pretrain_group: str | None) -> str:
    """The jobs that differ only in seed (W&B aggregates a group into one mean line)."""
    base = pretrain_group or spec.run_name.replace("/", "-")
    return f"{base}-{spec.task}-step{spec.pretrain_step}-lr{spec.lr:g}-{recipe_hash(spec.recipe)[:8]}"


def model_norm_type(model_path: str) -> str:
    """The norm type in a model folder's config.json; Hugging Face BERT (and a Hub id, not read here) is LayerNorm.

    Read for W&B only, not part of the job key (which would change every existing job's identity): the dashboard
    groups fine-tuning runs by placement and norm type, as it groups pretraining runs."""
    config_path = Path(model_path) / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    return str(config.get("norm_type", "layernorm"))


def job_config(spec: JobSpec, pretraining: dict[str, Any]) -> dict[str, Any]:
    config = {
        "norm_placement": spec.placement,
        "norm_type": model_norm_type(spec.model_path),
        "comparison": pretraining["comparison"],
        "pretrain_run_id": pretraining["id"],
        "pretrain_run": spec.run_name,
        "pretrain_step": spec.pretrain_step,
        "tokens_seen": spec.tokens_seen,
        "task": spec.task,
        "lr": spec.lr,
        "seed": spec.seed,
        "recipe_hash": recipe_hash(spec.recipe),
        "recipe": spec.recipe,
        "snapshot_hash": spec.snapshot_hash,
        "model_path": spec.model_path,
    }
    if pretraining["id"] and spec.pretrain_step >= 0:
        # The snapshot's model artifact (logged by the pretraining run): which checkpoint gave this number.
        config["snapshot_artifact"] = (
            f"{snapshot_artifact_name(pretraining['id'])}:{snapshot_alias(spec.pretrain_step)}"
        )
    return config


class JobRun:
    """The W&B run of one job: the training-loss curve while it trains, the dev metrics when it ends."""

    def __init__(self, run: Any, task: str) -> None:
        self.run, self.task = run, task
        run.define_metric("train_step")
        run.define_metric("train/*", step_metric="train_step")

    def log_step(self, step: int, loss: float, lr: float) -> None:
        self.run.log({"train_step": step, "train/loss": loss, "train/lr": lr})

    def finish(self, results: dict[str, Any]) -> None:
        metrics = {k: results.get(k) for k in ("accuracy", "f1", "dev_loss")}
        self.run.summary.update(
            {
                **metrics,
                **{f"{self.task}/{k}": v for k, v in metrics.items()},
                "train_loss": results.get("train_loss"),
                "train_steps": results.get("train_steps"),
                "wall_time_s": results.get("wall_time_s"),
                "status": "done",
            }
        )


@contextlib.contextmanager
def job_run(spec: JobSpec, settings: WandbSettings | None) -> Iterator[JobRun | None]:
    """A W&B run around one job (None when tracking is off); a job that raises ends its run as failed."""
    if settings is None:
        yield None
        return
    import wandb

    pretraining = pretraining_run(spec.run_dir)
    mode = wandb_mode()
    Path(settings.dir).mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=settings.project or pretraining["project"] or "lnbert",
        id=job_run_id(spec),
        resume="allow",
        name=f"{spec.run_name}-{spec.task}-step{spec.pretrain_step}-lr{spec.lr:g}-seed{spec.seed}",
        group=job_group(spec, pretraining["group"]),
        job_type="finetune",
        tags=sorted({spec.placement, spec.task, *([pretraining["comparison"]] if pretraining["comparison"] else [])}),
        config=job_config(spec, pretraining),
        dir=settings.dir,
        mode=mode,
        reinit="finish_previous",
    )
    if pretraining["id"] and spec.pretrain_step >= 0 and mode == "online":
        # Lineage: the same files give the same digest, so W&B links the version the pretraining run logged.
        # (W&B cannot use artifacts offline; the config key snapshot_artifact names it there.)
        run.use_artifact(snapshot_artifact(spec.model_path, pretraining["id"]))
    try:
        yield JobRun(run, spec.task)
    except BaseException:
        run.summary["status"] = "failed"
        run.finish(exit_code=1)
        raise
    run.finish()
