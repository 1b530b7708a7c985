"""``ranking``: the models of one or more grids ranked by final validation loss over seeds, ties marked, and the
learning rates each trains at (options.RankingConfig says how)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pretrain.analysis.common import titled_table, write_outputs
from pretrain.analysis.options import RankingConfig
from pretrain.common.cli import to_dict
from pretrain.common.reporting import pyplot, save_figure
from pretrain.run_folder.layout import read_metrics

VERDICT_COLORS = {"trains": "tab:green", "mixed": "tab:orange", "fails": "tab:red"}
DIAGNOSTIC_FORMS = {"input_similarity": ".3f", "output_norm_last_over_first": ".2f", "grad_spread": ".3f",
                    "composite_gain": ".3g"}  # fmt: skip
"""The diagnostics table's columns after the model's name, each with its number format."""


@dataclass(frozen=True)
class Result:
    """One seed of one model at one setting."""

    model: str
    depth: int
    width: int
    warmup: int
    lr: float
    seed: int
    outcome: str  # outcomes.OUTCOMES
    gap: float | None  # final validation MLM loss - the seed's validation unigram cross-entropy
    source: str  # the grid folder, or the recorded file
    run_dir: str = ""  # the run's folder (grid cells only)
    probe: dict[str, Any] = field(default_factory=dict, compare=False)  # the grid's probe of the run
    train_curve: list[list[float]] = field(default_factory=list, compare=False)  # [step, training MLM loss]


def grid_results(folder: Path) -> list[Result]:
    """The finished cells of a grid's results.json."""
    path = folder / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run the grid with --report_only to write it")
    try:
        cells = json.loads(path.read_text())["cells"]
    except (json.JSONDecodeError, KeyError) as err:
        raise ValueError(f"{path} is damaged ({err}): run the grid with --report_only to write it again") from None
    found = []
    for name, cell in cells.items():
        model, width, depth, warmup, lr = cell["setting"]
        probe = cell.get("probe") or {}
        reference, loss = probe.get("val_unigram_cross_entropy"), cell.get("val_mlm_loss")
        gap = loss - reference if loss is not None and reference is not None else None
        if cell["outcome"] != "incomplete":
            found.append(Result(model, depth, width, warmup, lr, cell["seed"], cell["outcome"], gap, str(folder),
                                str(folder / "runs" / name), probe, cell.get("train_curve") or []))  # fmt: skip
    return found


def recorded_results(path: Path) -> list[Result]:
    """Cells recorded elsewhere: a JSON list of {model, depth, width, warmup, lr, seed, outcome, gap}."""
    return [Result(**{**item, "source": item.get("source", str(path))}) for item in json.loads(path.read_text())]


def verdict(outcomes: list[str]) -> str:
    """trains: every seed trained; fails: none did; else mixed."""
    trained = sum(o == "trained" for o in outcomes)
    return "trains" if trained == len(outcomes) else "fails" if trained == 0 else "mixed"


def summarise(results: list[Result]) -> dict[str, Any]:
    """One model at one setting: its seeds' gaps side by side, mean, range, verdict and the seeds it rests on."""
    ordered = sorted(results, key=lambda r: r.seed)
    gaps = [r.gap for r in ordered if r.gap is not None]
    return {
        "seeds": [r.seed for r in ordered],
        "outcomes": [r.outcome for r in ordered],
        "gaps": [r.gap for r in ordered],
        "mean_gap": statistics.fmean(gaps) if gaps else None,
        "range": max(gaps) - min(gaps) if gaps else None,
        "verdict": verdict([r.outcome for r in ordered]),
        "sources": sorted({r.source for r in ordered}),
    }


def rank(summaries: dict[str, dict[str, Any]], tie_floor: float) -> list[dict[str, Any]]:
    """Models by mean gap, best first; ``ties_with``: the better-placed models within the tie threshold (the
    larger of the two seed ranges and ``tie_floor``), ``place``: one plus the number of models clearly ahead."""
    ordered = sorted((s for s in summaries.values() if s["mean_gap"] is not None), key=lambda s: s["mean_gap"])
    for s in ordered:
        threshold = [(o, max(s["range"], o["range"], tie_floor)) for o in ordered if o is not s]
        s["ties_with"] = [o["model"] for o, t in threshold if abs(o["mean_gap"] - s["mean_gap"]) <= t]
        s["place"] = 1 + sum(o["mean_gap"] < s["mean_gap"] - t for o, t in threshold)
    return ordered


# What the residual designs' papers claim, per run


def smoothed_curve(curve: list[list[float]], window: int) -> list[tuple[int, float]]:
    """(step, trailing mean of the last ``window`` logged training losses)."""
    losses = [loss for _, loss in curve]
    return [(int(step), statistics.fmean(losses[max(0, i + 1 - window) : i + 1])) for i, (step, _) in enumerate(curve)]


