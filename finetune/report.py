"""Figure 5 of Xiong et al. 2020 from pretraining logs and the fine-tuning results store.

    python -m finetune.report --runs='[runs/post_ln, runs/pre_ln]' --store=outputs/finetune/results.sqlite \
        --out=outputs/figure5 [--target_loss=1.69] [--wandb]

Panels: (a) validation MLM loss against pretraining step, one line per run (RUN/metrics.jsonl); (b) MRPC and
(c) RTE dev accuracy against pretraining step: for each (run, step) the learning rate with the best mean dev
accuracy over seeds, drawn as that mean with a 95% confidence interval from the t-distribution over seeds.
``summary.md`` holds the steps each run needs to reach a validation loss (interpolated between evaluations)
and their ratio to the slowest run (the paper: Post-LN needs about 700k steps to Pre-LN's 500k), the
per-step results, and links to the figures. ``--wandb`` logs the same to W&B (WANDB_MODE=offline works
without network) into the pretraining runs' comparison group.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from finetune.config import check_tasks
from finetune.store import ResultStore, StoreVersionError
from pretrain.cli import parse, require, run_cli
from pretrain.layout import RUN_CONFIG_FILE, read_metrics, read_status
from pretrain.reporting import pyplot, save_figure

VAL_LOSS = "val/mlm_loss"


@dataclass(kw_only=True)
class ReportConfig:
    """Draw Figure 5 (validation loss and MRPC/RTE dev accuracy against pretraining step) and a summary."""

    runs: list[str]
    """Pretraining run folders to compare (RUN/ of docs/run_layout.md), e.g. a Post-LN and a Pre-LN run."""
    store: str = "outputs/finetune/results.sqlite"
    """Results store written by finetune.run / finetune.schedule."""
    out: str = "outputs/figure5"
    """Folder for the PNG figures and summary.md."""
    tasks: list[str] = field(default_factory=lambda: ["mrpc", "rte"])
    """GLUE tasks to draw, one panel each."""
    target_loss: float | None = None
    """Validation loss for the steps-to-loss table; unset: the smallest loss every run reaches."""
    recipe_hash: str | None = None
    """Use only results of this fine-tuning recipe (needed when the store holds several)."""
    wandb: bool = False
    """Also log figures, tables and metrics to W&B (WANDB_MODE=offline logs locally)."""
    wandb_project: str | None = None
    """W&B project; unset: the pretraining runs' tracking.project (else lnbert)."""
    wandb_group: str | None = None
    """W&B group; unset: the pretraining runs' tracking.group, so the fine-tuning curves sit beside them."""

    def __post_init__(self) -> None:
        require(bool(self.runs), "runs", "is empty; pass the pretraining run folders with --runs='[RUN1, RUN2]'")
        check_tasks("tasks", self.tasks)
        require(self.target_loss is None or self.target_loss > 0, "target_loss", f"must be > 0; got {self.target_loss}")


@dataclass(frozen=True)
class RunInfo:
    path: Path
    name: str
    placement: str

    @property
    def label(self) -> str:
        return f"{self.name} ({self.placement})"


# --------------------------------------------------------------------------------------------------
# Validation loss curves and steps to a target loss
# --------------------------------------------------------------------------------------------------


def run_info(run_dir: str | Path) -> RunInfo:
    path = Path(run_dir).resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"pretraining run folder {path} not found")
    status = read_status(path)
    config_path = path / RUN_CONFIG_FILE
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    placement = status.get("norm_placement") or config.get("model", {}).get("norm_placement", "unknown")
    return RunInfo(path=path, name=str(status.get("run_name") or path.name), placement=str(placement))


def val_loss_curve(run_dir: str | Path) -> list[tuple[int, float]]:
    """(step, validation MLM loss) by step; a step logged twice (a resumed run) keeps its last value."""
    by_step = {int(m["step"]): float(m[VAL_LOSS]) for m in read_metrics(run_dir) if m.get(VAL_LOSS) is not None}
    # A diverged run logs nan/inf: not a point on the curve.
    return sorted((step, loss) for step, loss in by_step.items() if math.isfinite(loss))


