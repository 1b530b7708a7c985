"""Every W&B run the project starts, and their conventions: pretraining's (through Accelerate's tracker), one per
fine-tuning job, and the Figure 5 report's. What each run carries: docs/tracking.md.

- **Groups pool, tags and config compare.** W&B draws a group as one mean line, so a group holds only runs that may
  be averaged: one recipe and placement, different seeds. The comparison (``tracking.comparison``) is a tag and a
  config key; the placement is the config key ``norm_placement`` in every run type (pretrain, finetune, report).
- **One W&B run per pretraining run,** however often it is preempted: its id is kept in ``RUN/wandb_run.json``; a
  job's and the report's ids are derived from what they hold, so a retry or a re-run continues its run.
- **Outcomes in the summary:** ``status``, ``diverged_at_step``, the best and last ``val/mlm_loss``; one name per
  metric (W&B's end-of-run printout leaves out those two, a dict; the run's own last lines give the loss).
- **Lineage:** snapshots are model artifacts by reference (``file://``, nothing uploaded), aliased ``step-N``.

``wandb`` is imported inside the functions: a run without W&B tracking never loads it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import sys
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pretrain.common.atomic import write_json
from pretrain.common.roles import by_section, keys_where
from pretrain.config import PretrainConfig
from pretrain.run_folder.layout import (
    SNAPSHOT_INFO,
    WANDB_DIR,
    WANDB_RUN_FILE,
    folder_step,
    read_json_file,
    read_metrics,
    read_run_config,
    read_wandb_identity,
    run_folder_of,
)
from pretrain.variants import variant_of

if TYPE_CHECKING:
    from accelerate import Accelerator

    from finetune.manifest import JobSpec, Results

SUMMARY_LINES = 40
"""Summary values W&B prints when a run ends: its default (10, in key order) hides val/* behind the train/* keys."""
CURVES_ONLY = ("attention/", "branch/", "gpas/", "grad_norm/", "hidden/", "ngpt/", "norm/", "preact/", "residual/",
               "rezero/", "seednorm/", "value_residual/")  # fmt: skip
"""The families of per-layer metrics (tracking/design_stats.py, tracking/metrics.py, nGPT's): charts, kept out of a
run's summary, where a deep model's hundreds of last values would push the losses out of what W&B prints."""
# Fields that do not change what a run learns (pretrain/common/roles.py: seed, paths, cadence, how the batch is split
# over devices, ...), by section; everything else in the resolved config is the recipe.
_NOT_RECIPE = by_section(keys_where(PretrainConfig, lambda rules: not rules.recipe))
RUN_CONFIG_FIX = "fine-tune and report it with the checkout that wrote the run"
"""What a reader of another format version's RUN/run_config.json can do (pretrain/common/formats.py)."""


class WandbCredentialsError(ValueError):
    """W&B would log online but has no credentials (a bad-input error: exit code 2, nothing started)."""


def wandb_mode(configured: str = "online") -> str:
    """The mode W&B will use: the WANDB_MODE environment variable wins over the configured one."""
    return os.environ.get("WANDB_MODE", configured)


def check_credentials(mode: str, run_dir: str | Path = "RUN", fix: str | None = None) -> None:
    """Fail before any work when W&B would log online without credentials (it would stop the run later, or
    prompt for a key on a cluster node). Reads WANDB_API_KEY, ~/.netrc and W&B's settings; no network."""
    if mode in ("offline", "disabled", "dryrun"):
        return
    import wandb

    if wandb.setup().settings.mode in ("offline", "disabled", "dryrun"):  # `wandb offline` in this directory
        return
    if not wandb.login(verify=False, prompt=False):
        fix = fix or (
            f"or log offline: WANDB_MODE=offline now, `wandb sync {Path(run_dir) / WANDB_DIR}/offline-run-*` later; "
            "or turn W&B off (--tracking.backend=none for pretraining, no --wandb for fine-tuning and the report)"
        )
        login = "Log in once with `wandb login` (or set WANDB_API_KEY)"
        raise WandbCredentialsError(f"no W&B credentials found. {login}; {fix}.")


def short_hash(payload: Any, length: int = 8) -> str:
    """A stable short hash of a JSON-able value (dict keys sorted)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:length]


# Pretraining: one run per run folder, started by Accelerate's tracker


def recipe(resolved: dict[str, Any], global_batch_size: int) -> dict[str, Any]:
    """The part of a resolved pretraining config that changes what is learned (model, data, optimizer, steps, global
    batch): runs that differ only in seeds, paths, cadence or batch split share a recipe and a W&B group."""
    out = {
        section: {k: v for k, v in resolved[section].items() if k not in _NOT_RECIPE.get(section, set())}
        for section in ("model", "data", "optim", "train")
    }
    out["train"]["global_batch_size"] = global_batch_size
    return out


def pretrain_group(tracking: dict[str, Any], placement: str, recipe_hash: str) -> str:
    """``tracking.group`` when set, else ``{comparison}-{placement}-{recipe hash}``: a group pools only seeds."""
    return str(tracking.get("group") or f"{tracking.get('comparison') or 'lnbert'}-{placement}-{recipe_hash}")


def read_run_file(run_dir: str | Path) -> dict[str, Any]:
    """RUN/wandb_run.json ({} when the run never logged to W&B)."""
    try:
        return read_wandb_identity(Path(run_dir) / WANDB_RUN_FILE)
    except ValueError as err:
        raise ValueError(f"{err}: restore it from a copy, or remove it to log the run to a new W&B run") from None


def run_identity(run_dir: Path, resume_from: Path | None, group: str, project: str) -> dict[str, Any]:
    """The W&B run this pretraining run logs to, written to RUN/wandb_run.json before the run starts: a new id for a
    new run; resumed from its own checkpoint, the id in RUN/wandb_run.json (one W&B run, one curve); continued from
    another run's checkpoint (the 512-token phase), that run's id and group, so the phase extends its curve, unless
    that run logged steps after the checkpoint (W&B keeps the first value of a step: the phase's would be dropped)."""
    identity, fresh = {}, {"group": group, "project": project}
    if resume_from is not None:
        source = run_folder_of(resume_from)
        if source == Path(run_dir).resolve():
            identity = read_run_file(run_dir)
        else:
            identity = {**continued_identity(source, folder_step(resume_from)), "continued_from": str(source)}
            fresh["continued_from"] = str(source)
    elif earlier := _readable_run_file(run_dir).get("id"):
        print(f"warning: W&B run {earlier} holds the steps this run logged before it stopped, before its first "
              f"checkpoint; it starts again from step 0 as a new W&B run (delete {earlier} in W&B: its steps are "
              "logged again)", file=sys.stderr, flush=True)  # fmt: skip
    if not identity.get("id"):
        # W&B run ids are [a-z0-9]; 12 random hex digits never collide within a project in practice.
        identity = {"id": secrets.token_hex(6), **fresh}
    write_json(Path(run_dir) / WANDB_RUN_FILE, identity)
    return identity


def continued_identity(source: Path, step: int) -> dict[str, Any]:
    """The W&B run of ``source`` that a run continued from its checkpoint at ``step`` extends; {} (a new W&B run)
    when ``source`` never logged to W&B or logged steps after ``step``."""
    identity = read_run_file(source)
    logged = max((row.get("step", -1) for row in read_metrics(source)), default=-1)
    if identity.get("id") and logged > step:
        print(f"warning: {source} logged steps up to {logged} to W&B run {identity['id']}, after the checkpoint's "
              f"step {step}; W&B keeps one value per step, so this run logs to a new W&B run (its config's "
              "continued_from names the source)", file=sys.stderr, flush=True)  # fmt: skip
        return {}
    return identity


def _readable_run_file(run_dir: Path) -> dict[str, Any]:
    with contextlib.suppress(ValueError):  # damaged: a new run replaces it whatever it held
        return read_run_file(run_dir)
    return {}


def start_pretraining_run(accelerator: Accelerator, cfg: PretrainConfig, resolved: dict[str, Any],
                          derived: dict[str, Any], resume_from: Path | None) -> dict[str, Any]:  # fmt: skip
    """Accelerate's W&B tracker with the resolved config plus the placement, the comparison and the derived values
    at the top level, a group that pools only seeds, and the run id kept in RUN/. Returns that identity (what
    RUN/wandb_run.json holds; {} on the other processes)."""
    tracking = cfg.tracking
    recipe_hash = short_hash(recipe(resolved, derived["global_batch_size"]))
    group = pretrain_group({"group": tracking.group, "comparison": tracking.comparison}, cfg.model.variant,
                           recipe_hash)  # fmt: skip
    identity = {}
    if accelerator.is_main_process:  # Accelerate starts W&B on the main process only
        identity = run_identity(Path(cfg.train.output_dir), resume_from, group, tracking.project)
    config = {**resolved, **derived, "norm_placement": cfg.model.norm_placement, "norm_type": cfg.model.norm_type,
              "variant": cfg.model.variant, "comparison": tracking.comparison, "recipe_hash": recipe_hash}
    if identity.get("continued_from"):
        config["continued_from"] = identity["continued_from"]  # the run folder whose checkpoint this run continued
    wandb_kwargs: dict[str, Any] = {
        "name": tracking.run_name or cfg.train.run_name, "id": identity.get("id"), "resume": "allow",
        "group": identity.get("group", group), "job_type": "pretrain", "mode": wandb_mode(tracking.wandb_mode),
        "tags": sorted({cfg.model.norm_placement, cfg.model.variant, *tracking.tags} | ({tracking.comparison} - {""})),
        "dir": str(Path(cfg.train.output_dir)),  # offline runs land in RUN/wandb/ for `wandb sync`
        "settings": {"max_end_of_run_summary_metrics": SUMMARY_LINES},
    }  # fmt: skip
    accelerator.init_trackers(tracking.project, config, {"wandb": wandb_kwargs})
    if (run := wandb_run(accelerator)) is not None:  # the runs table shows the best and the last validation loss
        run.define_metric("val/mlm_loss", summary="min,last")
        run.define_metric("val/mlm_accuracy", summary="max,last")
        for family in CURVES_ONLY:
            run.define_metric(f"{family}*", summary="none")
        # The summary's step is the outcome's (record_outcome), not the last metrics line's: a diverged run logs a
        # line at the step that diverged, after status.json recorded the last good one. Live progress is `_step`.
        run.define_metric("step", summary="none")
    return identity


def wandb_run(accelerator: Accelerator) -> Any:
    """The W&B run Accelerate started on this process, or None (another tracker, or not the main process)."""
    if not accelerator.is_main_process:
        return None
    return next((tracker.tracker for tracker in accelerator.trackers if tracker.name == "wandb"), None)


def record_outcome(accelerator: Accelerator, status: str, step: int, diverged_at: int | None = None) -> None:
    """Put the run's status.json outcome into the W&B summary (the runs table's outcome columns)."""
    if (run := wandb_run(accelerator)) is not None:
        run.summary.update({"status": status, "step": step, "diverged_at_step": diverged_at})


def snapshot_artifact_name(wandb_run_id: str) -> str:
    """One artifact per pretraining run; each snapshot is a version, aliased step-N."""
    return f"snapshot-{wandb_run_id}"


def snapshot_alias(step: int) -> str:
    return f"step-{step}"


def snapshot_artifact(snapshot_dir: str | Path, wandb_run_id: str) -> Any:
    """A W&B model artifact referencing the snapshot's files (``file://``, checksummed, not uploaded)."""
    import wandb

    path = Path(snapshot_dir).resolve()
    info = read_json_file(path / SNAPSHOT_INFO)
    artifact = wandb.Artifact(
        snapshot_artifact_name(wandb_run_id),
        type="model",
        description=f"weights-only snapshot of {info.get('run_name')} at step {info['step']}",
        metadata={k: info.get(k) for k in ("step", "tokens_seen", "run_name", "norm_placement", "metrics")},
    )
    artifact.add_reference(path.as_uri(), checksum=True)
    return artifact


def log_snapshot(accelerator: Accelerator, snapshot_dir: Path | None, step: int) -> None:
    """Log a written snapshot as a version of the run's model artifact (by reference), aliased step-N."""
    run = wandb_run(accelerator)
    if run is not None and snapshot_dir is not None:
        run.log_artifact(snapshot_artifact(snapshot_dir, run.id), aliases=[snapshot_alias(step)])


# Fine-tuning: one run per job (snapshot x task x lr x seed), grouped so that W&B's mean line is a mean over seeds


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
    config = read_json_file(Path(model_path) / "config.json")
    return variant_of(config) if config.get("model_type") == "lnbert" else "post"


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
                                 "wall_time_s": results.wall_time_s, "device": results.device,
                                 "status": "done"})  # fmt: skip


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


# The Figure 5 report (finetune/report.py --wandb): one run that re-running updates

POINT_COLUMNS = ["task", "run", "norm_placement", "variant", "step", "lr", "seeds", "planned_seeds", "incomplete",
                 "accuracy", "accuracy_ci", "accuracy_low", "accuracy_high", "f1", "f1_ci", "dev_loss", "dev_loss_ci",
                 "one_class_seeds", "one_class", "diverged_seeds"]  # fmt: skip


def log_report(runs: Sequence[Any], config: Any, figure5: dict[str, Any], seed_columns: list[str]) -> str:
    """One W&B run (job_type report) with a deterministic id, so re-running the report updates it: the Figure 5
    series against ``pretrain_step`` (one log call per step), the steps-to-loss table, the best-lr points, the raw
    per-seed rows (``seed_columns`` of them, a wandb.Table) and the figures. ``runs`` are the report's ``RunInfo``s,
    ``config`` its ``ReportConfig``, ``figure5`` what ``finetune.report.report`` returns. Returns the run's local
    folder."""
    import wandb

    wb = _start_report_run(runs, config, figure5)
    wb.define_metric("pretrain_step")
    wb.define_metric("figure5/*", step_metric="pretrain_step")
    by_step: dict[int, dict[str, float]] = defaultdict(dict)
    for run in runs:
        for step, loss in figure5["curves"][run.label]:
            by_step[step][f"figure5/val_mlm_loss/{run.label}"] = loss
    for p in figure5["points"]:
        for panel, key in (("accuracy", "accuracy"), ("best_lr", "lr"), ("dev_loss", "dev_loss")):
            by_step[p["step"]][f"figure5/{p['task']}_{panel}/{p['run']}"] = p[key]
    for step in sorted(by_step):
        wb.log({"pretrain_step": step, **by_step[step]})
    model = {run.label: {"norm_placement": run.placement, "variant": run.variant} for run in runs}
    steps_columns = ["run", "norm_placement", "variant", "steps", "ratio", "approximate"]
    wb.log({
        "tables/steps_to_loss": _table([{**row, **model[row["run"]]} for row in figure5["steps"]], steps_columns),
        "tables/best_lr_points": _table([{**p, **model[p["run"]]} for p in figure5["points"]], POINT_COLUMNS),
        "tables/seed_rows": _table(figure5["rows"], seed_columns),  # the report's runs, tasks and recipe only
        **{f"figures/{image.stem}": wandb.Image(str(image)) for image in figure5["images"]},
    })  # fmt: skip
    wb.summary.update(
        {"target_loss": figure5["target_loss"], "warnings": " ".join(figure5["warnings"])}
        | {f"steps_to_loss/{row['run']}": row["steps"] for row in figure5["steps"]}
        | {f"baseline/{task}/{k}": value for task, base in figure5["baselines"].items() for k, value in base.items()}
    )
    directory = wb.dir
    wb.finish()
    return directory


def _start_report_run(runs: Sequence[Any], config: Any, figure5: dict[str, Any]) -> Any:
    import wandb

    pretraining = [pretraining_run(str(run.path)) for run in runs]
    comparison = next((p["comparison"] for p in pretraining if p["comparison"]), "")
    project = config.wandb_project or next((p["project"] for p in pretraining if p["project"]), None) or "lnbert"
    recipes = sorted({r["recipe_hash"] for r in figure5["rows"]})
    recipe_hash = config.recipe_hash or (recipes[0] if len(recipes) == 1 else None)
    placements, variants = [run.placement for run in runs], [run.variant for run in runs]
    run_config = {"norm_placement": placements, "variant": variants, "comparison": comparison,
                  "runs": [run.name for run in runs], "pretrain_run_ids": [p["id"] for p in pretraining],
                  "tasks": list(config.tasks), "target_loss": figure5["target_loss"], "recipe_hash": recipe_hash}  # fmt: skip
    # Deterministic: the same runs (in any order), recipe and tasks always update the same W&B report run.
    identity = sorted(p["id"] or run.run_id for p, run in zip(pretraining, runs, strict=True))
    run_id = short_hash({"runs": identity, "recipe": recipe_hash, "tasks": sorted(config.tasks)}, 16)
    return wandb.init(
        project=project, id=f"report-{run_id}", resume="allow",
        name=f"figure5-{comparison or 'report'}", group=f"{comparison or 'figure5'}-report", job_type="report",
        tags=sorted({*placements, *variants, *([comparison] if comparison else [])}), config=run_config,
        dir=config.out, mode=wandb_mode(), reinit="finish_previous",
    )


def _table(rows: list[dict[str, Any]], columns: list[str]) -> Any:
    import wandb

    return wandb.Table(columns=columns, data=[[row.get(c) for c in columns] for row in rows])
