"""Figure 5 of Xiong et al. 2020 from pretraining logs and the fine-tuning results folder.

    python -m finetune.report --runs='[runs/post_ln, runs/pre_ln]' --results_dir=outputs/finetune/results.d
        --out=outputs/figure5 [--target_loss=1.69] [--wandb]      (one command, on two lines here)

Panels: (a) validation MLM loss against pretraining step, one line per run (RUN/metrics.jsonl); (b) MRPC and
(c) RTE dev accuracy against pretraining step: for each (run, step) the learning rate with the best mean dev
accuracy over seeds, drawn as that mean with a 95% t-interval over seeds clipped to [0, 100] (accuracy cannot
leave it), beside the dev set's majority-class and chance accuracies; a hollow marker flags a point whose every
seed predicts (almost) one class; (d) the same points' dev loss. ``summary.md`` holds the steps each run needs
to reach a validation loss (interpolated between evaluations) in this comparison's own terms, the baselines,
the per-step results with their flags, and links to the figures. ``--wandb`` logs the same to one W&B report
run whose id is derived from the runs, so re-running updates it (WANDB_MODE=offline works without network).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from finetune.config import ResultsOption, check_tasks
from finetune.manifest import DONE, ResultsFolder
from finetune.tracking import Figure5, ReportSettings, log_report, of_runs
from pretrain.common.cli import parse, require, run_cli
from pretrain.common.reporting import pyplot, save_figure
from pretrain.run_folder.identity import read_run_id
from pretrain.run_folder.layout import RUN_CONFIG_FILE, read_metrics, read_status
from pretrain.tracking.wandb_logging import check_credentials, wandb_mode

VAL_LOSS = "val/mlm_loss"


@dataclass(kw_only=True)
class ReportConfig(ResultsOption):
    """Draw Figure 5 (validation loss and MRPC/RTE dev accuracy against pretraining step) and a summary."""

    runs: list[str]
    """Pretraining run folders to compare (RUN/ of docs/run_layout.md), e.g. a Post-LN and a Pre-LN run."""
    out: str = "outputs/figure5"
    """Folder for the PNG figures and summary.md."""
    tasks: list[str] = field(default_factory=lambda: ["mrpc", "rte"])
    """GLUE tasks to draw, one panel each."""
    target_loss: float | None = None
    """Validation loss for the steps-to-loss table; unset: the smallest loss every run reaches."""
    recipe_hash: str | None = None
    """Use only results of this fine-tuning recipe (needed when the results folder holds several)."""
    wandb: bool = False
    """Also log to W&B one report run (job_type report) with a deterministic id, so re-running updates it:
    steps-to-loss table, Figure 5 curves against pretrain_step, per-seed rows, figures (WANDB_MODE=offline
    logs into OUT/wandb)."""
    wandb_project: str | None = None
    """W&B project; unset: the pretraining runs' tracking.project (else lnbert)."""
    one_class_share: float = 0.95
    """A job predicts one class when at least this share of its dev predictions falls in one class; a point is
    flagged when all its seeds do (its accuracy is then the label balance of the dev set, not what was learned)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(bool(self.runs), "runs", "is empty; pass the pretraining run folders with --runs='[RUN1, RUN2]'")
        check_tasks("tasks", self.tasks)
        require(self.target_loss is None or self.target_loss > 0, "target_loss", f"must be > 0; got {self.target_loss}")
        require(
            0.5 < self.one_class_share <= 1,
            "one_class_share",
            f"must be in (0.5, 1] (a share of dev predictions); got {self.one_class_share}",
        )


@dataclass(frozen=True)
class RunInfo:
    path: Path
    run_id: str
    """The run's identity (RUN/run_id): results are matched by it, never by name or path."""
    name: str
    placement: str
    label: str
    """Legend and table label; unique among the runs of one report."""


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
    placement = str(status.get("norm_placement") or config.get("model", {}).get("norm_placement", "unknown"))
    name = str(status.get("run_name") or path.name)
    return RunInfo(path=path, run_id=read_run_id(path), name=name, placement=placement, label=f"{name} ({placement})")


