"""W&B runs of fine-tuning: one run per job (snapshot x task x lr x seed) when tracking is on, grouped so that
W&B's mean line is a mean over seeds (the report's run: finetune/report.py). Each run's id is derived from what it
holds (a retried job continues its run); what each run carries: docs/tracking.md.
"""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.manifest import JobSpec, Results
from pretrain.run_folder.layout import read_run_config
from pretrain.tracking.wandb_logging import (
    check_credentials,
    read_run_file,
    short_hash,
    snapshot_alias,
    snapshot_artifact,
    snapshot_artifact_name,
    wandb_mode,
)
from pretrain.variants import variant_name

RUN_CONFIG_FIX = "fine-tune and report it with the checkout that wrote the run"
"""What a reader of another format version's RUN/run_config.json can do (pretrain/common/formats.py)."""


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
    tracking = read_run_config(path, RUN_CONFIG_FIX).get("tracking", {})
    project = identity.get("project") or tracking.get("project")
    return {"id": identity.get("id"), "group": identity.get("group"), "project": project,
            "comparison": tracking.get("comparison") or ""}  # fmt: skip


def job_run_id(spec: JobSpec) -> str:
    """Deterministic: the same job (its key: run id, snapshot content, task, lr, seed, recipe) always logs to the
    same run; two runs of one name with equal weights do not share one."""
    return f"ft-{short_hash(spec.key, 16)}"


def model_variant(model_path: str) -> str:
    """The model variant (``pretrain.variants.variant_name``: ``pre``, ``pre-hc4``, ...) of a model folder's
    config.json; Hugging Face BERT, and a Hub id, is ``post``. For the dashboard's groups only, not in the job key."""
    config_path = Path(model_path) / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if config.get("model_type") != "lnbert":
        return "post"
    return variant_name(**{key: config[key] for key in inspect.signature(variant_name).parameters if key in config})


JOB_CONFIG_FIELDS = ("pretrain_step", "tokens_seen", "task", "lr", "seed", "recipe_hash", "recipe", "snapshot_hash",
                     "model_path")  # fmt: skip
"""The job's fields that its W&B run's config holds under their own names."""


def job_config(spec: JobSpec, pretraining: dict[str, Any]) -> dict[str, Any]:
    config = {"norm_placement": spec.placement, "variant": model_variant(spec.model_path),
              "comparison": pretraining["comparison"], "pretrain_run_id": pretraining["id"],
              "pretrain_run": spec.run_name, **{name: getattr(spec, name) for name in JOB_CONFIG_FIELDS}}  # fmt: skip
    if pretraining["id"] and spec.pretrain_step >= 0:
        # The snapshot's model artifact (logged by the pretraining run): which checkpoint gave this number.
        artifact = snapshot_artifact_name(pretraining["id"])
        config["snapshot_artifact"] = f"{artifact}:{snapshot_alias(spec.pretrain_step)}"
    return config


class JobRun:
    """The W&B run of one job: the training-loss curve while it trains, the dev metrics when it ends."""

    def __init__(self, run: Any, task: str) -> None:
        self.run, self.task = run, task
        run.define_metric("train_step")
        run.define_metric("train/*", step_metric="train_step")

    def log_step(self, step: int, loss: float, lr: float) -> None:
        self.run.log({"train_step": step, "train/loss": loss, "train/lr": lr})

    def finish(self, results: Results) -> None:
        metrics = {"accuracy": results.accuracy, "f1": results.f1, "dev_loss": results.dev_loss}
        self.run.summary.update({**metrics, **{f"{self.task}/{k}": v for k, v in metrics.items()},
                                 "train_loss": results.train_loss, "train_steps": results.train_steps,
                                 "wall_time_s": results.wall_time_s, "status": "done"})  # fmt: skip


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
    comparison = [pretraining["comparison"]] if pretraining["comparison"] else []
    # The jobs that differ only in seed share a group: W&B draws a group as one mean line.
    base = pretraining["group"] or spec.run_name.replace("/", "-")
    group = f"{base}-{spec.task}-step{spec.pretrain_step}-lr{spec.lr:g}-{spec.recipe_hash[:8]}"
    run = wandb.init(
        project=settings.project or pretraining["project"] or "lnbert", id=job_run_id(spec), resume="allow",
        name=f"{spec.run_name}-{spec.task}-step{spec.pretrain_step}-lr{spec.lr:g}-seed{spec.seed}",
        group=group, job_type="finetune", config=job_config(spec, pretraining),
        tags=sorted({spec.placement, spec.task, *comparison}), dir=settings.dir, mode=mode, reinit="finish_previous",
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
