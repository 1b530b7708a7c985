"""``compare``: models compared as a reviewer accepts it: each at its own learning rate (stage 1), enough seeds at
that lr (stage 2), paired tests with Holm's correction, one tokenizer and one data, the provenance of every cell
checked (options.CompareConfig says how). The cells are the grid's (grid.run_cell), so a stopped study continues
where it stopped and an ended cell is never run again."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from scipy import optimize, stats

from pretrain.analysis import grid, provenance
from pretrain.analysis.common import model_colors, titled_table, write_outputs
from pretrain.analysis.grid import Cell, Stopper, say
from pretrain.analysis.options import CompareConfig, StudyModel
from pretrain.common.cli import parse, to_dict
from pretrain.common.formats import STUDY_FORMAT, stamped
from pretrain.common.reporting import pyplot, save_figure
from pretrain.run_folder.layout import read_metrics, read_status

CANNOT_TELL = "cannot tell at this n"
VERDICT_COLORS = {"ahead": "tab:green", "behind": "tab:red", CANNOT_TELL: "tab:gray"}
MARK = "†"
"""Marks a cell, model or contrast resting on cells from another machine, other code or other library versions."""
GAP = "gap: final validation MLM loss minus the seed's own validation unigram cross-entropy (nats; lower is better)"


# The cells of the two stages


def study_cell(args: CompareConfig, model: StudyModel, lr: float, seed: int) -> Cell:
    return Cell(model.model.label, args.width, args.depth, model.warmup, lr, seed)


def stage1_cells(args: CompareConfig) -> list[Cell]:
    """Every model whose lr is not fixed at every lr of ``lrs`` with every lr seed, seed by seed."""
    return [study_cell(args, m, lr, seed) for seed in args.lr_seeds for lr in args.lrs for m in args.models
            if m.lr is None]  # fmt: skip


def stage2_cells(args: CompareConfig, chosen: dict[str, float]) -> list[Cell]:
    """Every model with an lr, at that lr, with every seed of ``seeds``."""
    return [study_cell(args, m, chosen[m.name], seed) for seed in args.seeds for m in args.models if m.name in chosen]


def candidate_cells(args: CompareConfig) -> list[Cell]:
    """Every cell either stage could run, whatever lr stage 1 picks."""
    seeds = sorted({*args.lr_seeds, *args.seeds})
    return list(dict.fromkeys(study_cell(args, m, lr, s) for m in args.models for lr in ([m.lr] if m.lr is not None else args.lrs)
                              for s in seeds))  # fmt: skip


def gap(result: dict[str, Any] | None) -> float | None:
    """A cell's gap (GAP) from its final validation loss; None until it finished (a diverged run's last validation
    loss is of an earlier step, step 0's at worst: no final loss)."""
    if (result or {}).get("status") != "finished":
        return None
    reference = (result.get("probe") or {}).get("val_unigram_cross_entropy")
    loss = result.get("val_mlm_loss")
    return loss - reference if loss is not None and reference is not None else None


def choose_lrs(args: CompareConfig, results: dict[Cell, dict]) -> tuple[dict[str, float], dict[str, str]]:
    """(each model's lr by the rule of CompareConfig, why a model has none yet)."""
    chosen, waiting = {}, {}
    for m in args.models:
        if m.lr is not None:
            chosen[m.name] = m.lr
            continue
        own = {lr: [results.get(study_cell(args, m, lr, s)) for s in args.lr_seeds] for lr in args.lrs}
        unended = sum(r is None or r["outcome"] == "incomplete" for found in own.values() for r in found)
        means = {lr: statistics.fmean(gaps) for lr, found in own.items() if None not in (gaps := [gap(r) for r in found])}
        if unended:
            waiting[m.name] = f"{unended} stage-1 cells not ended"
        elif means:
            chosen[m.name] = min(means, key=lambda lr: (means[lr], lr))
        else:
            waiting[m.name] = "no lr where every lr seed ended with a validation loss"
    return chosen, waiting


# Statistics (scipy for the tests and distributions)


