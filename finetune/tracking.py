"""W&B runs of fine-tuning: one run per job (snapshot x task x lr x seed) when tracking is on, grouped so that
W&B's mean line is a mean over seeds, and the report's run (``finetune.report --wandb``). Each run's id is derived
from what it holds (a retried job, a report run again, continues its run); what each run carries: docs/tracking.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

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


# --- The report's run (finetune/report.py --wandb) ------------------------------------------------


class ReportedRun(Protocol):
    """A pretraining run as the report sees it (finetune.report.RunInfo)."""

    path: Path
    run_id: str
    name: str
    placement: str
    variant: str
    label: str


@dataclass(frozen=True, kw_only=True)
class ReportSettings:
    """Where the report's run goes and what it selected (from finetune.report.ReportConfig)."""

    project: str | None
    """W&B project; None: the pretraining runs' tracking.project (else lnbert)."""
    recipe_hash: str | None
    """The fine-tuning recipe the report was restricted to; None: the results' only one, if there is one."""
    tasks: list[str]
    target_loss: float | None
    out: str
    """The report's folder; W&B writes its run folder under it."""


@dataclass(frozen=True, kw_only=True)
class Figure5:
    """What the report computed (finetune.report.report): the W&B run logs the same."""

    curves: dict[str, list[tuple[int, float]]]
    """Validation loss (step, loss) by run label."""
    steps: list[dict[str, Any]]
    """The steps-to-loss table: run, steps, ratio, approximate (interpolated across a wide gap), bracket."""
    points: list[dict[str, Any]]
    """The best-lr points of panels (b)-(d) (POINT_COLUMNS)."""
    rows: list[dict[str, Any]]
    """The result rows the points were drawn from: the done jobs of the runs, tasks and recipe (one per seed)."""
    images: list[Path]
    """The PNGs drawn."""
    baselines: dict[str, dict[str, Any]]
    """Majority-class, label-prior and chance baselines by task, with the dev examples they are of."""
    warnings: list[str]
    """What the inputs cannot show (jobs not done, no results, no verdict), for the reader."""


POINT_COLUMNS = ["task", "run", "norm_placement", "variant", "step", "lr", "seeds", "planned_seeds", "incomplete",
                 "accuracy", "accuracy_ci", "accuracy_low", "accuracy_high", "f1", "f1_ci", "dev_loss", "dev_loss_ci",
                 "one_class_seeds", "one_class"]  # fmt: skip
# The per-seed table: a job's name and placement, its key fields (the recipe by its hash) and its results.
_KEYED = [f.name for f in dataclasses.fields(JobSpec) if f.metadata["role"] == "key" and f.name != "recipe"]
SEED_COLUMNS = ["run_name", "placement", *_KEYED, "recipe_hash", *(f.name for f in dataclasses.fields(Results))]


def of_runs(row: dict[str, Any], runs: Sequence[ReportedRun]) -> bool:
    """A result row belongs to one of the runs (by run id: not by name, and wherever the folder is mounted)."""
    return any(row["run_id"] == run.run_id for run in runs)


def log_report(runs: Sequence[ReportedRun], settings: ReportSettings, figure5: Figure5) -> str:
    """One W&B run (job_type report) with a deterministic id, so re-running the report updates it: the Figure 5
    series against ``pretrain_step`` (one log call per step), the steps-to-loss table, the best-lr points, the raw
    per-seed rows (wandb.Table) and the figures. Returns the run's local folder."""
    import wandb

    wb = _start_report_run(runs, settings, figure5.rows)
    wb.define_metric("pretrain_step")
    wb.define_metric("figure5/*", step_metric="pretrain_step")
    by_step: dict[int, dict[str, float]] = defaultdict(dict)
    for run in runs:
        for step, loss in figure5.curves[run.label]:
            by_step[step][f"figure5/val_mlm_loss/{run.label}"] = loss
    for p in figure5.points:
        for panel, key in (("accuracy", "accuracy"), ("best_lr", "lr"), ("dev_loss", "dev_loss")):
            by_step[p["step"]][f"figure5/{p['task']}_{panel}/{p['run']}"] = p[key]
    for step in sorted(by_step):
        wb.log({"pretrain_step": step, **by_step[step]})
    model = {run.label: {"norm_placement": run.placement, "variant": run.variant} for run in runs}
    seed_rows = [r for r in figure5.rows if r["task"] in settings.tasks and of_runs(r, runs)]
    steps_columns = ["run", "norm_placement", "variant", "steps", "ratio", "approximate"]
    wb.log({
        "tables/steps_to_loss": _table([{**row, **model[row["run"]]} for row in figure5.steps], steps_columns),
        "tables/best_lr_points": _table([{**p, **model[p["run"]]} for p in figure5.points], POINT_COLUMNS),
        "tables/seed_rows": _table(seed_rows, SEED_COLUMNS),
        **{f"figures/{image.stem}": wandb.Image(str(image)) for image in figure5.images},
    })  # fmt: skip
    wb.summary.update(
        {"target_loss": settings.target_loss, "warnings": " ".join(figure5.warnings)}
        | {f"steps_to_loss/{row['run']}": row["steps"] for row in figure5.steps}
        | {f"baseline/{task}/{name}": value for task, base in figure5.baselines.items() for name, value in base.items()}
    )
    directory = wb.dir
    wb.finish()
    return directory


def _start_report_run(runs: Sequence[ReportedRun], settings: ReportSettings, rows: list[dict[str, Any]]) -> Any:
    import wandb

    pretraining = [pretraining_run(str(run.path)) for run in runs]
    comparison = next((p["comparison"] for p in pretraining if p["comparison"]), "")
    project = settings.project or next((p["project"] for p in pretraining if p["project"]), None) or "lnbert"
    recipes = sorted({r["recipe_hash"] for r in rows})
    recipe = settings.recipe_hash or (recipes[0] if len(recipes) == 1 else None)
    placements, variants = [run.placement for run in runs], [run.variant for run in runs]
    config = {"norm_placement": placements, "variant": variants, "comparison": comparison,
              "runs": [run.name for run in runs], "pretrain_run_ids": [p["id"] for p in pretraining],
              "tasks": list(settings.tasks), "target_loss": settings.target_loss, "recipe_hash": recipe}  # fmt: skip
    # Deterministic: the same runs, recipe and tasks always update the same W&B report run.
    identity = [p["id"] or run.run_id for p, run in zip(pretraining, runs, strict=True)]
    run_id = short_hash({"runs": identity, "recipe": recipe, "tasks": sorted(settings.tasks)}, 16)
    return wandb.init(
        project=project, id=f"report-{run_id}", resume="allow",
        name=f"figure5-{comparison or 'report'}", group=f"{comparison or 'figure5'}-report", job_type="report",
        tags=sorted({*placements, *variants, *([comparison] if comparison else [])}), config=config,
        dir=settings.out, mode=wandb_mode(), reinit="finish_previous",
    )


def _table(rows: list[dict[str, Any]], columns: list[str]) -> Any:
    import wandb

    return wandb.Table(columns=columns, data=[[row.get(c) for c in columns] for row in rows])