def run_infos(run_dirs: list[str]) -> list[RunInfo]:
    """The runs of a report, labelled apart: runs that share a name get their folder name (or id) added."""
    runs = [run_info(r) for r in run_dirs]
    ids = [run.run_id for run in runs]
    if len(set(ids)) < len(ids):
        raise ValueError(f"--runs names one run twice (run ids {', '.join(ids)}); pass each run folder once")
    labels = [run.label for run in runs]
    out = []
    for run in runs:
        if labels.count(run.label) > 1:
            folders = [r.path.name for r in runs if r.label == run.label]
            suffix = run.path.name if folders.count(run.path.name) == 1 else run.run_id
            run = replace(run, label=f"{run.label} [{suffix}]")
        out.append(run)
    return out


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
    from scipy import stats  # here: it takes seconds to import, and the command reads its options first

    n = len(values)
    if n < 2:
        return float("nan")
    return float(stats.t.ppf(0.5 + level / 2, n - 1) * np.std(values, ddof=1) / math.sqrt(n))


def clipped_interval(mean: float, half_width: float, low: float = 0.0, high: float = 1.0) -> tuple[float, float, bool]:
    """``(lower, upper, clipped)``: the interval ``mean ± half_width`` cut to the range the quantity can take (an
    accuracy's [0, 1]: a t-interval over two seeds can reach past both ends); nan bounds for an undefined one."""
    if math.isnan(half_width):
        return float("nan"), float("nan"), False
    lower, upper = mean - half_width, mean + half_width
    return max(lower, low), min(upper, high), lower < low or upper > high


def task_baselines(rows: list[dict[str, Any]], task: str) -> dict[str, float | None]:
    """The dev set's majority-class accuracy (and F1) as the task's jobs measured them, and chance (a uniform
    guess between the two labels). None where the task has none (RTE has no F1) or no job of it finished."""

    def typical(column: str) -> float | None:
        values = [r[column] for r in rows if r["task"] == task and r.get(column) is not None]
        # One recipe, one dev set: the values agree; the median is robust to a job with a capped dev set.
        return float(np.median(values)) if values else None

    return {"majority_accuracy": typical("majority_accuracy"), "majority_f1": typical("majority_f1"), "chance": 0.5}


def one_class_seeds(group: list[dict[str, Any]], share: float) -> int:
    """How many of a point's jobs put at least ``share`` of their dev predictions in one class."""
    return sum(r["top_class_share"] >= share for r in group)


def select_rows(rows: list[dict[str, Any]], recipe_hash: str | None) -> list[dict[str, Any]]:
    """Rows of one fine-tuning recipe: mixing recipes in one point would average unlike numbers."""
    if recipe_hash is not None:
        return [r for r in rows if r["recipe_hash"] == recipe_hash]
    recipes = sorted({r["recipe_hash"] for r in rows})
    if len(recipes) > 1:
        raise ValueError(
            f"the results folder holds results of several fine-tuning recipes {recipes}; choose one with --recipe_hash"
        )
    return rows