def paired(a: list[float], b: list[float], confidence: float) -> dict[str, Any]:
    """The paired difference a - b (one pair per seed): n, mean, its standard deviation, the confidence interval of
    the mean and the two-sided p-value of scipy.stats.ttest_rel; None where n < 2 leaves them undefined."""
    diff = np.subtract(a, b)
    found: dict[str, Any] = {"n": len(diff), "mean": float(diff.mean()) if len(diff) else None, "sd": None,
                             "low": None, "high": None, "p": None}  # fmt: skip
    if len(diff) > 1:
        test = stats.ttest_rel(a, b)
        interval = test.confidence_interval(confidence)
        values = {"sd": float(diff.std(ddof=1)), "low": interval.low, "high": interval.high, "p": test.pvalue}
        found |= {k: None if math.isnan(v) else float(v) for k, v in values.items()}  # all pairs equal: no test
    return found


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values over the contrasts that have one (None stays None and is not counted).
    Written here because scipy has none: scipy.stats.false_discovery_control controls the false discovery rate, not
    the family-wise error Holm's method controls."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    adjusted: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))  # monotone: never below a smaller p's
        adjusted[i] = running
    return adjusted


def detectable(sd: float, n: int, level: float, power: float) -> float:
    """The smallest true mean difference that a two-sided paired t-test at ``level`` on ``n`` pairs whose
    differences have standard deviation ``sd`` rejects with probability ``power`` (the noncentral t)."""
    df, critical = n - 1, stats.t.ppf(1 - level / 2, n - 1)

    def short(noncentrality: float) -> float:
        # The lower tail by symmetry, P(T < -c | nc) = P(T > c | -nc): nct.cdf far in its tail returns NaN.
        rejects = stats.nct.sf(critical, df, noncentrality) + stats.nct.sf(critical, df, -noncentrality)
        return rejects - power

    upper = 1.0
    while short(upper) < 0:
        upper *= 2
    return optimize.brentq(short, 0.0, upper) * sd / math.sqrt(n)


def verdict(mean: float | None, p_holm: float | None, alpha: float) -> str:
    """ahead (a's gap lower), behind, or cannot tell: the Holm-adjusted p-value decides."""
    if mean is None or p_holm is None or p_holm >= alpha:
        return CANNOT_TELL
    return "ahead" if mean < 0 else "behind"


# Provenance


def planned_provenance(args: CompareConfig) -> dict[str, Any]:
    """What a cell this sitting runs will record: this environment, the study's tokenizer and data."""
    from pretrain.config import PretrainConfig

    first = candidate_cells(args)[0]
    argv = grid.cell_overrides(args, first, Path(args.out) / "runs" / first.name)
    data = to_dict(parse(PretrainConfig, argv, prog="pretrain.run").data)
    inputs = {"tokenizer": provenance.tokenizer_hash(args.tokenizer), "data": provenance.data_hash(data)}
    return {"sittings": [provenance.environment()], "inputs": inputs}


def environment_key(sitting: dict[str, Any]) -> str:
    return json.dumps({k: sitting.get(k) for k in provenance.ENVIRONMENT_KEYS}, sort_keys=True)


def check_provenance(found: dict[str, dict[str, Any]], mixed: bool) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """(the study's environment: the one most cells ran in throughout, the cells marked with how theirs differs).
    ``found``: each cell's provenance by its name (``planned_provenance`` under "this sitting"). Another tokenizer or
    data is a ValueError; another environment too, unless ``mixed``."""
    for key in provenance.INPUT_KEYS:
        values = Counter(p["inputs"][key] for p in found.values())
        if len(values) > 1:
            named = "; ".join(f"{v} ({n} cells, e.g. {next(c for c, p in found.items() if p['inputs'][key] == v)})"
                              for v, n in values.most_common())  # fmt: skip
            raise ValueError(f"these cells were made with {len(values)} different {key}s: {named}. A study compares "
                             f"cells of one {key}: remove the others' folders under OUT/runs to run them again with "
                             "this one, or give them another --out")  # fmt: skip
    keys = {name: {environment_key(s) for s in p["sittings"]} for name, p in found.items()}
    whole = Counter(next(iter(k)) for k in keys.values() if len(k) == 1)
    key = whole.most_common(1)[0][0] if whole else None
    home = next((s for p in found.values() for s in p["sittings"] if environment_key(s) == key), {})
    marks = {}
    for name, p in found.items():
        others = [s for s in p["sittings"] if environment_key(s) != environment_key(home)]
        if others or not p["sittings"]:
            marks[name] = provenance.differences(home, others[0], provenance.ENVIRONMENT_KEYS) if others else [
                "no provenance recorded (run before it was)"]  # fmt: skip
    if marks and not mixed:
        listed = "; ".join(f"{name}: {', '.join(why)}" for name, why in list(marks.items())[:6])
        raise ValueError(f"{len(marks)} cells ran elsewhere than most of this study's ({listed}). Compare them "
                         "marked with --mixed_provenance=true, or remove their folders under OUT/runs to run them "
                         "again here")  # fmt: skip
    return home, marks


# The comparison


