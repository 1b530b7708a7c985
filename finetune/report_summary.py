"""The summary text of the Figure 5 report (finetune/report.py, summary.md): what its inputs cannot show (jobs not
done, runs without results, recipes that differ), the steps-to-loss sentence and table, the inputs, the recipes, the
baselines and the per-step results."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from finetune.config import DEFAULT_LRS, DEFAULT_SEEDS, FinetuneConfig
from finetune.manifest import recipe_hash
from finetune.report_numbers import WIDE_GAP_SHARE, RunInfo, clipped_interval, recipe_differences, unconfigured
from pretrain.common.cli import read_yaml
from pretrain.run_folder.layout import RUN_CONFIG_FILE

NOT_DONE = ("queued", "submitted", "failed")
"""The statuses of a job without a result (finetune.manifest.Status), in the order the report counts them."""
PRESETS = Path(__file__).resolve().parents[1] / "configs" / "finetune"
"""The fine-tuning presets (bert_glue.yaml: the paper's recipe; quick.yaml: the quick comparison's)."""


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


# What the inputs cannot show


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


def preset_of(jobs: list[dict[str, Any]]) -> str:
    """The --config that gives more runs results beside ``jobs``': the preset with their recipe (a report reads one
    recipe), named relative to the checkout; a placeholder that says so where no preset has it."""
    done = {job["recipe_hash"] for job in jobs if job["status"] == "done"}
    for path in sorted(PRESETS.glob("*.yaml")):
        if recipe_hash(FinetuneConfig(**read_yaml(path.read_text()).get("recipe", {})).result_key()) in done:
            return str(path.relative_to(PRESETS.parents[1]))
    return f"CONFIG (the config of recipe {', '.join(sorted(done))}, which fine-tuned the others)"


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
            "absent from panels (b)-(d) and the dev results, and no accuracy of theirs is compared. Fine-tune them "
            f"with the others' recipe: `python -m finetune.schedule --config={preset_of(jobs)} --runs='[{paths}]' "
            f"--results_dir={root} --data_dir=GLUE`, or pass the --results_dir that holds their results.")


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
    """The accuracy interval's lower end; where there is none (one seed), no accuracy: one seed beats nothing."""
    low = point.get("accuracy_low")
    return -math.inf if low is None or math.isnan(low) else low


# Sections


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
    return [*lines, "", *devices_lines(jobs)]


def devices_lines(jobs: list[dict[str, Any]]) -> list[str]:
    """What the finished jobs computed on, with a caveat where they differ: the same job on another device differs
    in its last digits, so seeds compared across devices differ by that as well as by chance."""
    devices = Counter(job["device"] for job in jobs if job["status"] == "done")
    if not devices:
        return []
    total = sum(devices.values())
    lines = ["Computed on: " + "; ".join(f"{name} ({n} of {total} jobs)" for name, n in devices.most_common()) + "."]
    if len(devices) > 1:
        lines.append("These are several devices: a job's numbers differ in their last digits from one to another, so "
                     "the points and their intervals mix that with the seeds' own spread.")
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


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.2f}"


def _mean_ci(mean: float, ci: float, scale: float = 100, digits: int = 2) -> str:
    """Percent (or ``scale`` 1: the value), with the interval when there is one (a single seed has none)."""
    return f"{scale * mean:.{digits}f}" + ("" if math.isnan(ci) else f" ± {scale * ci:.{digits}f}")


def _share_cell(mean: float, half_width: float) -> str:
    """A share (accuracy, F1): mean ± half-width; an interval past [0, 1] is given by its bounds clipped to it (†),
    so the table never shows a share > 100%."""
    low, high, clipped = clipped_interval(mean, half_width)
    return f"{100 * mean:.2f} [{100 * low:.2f}, {100 * high:.2f}]†" if clipped else _mean_ci(mean, half_width)


def _seeds_cell(point: dict[str, Any]) -> str:
    """Seeds done, of those planned when fewer are done; * when jobs of the point are not done."""
    done = str(point["seeds"]) + ("" if point["seeds"] == point["planned_seeds"] else f"/{point['planned_seeds']}")
    return done + (" *" if point["incomplete"] else "")


def _flag_cell(point: dict[str, Any]) -> str:
    seeds, diverged = point["seeds"], point["diverged_seeds"]
    parts = [f"**diverged** ({diverged}/{seeds} seeds: dev loss not finite)"] if diverged else []
    if point["one_class_seeds"]:
        one_class = f"{point['one_class_seeds']}/{seeds} seeds"
        parts.append(f"**one class** ({one_class})" if point["one_class"] else one_class)
    return " ".join(parts)