def best_lr_points(
    rows: list[dict[str, Any]], runs: list[RunInfo], task: str, one_class_share: float = 0.95
) -> list[dict[str, Any]]:
    """For each (run, step): the lr with the best mean dev accuracy, with its mean, CI (and the CI clipped to
    [0, 1]), seed count, mean dev loss, and how many seeds predict one class (``one_class``: all of them)."""
    groups: dict[tuple[str, int], dict[float, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        # By run id: a run folder moved or mounted elsewhere is the same run; another run of the same name is not.
        for row in (r for r in rows if r["task"] == task and r["run_id"] == run.run_id):
            groups[(run.label, row["pretrain_step"])][row["lr"]].append(row)
    points = []
    for (label, step), by_lr in sorted(groups.items()):
        lr, group = max(by_lr.items(), key=lambda item: (np.mean([r["accuracy"] for r in item[1]]), -item[0]))
        accuracies = [r["accuracy"] for r in group]
        f1s = [r["f1"] for r in group if r["f1"] is not None]
        accuracy, accuracy_ci = float(np.mean(accuracies)), confidence_interval(accuracies)
        low, high, clipped = clipped_interval(accuracy, accuracy_ci)
        one_class = one_class_seeds(group, one_class_share)
        points.append(
            {
                "run": label,
                "task": task,
                "step": step,
                "lr": lr,
                "seeds": len(group),
                "accuracy": accuracy,
                "accuracy_ci": accuracy_ci,
                "accuracy_low": low,
                "accuracy_high": high,
                "accuracy_clipped": clipped,
                "f1": float(np.mean(f1s)) if f1s else None,
                "f1_ci": confidence_interval(f1s) if f1s else None,
                "dev_loss": float(np.mean([r["dev_loss"] for r in group])),
                "one_class_seeds": one_class,
                "one_class": one_class == len(group),
            }
        )
    return points


# --------------------------------------------------------------------------------------------------
# Figures and summary
# --------------------------------------------------------------------------------------------------

# One marker and line style per run, so that series that coincide (two runs stuck on the majority class) stay
# visible: the later run's line is drawn over the earlier one's in another style, offset a little along x.
MARKERS = ("o", "s", "^", "D", "v", "P")
LINESTYLES = ("-", "--", "-.", ":")
OFFSET_SHARE = 0.012
"""Horizontal offset between neighbouring runs' points, as a share of the steps' range."""


def x_offsets(runs: list[RunInfo], steps: list[int]) -> dict[str, float]:
    """A small horizontal offset per run, centred on zero, so that equal values at one step do not hide."""
    span = (max(steps) - min(steps)) if steps else 0
    unit = OFFSET_SHARE * (span or 1)
    return {run.label: unit * (i - (len(runs) - 1) / 2) for i, run in enumerate(runs)}


def style(index: int) -> dict[str, Any]:
    """A run's colour, marker and line style, the same in every panel."""
    return {
        "color": f"C{index}",
        "marker": MARKERS[index % len(MARKERS)],
        "linestyle": LINESTYLES[index % len(LINESTYLES)],
    }


def seeds_text(points: list[dict[str, Any]]) -> str:
    counts = sorted({p["seeds"] for p in points})
    return f"n={counts[0]}" if len(counts) == 1 else f"n={counts[0]}-{counts[-1]}"


def plot_loss(
    runs: list[RunInfo], curves: dict[str, list[tuple[int, float]]], target: float | None, path: Path
) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for index, run in enumerate(runs):
        if curves[run.label]:
            steps, losses = zip(*curves[run.label], strict=True)
            ax.plot(steps, losses, markersize=4, label=run.label, **style(index))
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=0.8, label=f"target {target:.3g}")
    ax.set(xlabel="pretraining step", ylabel="validation MLM loss", title="(a) validation loss")
    return _finish(fig, ax, path)


def _finish(fig: Any, ax: Any, path: Path, note: str | None = None) -> Path:
    ax.grid(alpha=0.3)
    # Beside the axes, never over a point or a bar; the note says how to read what is drawn.
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize="small", frameon=False, title=note,
              title_fontsize="x-small", alignment="left")  # fmt: skip
    return save_figure(fig, path)


