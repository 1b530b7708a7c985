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
import inspect
import itertools
import json
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from finetune.config import DEFAULT_LRS, DEFAULT_SEEDS, FinetuneConfig, ResultsOption, check_tasks
from finetune.glue import get_task
from finetune.manifest import DONE, JobSpec, Results, ResultsFolder
from finetune.tracking import RUN_CONFIG_FIX, pretraining_run
from pretrain.common import atomic
from pretrain.common.cli import flatten, parse, require, run_cli
from pretrain.common.reporting import pyplot, save_figure
from pretrain.common.roles import keys_where
from pretrain.config import PretrainConfig
from pretrain.run_folder.identity import read_run_id
from pretrain.run_folder.layout import RUN_CONFIG_FILE, read_metrics, read_run_config, read_status
from pretrain.tracking.wandb_logging import check_credentials, short_hash, wandb_mode
from pretrain.variants import variant_name

VAL_LOSS = "val/mlm_loss"
WIDE_GAP_SHARE = 0.1
"""A steps-to-loss figure interpolated across a gap wider than this share of the figure itself is marked ``~``."""
MIN_LOSS_SPAN = 0.1
"""Panel (d)'s y-axis spans at least this many nats, so that seed noise of 1e-4 is not stretched into a trend."""
VARIANT_KEYS = frozenset(f"model.{name}" for name in inspect.signature(variant_name).parameters)
"""The config keys that make a run's model variant (its label): what a comparison of placements varies on purpose."""
RECIPE_KEYS = keys_where(PretrainConfig, lambda rules: rules.recipe) - VARIANT_KEYS
"""The keys of what a run learns (roles recipe and limit, pretrain/common/roles.py) besides the model variant."""
NOT_DONE = ("queued", "submitted", "failed")
"""The statuses of a job without a result (finetune.manifest.Status), in the order the report counts them."""


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
        super().__post_init__()
        require(bool(self.runs), "runs", "is empty; pass the pretraining run folders with --runs='[RUN1, RUN2]'")
        check_tasks("tasks", self.tasks)
        require(self.target_loss is None or self.target_loss > 0, "target_loss", f"must be > 0; got {self.target_loss}")
        require(0.5 < self.one_class_share <= 1, "one_class_share",
                f"must be in (0.5, 1] (a share of dev predictions); got {self.one_class_share}")  # fmt: skip


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
    given = {key.removeprefix("model."): config[key] for key in VARIANT_KEYS if key in config}
    variant = variant_name(**given) if config else placement
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


def differences_text(runs: Sequence[RunInfo], differences: list[tuple[str, list[Any]]]) -> str:
    """``(A vs B: optim.lr 0.0001 vs 0.0003, optim.warmup_steps 100 vs 0)``, each value as a user writes it (YAML)."""

    def written(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:g}"
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True)

    pairs = ", ".join(f"{key} {' vs '.join(map(written, values))}" for key, values in differences)
    return f"({' vs '.join(run.label for run in runs)}: {pairs})"


def recipe_caveat(runs: Sequence[RunInfo], what: str = "the ratio") -> str:
    """What a comparison of ``runs`` (``what`` it compares) owes besides the placement; empty when nothing."""
    if unconfigured(runs):
        return (f"Their recipes are unknown ({', '.join(unconfigured(runs))}: no {RUN_CONFIG_FILE}, which a run writes "
                f"when it starts), so {what} may not be the placement's alone.")  # fmt: skip
    if differences := recipe_differences(runs):
        return (f"Their recipes differ besides the model variant {differences_text(runs, differences)}, so {what} is "
                "not the placement's alone.")  # fmt: skip
    return ""


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


# Fine-tuning jobs: which are done, which are not


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


def progress_warning(jobs: list[dict[str, Any]], runs: Sequence[RunInfo], tasks: list[str], root: Path) -> str | None:
    """How many jobs of which runs and tasks are queued, submitted and failed; None when every job is done."""
    pending = Counter((job["run_id"], job["task"], job["status"]) for job in jobs if job["status"] != "done")
    if not pending:
        return None
    parts = []
    for run, task in itertools.product(runs, tasks):
        if counts := [f"{pending[run.run_id, task, s]} {s}" for s in NOT_DONE if pending[run.run_id, task, s]]:
            parts.append(f"{run.label} {task.upper()}: {', '.join(counts)}")
    failed = any(status == "failed" for *_, status in pending)
    return (f"**Incomplete: {sum(pending.values())} of {len(jobs)} jobs are not done** in {root} "
            f"({'; '.join(parts)}). The points they belong to are marked * in the table (their best lr and mean may "
            "still change) and no verdict is final. Run the report again when `python -m finetune.schedule status "
            f"--results_dir={root}` shows them done"
            + ("; failed jobs run again with finetune.schedule's --retry_failed=true." if failed else "."))