def model_summary(args: CompareConfig, m: StudyModel, lr: float | None, results: dict[Cell, dict],
                  marks: dict[str, list[str]]) -> dict[str, Any]:  # fmt: skip
    """One model at its lr over the contrasts' seeds: its gaps, mean and confidence interval, outcomes, marks."""
    cells = [study_cell(args, m, lr, s) for s in args.seeds] if lr else []
    ended = {c.seed: results[c] for c in cells if gap(results.get(c)) is not None}
    gaps = [gap(r) for r in ended.values()]
    interval = stats.ttest_1samp(gaps, 0.0).confidence_interval(1 - args.alpha) if len(gaps) > 1 else None
    return {
        "name": m.name, **to_dict(m), "lr": lr, "seeds": list(ended), "gaps": gaps, "planned": len(args.seeds),
        "mean_gap": statistics.fmean(gaps) if gaps else None,
        "low": interval.low if interval else None, "high": interval.high if interval else None,
        "trained": sum(r["outcome"] == "trained" for r in ended.values()),
        # Seeds lost to divergence: the gaps are of the survivors, which flatter the model; said beside every number.
        "diverged": [c.seed for c in cells if (results.get(c) or {}).get("outcome") == "diverged"],
        "marked": [c.seed for c in cells if c.name in marks],
    }  # fmt: skip


def contrast_names(args: CompareConfig) -> list[tuple[str, str]]:
    """Every model against the baseline, then the named pairs: each contrast once (b vs a is a vs b reversed)."""
    against = [(m.name, args.baseline) for m in args.models if args.baseline and m.name != args.baseline]
    found: list[tuple[str, str]] = []
    for a, b in [*against, *args.pairs]:
        if (a, b) not in found and (b, a) not in found:
            found.append((a, b))
    return found


