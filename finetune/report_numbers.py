"""The numbers of the Figure 5 report (finetune/report.py): the runs compared and their recipes, the validation
loss curves and the steps to a loss, the fine-tuning jobs of the runs, and per (run, step) the best lr's mean and
t-interval over seeds beside the dev sets' baselines."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from finetune.glue import get_task
from finetune.manifest import ResultsFolder
from pretrain.common.cli import flatten
from pretrain.common.roles import keys_where
from pretrain.config import PretrainConfig
from pretrain.run_folder.identity import read_run_id
from pretrain.run_folder.layout import read_metrics, read_run_config, read_status
from pretrain.tracking.wandb_logging import RUN_CONFIG_FIX
from pretrain.variants import VARIANT_FIELDS, variant_of

VAL_LOSS = "val/mlm_loss"
WIDE_GAP_SHARE = 0.1
"""A steps-to-loss figure interpolated across a gap wider than this share of the figure itself is marked ``~``."""
VARIANT_KEYS = frozenset(f"model.{name}" for name in VARIANT_FIELDS)
"""The config keys that make a run's model variant (its label): what a comparison of placements varies on purpose."""
RECIPE_KEYS = keys_where(PretrainConfig, lambda rules: rules.recipe) - VARIANT_KEYS
"""The keys of what a run learns (roles recipe and limit, pretrain/common/roles.py) besides the model variant."""


@dataclass(frozen=True)
class RunInfo:
    """A pretraining run as the report compares it."""

    path: Path
    """The run folder, resolved."""
    run_id: str
    """The run's identity (RUN/run_id): results are matched by it, never by name or path."""
    name: str
    """The run's name (status.json run_name, else the folder's name)."""
    placement: str
    """The norm placement (post, pre, ...)."""
    variant: str
    """The model variant (pretrain.variants.variant_name); the placement alone for a run without run_config.json."""
    config: dict[str, Any]
    """The run's resolved pretraining config (RUN/run_config.json) by dotted key; {} for a run without one."""
    label: str
    """Legend and table label, ``NAME (VARIANT)``; unique among the runs of one report."""


# Runs: their labels and recipes


def run_info(run_dir: str | Path) -> RunInfo:
    """A run folder as the report compares it; a run_config.json of another format version is refused."""
    path = Path(run_dir).resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"pretraining run folder {path} not found")
    status = read_status(path)
    config = flatten(read_run_config(path, RUN_CONFIG_FIX))
    placement = str(config.get("model.norm_placement") or status.get("norm_placement") or "unknown")
    variant = variant_of({key.removeprefix("model."): config[key] for key in VARIANT_KEYS if key in config}) if config \
        else placement
    name = str(status.get("run_name") or path.name)
    return RunInfo(path=path, run_id=read_run_id(path), name=name, placement=placement, variant=variant,
                   config=config, label=f"{name} ({variant})")  # fmt: skip


def run_infos(run_dirs: list[str]) -> list[RunInfo]:
    """The runs of a report, labelled apart: runs that share a name get their folder name (or id) added."""
    runs = [run_info(r) for r in run_dirs]
    ids = [run.run_id for run in runs]
    if len(set(ids)) < len(ids):
        raise ValueError(f"--runs names one run twice (run ids {', '.join(ids)}); pass each run folder once")
    labels = Counter(run.label for run in runs)
    out = []
    for run in runs:
        if labels[run.label] > 1:
            folders = [r.path.name for r in runs if r.label == run.label]
            suffix = run.path.name if folders.count(run.path.name) == 1 else run.run_id
            run = replace(run, label=f"{run.label} [{suffix}]")
        out.append(run)
    return out


def unconfigured(runs: Sequence[RunInfo]) -> list[str]:
    """The labels of the runs whose recipe is unknown (no run_config.json)."""
    return [run.label for run in runs if not run.config]


def recipe_differences(runs: Sequence[RunInfo]) -> list[tuple[str, list[Any]]]:
    """The recipe keys whose values differ between ``runs``, with the runs' values; [] when one is unconfigured."""
    if len(runs) < 2 or unconfigured(runs):
        return []
    values = {key: [run.config.get(key, "(absent)") for run in runs] for key in sorted(RECIPE_KEYS)}
    return [(key, v) for key, v in values.items() if len({json.dumps(value) for value in v}) > 1]


# Validation loss curves and steps to a target loss


def val_loss_curve(run_dir: str | Path) -> list[tuple[int, float]]:
    """(step, validation MLM loss) by step; a step logged twice (a resumed run) keeps its last value."""
    by_step = {int(m["step"]): float(m[VAL_LOSS]) for m in read_metrics(run_dir) if m.get(VAL_LOSS) is not None}
    # A diverged run logs nan/inf: not a point on the curve.
    return sorted((step, loss) for step, loss in by_step.items() if math.isfinite(loss))