def refused_warning(jobs: list[dict[str, Any]], runs: Sequence[RunInfo]) -> str | None:
    """The points that lack jobs failed for good (their snapshot refused: gone, incomplete or damaged) and why;
    None when no job did."""
    labels, refused = {run.run_id: run.label for run in runs}, {}
    for job in jobs:
        if job["status"] == "failed" and job["permanent"]:
            refused.setdefault((labels[job["run_id"]], job["pretrain_step"]), []).append(job)
    parts = []
    for (label, step), group in sorted(refused.items()):
        tasks = ", ".join(f"{task.upper()}: {n} jobs" for task, n in sorted(Counter(j["task"] for j in group).items()))
        parts.append(f"{label} step {step} ({tasks}): {'; '.join(sorted({j['error'] for j in group}))}")
    return (f"**Failed for good**, so missing from their points until the snapshot's files change (e.g. restored "
            f"from a copy) and finetune.schedule runs them: {' | '.join(parts)}") if parts else None  # fmt: skip


def no_results_warning(jobs: list[dict[str, Any]], runs: Sequence[RunInfo], root: Path) -> str | None:
    """What to do when no job of the runs is done: wait for the jobs named, or schedule them; None when one is."""
    if any(job["status"] == "done" for job in jobs):
        return None
    if jobs:
        return (f"**No fine-tuning job of these runs is done yet** ({len(jobs)} named in {root}): panels (b)-(d) are "
                "not drawn until one is.")  # fmt: skip
    paths = ", ".join(str(run.path) for run in runs)
    return (f"**No fine-tuning results of these runs** in {root}: panels (b)-(d) are not drawn. Fine-tune their "
            "snapshots first: `python -m finetune.schedule --config=configs/finetune/bert_glue.yaml "
            f"--runs='[{paths}]' --results_dir={root} --data_dir=GLUE` (docs/finetuning.md), or pass the --results_dir "
            "that holds them.")


def runs_without_results_warning(jobs: list[dict[str, Any]], runs: Sequence[RunInfo], root: Path) -> str | None:
    """The runs with no done job when another run has one: named, not silently absent from panels (b)-(d) and the
    dev results (no_results_warning speaks when no run has one)."""
    done = {job["run_id"] for job in jobs if job["status"] == "done"}
    missing = [run for run in runs if run.run_id not in done]
    if not done or not missing:
        return None
    named = Counter(job["run_id"] for job in jobs)
    which = "; ".join(f"{run.label}: none of its {named[run.run_id]} jobs is done" if named[run.run_id] else
                      f"{run.label}: no job" for run in missing)  # fmt: skip
    paths = ", ".join(str(run.path) for run in missing)
    return (f"**No fine-tuning results for {len(missing)} of the {len(runs)} runs** in {root} ({which}): they are "
            "absent from panels (b)-(d) and the dev results, and no accuracy of theirs is compared. Fine-tune them: "
            f"`python -m finetune.schedule --config=configs/finetune/bert_glue.yaml --runs='[{paths}]' "
            f"--results_dir={root} --data_dir=GLUE`, or pass the --results_dir that holds their results.")


def inputs_section(runs: Sequence[RunInfo], jobs: list[dict[str, Any]], tasks: list[str], root: Path) -> list[str]:
    """What the report read: the results folder, and per run its folder and the jobs found for it by task."""
    found = Counter((job["run_id"], job["task"]) for job in jobs)
    done = Counter((job["run_id"], job["task"]) for job in jobs if job["status"] == "done")
    lines = ["## Inputs", "", f"Results folder read: `{root}` (--results_dir). Fine-tuning jobs found there per run and "
             "task, done of all:", "", f"| run | run folder | {' | '.join(t.upper() for t in tasks)} |",
             "|---|---|" + "---:|" * len(tasks)]  # fmt: skip
    for run in runs:
        cells = [f"{done[run.run_id, t]} of {found[run.run_id, t]}" if found[run.run_id, t] else "none" for t in tasks]
        lines.append(f"| {run.label} | `{run.path}` | {' | '.join(cells)} |")
    return [*lines, ""]