def contrasts(args: CompareConfig, summaries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each contrast's paired difference over the seeds both models have, Holm over them all, verdicts."""
    found = []
    for a, b in contrast_names(args):
        gaps = [dict(zip(summaries[n]["seeds"], summaries[n]["gaps"], strict=True)) for n in (a, b)]
        seeds = [s for s in gaps[0] if s in gaps[1]]
        found.append({"a": a, "b": b, "seeds": seeds, "marked": bool(summaries[a]["marked"] or summaries[b]["marked"]),
                      "diverged": {n: summaries[n]["diverged"] for n in (a, b) if summaries[n]["diverged"]},
                      **paired([gaps[0][s] for s in seeds], [gaps[1][s] for s in seeds], 1 - args.alpha)})  # fmt: skip
    tested = sum(c["p"] is not None for c in found)
    for c, p_holm in zip(found, holm([c["p"] for c in found]), strict=True):
        c["p_holm"], c["verdict"] = p_holm, verdict(c["mean"], p_holm, args.alpha)
        # At alpha / tests, the level Holm holds the smallest p-value to: a bound for every contrast of the family.
        c["detectable"] = detectable(c["sd"], c["n"], args.alpha / tested, args.power) if c["sd"] and tested else None
    return found


# The residual designs' claims, per run


def smoothed_curve(curve: list[list[float]], window: int) -> list[tuple[int, float]]:
    """(step, trailing mean of the last ``window`` logged training losses)."""
    losses = [loss for _, loss in curve]
    return [(int(step), statistics.fmean(losses[max(0, i + 1 - window) : i + 1])) for i, (step, _) in enumerate(curve)]


def late(rows: list[dict[str, Any]], value: Callable[[dict[str, Any]], float | None]) -> float | None:
    """The median of ``value(row)`` over the last tenth of a run's metrics ``rows`` that have it (a logged step
    measures one micro-batch: the median of many steps, not the last one's draw); None where none has it."""
    found = [v for row in rows if (v := value(row)) is not None]
    return statistics.median(found[len(found) - max(1, len(found) // 10) :]) if found else None


def series(row: dict[str, Any], prefix: str) -> list[float]:
    """A row's per-layer (or per-sub-layer) values of ``prefix``LL, in layer order (by number: layer 100 after 99)."""
    return [row[k] for k in sorted((k for k in row if k.startswith(prefix)), key=lambda k: int(k[len(prefix) :]))]


def ffn_spread(row: dict[str, Any]) -> float | None:
    """The coefficient of variation (std / mean) of the per-layer FFN gradient norms: 0 when every layer gets the
    same gradient."""
    norms = [v for k, v in row.items() if k.startswith("grad_norm/layer_") and k.endswith("/ffn")]
    return statistics.pstdev(norms) / statistics.fmean(norms) if len(norms) > 1 and statistics.fmean(norms) > 0 else None


def variance_growth(row: dict[str, Any]) -> float | None:
    """The stream's variance after the last layer over that after the first (Pre-LN's grows with depth)."""
    variances = series(row, "hidden/variance/")
    return variances[-1] / variances[0] if len(variances) > 1 and variances[0] > 0 else None


def mean_of(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


SPIKE_WINDOW = 100  # the logged values before one that it is judged against
SPIKE_STDS = 7.0  # how many of their standard deviations above their mean make a spike


def spikes(values: list[float]) -> int | None:
    """How many of ``values`` (a run's logged training losses or gradient norms, in step order; non-finite ones left
    out) lie more than ``SPIKE_STDS`` standard deviations above the mean of the ``SPIKE_WINDOW`` before them (mHC's
    and gated attention's stability claims); None for a run too short to judge. A spike in the window widens it, so
    a burst counts less than its values; small-batch gradient norms are heavy-tailed, so a tighter rule (6 median
    absolute deviations) counted ordinary 1.5x excursions by the dozen."""
    found = np.asarray(values, dtype=float)
    found = found[np.isfinite(found)]
    if len(found) <= SPIKE_WINDOW:
        return None
    windows = np.lib.stride_tricks.sliding_window_view(found[:-1], SPIKE_WINDOW)  # row i: the values before i + W
    return int((found[SPIKE_WINDOW:] - windows.mean(1) > SPIKE_STDS * windows.std(1)).sum())


def diagnostics(result: dict[str, Any], run_dir: Path, target: float | None, window: int) -> dict[str, float | None]:
    """One run's numbers for the designs' claims (docs/placements.md): the similarity of consecutive sub-layers'
    inputs and the last over the first sub-layers' output norm (probes.sublayer_io, last snapshot); from the logged
    steps (``late``) the FFN gradients' spread over layers, the stream's variance after the last layer over the first
    (GPAS), the attention mass on [CLS] and on [SEP] (gated attention, value residuals: the sinks), the largest
    attention logit over the layers (QK-norm: the logit growth) and the entropy of the attention keys receive (value
    residuals: its concentration), the last layer's token similarity (value residuals: over-smoothing), the fraction
    of the norms' pre-activations past the flat part (Derf, SeeDNorm, DyT) and the weight the residual designs'
    averages put on the embeddings (DenseFormer, AttnRes); HC's and mHC's composite gain at the end, the last
    evaluation's validation loss minus its training-split loss (Derf: generalization), the loss and gradient-norm
    ``spikes`` (mHC, gated attention: stability), and the first step whose smoothed training loss reaches ``target``
    (the baseline's final one at the same seed)."""
    sublayers = (result.get("probe") or {}).get("sublayers") or {}
    similarity, norms = sublayers.get("input_similarity"), sublayers.get("output_norm")
    rows = read_metrics(run_dir)
    logged = {key: [r[key] for r in rows if key in r] for key in ("train/loss", "train/grad_norm")}
    gains = [r["residual/composite_gain/row"] for r in rows if "residual/composite_gain/row" in r]
    gaps = [r["val/generalization_gap"] for r in rows if "val/generalization_gap" in r]
    curve = smoothed_curve(result.get("train_curve") or [], window)
    return {
        "input_similarity": statistics.fmean(similarity) if similarity else None,
        "output_norm_last_over_first": (norms[-2] + norms[-1]) / (norms[0] + norms[1])
        if norms and norms[0] + norms[1] > 0 else None,
        "grad_spread": late(rows, ffn_spread),
        "variance_last_over_first": late(rows, variance_growth),
        "first_token_mass": late(rows, lambda r: mean_of(series(r, "attention/first_token/"))),
        "sep_mass": late(rows, lambda r: mean_of(series(r, "attention/sep/"))),
        "max_logit": late(rows, lambda r: max(series(r, "attention/max_logit/"), default=None)),
        "token_similarity": late(rows, lambda r: (series(r, "hidden/token_similarity/") or [None])[-1]),
        "attention_entropy": late(rows, lambda r: mean_of(series(r, "attention/entropy/"))),
        "preact_saturated": late(rows, lambda r: mean_of(series(r, "preact/saturated/"))),
        "weight_on_embeddings": late(rows, lambda r: mean_of([w[0] for w in r.get("residual/depth_weights") or []])),
        "composite_gain": gains[-1] if gains else None,
        "generalization_gap": gaps[-1] if gaps else None,
        "loss_spikes": spikes(logged["train/loss"]),
        "grad_spikes": spikes(logged["train/grad_norm"]),
        "steps_to_target": next((s for s, loss in curve if loss <= target), None) if target is not None else None,
    }


def model_diagnostics(args: CompareConfig, summaries: dict[str, dict], results: dict[Cell, dict]) -> dict[str, dict]:
    """``diagnostics`` per model, the mean over its seeds of each number they have."""
    by_name = {m.name: m for m in args.models}
    base = summaries.get(args.baseline, {})
    found = {}
    for name, s in summaries.items():
        per_seed = []
        for seed in s["seeds"]:
            cell = study_cell(args, by_name[name], s["lr"], seed)
            target = None
            if seed in base.get("seeds", []):
                curve = results[study_cell(args, by_name[args.baseline], base["lr"], seed)]["train_curve"]
                target = smoothed_curve(curve, args.smoothing)[-1][1] if curve else None
            per_seed.append(diagnostics(results[cell], Path(args.out) / "runs" / cell.name, target, args.smoothing))
        # A number some seed lacks (not measured, or the target never reached) has no mean.
        found[name] = {k: None if any(d[k] is None for d in per_seed) else statistics.fmean(d[k] for d in per_seed)
                       for k in (per_seed[0] if per_seed else {})}  # fmt: skip
    return found


# Running


def read_ended(args: CompareConfig, cells: list[Cell], stopper: Stopper) -> dict[Cell, dict]:
    """The cells whose runs have ended, read (grid.run_cell never runs an ended cell again)."""
    ended = [c for c in cells if read_status(Path(args.out) / "runs" / c.name).get("status") in grid.ENDED]
    return grid.run_cells(args, ended, stopper)


def cost_text(args: CompareConfig, results: dict[Cell, dict], chosen: dict[str, float]) -> str:
    """The cells this sitting may run, times the measured (or estimated) seconds per cell."""
    stage1 = sum(c not in results for c in stage1_cells(args))
    stage2 = 0
    if not args.lr_only:  # a model without its lr yet: its seeds outside lr_seeds, once stage 1 has picked it
        unpicked = sum(m.name not in chosen for m in args.models) * len(set(args.seeds) - set(args.lr_seeds))
        stage2 = sum(c not in results for c in stage2_cells(args, chosen)) + unpicked
    seconds, source = grid.cell_time(args, [r["wall_seconds"] for r in results.values() if r.get("wall_seconds")])
    if seconds is None:
        return f"cost: {stage1 + stage2} cells to run ({stage1} in stage 1, {stage2} in stage 2)"
    hours = (stage1 + stage2) * seconds / 3600
    return (f"cost: {stage1 + stage2} cells to run ({stage1} in stage 1, {stage2} in stage 2) x {seconds:.0f} s "
            f"({source}) = {hours:.1f} h of one process, {hours / args.jobs:.1f} h at --jobs={args.jobs}")


def run(args: CompareConfig) -> int:
    with Stopper() as stopper:
        results = read_ended(args, candidate_cells(args), stopper)
        check_all(args, results, planned=not args.report_only)
        chosen, _ = choose_lrs(args, results)
        if not args.report_only:
            say(cost_text(args, results, chosen))
            results |= grid.run_cells(args, [c for c in stage1_cells(args) if c not in results], stopper)
            chosen, _ = choose_lrs(args, results)
            if not args.lr_only and not stopper.requested.is_set():
                results |= grid.run_cells(args, [c for c in stage2_cells(args, chosen) if c not in results], stopper)
    results = {c: r for c, r in results.items() if r["outcome"] != "incomplete"}
    home, marks = check_all(args, results, planned=False)
    chosen, waiting = choose_lrs(args, results)
    report(args, results, chosen, waiting, home, marks)
    planned = [*stage1_cells(args), *([] if args.lr_only else stage2_cells(args, chosen))]
    return 1 if not args.report_only and (waiting or any(c not in results for c in planned)) else 0


def check_all(args: CompareConfig, results: dict[Cell, dict], planned: bool) -> tuple[dict, dict[str, list[str]]]:
    """``check_provenance`` over the ended cells (and, when ``planned``, what this sitting would run)."""
    found = {c.name: r["provenance"] for c, r in results.items() if r.get("provenance")}
    if planned:
        found["this sitting"] = planned_provenance(args)
    return check_provenance(found, args.mixed_provenance) if found else ({}, {})


# The report


def report(args: CompareConfig, results: dict[Cell, dict], chosen: dict[str, float], waiting: dict[str, str],
           home: dict[str, Any], marks: dict[str, list[str]]) -> None:  # fmt: skip
    summaries = {m.name: model_summary(args, m, chosen.get(m.name), results, marks) for m in args.models}
    ranked = sorted(summaries.values(), key=lambda s: (s["mean_gap"] is None, s["mean_gap"] or 0.0))
    found = contrasts(args, summaries)
    stage1 = stage1_table(args, results)
    diagnosed = model_diagnostics(args, summaries, results)
    tables = [stage1_text(args, stage1, chosen, waiting), ranking_text(args, ranked, waiting),
              contrasts_text(args, found), diagnostics_text(args, ranked, diagnosed), provenance_text(home, marks)]
    environments = {environment_key(s): s for r in results.values() for s in r["provenance"]["sittings"]}
    keys = list(environments)
    write_outputs(Path(args.out), "\n\n".join(t for t in tables if t), stamped({
        "args": to_dict(args), "gap": GAP, "protocol": CompareConfig.__doc__,
        "provenance": {
            "home": home, "inputs": next(iter(results.values()))["provenance"]["inputs"] if results else {},
            "environments": list(environments.values()),
            "cells": {c.name: [keys.index(environment_key(s)) for s in r["provenance"]["sittings"]]
                      for c, r in results.items()},
            "marked": marks,
        },
        "cells": {c.name: {"model": c.placement, "warmup": c.warmup, "lr": c.lr, "seed": c.seed,
                           "outcome": r["outcome"], "gap": gap(r), "val_mlm_loss": r["val_mlm_loss"],
                           "wall_seconds": r.get("wall_seconds")} for c, r in sorted(results.items(), key=str)},
        "stage1": stage1, "chosen": chosen, "waiting": waiting, "models": ranked, "contrasts": found,
        "diagnostics": diagnosed,
    }, STUDY_FORMAT))  # fmt: skip
    plot_compare(args, ranked, found, stage1, chosen, Path(args.out) / "compare.png")


def stage1_table(args: CompareConfig, results: dict[Cell, dict]) -> dict[str, dict[str, Any]]:
    """Per model whose lr stage 1 picks, per lr: the lr seeds' gaps and outcomes, and their mean when all ended."""
    table = {}
    for m in [m for m in args.models if m.lr is None]:
        table[m.name] = {}
        for lr in args.lrs:
            found = [results.get(study_cell(args, m, lr, s)) for s in args.lr_seeds]
            gaps = [gap(r) for r in found]
            table[m.name][f"{lr:g}"] = {"gaps": gaps, "outcomes": [r["outcome"] if r else "not run" for r in found],
                                        "mean_gap": None if None in gaps else statistics.fmean(gaps)}  # fmt: skip
    return table


def _number(value: float | None, form: str = "+.3f") -> str:
    return "-" if value is None else format(value, form)


def stage1_text(args: CompareConfig, stage1: dict, chosen: dict[str, float], waiting: dict[str, str]) -> str:
    if not stage1:
        return ""
    rows = [[name, *(f"{_number(v['mean_gap'])}{'*' if chosen.get(name) == float(lr) else ''} "
                     f"({sum(o == 'trained' for o in v['outcomes'])}/{len(v['outcomes'])})" for lr, v in by_lr.items()),
             waiting.get(name, "")] for name, by_lr in stage1.items()]  # fmt: skip
    return titled_table(
        f"stage 1: mean gap over seeds {args.lr_seeds} per lr, '*' the lr picked (the lowest mean among the lrs "
        f"where every seed ended with a validation loss); (k/n): seeds trained", ["model", *stage1[next(iter(stage1))],
        "waiting"], rows)  # fmt: skip


def _label(s: dict[str, Any]) -> str:
    unfinished = f", {len(s['seeds'])} of {s['planned']} seeds" if len(s["seeds"]) < s["planned"] else ""
    unfinished += f", {len(s['diverged'])} diverged" if s["diverged"] else ""
    return f"{s['name']} (lr {s['lr']:g}{unfinished}){' ' + MARK if s['marked'] else ''}"


def _verdict(c: dict[str, Any]) -> str:
    """The verdict, and the seeds a model lost to divergence: the test saw only the seeds that did not diverge."""
    lost = "; ".join(f"{name}: {len(seeds)} diverged" for name, seeds in c["diverged"].items())
    return f"{c['verdict']} ({lost}, left out)" if lost else c["verdict"]


def ranking_text(args: CompareConfig, ranked: list[dict[str, Any]], waiting: dict[str, str]) -> str:
    rows = [[place, _label(s), len(s["seeds"]), _number(s["mean_gap"]), f"[{_number(s['low'])}, {_number(s['high'])}]",
             f"{s['trained']}/{len(s['seeds'])}", " ".join(f"{g:+.3f}" for g in s["gaps"])]
            for place, s in enumerate((s for s in ranked if s["mean_gap"] is not None), 1)]  # fmt: skip
    rows += [["-", s["name"], 0, "-", "-", "-", waiting.get(s["name"], "not run")]
             for s in ranked if s["mean_gap"] is None]  # fmt: skip
    head = (f"depth {args.depth}, width {args.width}, {args.max_steps} steps, each model at its lr over seeds "
            f"{args.seeds}; {GAP}; {100 * (1 - args.alpha):g}% interval of the mean (t); trained: at least "
            f"{args.trained_margin:g} below the reference; {MARK}: cells from elsewhere (below)")  # fmt: skip
    return titled_table(head, ["place", "model", "n", "mean gap", "interval", "trained", "gap per seed"], rows)


def contrasts_text(args: CompareConfig, found: list[dict[str, Any]]) -> str:
    rows = [[f"{c['a']} - {c['b']}{' ' + MARK if c['marked'] else ''}", c["n"], _number(c["mean"]),
             f"[{_number(c['low'])}, {_number(c['high'])}]", _number(c["p"], ".3g"), _number(c["p_holm"], ".3g"),
             _verdict(c), _number(c["detectable"], ".3f")] for c in found]  # fmt: skip
    tested = sum(c["p"] is not None for c in found)
    head = (f"paired differences of the gaps (a - b; negative: a ahead), one pair per seed both ran; "
            f"{100 * (1 - args.alpha):g}% interval and p (scipy.stats.ttest_rel), Holm over the {tested} tested "
            f"contrasts; verdict at Holm p < {args.alpha:g}; detectable: the smallest true difference this n finds "
            f"with {100 * args.power:g}% power at {args.alpha:g}/{tested} (two-sided, the observed SD)")  # fmt: skip
    headers = ["contrast", "n", "mean", "interval", "p", "Holm p", "verdict", "detectable"]
    return titled_table(head, headers, rows) if found else ""


def diagnostics_text(args: CompareConfig, ranked: list[dict[str, Any]], diagnosed: dict[str, dict]) -> str:
    columns = {"input_similarity": ("input similarity", ".3f"), "output_norm_last_over_first": ("out norm L/1", ".2f"),
               "grad_spread": ("grad spread", ".3f"), "variance_last_over_first": ("variance L/1", ".2f"),
               "first_token_mass": ("[CLS] mass", ".3f"), "sep_mass": ("[SEP] mass", ".3f"),
               "max_logit": ("max logit", ".1f"),
               "attention_entropy": ("attn entropy", ".2f"), "token_similarity": ("token sim. L", ".3f"),
               "preact_saturated": ("saturated", ".3f"),
               "weight_on_embeddings": ("weight on X_0", ".3f"), "composite_gain": ("composite gain", ".3g"),
               "generalization_gap": ("val - train", ".3f"), "loss_spikes": ("loss spikes", ".1f"),
               "grad_spikes": ("grad spikes", ".1f"),
               "steps_to_target": ("steps to baseline", ".0f")}  # fmt: skip
    # A column no model has is left out (a study without the designs it measures).
    shown = {k: c for k, c in columns.items() if any(d.get(k) is not None for d in diagnosed.values())}
    rows = [[s["name"], *(_number(diagnosed[s["name"]].get(k), f) for k, (_, f) in shown.items())]
            for s in ranked if diagnosed.get(s["name"])]  # fmt: skip
    head = (f"per model, mean over its seeds: input similarity of consecutive sub-layers and output norm of the last "
            f"sub-layers over the first (last snapshot); median over the last tenth of the logged steps: FFN gradient "
            f"spread over layers (CV), the stream's variance after the last layer over the first, attention mass on "
            f"[CLS] and on [SEP], the largest attention logit (over layers), the entropy (nats) of the attention keys "
            f"receive (layers' mean), the mean cosine of two tokens after the last layer, the norms' pre-activations "
            f"with |z| > 2, the averages' weight on the embeddings; HC/mHC composite gain at the end; the last "
            f"evaluation's MLM loss on validation minus on as many training instances; loss and gradient-norm spikes "
            f"(a logged value more than {SPIKE_STDS:g} standard deviations above the mean of the {SPIKE_WINDOW} before "
            f"it); steps to {args.baseline or 'a baseline'}'s final training loss (trailing mean of {args.smoothing}); "
            f"'-': not measured, or some seed never got there")  # fmt: skip
    return titled_table(head, ["model", *(name for name, _ in shown.values())], rows) if rows else ""


def provenance_text(home: dict[str, Any], marks: dict[str, list[str]]) -> str:
    if not home:
        return "provenance: no cell has ended"
    machine = home["machine"]
    lines = [f"provenance: commit {home['commit'][:12]} (code {home['code']}), {machine['cpu']}, "
             f"{machine['threads']} thread(s){', ' + machine['gpu'] if machine['gpu'] else ''}, torch {home['torch']}, "
             f"transformers {home['transformers']}, Python {home['python']}"]  # fmt: skip
    lines += [f"  {MARK} {name}: {', '.join(why)}" for name, why in marks.items()]
    return "\n".join(lines)


def plot_compare(args: CompareConfig, ranked: list[dict[str, Any]], found: list[dict[str, Any]], stage1: dict,
                 chosen: dict[str, float], path: Path) -> None:  # fmt: skip
    """Left: each model's seeds (hollow: a cell from elsewhere) and mean with its interval, best first, places in
    order; middle: each contrast's paired difference and interval, coloured by its verdict; right: stage 1's mean gap
    per lr, the picked lr ringed."""
    panels = 3 if stage1 else 2
    rows = max(len(ranked), len(found), 1)
    fig, axes = pyplot().subplots(1, panels, figsize=(5.5 * panels, 0.42 * rows + 2.0), squeeze=False)
    ax, cx = axes[0][0], axes[0][1]
    colors = model_colors((m.name, m.model.placement) for m in args.models)
    labels = []
    for y, s in enumerate(ranked):
        place = f"{y + 1}." if s["mean_gap"] is not None else "-"
        labels.append(f"{place} {_label(s)}" if s["lr"] else f"- {s['name']} (no lr yet)")
        for seed, g in zip(s["seeds"], s["gaps"], strict=True):
            ax.scatter(g, y, s=16, zorder=3, edgecolors=colors[s["name"]],
                       facecolors="none" if seed in s["marked"] else colors[s["name"]])  # fmt: skip
        if s["low"] is not None:
            ax.errorbar(s["mean_gap"], y, xerr=[[s["mean_gap"] - s["low"]], [s["high"] - s["mean_gap"]]], fmt="D",
                        color="black", ms=4, capsize=3, zorder=4)  # fmt: skip
    ax.set_yticks(range(len(ranked)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(-args.trained_margin, color="gray", ls="--", lw=0.8)
    ax.set(xlabel="gap (nats; trained: left of the dashed line)",
           title=f"d{args.depth} h{args.width}, {args.max_steps} steps: seeds, mean, {100 * (1 - args.alpha):g}% interval")
    for y, c in enumerate(found):
        if c["low"] is not None:
            cx.errorbar(c["mean"], y, xerr=[[c["mean"] - c["low"]], [c["high"] - c["mean"]]], fmt="o", capsize=3,
                        color=VERDICT_COLORS[c["verdict"]])  # fmt: skip
    cx.set_yticks(range(len(found)), [f"{c['a']} - {c['b']} (n={c['n']}): {_verdict(c)}{' ' + MARK if c['marked'] else ''}"
                                      for c in found], fontsize=8)  # fmt: skip
    cx.invert_yaxis()
    cx.axvline(0, color="gray", lw=0.8)
    cx.set(xlabel="paired difference of gaps (negative: the first ahead)",
           title=f"green ahead, red behind, gray cannot tell (Holm, {args.alpha:g})")
    if stage1:
        lx = axes[0][2]
        for name, by_lr in stage1.items():
            points = [(float(lr), v["mean_gap"]) for lr, v in by_lr.items() if v["mean_gap"] is not None]
            if points:
                lx.plot(*zip(*points, strict=True), "o-", color=colors[name], label=name, ms=4)
            if name in chosen:
                lx.scatter(chosen[name], by_lr[f"{chosen[name]:g}"]["mean_gap"], s=140, facecolors="none",
                           edgecolors=colors[name], lw=1.5)  # fmt: skip
        lx.set_xscale("log")
        lx.set_xticks(args.lrs, [f"{lr:g}" for lr in args.lrs], minor=False)
        lx.minorticks_off()  # the log axis's own labels overlap between lrs a few x apart
        lx.set(xlabel="peak lr", ylabel=f"mean gap, seeds {args.lr_seeds}", title="stage 1 (ringed: the lr picked)")
        if lx.get_legend_handles_labels()[0]:
            lx.legend(fontsize=7)
    fig.text(0.01, 0.005, f"{MARK} / hollow: cells from another machine, code or library versions; 'k of n seeds': "
             "unfinished; +wN: a model's own warm-up", fontsize=7)  # fmt: skip
    print(f"wrote {save_figure(fig, path)}")