@dataclass(frozen=True)
class Crossing:
    """Where a validation curve first reaches a loss."""

    step: float
    """The step, linearly interpolated between the two evaluations around it."""
    bracket: tuple[int, int] | None
    """Those two evaluations' steps; None when an evaluation is at the loss or the first one is below it."""

    @property
    def wide(self) -> bool:
        """Interpolated across a gap wider than WIDE_GAP_SHARE of the figure: the figure is that uncertain."""
        return self.bracket is not None and self.bracket[1] - self.bracket[0] > WIDE_GAP_SHARE * self.step


def crossing(curve: list[tuple[int, float]], target: float) -> Crossing | None:
    """The first step at which the loss reaches ``target`` (None if it never does)."""
    previous = None
    for step, loss in curve:
        if loss <= target:
            if previous is None or loss == target:
                return Crossing(float(step), None)
            (s0, l0) = previous  # l0 > target >= loss
            return Crossing(s0 + (l0 - target) / (l0 - loss) * (step - s0), (s0, step))
        previous = (step, loss)
    return None


def default_target(curves: dict[str, list[tuple[int, float]]]) -> float | None:
    """The smallest validation loss that every run reaches (the slowest run's best)."""
    bests = [min(loss for _, loss in curve) for curve in curves.values() if curve]
    return max(bests) if bests and len(bests) == len(curves) else None


def steps_table(runs: list[RunInfo], curves: dict[str, list[tuple[int, float]]], target: float) -> list[dict[str, Any]]:
    """Steps to ``target`` per run, the ratio to the slowest run that reaches it, and whether it is ``approximate``."""
    found = {run.label: crossing(curves[run.label], target) for run in runs}
    slowest = max((c.step for c in found.values() if c is not None), default=None)
    return [{"run": label, "steps": None if c is None else c.step,
             "ratio": c.step / slowest if c is not None and slowest else None,
             "approximate": c is not None and c.wide, "bracket": None if c is None else c.bracket}
            for label, c in found.items()]  # fmt: skip


# Fine-tuning results: the jobs of the runs; best lr per (run, step), mean and t-interval over seeds; the dev sets' baselines


def report_jobs(folder: ResultsFolder, runs: Sequence[RunInfo], tasks: list[str],
                recipe_hash: str | None) -> list[dict[str, Any]]:  # fmt: skip
    """Every job of the report's runs and tasks that the results folder names, whatever its status, of one recipe:
    mixing recipes in one point would average unlike numbers."""
    rows = [state.row() for state in folder.jobs().values()]
    ids = {run.run_id for run in runs}  # by run id: not by name, and wherever the folder is mounted
    rows = [r for r in rows if r["task"] in tasks and r["run_id"] in ids]
    if recipe_hash is not None:
        return [r for r in rows if r["recipe_hash"] == recipe_hash]
    recipes = sorted({r["recipe_hash"] for r in rows})
    if len(recipes) > 1:
        raise ValueError(f"the results folder holds results of several fine-tuning recipes {recipes}; choose one "
                         "with --recipe_hash")  # fmt: skip
    return rows


def confidence_interval(values: list[float], level: float = 0.95) -> float:
    """Half-width of the t-distribution interval of the mean; nan (undefined, drawn without a bar) for one value."""
    from scipy import stats  # here: it takes seconds to import, and the command reads its options first

    n = len(values)
    if n < 2:
        return float("nan")
    return float(stats.t.ppf(0.5 + level / 2, n - 1) * np.std(values, ddof=1) / math.sqrt(n))


def clipped_interval(mean: float, half_width: float, low: float = 0.0, high: float = 1.0) -> tuple[float, float, bool]:
    """``(lower, upper, clipped)``: ``mean ± half_width`` cut to [low, high] (a t-interval over two seeds can reach
    past both ends of an accuracy's range); nan bounds for an undefined one."""
    if math.isnan(half_width):
        return float("nan"), float("nan"), False
    lower, upper = mean - half_width, mean + half_width
    return max(lower, low), min(upper, high), lower < low or upper > high


def entropy(shares: Iterable[float]) -> float:
    """In nats, as the dev loss: the cross-entropy of always predicting the label prior."""
    return -sum(p * math.log(p) for p in shares if p > 0)


def prior_loss(majority_share: float) -> float:
    """The dev loss of predicting the label prior of a two-class dev set whose majority class has this share."""
    return entropy((majority_share, 1 - majority_share))