def finetuning_recipe_section(jobs: list[dict[str, Any]]) -> list[str]:
    """The fine-tuning recipe of these results (one: report_jobs keeps one) beside the paper's as
    configs/finetune/bert_glue.yaml runs it (original BERT's: FinetuneConfig's defaults, DEFAULT_LRS x DEFAULT_SEEDS)."""
    if not jobs:
        return []
    recipe, paper = jobs[0]["recipe"], FinetuneConfig()

    def examples(n: int | None) -> str:
        return "all" if n is None else f"first {n:,}"

    lrs = ", ".join(f"{lr:g}" for lr in sorted({job["lr"] for job in jobs}))
    rows = [
        ("learning rates", lrs, ", ".join(f"{lr:g}" for lr in DEFAULT_LRS)),
        ("seeds per point", len({job["seed"] for job in jobs}), len(DEFAULT_SEEDS)),
        ("epochs", recipe.get("epochs", "—"), paper.epochs),
        ("batch size", recipe.get("batch_size", "—"), paper.batch_size),
        ("training examples", examples(recipe.get("max_train_examples")), examples(paper.max_train_examples)),
        ("dev examples", examples(recipe.get("max_eval_examples")), examples(paper.max_eval_examples)),
    ]
    lines = ["## Fine-tuning recipe", "",
             "| | these results | the paper's (original BERT's recipe, configs/finetune/bert_glue.yaml) |", "|---|---|---|",
             *(f"| {name} | {ours} | {theirs} |" for name, ours, theirs in rows), ""]  # fmt: skip
    if any(str(ours) != str(theirs) for _, ours, theirs in rows):
        lines += ["Not the paper's recipe: fewer seeds give wider intervals, fewer examples or epochs lower accuracies. "
                  "Compare these runs with each other, not with the paper's numbers.", ""]  # fmt: skip
    return lines