def plot_task(
    runs: list[RunInfo],
    points: list[dict[str, Any]],
    task: str,
    panel: str,
    path: Path,
    baselines: dict[str, float | None] | None = None,
) -> Path:
    """Best-lr mean accuracy per step and run, its clipped t-interval, the dev set's majority and chance
    accuracies; a hollow marker is a point whose every seed predicts (almost) one class."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 3.6))  # the legend takes the right third
    offsets = x_offsets(runs, [p["step"] for p in points])
    for index, run in enumerate(runs):
        mine = [p for p in points if p["run"] == run.label]
        if not mine:
            continue
        x = [p["step"] + offsets[run.label] for p in mine]
        y = [100 * p["accuracy"] for p in mine]
        bars = [
            [0.0 if math.isnan(p["accuracy_low"]) else 100 * (p["accuracy"] - p["accuracy_low"]) for p in mine],
            [0.0 if math.isnan(p["accuracy_high"]) else 100 * (p["accuracy_high"] - p["accuracy"]) for p in mine],
        ]
        marker = style(index)["marker"]
        ax.errorbar(x, y, yerr=bars, capsize=3, label=f"{run.label}, {seeds_text(mine)} seeds", **style(index))
        colour = style(index)["color"]
        # Markers on top of every line and bar; hollow: the point's accuracy is the dev set's label balance.
        for xi, yi, p in zip(x, y, mine, strict=True):
            face = "white" if p["one_class"] else colour
            ax.plot([xi], [yi], marker=marker, markersize=6, markerfacecolor=face, markeredgecolor=colour, zorder=3)
    baselines = baselines or {}
    if baselines.get("majority_accuracy") is not None:
        majority = 100 * baselines["majority_accuracy"]
        ax.axhline(majority, color="black", linestyle="--", linewidth=0.9, label=f"majority class {majority:.1f}%")
    if baselines.get("chance") is not None:
        chance = 100 * baselines["chance"]
        ax.axhline(chance, color="grey", linestyle=":", linewidth=0.9, label=f"chance {chance:.0f}%")
    if any(p["one_class"] for p in points):
        ax.plot([], [], linestyle="none", marker="o", markerfacecolor="white", markeredgecolor="black",
                label="hollow: every seed predicts one class")  # fmt: skip
    ax.set_ylim(max(0.0, ax.get_ylim()[0]), min(100.0, ax.get_ylim()[1]))
    ax.set(xlabel="pretraining step", ylabel="dev accuracy (%)", title=f"({panel}) {task.upper()}: best lr per step")
    note = "mean over seeds; bars: 95% t-interval,\nclipped to [0, 100]" + (
        " (some are)" if any(p["accuracy_clipped"] for p in points) else ""
    )
    return _finish(fig, ax, path, note)


def plot_dev_loss(runs: list[RunInfo], points: list[dict[str, Any]], tasks: list[str], panel: str, path: Path) -> Path:
    """The best-lr points' mean dev loss: it separates runs whose accuracies are all the majority class."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(tasks), figsize=(4 * len(tasks), 3.4), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        mine = [p for p in points if p["task"] == task]
        offsets = x_offsets(runs, [p["step"] for p in mine])
        for index, run in enumerate(runs):
            series = [p for p in mine if p["run"] == run.label]
            if series:
                ax.plot([p["step"] + offsets[run.label] for p in series], [p["dev_loss"] for p in series],
                        markersize=5, label=run.label, **style(index))  # fmt: skip
        ax.set(xlabel="pretraining step", ylabel="dev loss (cross-entropy)", title=f"{task.upper()}")
        ax.grid(alpha=0.3)
    fig.suptitle(f"({panel}) dev loss of the best-lr points, mean over seeds")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 0.9), fontsize="small", frameon=False)
    return save_figure(fig, path)


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.2f}"


def _mean_ci(mean: float, ci: float) -> str:
    """Percent, with the interval when there is one (a single seed has none)."""
    return f"{100 * mean:.2f}" + ("" if math.isnan(ci) else f" ± {100 * ci:.2f}")


def _accuracy_cell(point: dict[str, Any]) -> str:
    """Mean ± half-width; a clipped interval is given by its bounds, so the table never shows a share > 100%."""
    if not point["accuracy_clipped"]:
        return _mean_ci(point["accuracy"], point["accuracy_ci"])
    return f"{100 * point['accuracy']:.2f} [{100 * point['accuracy_low']:.2f}, {100 * point['accuracy_high']:.2f}]†"


def _flag_cell(point: dict[str, Any]) -> str:
    if point["one_class"]:
        return f"**one class** ({point['one_class_seeds']}/{point['seeds']} seeds)"
    return f"{point['one_class_seeds']}/{point['seeds']} seeds" if point["one_class_seeds"] else ""