def full_dev_baselines(task: str, data_dir: str) -> dict[str, Any]:
    """The baselines of the whole dev set in ``data_dir`` (GLUE's original layout)."""
    from finetune.glue import baseline_metrics, load_task  # scikit-learn: only when asked

    labels = np.array([e.label for e in load_task(task, data_dir)["dev"]])
    metrics = baseline_metrics(get_task(task), labels, labels)
    return {"full_examples": len(labels), "full_majority_accuracy": metrics["majority_accuracy"],
            "full_majority_f1": metrics.get("majority_f1"),
            "full_prior_loss": entropy(np.bincount(labels) / len(labels))}  # fmt: skip


def task_baselines(rows: list[dict[str, Any]], task: str, data_dir: str | None = None) -> dict[str, Any]:
    """The dev set's majority-class accuracy (and F1), label-prior loss and chance as the task's jobs measured them;
    ``eval_examples``: the N of recipe.max_eval_examples when they saw the first N dev examples only (None: all);
    ``full_*``: with ``data_dir``, a truncated set's baselines over the whole dev set."""
    mine = [r for r in rows if r["task"] == task]

    def typical(column: str) -> float | None:
        values = [r[column] for r in mine if r.get(column) is not None]
        # One recipe, one dev set: the values agree; the median is robust to a job with a capped dev set.
        return float(np.median(values)) if values else None

    majority = typical("majority_accuracy")
    two_classes = len(get_task(task).label_names) == 2
    base: dict[str, Any] = {
        "majority_accuracy": majority,
        "majority_f1": typical("majority_f1"),
        "chance": 0.5,
        "prior_loss": prior_loss(majority) if majority is not None and two_classes else None,
        "eval_examples": next(iter({r["recipe"].get("max_eval_examples") for r in mine}), None),  # one recipe
        **dict.fromkeys(("full_examples", "full_majority_accuracy", "full_majority_f1", "full_prior_loss")),
    }
    if base["eval_examples"] is not None and data_dir is not None:
        base.update(full_dev_baselines(task, data_dir))
        if base["full_examples"] <= base["eval_examples"]:  # the limit cut nothing: the jobs saw the whole set
            base["eval_examples"] = None
    return base


def best_lr_points(jobs: list[dict[str, Any]], runs: list[RunInfo], task: str,
                   one_class_share: float) -> list[dict[str, Any]]:  # fmt: skip
    """For each (run, step) with a result: the lr with the best mean dev accuracy, its mean and CI over seeds, dev
    loss, one-class seeds, seeds whose fine-tuning diverged (a loss not finite); ``jobs`` not done yet give
    ``planned_seeds`` and ``not_done`` (``incomplete``)."""
    label_of = {run.run_id: run.label for run in runs}
    groups: dict[tuple[str, int], dict[float, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    planned: dict[tuple[str, int, float], set[int]] = defaultdict(set)
    not_done: Counter[tuple[str, int]] = Counter()
    # By run id: a run folder moved or mounted elsewhere is the same run; another run of the same name is not.
    for job in (j for j in jobs if j["task"] == task and j["run_id"] in label_of):
        point = (label_of[job["run_id"]], job["pretrain_step"])
        planned[(*point, job["lr"])].add(job["seed"])
        not_done[point] += job["status"] != "done"
        if job["status"] == "done":
            groups[point][job["lr"]].append(job)
    points = []
    for (label, step), by_lr in sorted(groups.items()):
        lr, group = max(by_lr.items(), key=lambda item: (np.mean([r["accuracy"] for r in item[1]]), -item[0]))
        accuracies = [r["accuracy"] for r in group]
        f1s = [r["f1"] for r in group if r["f1"] is not None]
        dev_losses = [r["dev_loss"] for r in group]
        accuracy, accuracy_ci = float(np.mean(accuracies)), confidence_interval(accuracies)
        low, high, clipped = clipped_interval(accuracy, accuracy_ci)
        one_class = sum(r["top_class_share"] >= one_class_share for r in group)
        points.append({
            "run": label, "task": task, "step": step, "lr": lr, "seeds": len(group),
            "planned_seeds": max(len(planned[(label, step, lr)]), len(group)), "not_done": not_done[(label, step)],
            "incomplete": not_done[(label, step)] > 0, "accuracy": accuracy, "accuracy_ci": accuracy_ci,
            "accuracy_low": low, "accuracy_high": high, "accuracy_clipped": clipped,
            "f1": float(np.mean(f1s)) if f1s else None, "f1_ci": confidence_interval(f1s) if f1s else None,
            "dev_loss": float(np.mean(dev_losses)), "dev_loss_ci": confidence_interval(dev_losses),
            "one_class_seeds": one_class, "one_class": one_class == len(group),
            "diverged_seeds": sum(not math.isfinite(r["dev_loss"]) for r in group),
        })  # fmt: skip
    return points