# Fine-tuning results: best lr per (run, step), mean and t-interval over seeds; the dev sets' baselines


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
    loss, one-class seeds; ``jobs`` not done yet give ``planned_seeds`` and ``not_done`` (``incomplete``)."""
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
        })  # fmt: skip
    return points


# Figures

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


# Summary


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.2f}"


def _mean_ci(mean: float, ci: float, scale: float = 100, digits: int = 2) -> str:
    """Percent (or ``scale`` 1: the value), with the interval when there is one (a single seed has none)."""
    return f"{scale * mean:.{digits}f}" + ("" if math.isnan(ci) else f" ± {scale * ci:.{digits}f}")


def _accuracy_cell(point: dict[str, Any]) -> str:
    """Mean ± half-width; a clipped interval is given by its bounds, so the table never shows a share > 100%."""
    if not point["accuracy_clipped"]:
        return _mean_ci(point["accuracy"], point["accuracy_ci"])
    return f"{100 * point['accuracy']:.2f} [{100 * point['accuracy_low']:.2f}, {100 * point['accuracy_high']:.2f}]†"


def _seeds_cell(point: dict[str, Any]) -> str:
    """Seeds done, of those planned when fewer are done; * when jobs of the point are not done."""
    done = str(point["seeds"]) + ("" if point["seeds"] == point["planned_seeds"] else f"/{point['planned_seeds']}")
    return done + (" *" if point["incomplete"] else "")


def _flag_cell(point: dict[str, Any]) -> str:
    if point["one_class"]:
        return f"**one class** ({point['one_class_seeds']}/{point['seeds']} seeds)"
    return f"{point['one_class_seeds']}/{point['seeds']} seeds" if point["one_class_seeds"] else ""


def _steps_cell(row: dict[str, Any]) -> str:
    """The steps, ``~`` before a figure interpolated across a wide gap."""
    return "—" if row["steps"] is None else ("~" if row["approximate"] else "") + f"{row['steps']:.0f}"


def steps_sentence(table: list[dict[str, Any]], target: float, runs: Sequence[RunInfo]) -> str:
    """Which run reaches the target first, in how many steps, against which, and what else differs (recipe_caveat)."""
    reached = sorted((row for row in table if row["steps"] is not None), key=lambda row: row["steps"])
    if len(reached) < 2:
        return f"Fewer than two runs reach validation loss {target:.4g}: no comparison of their steps."
    fastest, slowest = reached[0], reached[-1]
    if not fastest["steps"]:
        return f"{fastest['run']} starts at or below validation loss {target:.4g}: no comparison of steps."
    about = "~" if fastest["approximate"] or slowest["approximate"] else ""
    pair = [run for row in (fastest, slowest) for run in runs if run.label == row["run"]]
    return (f"In this comparison, {fastest['run']} reaches validation loss {target:.4g} in {_steps_cell(fastest)} "
            f"steps, {about}{slowest['steps'] / fastest['steps']:.2f}x fewer than {slowest['run']} "
            f"({_steps_cell(slowest)} steps). {recipe_caveat(pair)}").rstrip()


def steps_section(table: list[dict[str, Any]], target: float, runs: Sequence[RunInfo]) -> list[str]:
    """The steps-to-loss sentence and table, and one footnote per figure interpolated across a wide gap."""
    lines = [
        f"## Steps to validation MLM loss {target:.4g}",
        "",
        steps_sentence(table, target, runs),
        "Steps are interpolated linearly between evaluations. They measure these runs (their model, data and "
        "schedule) against each other; the paper's step counts are of BERT-base on its own corpus and scale.",
        "",
        "| run | steps | steps / slowest | slowest / steps |",
        "|---|---:|---:|---:|",
    ]
    for row in table:
        speedup = 1 / row["ratio"] if row["ratio"] else None
        lines.append(f"| {row['run']} | {_steps_cell(row)} | {_fmt(row['ratio'], '.3f')} | "
                     f"{_fmt(speedup, '.2f')}{'x' if speedup else ''} |")  # fmt: skip
    lines.append("")
    for row in (row for row in table if row["approximate"]):
        lines += [
            f"~ {row['run']}: interpolated between the evaluations at steps {row['bracket'][0]} and "
            f"{row['bracket'][1]}, more than {100 * WIDE_GAP_SHARE:.0f}% of the figure apart: the run reaches the loss "
            "somewhere in between. Evaluate more often (--train.eval_every; launch/compare_placements.sh sizes it to "
            "the run's length) for a closer figure.",
            "",
        ]
    return lines


def recipes_section(runs: Sequence[RunInfo]) -> list[str]:
    """Whether the runs share their recipe besides the model variant, and every key in which they do not."""
    if len(runs) < 2:
        return []
    verdict = recipe_caveat(runs, "a difference between their curves")
    return ["## Recipes", "", verdict or "The runs share their recipe besides the model variant.",
            "(Compared: the pretraining config keys of role recipe and limit, pretrain/common/roles.py, other than the "
            "variant's: placement, norm type, QK-norm, residual scheme.)", ""]  # fmt: skip


def baselines_section(baselines: dict[str, dict[str, Any]]) -> list[str]:
    """The baselines of the dev examples the jobs were scored on, and the full dev sets' where they differ."""
    lines = [
        "## Baselines on the dev sets",
        "",
        "Majority class: always answer the dev set's most common label; label prior: the dev loss of predicting the "
        "labels' shares (their entropy, nats); chance: a uniform guess between the two.",
        "",
        "| task | dev examples | majority-class accuracy (%) | majority-class F1 (%) | label-prior loss | chance accuracy (%) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for task, base in baselines.items():
        rows = {"": "all" if base["eval_examples"] is None else f"first {base['eval_examples']}"}
        if base["eval_examples"] is not None and base["full_examples"] is not None:
            rows["full_"] = f"all {base['full_examples']}"  # the whole dev set, from --data_dir
        lines += [f"| {task.upper()} | {scored} | {_pct(base[f'{of}majority_accuracy'])} | "
                  f"{_pct(base[f'{of}majority_f1'])} | {_fmt(base[f'{of}prior_loss'], '.4f')} | "
                  f"{_pct(base['chance'])} |" for of, scored in rows.items()]  # fmt: skip
    lines.append("")
    truncated = [base for base in baselines.values() if base["eval_examples"] is not None]
    if truncated:
        n = ", ".join(map(str, sorted({base["eval_examples"] for base in truncated})))
        full = all(base["full_examples"] is not None for base in truncated)
        lines += [
            f"The jobs were scored on the first {n} dev examples (recipe.max_eval_examples={n}): their accuracies, "
            "the majority class and the label prior above are those of that subset, not of the full dev set. "
            + ("The rows 'all' are the full dev sets (--data_dir)." if full else
               "For the full dev sets' figures pass --data_dir=GLUE (the folder in the original layout)."),
            "",
        ]  # fmt: skip
    return lines


def points_section(points: list[dict[str, Any]], one_class_share: float) -> list[str]:
    lines = [
        "## Dev results per pretraining step",
        "",
        "Best lr by mean accuracy; mean ± 95% t-interval over seeds; † the interval reaches past [0, 100] and is "
        f"given by its bounds clipped to it. One class: at least {100 * one_class_share:.0f}% of a seed's dev "
        "predictions fall in one class (n/n: every seed's). Seeds d/p: d of the p seeds of that lr are done; "
        "* incomplete: jobs of that run and step (any lr) are not done, so its best lr and mean may change.",
        "",
        "| task | run | step | best lr | seeds | accuracy (%) | F1 (%) | dev loss | one class |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for p in points:
        f1 = "—" if p["f1"] is None else _mean_ci(p["f1"], p["f1_ci"])
        lines.append(f"| {p['task'].upper()} | {p['run']} | {p['step']} | {p['lr']:g} | {_seeds_cell(p)} | "
                     f"{_accuracy_cell(p)} | {f1} | {_mean_ci(p['dev_loss'], p['dev_loss_ci'], 1, 4)} | "
                     f"{_flag_cell(p)} |")  # fmt: skip
    return [*lines, ""]


def warnings_for(points: list[dict[str, Any]], tasks: list[str], baselines: dict[str, dict[str, Any]] | None = None,
                 not_done: int = 0, jobs: int = 0) -> list[str]:  # fmt: skip
    """Sentences for when the results cannot tell the runs apart: every point (or every point of a task) predicts one
    class, or none beats the majority class beyond its interval; provisional while ``not_done`` jobs have no result."""
    if points and all(p["one_class"] for p in points):
        if not_done:
            return [f"**No verdict yet** ({not_done} of {jobs} jobs not done): every seed of every point done so far "
                    "predicts (almost) one class; wait for the rest before concluding that no snapshot beats the "
                    "majority class."]  # fmt: skip
        return ["**No snapshot beats the majority class**: at every point every seed predicts (almost) one class, so "
                "the accuracies are the dev sets' label balance, not what pretraining gave: pretrain longer or use a "
                "larger model (the dev loss may still differ between runs)."]  # fmt: skip
    out = []
    for task in tasks:
        mine = [p for p in points if p["task"] == task]
        majority = (baselines or {}).get(task, {}).get("majority_accuracy")
        if mine and all(p["one_class"] for p in mine):
            out.append(f"Every {task.upper()} point predicts (almost) one class: its accuracies say nothing of the "
                       "runs.")  # fmt: skip
        elif mine and majority is not None and not any(_lower_bound(p) > majority for p in mine):
            out.append(f"No {task.upper()} point beats the majority class ({100 * majority:.2f}%) beyond its 95% "
                       "interval: pretrain longer or use a larger model before reading its accuracies.")  # fmt: skip
    provisional = f" Provisional: {not_done} of {jobs} jobs are not done." if not_done else ""
    return [sentence + provisional for sentence in out]


def _lower_bound(point: dict[str, Any]) -> float:
    """The accuracy interval's lower end; the mean itself where there is no interval (one seed)."""
    low = point.get("accuracy_low")
    return point["accuracy"] if low is None or math.isnan(low) else low


def summary_markdown(runs: Sequence[RunInfo], figure5: dict[str, Any], tasks: list[str], one_class_share: float) -> str:
    target = figure5["target_loss"]
    lines = ["# Figure 5: pretraining speed and downstream accuracy by LayerNorm placement", ""]
    lines += [f"> {warning}\n" for warning in figure5["warnings"]]
    if not tasks:
        lines += ["Panel (a) alone (--tasks=[]): no fine-tuning results read.", ""]
    if target is None:
        lines += ["No validation loss is reached by every run yet: no steps-to-loss table.", ""]
    else:
        lines += steps_section(figure5["steps"], target, runs)
    lines += recipes_section(runs)
    if tasks:
        lines += inputs_section(runs, figure5["jobs"], tasks, figure5["results_dir"])
        lines += finetuning_recipe_section(figure5["jobs"])
    if figure5["points"]:
        lines += baselines_section(figure5["baselines"]) + points_section(figure5["points"], one_class_share)
    lines += ["## Figures", ""] + [f"![{image.stem}]({image.name})" for image in figure5["images"]]
    return "\n".join(lines) + "\n"


# The report's W&B run (--wandb)


POINT_COLUMNS = ["task", "run", "norm_placement", "variant", "step", "lr", "seeds", "planned_seeds", "incomplete",
                 "accuracy", "accuracy_ci", "accuracy_low", "accuracy_high", "f1", "f1_ci", "dev_loss", "dev_loss_ci",
                 "one_class_seeds", "one_class"]  # fmt: skip
# The per-seed table: a job's name and placement, its key fields (the recipe by its hash) and its results.
_KEYED = [f.name for f in dataclasses.fields(JobSpec) if f.metadata["role"] == "key" and f.name != "recipe"]
SEED_COLUMNS = ["run_name", "placement", *_KEYED, "recipe_hash", *(f.name for f in dataclasses.fields(Results))]


def log_report(runs: Sequence[RunInfo], config: ReportConfig, figure5: dict[str, Any]) -> str:
    """One W&B run (job_type report) with a deterministic id, so re-running the report updates it: the Figure 5
    series against ``pretrain_step`` (one log call per step), the steps-to-loss table, the best-lr points, the raw
    per-seed rows (wandb.Table) and the figures. Returns the run's local folder."""
    import wandb

    wb = _start_report_run(runs, config, figure5["rows"])
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
        "tables/seed_rows": _table(figure5["rows"], SEED_COLUMNS),  # the report's runs, tasks and recipe only
        **{f"figures/{image.stem}": wandb.Image(str(image)) for image in figure5["images"]},
    })  # fmt: skip
    wb.summary.update(
        {"target_loss": config.target_loss, "warnings": " ".join(figure5["warnings"])}
        | {f"steps_to_loss/{row['run']}": row["steps"] for row in figure5["steps"]}
        | {f"baseline/{task}/{k}": value for task, base in figure5["baselines"].items() for k, value in base.items()}
    )
    directory = wb.dir
    wb.finish()
    return directory