def _steps_cell(row: dict[str, Any]) -> str:
    """The steps, ``~`` before a figure interpolated across a wide gap."""
    return "—" if row["steps"] is None else ("~" if row["approximate"] else "") + f"{row['steps']:.0f}"


def steps_sentence(table: list[dict[str, Any]], target: float, runs: Sequence[RunInfo]) -> str:
    """Which run reaches the target first, in how many steps, against which, and what else differs (recipe_caveat)."""
    reached = sorted((row for row in table if row["steps"] is not None), key=lambda row: row["steps"])
    missed = [row["run"] for row in table if row["steps"] is None]
    never = (f" {', '.join(missed)} {'does' if len(missed) == 1 else 'do'} not reach it in the steps logged "
             "(— below).") if missed else ""  # fmt: skip
    if len(reached) < 2:
        return f"Fewer than two runs reach validation loss {target:.4g}: no comparison of their steps.{never}"
    fastest, slowest = reached[0], reached[-1]
    if not fastest["steps"]:
        return f"{fastest['run']} starts at or below validation loss {target:.4g}: no comparison of steps."
    about = "~" if fastest["approximate"] or slowest["approximate"] else ""
    pair = [run for row in (fastest, slowest) for run in runs if run.label == row["run"]]
    return (f"In this comparison, {fastest['run']} reaches validation loss {target:.4g} in {_steps_cell(fastest)} "
            f"steps, {about}{slowest['steps'] / fastest['steps']:.2f}x fewer than {slowest['run']} "
            f"({_steps_cell(slowest)} steps).{never} {recipe_caveat(pair)}").rstrip()


def steps_section(table: list[dict[str, Any]], target: float, runs: Sequence[RunInfo]) -> list[str]:
    """The steps-to-loss sentence and table, and one footnote per figure interpolated across a wide gap."""
    lines = [
        f"## Steps to validation MLM loss {target:.4g}",
        "",
        steps_sentence(table, target, runs),
        "Steps are interpolated linearly between evaluations. They measure these runs (their model, data and "
        "schedule) against each other; the paper's step counts are of BERT-base on its own corpus and scale.",
        "",
        "| run | steps | steps / slowest | slowest / steps |",  # slowest: of the runs that reach it
        "|---|---:|---:|---:|",
    ]
    reached = [row for row in table if row["steps"] is not None]
    slowest = max(reached, key=lambda row: row["steps"]) if reached else None
    for row in table:
        speedup = 1 / row["ratio"] if row["ratio"] else None
        # The slowest's own ratio is 1 exactly; another's is as approximate as either of its two steps.
        rough = row["steps"] is not None and row is not slowest and (row["approximate"] or slowest["approximate"])
        about = "~" if rough else ""
        lines.append(f"| {row['run']} | {_steps_cell(row)} | {about}{_fmt(row['ratio'], '.3f')} | "
                     f"{about}{_fmt(speedup, '.2f')}{'x' if speedup else ''} |")  # fmt: skip
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
        "Best lr by mean accuracy on the dev set it is then scored on (as in the paper: dev results over a "
        "learning-rate grid; the choice favours the number slightly, more so with few seeds); mean ± 95% t-interval "
        "over seeds; † the interval reaches past [0, 100] and is given by its bounds clipped to it. One class: at "
        f"least {100 * one_class_share:.0f}% of a seed's dev predictions fall in one class (n/n: every seed's); "
        "diverged: a seed's dev loss is not finite. Seeds d/p: d of the p seeds of that lr are done; * incomplete: "
        "jobs of that run and step (any lr) are not done, so its best lr and mean may change.",
        "",
        "| task | run | step | best lr | seeds | accuracy (%) | F1 (%) | dev loss | one class |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for p in points:
        f1 = "—" if p["f1"] is None else _share_cell(p["f1"], p["f1_ci"])
        lines.append(f"| {p['task'].upper()} | {p['run']} | {p['step']} | {p['lr']:g} | {_seeds_cell(p)} | "
                     f"{_share_cell(p['accuracy'], p['accuracy_ci'])} | {f1} | "
                     f"{_mean_ci(p['dev_loss'], p['dev_loss_ci'], 1, 4)} | "
                     f"{_flag_cell(p)} |")  # fmt: skip
    return [*lines, ""]


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
