"""The pictures of the Figure 5 report (finetune/report.py): (a) the validation loss, from (b) on the dev accuracy of
each task, last the dev loss of the same best-lr points; one colour, marker and line style per run."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from finetune.report_numbers import RunInfo
from pretrain.common.reporting import pyplot, save_figure

MIN_LOSS_SPAN = 0.1
"""Panel (d)'s y-axis spans at least this many nats, so that seed noise of 1e-4 is not stretched into a trend."""

# One marker and line style per run, so that series that coincide (two runs stuck on the majority class) stay
# visible: the later run's line is drawn over the earlier one's in another style, offset a little along x.
MARKERS = ("o", "s", "^", "D", "v", "P")
LINESTYLES = ("-", "--", "-.", ":")
OFFSET_SHARE = 0.012
"""Horizontal offset between neighbouring runs' points, as a share of the steps' range."""


def run_series(runs: list[RunInfo], points: list[dict[str, Any]]) -> Iterator[tuple[int, RunInfo, list, list[float]]]:
    """(index, run, its points, their x) per run with points; x offset a little per run, centred on zero, so that equal
    values at one step do not hide."""
    steps = [p["step"] for p in points] or [0]
    unit = OFFSET_SHARE * ((max(steps) - min(steps)) or 1)
    for index, run in enumerate(runs):
        if mine := [p for p in points if p["run"] == run.label]:
            yield index, run, mine, [p["step"] + unit * (index - (len(runs) - 1) / 2) for p in mine]


def style(index: int) -> dict[str, Any]:
    """A run's colour, marker and line style, the same in every panel."""
    return {"color": f"C{index}", "marker": MARKERS[index % len(MARKERS)],
            "linestyle": LINESTYLES[index % len(LINESTYLES)]}  # fmt: skip


def plot_loss(runs: list[RunInfo], curves: dict[str, list[tuple[int, float]]], target: float | None,
              path: Path) -> Path:  # fmt: skip
    fig, ax = pyplot().subplots(figsize=(7, 3.6))
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


def dev_set_text(base: dict[str, Any]) -> str:
    """Which dev examples a baseline is of, for a legend: empty for the whole dev set."""
    return "" if base["eval_examples"] is None else f", first {base['eval_examples']} dev examples"


def plot_task(runs: list[RunInfo], points: list[dict[str, Any]], task: str, panel: str, path: Path,
              base: dict[str, Any]) -> Path:  # fmt: skip
    """Best-lr mean accuracy per step and run of ``task`` with its clipped t-interval, beside the majority and chance
    accuracies; hollow markers: every seed predicts (almost) one class."""
    points = [p for p in points if p["task"] == task]
    fig, ax = pyplot().subplots(figsize=(7.5, 3.6))  # the legend takes the right third
    for index, run, mine, x in run_series(runs, points):
        y = [100 * p["accuracy"] for p in mine]
        # No interval (one seed): no bar.
        bars = 100 * np.nan_to_num([[p["accuracy"] - p["accuracy_low"] for p in mine],
                                    [p["accuracy_high"] - p["accuracy"] for p in mine]])  # fmt: skip
        seeds = sorted({p["seeds"] for p in mine})
        n = f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
        ax.errorbar(x, y, yerr=bars, capsize=3, label=f"{run.label}, n={n} seeds", **style(index))
        # Markers on top of every line and bar; hollow: the point's accuracy is the dev set's label balance.
        colour = style(index)["color"]
        ax.scatter(x, y, s=36, marker=style(index)["marker"], c=["white" if p["one_class"] else colour for p in mine],
                   edgecolors=colour, linewidths=1, zorder=3)  # fmt: skip
    if base["majority_accuracy"] is not None:
        majority, full = 100 * base["majority_accuracy"], base["full_majority_accuracy"]
        label = f"majority class {majority:.1f}%{dev_set_text(base)}" + (
            f"\n(all {base['full_examples']}: {100 * full:.1f}%)" if full is not None and base["eval_examples"] else ""
        )
        ax.axhline(majority, color="black", linestyle="--", linewidth=0.9, label=label)
    chance = 100 * base["chance"]
    ax.axhline(chance, color="grey", linestyle=":", linewidth=0.9, label=f"chance {chance:.0f}%")
    if any(p["one_class"] for p in points):
        ax.plot([], [], linestyle="none", marker="o", markerfacecolor="white", markeredgecolor="black",
                label="hollow: every seed predicts one class")  # fmt: skip
    ax.set_ylim(max(0.0, ax.get_ylim()[0]), min(100.0, ax.get_ylim()[1]))
    ax.set(xlabel="pretraining step", ylabel="dev accuracy (%)", title=f"({panel}) {task.upper()}: best lr per step")
    clipped = " (some are)" if any(p["accuracy_clipped"] for p in points) else ""
    note = f"mean over seeds; bars: 95% t-interval,\nclipped to [0, 100]{clipped}"
    if incomplete := sum(p["incomplete"] for p in points):
        note += f"\n{incomplete} point(s) incomplete: jobs not done"
    return _finish(fig, ax, path, note)