def steps_to_loss(curve: list[tuple[int, float]], target: float) -> float | None:
    """First step at which the loss reaches ``target``, linearly interpolated between evaluations."""
    previous = None
    for step, loss in curve:
        if loss <= target:
            if previous is None or previous[1] == loss:
                return float(step)
            (s0, l0) = previous
            return s0 + (l0 - target) / (l0 - loss) * (step - s0)
        previous = (step, loss)
    return None


def default_target(curves: dict[str, list[tuple[int, float]]]) -> float | None:
    """The smallest validation loss that every run reaches (the slowest run's best)."""
    bests = [min(loss for _, loss in curve) for curve in curves.values() if curve]
    return max(bests) if bests and len(bests) == len(curves) else None


def steps_table(runs: list[RunInfo], curves: dict[str, list[tuple[int, float]]], target: float) -> list[dict[str, Any]]:
    """Steps to ``target`` per run, and the ratio to the slowest run that reaches it."""
    steps = {run.label: steps_to_loss(curves[run.label], target) for run in runs}
    reached = [s for s in steps.values() if s is not None]
    slowest = max(reached) if reached else None
    return [
        {
            "run": run.label,
            "steps": steps[run.label],
            "ratio": steps[run.label] / slowest if steps[run.label] is not None and slowest else None,
        }
        for run in runs
    ]


# --------------------------------------------------------------------------------------------------
# Fine-tuning results: best lr per (run, step), mean and t-interval over seeds
# --------------------------------------------------------------------------------------------------


def confidence_interval(values: list[float], level: float = 0.95) -> float:
    """Half-width of the t-distribution interval of the mean; nan (undefined, drawn without a bar) for one value."""
    n = len(values)
    if n < 2:
        return float("nan")
    return float(stats.t.ppf(0.5 + level / 2, n - 1) * np.std(values, ddof=1) / math.sqrt(n))


def select_rows(rows: list[dict[str, Any]], recipe_hash: str | None) -> list[dict[str, Any]]:
    """Rows of one fine-tuning recipe: mixing recipes in one point would average unlike numbers."""
    if recipe_hash is not None:
        return [r for r in rows if r["recipe_hash"] == recipe_hash]
    recipes = sorted({r["recipe_hash"] for r in rows})
    if len(recipes) > 1:
        raise ValueError(
            f"the store holds results of several fine-tuning recipes {recipes}; choose one with --recipe_hash"
        )
    return rows


def best_lr_points(rows: list[dict[str, Any]], runs: list[RunInfo], task: str) -> list[dict[str, Any]]:
    """For each (run, step): the lr with the best mean dev accuracy, with its mean, CI and seed count."""
    groups: dict[tuple[str, int], dict[float, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        mine = [r for r in rows if r["task"] == task and r["run_dir"] == str(run.path)]
        # Results computed where the run folder had another path (a cluster mount): match by run name.
        mine = mine or [r for r in rows if r["task"] == task and r["run_name"] == run.name]
        for row in mine:
            groups[(run.label, row["pretrain_step"])][row["lr"]].append(row)
    points = []
    for (label, step), by_lr in sorted(groups.items()):
        lr, group = max(by_lr.items(), key=lambda item: (np.mean([r["accuracy"] for r in item[1]]), -item[0]))
        accuracies = [r["accuracy"] for r in group]
        f1s = [r["f1"] for r in group if r["f1"] is not None]
        points.append(
            {
                "run": label,
                "task": task,
                "step": step,
                "lr": lr,
                "seeds": len(group),
                "accuracy": float(np.mean(accuracies)),
                "accuracy_ci": confidence_interval(accuracies),
                "f1": float(np.mean(f1s)) if f1s else None,
                "f1_ci": confidence_interval(f1s) if f1s else None,
            }
        )
    return points


# --------------------------------------------------------------------------------------------------
# Figures and summary
# --------------------------------------------------------------------------------------------------


def plot_loss(
    runs: list[RunInfo], curves: dict[str, list[tuple[int, float]]], target: float | None, path: Path
) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for run in runs:
        if curves[run.label]:
            steps, losses = zip(*curves[run.label], strict=True)
            ax.plot(steps, losses, marker=".", label=run.label)
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=0.8, label=f"target {target:.3g}")
    ax.set(xlabel="pretraining step", ylabel="validation MLM loss", title="(a) validation loss")
    return _finish(fig, ax, path)


def _finish(fig: Any, ax: Any, path: Path) -> Path:
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, path)