def _start_report_run(runs: Sequence[RunInfo], config: ReportConfig, rows: list[dict[str, Any]]) -> Any:
    import wandb

    pretraining = [pretraining_run(str(run.path)) for run in runs]
    comparison = next((p["comparison"] for p in pretraining if p["comparison"]), "")
    project = config.wandb_project or next((p["project"] for p in pretraining if p["project"]), None) or "lnbert"
    recipes = sorted({r["recipe_hash"] for r in rows})
    recipe = config.recipe_hash or (recipes[0] if len(recipes) == 1 else None)
    placements, variants = [run.placement for run in runs], [run.variant for run in runs]
    run_config = {"norm_placement": placements, "variant": variants, "comparison": comparison,
                  "runs": [run.name for run in runs], "pretrain_run_ids": [p["id"] for p in pretraining],
                  "tasks": list(config.tasks), "target_loss": config.target_loss, "recipe_hash": recipe}  # fmt: skip
    # Deterministic: the same runs, recipe and tasks always update the same W&B report run.
    identity = [p["id"] or run.run_id for p, run in zip(pretraining, runs, strict=True)]
    run_id = short_hash({"runs": identity, "recipe": recipe, "tasks": sorted(config.tasks)}, 16)
    return wandb.init(
        project=project, id=f"report-{run_id}", resume="allow",
        name=f"figure5-{comparison or 'report'}", group=f"{comparison or 'figure5'}-report", job_type="report",
        tags=sorted({*placements, *variants, *([comparison] if comparison else [])}), config=run_config,
        dir=config.out, mode=wandb_mode(), reinit="finish_previous",
    )


def _table(rows: list[dict[str, Any]], columns: list[str]) -> Any:
    import wandb

    return wandb.Table(columns=columns, data=[[row.get(c) for c in columns] for row in rows])


# Driver


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
        result["wandb_dir"] = log_report(runs, config, result)
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