def loss_limits(values: list[float], min_span: float = MIN_LOSS_SPAN) -> tuple[float, float]:
    """A loss axis over ``values`` (5% margins), at least ``min_span`` tall around their middle, never below 0."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return 0.0, min_span
    low, high = min(finite), max(finite)
    low, high = low - 0.05 * (high - low), high + 0.05 * (high - low)
    if high - low < min_span:
        middle = (low + high) / 2
        low, high = middle - min_span / 2, middle + min_span / 2
    return (0.0, high - low) if low < 0 else (low, high)


def plot_dev_loss(runs: list[RunInfo], points: list[dict[str, Any]], tasks: list[str], panel: str, path: Path,
                  baselines: dict[str, dict[str, Any]]) -> Path:  # fmt: skip
    """The best-lr points' mean dev loss and t-interval beside the label prior's loss: it separates runs whose
    accuracies are all the majority class."""
    fig, axes = pyplot().subplots(1, len(tasks), figsize=(4 * len(tasks), 3.4), squeeze=False)
    legend: dict[str, Any] = {}
    for ax, task in zip(axes[0], tasks, strict=True):
        mine = [p for p in points if p["task"] == task]
        drawn: list[float] = []
        for index, run, series, x in run_series(runs, mine):
            half = np.nan_to_num([p["dev_loss_ci"] for p in series])
            y = np.array([p["dev_loss"] for p in series])
            ax.errorbar(x, y, yerr=half, capsize=3, markersize=5, label=run.label, **style(index))
            drawn += [*(y - half), *(y + half)]
        base, title = baselines[task], task.upper()
        if base["prior_loss"] is not None:
            ax.axhline(base["prior_loss"], color="black", linestyle="--", linewidth=0.9,
                       label="label prior (entropy of the dev labels)")  # fmt: skip
            drawn.append(base["prior_loss"])
            title += f" (label prior {base['prior_loss']:.4f}{dev_set_text(base)})"
        ax.set_ylim(*loss_limits(drawn))
        ax.set(xlabel="pretraining step", ylabel="dev loss (cross-entropy, nats)")
        ax.set_title(title, fontsize="small")
        ax.grid(alpha=0.3)
        legend.update(zip(*reversed(ax.get_legend_handles_labels()), strict=True))
    fig.suptitle(f"({panel}) dev loss of the best-lr points: mean over seeds, bars 95% t-interval; "
                 f"y-axis at least {MIN_LOSS_SPAN:g} nats tall")  # fmt: skip
    if legend:
        fig.legend(list(legend.values()), list(legend), loc="upper left", bbox_to_anchor=(1.0, 0.9), fontsize="small",
                   frameon=False)  # fmt: skip
    return save_figure(fig, path)