def steps_sentence(table: list[dict[str, Any]], target: float) -> str:
    """The comparison in its own terms: which run reaches the target first, in how many steps, against which."""
    reached = sorted((row for row in table if row["steps"] is not None), key=lambda row: row["steps"])
    if len(reached) < 2:
        return f"Fewer than two runs reach validation loss {target:.4g}: no comparison of their steps."
    fastest, slowest = reached[0], reached[-1]
    if not fastest["steps"]:
        return f"{fastest['run']} starts at or below validation loss {target:.4g}: no comparison of steps."
    return (
        f"In this comparison, {fastest['run']} reaches validation loss {target:.4g} in {fastest['steps']:.0f} steps, "
        f"{slowest['steps'] / fastest['steps']:.2f}x fewer than {slowest['run']} ({slowest['steps']:.0f} steps)."
    )


def warnings_for(
    points: list[dict[str, Any]], tasks: list[str], baselines: dict[str, dict[str, float | None]] | None = None
) -> list[str]:
    """Sentences for the reader when the fine-tuning results cannot tell the runs apart: every point predicts
    one class, or (per task) every point predicts one class or none beats the dev set's majority class beyond its
    interval (a mean one point above it, ± three, is no better than the majority class)."""
    if points and all(p["one_class"] for p in points):
        return [
            "**No snapshot beats the majority class**: at every point every seed predicts (almost) one class, so "
            "the accuracies are the dev sets' label balance, not what pretraining gave: pretrain longer or use a "
            "larger model (the dev loss may still differ between runs)."
        ]
    out = []
    for task in tasks:
        mine = [p for p in points if p["task"] == task]
        majority = (baselines or {}).get(task, {}).get("majority_accuracy")
        if mine and all(p["one_class"] for p in mine):
            out.append(
                f"Every {task.upper()} point predicts (almost) one class: its accuracies say nothing of the runs."
            )
        elif mine and majority is not None and not any(_lower_bound(p) > majority for p in mine):
            out.append(
                f"No {task.upper()} point beats the majority class ({100 * majority:.2f}%) beyond its 95% interval: "
                "pretrain longer or use a larger model before reading its accuracies."
            )
    return out


def _lower_bound(point: dict[str, Any]) -> float:
    """The accuracy interval's lower end; the mean itself where there is no interval (one seed)."""
    low = point.get("accuracy_low")
    return point["accuracy"] if low is None or math.isnan(low) else low