def plot_task(runs: list[RunInfo], points: list[dict[str, Any]], task: str, panel: str, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for run in runs:
        mine = [p for p in points if p["run"] == run.label]
        if mine:
            ax.errorbar(
                [p["step"] for p in mine],
                [100 * p["accuracy"] for p in mine],
                yerr=[100 * p["accuracy_ci"] for p in mine],
                marker="o",
                capsize=3,
                label=run.label,
            )
    ax.set(
        xlabel="pretraining step",
        ylabel="dev accuracy (%)",
        title=f"({panel}) {task.upper()}: best lr, mean ± 95% CI over seeds",
    )
    return _finish(fig, ax, path)


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _mean_ci(mean: float, ci: float) -> str:
    """Percent, with the interval when there is one (a single seed has none)."""
    return f"{100 * mean:.2f}" + ("" if math.isnan(ci) else f" ± {100 * ci:.2f}")


def summary_markdown(
    target: float | None, table: list[dict[str, Any]], points: list[dict[str, Any]], images: list[Path]
) -> str:
    lines = ["# Figure 5: pretraining speed and downstream accuracy by LayerNorm placement", ""]
    if target is None:
        lines += ["No validation loss is reached by every run yet: no steps-to-loss table.", ""]
    else:
        lines += [
            f"## Steps to validation MLM loss {target:.4g}",
            "",
            "Interpolated linearly between evaluations. The paper (Figure 5): Pre-LN reaches 1.69 at about 500k "
            "steps, Post-LN at about 700k, i.e. steps / slowest = 0.71 and the slowest needs 1.4x the steps (40% more).",
            "",
            "| run | steps | steps / slowest | slowest / steps |",
            "|---|---:|---:|---:|",
        ]
        for row in table:
            speedup = None if not row["ratio"] else 1 / row["ratio"]
            lines.append(
                f"| {row['run']} | {_fmt(row['steps'], '.0f')} | {_fmt(row['ratio'], '.3f')} | {_fmt(speedup, '.2f')}{'x' if speedup else ''} |"
            )
        lines.append("")
    lines += [
        "## Dev results per pretraining step (best lr by mean accuracy; mean ± 95% t-interval over seeds)",
        "",
        "| task | run | step | best lr | seeds | accuracy (%) | F1 (%) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        f1 = "—" if p["f1"] is None else _mean_ci(p["f1"], p["f1_ci"])
        lines.append(
            f"| {p['task'].upper()} | {p['run']} | {p['step']} | {p['lr']:g} | {p['seeds']} | "
            f"{_mean_ci(p['accuracy'], p['accuracy_ci'])} | {f1} |"
        )
    lines += ["", "## Figures", ""] + [f"![{image.stem}]({image.name})" for image in images]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# W&B
# --------------------------------------------------------------------------------------------------


def _tracking_defaults(runs: list[RunInfo]) -> dict[str, Any]:
    for run in runs:
        path = run.path / RUN_CONFIG_FILE
        if path.is_file():
            return json.loads(path.read_text()).get("tracking", {}) or {}
    return {}


def log_wandb(
    config: ReportConfig,
    runs: list[RunInfo],
    curves: dict[str, list[tuple[int, float]]],
    points: list[dict[str, Any]],
    images: list[Path],
) -> list[str]:
    """One W&B run per pretraining run (fine-tune metrics against pretrain_step) and one with the figures."""
    import wandb

    tracking = _tracking_defaults(runs)
    project = config.wandb_project or tracking.get("project") or "lnbert"
    group = config.wandb_group or tracking.get("group") or "figure5"
    settings = dict(project=project, group=group, dir=config.out, mode=os.environ.get("WANDB_MODE", "online"))
    directories = []
    for run in runs:
        wb = wandb.init(
            **settings,
            name=f"{run.name}-finetune",
            job_type="finetune",
            config={"run": run.name, "placement": run.placement},
            tags=[run.placement],
            reinit="finish_previous",
        )
        wb.define_metric("pretrain_step")
        for key in ("val/mlm_loss", *(f"{t}/*" for t in config.tasks)):
            wb.define_metric(key, step_metric="pretrain_step")
        by_step: dict[int, dict[str, float]] = defaultdict(dict)
        for step, loss in curves[run.label]:
            by_step[step]["val/mlm_loss"] = loss
        for p in points:
            if p["run"] == run.label:
                by_step[p["step"]].update(
                    {
                        f"{p['task']}/accuracy": p["accuracy"],
                        f"{p['task']}/accuracy_ci": p["accuracy_ci"],
                        f"{p['task']}/best_lr": p["lr"],
                    }
                )
                if p["f1"] is not None:
                    by_step[p["step"]][f"{p['task']}/f1"] = p["f1"]
        for step in sorted(by_step):
            wb.log({"pretrain_step": step, **by_step[step]})
        directories.append(wb.dir)
        wb.finish()
    wb = wandb.init(**settings, name="figure5-report", job_type="report", reinit="finish_previous")
    columns = ["task", "run", "step", "lr", "seeds", "accuracy", "accuracy_ci", "f1", "f1_ci"]
    wb.log(
        {
            "figure5/results": wandb.Table(columns=columns, data=[[p[c] for c in columns] for p in points]),
            **{f"figure5/{image.stem}": wandb.Image(str(image)) for image in images},
        }
    )
    directories.append(wb.dir)
    wb.finish()
    return directories


# --------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------


def report(config: ReportConfig) -> dict[str, Any]:
    """Write the figures and summary.md to ``config.out``; returns what they show."""
    runs = [run_info(r) for r in config.runs]
    curves = {run.label: val_loss_curve(run.path) for run in runs}
    target = config.target_loss if config.target_loss is not None else default_target(curves)
    table = steps_table(runs, curves, target) if target is not None else []
    if not Path(config.store).is_file():
        raise FileNotFoundError(f"results store {config.store} not found; run finetune.schedule first or pass --store")
    with ResultStore(config.store) as store:
        rows = select_rows(store.rows("done"), config.recipe_hash)
    points = [p for task in config.tasks for p in best_lr_points(rows, runs, task)]
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    images = [plot_loss(runs, curves, target, out / "figure5a_val_loss.png")]
    for panel, task in zip("bcdefgh", config.tasks, strict=False):
        images.append(
            plot_task(runs, [p for p in points if p["task"] == task], task, panel, out / f"figure5{panel}_{task}.png")
        )
    (out / "summary.md").write_text(summary_markdown(target, table, points, images))
    result = {"target_loss": target, "steps": table, "points": points, "images": images, "summary": out / "summary.md"}
    if config.wandb:
        result["wandb_dirs"] = log_wandb(config, runs, curves, points, images)
    return result


def main(argv: list[str] | None = None) -> int:
    config = parse(ReportConfig, argv, prog="python -m finetune.report", description=__doc__)
    result = report(config)
    print(result["summary"].read_text())
    print(f"wrote {', '.join(str(p) for p in result['images'])} and {result['summary']}")
    return 0


def cli() -> int:
    """``main`` for the command line: bad input ends with its message and exit code 2, not a traceback."""
    return run_cli(main, errors=(StoreVersionError,))


if __name__ == "__main__":
    raise SystemExit(cli())
