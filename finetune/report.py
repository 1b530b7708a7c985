"""Figure 5 of Xiong et al. 2020 from pretraining logs and the fine-tuning results folder.

    python -m finetune.report --runs='[runs/post_ln, runs/pre_ln]' --results_dir=outputs/finetune/results.d
        --out=outputs/figure5 [--target_loss=1.69] [--data_dir=path/to/glue] [--wandb]   (one command, two lines)
    python -m finetune.report --runs='[runs/post_ln, runs/pre_ln]' --tasks='[]'   # panel (a) alone, no results

Panels: (a) validation MLM loss against pretraining step, one line per run; (b) MRPC and (c) RTE dev accuracy of
the best lr per (run, step), mean and 95% t-interval over seeds, beside the dev set's majority-class and chance
accuracies; (d) the same points' dev loss beside the loss of predicting the label prior. ``summary.md`` holds the
steps each run needs to reach a validation loss, the recipe keys in which the runs differ, the baselines and the
per-step results. It says what its inputs cannot show (docs/finetuning.md): jobs not done yet (no verdict is drawn
from them), no fine-tuning results (panel (a) alone, a warning, exit code 0), runs whose recipes differ, figures
interpolated over a wide gap and baselines of a truncated dev set. A results folder that does not exist is an error
(exit code 2). ``--wandb`` logs the same to one W&B report run that re-running updates (WANDB_MODE=offline works).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune.config import ResultsOption, check_tasks
from finetune.manifest import DONE, JobSpec, Results, ResultsFolder
from finetune.report_figures import plot_dev_loss, plot_loss, plot_task
from finetune.report_numbers import (
    best_lr_points,
    default_target,
    recipe_differences,
    report_jobs,
    run_infos,
    steps_table,
    task_baselines,
    val_loss_curve,
)
from finetune.report_summary import (
    no_results_warning,
    progress_warning,
    refused_warning,
    runs_without_results_warning,
    summary_markdown,
    warnings_for,
)
from pretrain.common import atomic
from pretrain.common.cli import parse, require, run_cli
from pretrain.tracking.wandb_logging import check_credentials, log_report, wandb_mode

# The W&B run's per-seed table: a job's name and placement, its key fields (the recipe by its hash) and its results.
_KEYED = [f.name for f in dataclasses.fields(JobSpec) if f.metadata["role"] == "key" and f.name != "recipe"]
SEED_COLUMNS = ["run_name", "placement", *_KEYED, "recipe_hash", *(f.name for f in dataclasses.fields(Results))]


@dataclass(kw_only=True)
class ReportConfig(ResultsOption):
    """Draw Figure 5 (validation loss and MRPC/RTE dev accuracy against pretraining step) and a summary."""

    runs: list[str]
    """Pretraining run folders to compare (RUN/ of docs/run_layout.md), e.g. a Post-LN and a Pre-LN run."""
    out: str = "outputs/figure5"
    """Folder for the PNG figures and summary.md."""
    tasks: list[str] = field(default_factory=lambda: ["mrpc", "rte"])
    """GLUE tasks to draw, one panel each; [] draws panel (a) alone and reads no results folder."""
    target_loss: float | None = None
    """Validation loss for the steps-to-loss table; unset: the smallest loss every run reaches."""
    recipe_hash: str | None = None
    """Use only results of this fine-tuning recipe (needed when the results folder holds several)."""
    data_dir: str | None = None
    """GLUE folder in the original layout (MRPC/dev.tsv, RTE/dev.tsv): baselines of jobs scored on the first N dev
    examples (recipe.max_eval_examples) are then also given over the full dev sets (it never downloads GLUE)."""
    wandb: bool = False
    """Also log to W&B one report run (job_type report) with a deterministic id, so re-running updates it
    (WANDB_MODE=offline logs into OUT/wandb)."""
    wandb_project: str | None = None
    """W&B project; unset: the pretraining runs' tracking.project (else lnbert)."""
    one_class_share: float = 0.95
    """A job predicts one class when at least this share of its dev predictions falls in one class; a point is
    flagged when all its seeds do (its accuracy is then the label balance of the dev set, not what was learned)."""

    def __post_init__(self) -> None:
        require(bool(self.runs), "runs", "is empty; pass the pretraining run folders with --runs='[RUN1, RUN2]'")
        check_tasks("tasks", self.tasks)
        require(self.target_loss is None or self.target_loss > 0, "target_loss", f"must be > 0; got {self.target_loss}")
        require(0.5 < self.one_class_share <= 1, "one_class_share",
                f"must be in (0.5, 1] (a share of dev predictions); got {self.one_class_share}")  # fmt: skip