def steps_to(curve: list[tuple[int, float]], target: float) -> int | None:
    """The first step whose smoothed loss is at or below ``target``; None when none is."""
    return next((step for step, loss in curve if loss <= target), None)


def grad_spread(rows: list[dict[str, Any]]) -> float | None:
    """The coefficient of variation (std / mean) of the per-layer FFN gradient norms in a run's metrics ``rows``,
    median over the last tenth of the logged steps: 0 when every layer gets the same gradient; None without rows."""
    rows = [r for r in rows if any(k.startswith("grad_norm/layer_") for k in r)]
    spreads = []
    for row in rows[len(rows) - max(1, len(rows) // 10) :]:
        norms = [v for k, v in row.items() if k.startswith("grad_norm/layer_") and k.endswith("/ffn")]
        if len(norms) > 1 and statistics.fmean(norms) > 0:
            spreads.append(statistics.pstdev(norms) / statistics.fmean(norms))
    return statistics.median(spreads) if spreads else None


def composite_gain(rows: list[dict[str, Any]]) -> float | None:
    """HC's and mHC's composite gain over the whole depth at the last logged step (``residual/composite_gain/row``)."""
    found = [r["residual/composite_gain/row"] for r in rows if "residual/composite_gain/row" in r]
    return found[-1] if found else None


def diagnostics(result: Result, target_curve: list[list[float]] | None, window: int) -> dict[str, float | None]:
    """One run's numbers for the papers' claims (options.RankingConfig)."""
    sublayers = result.probe.get("sublayers") or {}
    similarity, norms = sublayers.get("input_similarity"), sublayers.get("output_norm")
    rows = read_metrics(result.run_dir) if result.run_dir else []  # read once; [] without a metrics file
    target = smoothed_curve(target_curve, window)[-1][1] if target_curve else None
    known = target is not None and bool(result.train_curve)
    return {
        "input_similarity": statistics.fmean(similarity) if similarity else None,
        "output_norm_last_over_first": (norms[-2] + norms[-1]) / (norms[0] + norms[1])
        if norms and norms[0] + norms[1] > 0 else None,
        "grad_spread": grad_spread(rows),
        "composite_gain": composite_gain(rows),
        "target_known": known,
        "steps_to_target": steps_to(smoothed_curve(result.train_curve, window), target) if known else None,
    }


def mean_diagnostics(found: list[dict[str, float | None]]) -> dict[str, float | None]:
    """The mean over seeds of each diagnostic the seeds have (steps to target: None if any seed never got there)."""
    out: dict[str, float | None] = {}
    for key in found[0] if found else ():
        values = [d[key] for d in found]
        known = [v for v in values if v is not None]
        if key == "target_known":
            out[key] = all(values)
        else:
            never = key == "steps_to_target" and len(known) < len(values)
            out[key] = statistics.fmean(known) if known and not never else None
    return out


def run(args: RankingConfig) -> int:
    results = [r for folder in args.grids for r in grid_results(Path(folder))]
    if args.recorded:  # a cell the grids ran here wins over the same cell recorded elsewhere
        ran = {(r.model, r.depth, r.width, r.warmup, r.lr, r.seed) for r in results}
        results += [r for r in recorded_results(Path(args.recorded))
                    if (r.model, r.depth, r.width, r.warmup, r.lr, r.seed) not in ran]  # fmt: skip
    by_key: dict[tuple[str, float], list[Result]] = {}
    for r in results:
        if (r.depth, r.width, r.warmup) == (args.depth, args.width, args.warmup):
            by_key.setdefault((r.model, r.lr), []).append(r)
    targets = {(r.seed, r.lr): r.train_curve for (model, _), found in by_key.items() if model == args.target
               for r in found}  # fmt: skip
    summaries = {}
    for (model, lr), found in by_key.items():
        found = sorted(found, key=lambda r: r.seed)
        per_seed = [diagnostics(r, targets.get((r.seed, r.lr)), args.smoothing) for r in found]
        summaries[model, lr] = {"model": model, "lr": lr, **summarise(found),
                                "diagnostics": {"per_seed": per_seed, "mean": mean_diagnostics(per_seed)}}  # fmt: skip
    ranked = rank({m: s for (m, lr), s in summaries.items() if lr == args.lr}, args.tie_floor)
    if not ranked:
        raise ValueError(f"no finished cell at depth {args.depth}, width {args.width}, warm-up {args.warmup}, "
                         f"lr {args.lr:g} in {', '.join(args.grids)}")  # fmt: skip
    ranges = {s["model"]: {lr: summaries.get((s["model"], lr), {}).get("verdict") for lr in args.lrs} for s in ranked}
    table = ranking_table(args, ranked, ranges) + "\n\n" + diagnostics_table(args, ranked)
    write_outputs(Path(args.out), table, {
        "args": to_dict(args), "ranked": ranked, "lr_verdicts": {m: {f"{lr:g}": v for lr, v in r.items()}
                                                                 for m, r in ranges.items()},
        "summaries": {f"{m}/lr{lr:g}": s for (m, lr), s in summaries.items()},
    })  # fmt: skip
    plot_ranking(args, ranked, ranges, Path(args.out) / "ranking.png")
    return 0


def ranking_table(args: RankingConfig, ranked: list[dict[str, Any]], ranges: dict[str, dict]) -> str:
    rows = [[s["place"], s["model"], f"{s['verdict']} ({len(s['seeds'])})", f"{s['mean_gap']:+.3f}",
             " / ".join("-" if g is None else f"{g:+.3f}" for g in s["gaps"]), f"{s['range']:.3f}",
             ", ".join(s["ties_with"]) or "-",
             " ".join(f"{lr:g}:{v or 'not run'}" for lr, v in ranges[s["model"]].items())] for s in ranked]  # fmt: skip
    head = (f"depth {args.depth}, width {args.width}, warm-up {args.warmup}, lr {args.lr:g}: final val MLM loss minus "
            f"the seed's validation unigram cross-entropy (nats; 'trained' needs <= -0.1); ties: means within the "
            f"larger of the two seed ranges and {args.tie_floor:g}")  # fmt: skip
    headers = ["place", "model", "verdict (seeds)", "mean gap", "gap per seed", "range", "ties with", "verdict per lr"]
    return titled_table(head, headers, rows)


def diagnostics_table(args: RankingConfig, ranked: list[dict[str, Any]]) -> str:
    rows = []
    for s in ranked:
        mean, per_seed = s["diagnostics"]["mean"], s["diagnostics"]["per_seed"]
        steps = " / ".join("no target" if not d["target_known"] else "never" if d["steps_to_target"] is None
                           else str(d["steps_to_target"]) for d in per_seed)  # fmt: skip
        shown = ["-" if mean[key] is None else format(mean[key], form) for key, form in DIAGNOSTIC_FORMS.items()]
        rows.append([s["model"], *shown, steps if args.target else "-"])
    head = (f"per model, mean over its seeds: input similarity of consecutive sub-layers and output norm of the last "
            f"layer over the first (last snapshot); FFN gradient spread over layers (CV, last tenth); HC/mHC composite "
            f"gain at the end; steps to {args.target or 'a target'}'s final training MLM loss (per seed, trailing mean "
            f"over {args.smoothing} steps)")  # fmt: skip
    headers = ["model", "input similarity", "out norm L/1", "grad spread", "composite gain", f"steps to {args.target}"]
    return titled_table(head, headers, rows)


def plot_ranking(args: RankingConfig, ranked: list[dict[str, Any]], ranges: dict[str, dict], path: Path) -> None:
    """Left: each model's seeds (dots) and mean (bar), best at the top, its place on the label ("=" when it ties
    with a model above); right: its verdict at each learning rate of ``lrs``."""
    n = len(ranked)
    fig, (ax, lr_ax) = pyplot().subplots(1, 2, figsize=(11, 0.32 * n + 1.6), width_ratios=[3, 1], sharey=True)
    for y, s in enumerate(ranked):
        color = VERDICT_COLORS[s["verdict"]]
        ax.barh(y, s["mean_gap"], color=color, alpha=0.35, height=0.6)
        gaps = [g for g in s["gaps"] if g is not None]
        ax.scatter(gaps, [y] * len(gaps), color=color, s=14, zorder=3)
        for x, lr in enumerate(args.lrs):
            lr_ax.scatter(x, y, marker="s", s=90, color=VERDICT_COLORS.get(ranges[s["model"]][lr], "lightgray"))
    position = {s["model"]: y for y, s in enumerate(ranked)}
    tied = ["=" if any(position[o] < y for o in s["ties_with"]) else "" for y, s in enumerate(ranked)]
    labels = [f"{s['place']}{t} {s['model']} ({len(s['seeds'])})" for s, t in zip(ranked, tied, strict=True)]
    ax.set_yticks(range(n), labels)
    ax.invert_yaxis()
    ax.axvline(-0.1, color="gray", ls="--", lw=0.8)
    ax.set(xlabel="final val MLM loss − unigram cross-entropy (nats; trained: left of the dashed line)",
           title=f"depth {args.depth}, width {args.width}, lr {args.lr:g}, warm-up {args.warmup}: seeds and mean")
    lr_ax.set_xticks(range(len(args.lrs)), [f"{lr:g}" for lr in args.lrs])
    lr_ax.set(xlim=(-0.6, len(args.lrs) - 0.4), xlabel="peak lr")
    lr_ax.set_title("trains / mixed / fails (grey: not run)", fontsize=9)
    save_figure(fig, path)