def summary_markdown(
    target: float | None,
    table: list[dict[str, Any]],
    points: list[dict[str, Any]],
    images: list[Path],
    baselines: dict[str, dict[str, float | None]] | None = None,
    one_class_share: float = 0.95,
) -> str:
    baselines = baselines or {}
    lines = ["# Figure 5: pretraining speed and downstream accuracy by LayerNorm placement", ""]
    lines += [
        f"> {warning}\n"
        for warning in warnings_for(points, list(baselines) or sorted({p["task"] for p in points}), baselines)
    ]
    if target is None:
        lines += ["No validation loss is reached by every run yet: no steps-to-loss table.", ""]
    else:
        lines += [
            f"## Steps to validation MLM loss {target:.4g}",
            "",
            steps_sentence(table, target),
            "Steps are interpolated linearly between evaluations. They measure these runs (their model, data and "
            "schedule) against each other; the paper's step counts are of BERT-base on its own corpus and scale.",
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
    if baselines:
        lines += [
            "## Baselines on the dev sets",
            "",
            "Majority class: always answer the dev set's most common label; chance: a uniform guess between the two.",
            "",
            "| task | majority-class accuracy (%) | majority-class F1 (%) | chance accuracy (%) |",
            "|---|---:|---:|---:|",
        ]
        for task, base in baselines.items():
            lines.append(
                f"| {task.upper()} | {_pct(base['majority_accuracy'])} | {_pct(base['majority_f1'])} | {_pct(base['chance'])} |"
            )
        lines.append("")
    lines += [
        "## Dev results per pretraining step",
        "",
        "Best lr by mean accuracy; mean ± 95% t-interval over seeds; † the interval reaches past [0, 100] and is "
        f"given by its bounds clipped to it. One class: at least {100 * one_class_share:.0f}% of a seed's dev "
        "predictions fall in one class (n/n: every seed's).",
        "",
        "| task | run | step | best lr | seeds | accuracy (%) | F1 (%) | dev loss | one class |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for p in points:
        f1 = "—" if p["f1"] is None else _mean_ci(p["f1"], p["f1_ci"])
        lines.append(
            f"| {p['task'].upper()} | {p['run']} | {p['step']} | {p['lr']:g} | {p['seeds']} | "
            f"{_accuracy_cell(p)} | {f1} | {_fmt(p['dev_loss'], '.4f')} | {_flag_cell(p)} |"
        )
    lines += ["", "## Figures", ""] + [f"![{image.stem}]({image.name})" for image in images]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------


def check_results_dir(root: Path) -> None:
    """A missing results folder names the ones beside it (configs/finetune/smoke.yaml writes smoke.d, not the
    default results.d), so that the fix is one --results_dir away."""
    if root.is_dir():
        return
    others = sorted(p for p in root.parent.glob("*") if (p / DONE).is_dir()) if root.parent.is_dir() else []
    hint = (
        f"; {root.parent} holds {', '.join(p.name for p in others)}: pass --results_dir={others[0]}"
        + (" (or another of them)" if len(others) > 1 else "")
        if others
        else "; run finetune.schedule first or pass --results_dir"
    )
    raise FileNotFoundError(f"results folder {root} not found{hint}")


def report(config: ReportConfig) -> dict[str, Any]:
    """Write the figures and summary.md to ``config.out``; returns what they show."""
    if config.wandb:
        check_credentials(wandb_mode(), Path(config.out))
    runs = run_infos(config.runs)
    curves = {run.label: val_loss_curve(run.path) for run in runs}
    target = config.target_loss if config.target_loss is not None else default_target(curves)
    table = steps_table(runs, curves, target) if target is not None else []
    folder = ResultsFolder(config.results_dir)
    check_results_dir(folder.root)
    rows = select_rows([state.row() for state in folder.done().values()], config.recipe_hash)
    points = [p for task in config.tasks for p in best_lr_points(rows, runs, task, config.one_class_share)]
    mine = [r for r in rows if of_runs(r, runs)]
    baselines = {task: task_baselines(mine, task) for task in config.tasks}
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    images = [plot_loss(runs, curves, target, out / "figure5a_val_loss.png")]
    panels = iter("bcdefghij")
    for task in config.tasks:
        panel = next(panels)
        mine_points = [p for p in points if p["task"] == task]
        images.append(plot_task(runs, mine_points, task, panel, out / f"figure5{panel}_{task}.png", baselines[task]))
    panel = next(panels)
    images.append(plot_dev_loss(runs, points, config.tasks, panel, out / f"figure5{panel}_dev_loss.png"))
    summary = summary_markdown(target, table, points, images, baselines, config.one_class_share)
    (out / "summary.md").write_text(summary)
    warnings = warnings_for(points, config.tasks, baselines)
    result = {
        "target_loss": target,
        "steps": table,
        "points": points,
        "baselines": baselines,
        "warnings": warnings,
        "images": images,
        "summary": out / "summary.md",
    }
    if config.wandb:
        settings = ReportSettings(
            project=config.wandb_project,
            recipe_hash=config.recipe_hash,
            tasks=config.tasks,
            target_loss=config.target_loss,
            out=config.out,
        )
        figure5 = Figure5(
            curves=curves, steps=table, points=points, rows=rows, images=images, baselines=baselines, warnings=warnings
        )
        result["wandb_dir"] = log_report(runs, settings, figure5)
    return result


def main(argv: list[str] | None = None) -> int:
    config = parse(ReportConfig, argv, prog="python -m finetune.report", description=__doc__)
    result = report(config)
    print(result["summary"].read_text())
    print(f"wrote {', '.join(str(p) for p in result['images'])} and {result['summary']}")
    return 0


def cli() -> int:
    """``main`` for the command line: bad input ends with its message and exit code 2, not a traceback."""
    return run_cli(main)


if __name__ == "__main__":
    raise SystemExit(cli())