def check_results_dir(root: Path) -> None:
    """A missing results folder names the ones beside it (configs/finetune/smoke.yaml writes smoke.d, not results.d)."""
    if root.is_dir():
        return
    hint = "; run finetune.schedule first or pass --results_dir"
    if others := sorted(p for p in root.parent.glob("*") if (p / DONE).is_dir()):
        hint = f"; {root.parent} holds {', '.join(p.name for p in others)}: pass --results_dir={others[0]}"
        hint += " (or another of them)" if len(others) > 1 else ""
    raise FileNotFoundError(f"results folder {root} not found{hint}; --tasks='[]' draws panel (a) alone")


def report(config: ReportConfig) -> dict[str, Any]:
    """Write the figures and summary.md to ``config.out`` (and with --wandb the W&B run); returns what they show:
    ``curves`` (validation loss (step, loss) by run label), ``steps`` (the steps-to-loss table), ``jobs`` and
    ``rows`` (every job of the runs, tasks and recipe; the done ones, one per seed), ``points`` (the best-lr points
    of panels (b)-(d)), ``baselines`` by task, ``warnings``, ``images``, ``summary``."""
    if config.wandb:
        check_credentials(wandb_mode(), Path(config.out))
    runs = run_infos(config.runs)
    curves = {run.label: val_loss_curve(run.path) for run in runs}
    target = config.target_loss if config.target_loss is not None else default_target(curves)
    table = steps_table(runs, curves, target) if target is not None else []
    root = Path(config.results_dir).resolve()
    jobs, warnings = [], []
    if config.tasks:  # --tasks=[]: panel (a) alone, no results folder read
        check_results_dir(root)
        jobs = report_jobs(ResultsFolder(root), runs, config.tasks, config.recipe_hash)
        notes = (no_results_warning(jobs, runs, root), runs_without_results_warning(jobs, runs, root),
                 progress_warning(jobs, runs, config.tasks, root), refused_warning(jobs, runs))  # fmt: skip
        warnings = [note for note in notes if note]
    rows = [job for job in jobs if job["status"] == "done"]
    points = [p for task in config.tasks for p in best_lr_points(jobs, runs, task, config.one_class_share)]
    baselines = {task: task_baselines(rows, task, config.data_dir) for task in config.tasks} if rows else {}
    warnings += warnings_for(points, config.tasks, baselines, len(jobs) - len(rows), len(jobs))
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    images = [plot_loss(runs, curves, target, out / "figure5a_val_loss.png")]
    if rows:  # panels (b)-(d) have something to draw
        panels = "bcdefghij"
        for panel, task in zip(panels, config.tasks, strict=False):
            images.append(plot_task(runs, points, task, panel, out / f"figure5{panel}_{task}.png", baselines[task]))
        panel = panels[len(config.tasks)]
        images.append(plot_dev_loss(runs, points, config.tasks, panel, out / f"figure5{panel}_dev_loss.png", baselines))
    result = {"target_loss": target, "curves": curves, "steps": table, "recipe_differences": recipe_differences(runs),
              "jobs": jobs, "rows": rows, "points": points, "baselines": baselines, "warnings": warnings,
              "images": images, "summary": out / "summary.md", "results_dir": root}  # fmt: skip
    atomic.write_text(result["summary"], summary_markdown(runs, result, config.tasks, config.one_class_share))
    if config.wandb:
        result["wandb_dir"] = log_report(runs, config, result, SEED_COLUMNS)
    return result


def main(argv: list[str] | None = None) -> int:
    """Exit code 0 once the report is written, warnings or not (each on stderr as well as in summary.md)."""
    config = parse(ReportConfig, argv, prog="python -m finetune.report", description=__doc__)
    result = report(config)
    print(result["summary"].read_text())
    print(f"wrote {', '.join(str(p) for p in result['images'])} and {result['summary']}")
    for warning in result["warnings"]:
        print(f"warning: {warning.replace('**', '')}", file=sys.stderr)
    return 0


cli = functools.partial(run_cli, main)  # bad input: its message and exit code 2, not a traceback


if __name__ == "__main__":
    raise SystemExit(cli())
