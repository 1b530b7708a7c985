"""grid: placement x depth x width x warm-up x peak learning rate x seed, each cell a short pretraining run
through pretrain/run.py, classified as diverged, blew up, failed to train or trained (outcomes.py)."""

from __future__ import annotations

import itertools
import math
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from pretrain.analysis import outcomes, probes, provenance
from pretrain.analysis.common import model_colors, titled_table, write_outputs
from pretrain.analysis.options import CompareConfig, GridConfig, Model
from pretrain.common.cli import parse, to_dict
from pretrain.common.reporting import pyplot, save_figure
from pretrain.config import STANDARD_LABEL, residual_scheme_fields
from pretrain.data.cache import exclusive_lock
from pretrain.run_folder.layout import RUN_CONFIG_FILE, STATUS_FILE, read_metrics, read_status

ENDED = ("finished", "diverged")
"""The statuses of a run that ended (RUN/status.json): such a cell is read and probed, never run again."""
Cells = GridConfig | CompareConfig
"""What runs cells: a grid, or a study of ``compare`` (each names its models, ``model``, and shares CellRecipe)."""


@dataclass(frozen=True)
class Cell:
    """One run of the grid: a setting and a seed."""

    placement: str  # the model's name: its placement, with its norm type when not layernorm (GridConfig.models)
    width: int
    depth: int
    warmup: int
    lr: float
    seed: int

    @property
    def setting(self) -> tuple[str, int, int, int, float]:
        return (self.placement, self.width, self.depth, self.warmup, self.lr)

    @property
    def name(self) -> str:
        return f"{self.placement}-d{self.depth}-h{self.width}-w{self.warmup}-lr{self.lr:g}-s{self.seed}"


def grid_cells(args: GridConfig, seeds: list[int]) -> list[Cell]:
    """Every setting with every seed, placements innermost (a stopped grid has compared them where it got to)."""
    axes = (args.hidden_sizes, args.depths, args.warmup_steps, args.lrs, seeds)
    return [Cell(placement, *values) for values in itertools.product(*axes) for placement in args.variants]


def cell_overrides(args: Cells, cell: Cell, run_dir: Path) -> list[str]:
    """pretrain/run.py arguments of one cell: every step logged, snapshots at steps 0..probe_steps (the output-change
    measure), one evaluation at the end; ``overrides`` come last, so they win."""
    model = args.model(cell.placement)
    snapshot_steps = ", ".join(str(s) for s in range(1, args.probe_steps + 1))
    return [
        *([f"--config={args.preset}"] if args.preset else []),
        f"--model.norm_placement={model.placement}", f"--model.norm_type={model.norm_type}", *scheme_overrides(model),
        f"--model.num_hidden_layers={cell.depth}", f"--model.hidden_size={cell.width}",
        f"--model.num_attention_heads={args.num_heads}",
        f"--model.intermediate_size={args.intermediate_size or 4 * cell.width}",
        f"--optim.lr={cell.lr}", f"--optim.warmup_steps={cell.warmup}",
        f"--train.seed={cell.seed}", f"--train.max_steps={args.max_steps}", f"--train.output_dir={run_dir}",
        f"--train.run_name=grid-{cell.name}", "--train.log_every=1", "--train.eval_every=0",
        "--train.checkpoint_every=0", f"--train.snapshot_at_start={'true' if args.probe_steps else 'false'}",
        f"--train.snapshot_steps=[{snapshot_steps}]", "--train.snapshot_at_end=false", "--tracking.backend=none",
        *(f"--{item.removeprefix('--')}" for item in args.run_overrides),
    ]  # fmt: skip


def scheme_overrides(model: Model) -> list[str]:
    """Every residual-scheme field and option inside the layer the model's label names (so that a preset cannot
    change what the label says); none for the standard scheme without them, whose cells run as before."""
    fields = {} if model.scheme == STANDARD_LABEL else residual_scheme_fields(model.scheme)
    return [f"--model.{key}={'null' if v is None else str(v).lower() if isinstance(v, bool) else v}"
            for key, v in (*fields.items(), *model.options)]  # fmt: skip


def read_cell(run_dir: Path) -> dict[str, Any]:
    """Status, training MLM loss curve, final validation MLM loss and divergence step of one run."""
    status = read_status(run_dir)
    rows = read_metrics(run_dir)
    val = [row for row in rows if "val/mlm_loss" in row]
    # A run killed after its last checkpoint logs some steps twice (before the kill and after resuming): the
    # later line is the one the finished run continued from.
    curve = {row["step"]: row["train/mlm_loss"] for row in rows if "train/mlm_loss" in row}
    # The lowest and the highest layer's FFN gradient norm at every logged step: where Post-LN's lower layers
    # stop learning (Liu et al. 2020's gradient vanishing toward the input) shows over the whole run.
    ffn = sorted({k for row in rows for k in row if k.startswith("grad_norm/layer_") and k.endswith("/ffn")},
                 key=probes.by_layer)  # fmt: skip
    grads = {row["step"]: [row[ffn[0]], row[ffn[-1]]] for row in rows if ffn and ffn[0] in row and ffn[-1] in row}
    return {
        **cell_cost(run_dir, rows),
        "status": status.get("status", "unknown"),
        "diverged_at_step": status.get("diverged_at_step"),
        "val_mlm_loss": val[-1]["val/mlm_loss"] if val else None,
        "val_step": val[-1]["step"] if val else None,
        "train_curve": sorted([step, loss] for step, loss in curve.items()),
        "ffn_grad_first_last": sorted([step, *pair] for step, pair in grads.items()),
        "message": status.get("message", ""),
    }


def cell_cost(run_dir: Path, rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """What a run cost: ``train_seconds``, its training steps' time (each logged step's new tokens over its tokens per
    second), and ``wall_seconds``, from RUN/run_config.json written to the last RUN/status.json (evaluation and saves
    included, the interpreter's start not); None where the files are missing."""
    seconds, seen = 0.0, 0
    for row in rows:
        if row.get("train/tokens_per_s"):
            seconds += (row["tokens_seen"] - seen) / row["train/tokens_per_s"]
            seen = row["tokens_seen"]
    start, end = run_dir / RUN_CONFIG_FILE, run_dir / STATUS_FILE
    wall = end.stat().st_mtime - start.stat().st_mtime if start.is_file() and end.is_file() else None
    return {"train_seconds": seconds if seen else None, "wall_seconds": wall}


def say(line: str) -> None:
    """One line to stdout in one write (cells report from several threads)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Stopper:
    """Stops the grid cleanly on SIGTERM or SIGINT (Ctrl-C): the running cells get SIGTERM, on which
    pretrain/run.py saves a checkpoint at the next step boundary and exits (status preempted), and cells not yet
    started are skipped. The next sitting reads what ended and resumes the rest (train.resume=auto)."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self._children: set[subprocess.Popen] = set()
        self._lock = threading.Lock()  # a child is either started and registered, or never started

    def request(self, signum: int = signal.SIGTERM, frame: Any = None) -> None:
        if not self.requested.is_set():
            say(f"{signal.Signals(signum).name}: stopping the running cells at their next step (checkpoint saved)")
        self.requested.set()
        with self._lock:
            for child in self._children:
                child.send_signal(signal.SIGTERM)

    def run(self, argv: list[str], log: Any) -> int | None:
        """Run ``argv`` to its end with output to ``log``; its exit code, or None when the grid is stopping."""
        with self._lock:
            if self.requested.is_set():
                return None
            child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
            self._children.add(child)
        try:
            return child.wait()
        finally:
            with self._lock:
                self._children.discard(child)

    def __enter__(self) -> Stopper:
        self._previous = {sig: signal.signal(sig, self.request) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


# pretrain/run.py settings that do not change what a cell measures (where and how often it saves, how it loads
# data, when it was stopped); any other difference makes the run in a cell's folder another cell.
SAME_CELL_IGNORES = frozenset({
    "train.output_dir", "train.resume", "train.stop_at_step", "train.checkpoint_every", "train.keep_last_checkpoints",
    "train.num_workers", "train.peak_flops_per_device", "train.collective_timeout_s", "data.num_proc",
    "data.cache_dir", "data.max_inline_preparation_mb",
})  # fmt: skip


def other_settings(args: Cells, cell: Cell, run_dir: Path) -> list[str]:
    """Keys (besides SAME_CELL_IGNORES) on which the run already in a cell's folder differs from the cell as this grid
    would run it: such a run is not this cell, and continuing it would change its schedule mid-run."""
    from pretrain.config import PretrainConfig
    from pretrain.run_folder.same_run import config_differences

    wanted = parse(PretrainConfig, cell_overrides(args, cell, run_dir), prog="pretrain.run")
    return config_differences(run_dir, to_dict(wanted), SAME_CELL_IGNORES)


def run_cell(args: Cells, cell: Cell, stopper: Stopper | None = None) -> dict[str, Any]:
    """Run one cell in a fresh interpreter and probe it; an ended run is read, an interrupted one resumed, one with
    other settings left alone (the cell fails, saying so)."""
    stopper = stopper or Stopper()
    run_dir = Path(args.out) / "runs" / cell.name
    # One grid at a time in a cell: two grids with overlapping axes on one --out would otherwise both run it
    # into the same folder. The second waits, then reads the cell the first ran (as data preparation does).
    waiting = partial(say, f"{cell.name}: another grid is running this cell in {run_dir}; waiting for it to end")
    try:
        with exclusive_lock(run_dir.with_name(f"{cell.name}.lock"), on_wait=waiting, stop=stopper.requested):
            return _run_cell_locked(args, cell, stopper, run_dir)
    except InterruptedError:
        return incomplete(run_dir, "grid stopped", "not started")


def incomplete(run_dir: Path, message: str, status: str | None = None) -> dict[str, Any]:
    """A cell that did not end in this sitting: what its folder holds, with ``message`` and, if given, ``status``."""
    found = {**read_cell(run_dir), "outcome": "incomplete", "message": message}
    return found if status is None else {**found, "status": status}


def _run_cell_locked(args: Cells, cell: Cell, stopper: Stopper, run_dir: Path) -> dict[str, Any]:
    from pretrain.run_folder.checkpointing import latest_checkpoint  # imports accelerate: only when running cells

    if differ := other_settings(args, cell, run_dir):
        message = (f"{run_dir} holds a run with other settings ({', '.join(differ[:6])} differ from this grid's): "
                   "left as it is. Rerun with the settings it was made with, or use another --out for these.")
        say(f"{cell.name}: {message}")
        return incomplete(run_dir, message, "failed")
    if read_status(run_dir).get("status") not in ENDED:
        if args.report_only:
            return incomplete(run_dir, "not ended (--report_only runs nothing)")
        if stopper.requested.is_set():
            return incomplete(run_dir, "grid stopped", "not started")
        argv = cell_overrides(args, cell, run_dir)
        if run_dir.exists() and latest_checkpoint(run_dir) is not None:
            argv.append("--train.resume=auto")
        elif run_dir.exists():  # killed before its first checkpoint: kept aside, not reused
            aside = run_dir.with_name(f"{run_dir.name}.stopped-{time.strftime('%Y%m%dT%H%M%S')}")
            run_dir.rename(aside)
            say(f"{run_dir.name}: no checkpoint to resume; the partial run was moved to {aside}")
        log = Path(args.out) / "logs" / f"{cell.name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        provenance.record_sitting(run_dir)
        say(f"{cell.name}: python -m pretrain.run {' '.join(argv)}  (log: {log})")
        with log.open("a") as f:  # a resumed cell appends to its log
            code = stopper.run([sys.executable, "-m", "pretrain.run", *argv], f)
        if code is None:
            return incomplete(run_dir, "grid stopped", "not started")
        if code != 0 and read_status(run_dir).get("status") not in ENDED:
            # (a run that recorded its end before a late signal or error is read like any other)
            tail = log.read_text().strip().splitlines()[-3:]
            return incomplete(run_dir, f"exit code {code}: {' | '.join(tail)}", "failed")
    else:
        say(f"{cell.name}: already done, reading {run_dir}")
    result = read_cell(run_dir)
    probe = {}
    if result["status"] in ENDED:
        probe = probes.probe_cell(run_dir, max_step=args.probe_steps, batch_size=args.probe_batch_size)
        result["probe"] = probe
        result["provenance"] = provenance.with_inputs(run_dir)
    result["outcome"] = outcomes.classify(
        status=result["status"], train_losses=[loss for _, loss in result["train_curve"]],
        val_loss=result["val_mlm_loss"], train_unigram_entropy=probe.get("train_unigram_entropy"),
        val_unigram_cross_entropy=probe.get("val_unigram_cross_entropy"), rules=args.rules,
    )  # fmt: skip
    return result


def run_cells(args: Cells, cells: list[Cell], stopper: Stopper) -> dict[Cell, dict[str, Any]]:
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        return dict(zip(cells, pool.map(lambda cell: run_cell(args, cell, stopper), cells), strict=True))


def setting_outcomes(results: dict[Cell, dict[str, Any]]) -> dict[tuple, str]:
    """The combined outcome of each setting over its seeds (outcomes.combine)."""
    by_setting: dict[tuple, list[str]] = {}
    for cell, result in results.items():
        by_setting.setdefault(cell.setting, []).append(result["outcome"])
    return {setting: outcomes.combine(found) for setting, found in by_setting.items()}


def extra_seed_cells(args: GridConfig, results: dict[Cell, dict[str, Any]]) -> list[Cell]:
    """Further seeds for the settings on the boundary, up to boundary_seeds per setting."""
    on_boundary = outcomes.boundary(setting_outcomes(results), args.axes)
    return [cell for cell in grid_cells(args, extra_seeds(args)) if cell.setting in on_boundary and cell not in results]


def extra_seeds(args: GridConfig) -> list[int]:
    """The seeds settings on the boundary are repeated with (max(seeds)+1, ...), up to boundary_seeds in all."""
    return [max(args.seeds) + k for k in range(1, args.boundary_seeds - len(args.seeds) + 1)]


def cell_time(args: GridConfig | CompareConfig, measured: list[float]) -> tuple[float | None, str]:
    """The seconds a cell takes, for the cost printed before cells start: the mean run time of the cells of --out that
    ended (``measured``), else --seconds_per_cell, a stated estimate (else None); and where that figure comes from."""
    if measured:
        return sum(measured) / len(measured), f"the mean run time of the {len(measured)} ended cells under {args.out}"
    if args.seconds_per_cell is None:
        return None, ""
    return args.seconds_per_cell, f"an estimate, --seconds_per_cell: no cell under {args.out} has ended"


def cost_line(args: GridConfig, cells: list[Cell]) -> str:
    """What the grid is about to cost: the cells to run and their steps, times the seconds a cell takes (cell_time)."""
    runs = Path(args.out) / "runs"
    ended = [cell for cell in cells if read_status(runs / cell.name).get("status") in ENDED]
    todo = len(cells) - len(ended)
    more = f", and up to {len(extra_seeds(args))} more seeds of each setting on the boundary" if extra_seeds(args) else ""
    line = f"grid: {todo} of {len(cells)} cells to run ({todo * args.max_steps:,} steps{more})"
    seconds, source = cell_time(args, [s for cell in ended if (s := read_cell(runs / cell.name)["wall_seconds"])])
    if not todo or seconds is None:
        return line + ("" if not todo else "; the time a cell takes follows as cells end (none of --out has; "
                       "--seconds_per_cell=S gives an estimate now)")  # fmt: skip
    return (f"{line} x {seconds:.0f} s ({source}) = about {todo * seconds / min(args.jobs, todo) / 60:.0f} min with "
            f"{args.jobs} job(s)")


def run(args: GridConfig) -> int:
    out = Path(args.out)
    with Stopper() as stopper:
        seeds = [*args.seeds, *extra_seeds(args)] if args.report_only else args.seeds
        cells = [c for c in grid_cells(args, seeds) if not args.report_only or (out / "runs" / c.name).is_dir()]
        if not args.report_only:
            say(cost_line(args, cells))
        results = run_cells(args, cells, stopper)
        extra = [] if args.report_only else extra_seed_cells(args, results)
        if extra and not stopper.requested.is_set():
            say(f"{len({c.setting for c in extra})} settings on the boundary: {len(extra)} more seeds")
            results |= run_cells(args, extra, stopper)
    combined = setting_outcomes(results)
    on_boundary = outcomes.boundary(combined, args.axes)
    shown = probe_settings(args, on_boundary)
    table = report_table(args, results, combined, on_boundary, shown)
    write_outputs(out, table, {
        "args": to_dict(args),
        "rules": outcomes.__doc__,
        "cells": {cell.name: {"setting": cell.setting, "seed": cell.seed, **r} for cell, r in results.items()},
        "settings": {"/".join(map(str, s)): o for s, o in combined.items()},
        "boundary": sorted("/".join(map(str, s)) for s in on_boundary),
    })  # fmt: skip
    plot_grid(args, results, combined, out / "grid.png")
    plot_probes(args, results, shown, out / "boundary.png")
    failed = any(r["status"] not in ENDED for r in results.values())
    return 1 if failed and not args.report_only else 0


def _seed_results(results: dict[Cell, dict[str, Any]], setting: tuple) -> list[dict[str, Any]]:
    return [r for cell, r in sorted(results.items(), key=lambda kv: kv[0].seed) if cell.setting == setting]


def _one(result: dict[str, Any]) -> str:
    outcome = result["outcome"]
    if outcome == "diverged":
        return f"div@{result['diverged_at_step']}"
    if outcome == "incomplete":
        return result["status"]
    return f"{outcomes.SHORT[outcome]}{result['val_mlm_loss']:.3f}"


def setting_text(results: dict[Cell, dict[str, Any]], combined: dict[tuple, str], setting: tuple) -> str:
    """``describe_setting`` of one setting of the grid."""
    return describe_setting(_seed_results(results, setting), combined.get(setting, "incomplete"))


def describe_setting(runs: list[dict[str, Any]], combined: str) -> str:
    """Table text of one setting: its outcome and mean final loss over agreeing seeds, '(n)' for n seeds;
    each seed's own result, joined by '|', where they differ."""
    if not runs:
        return "-"
    if combined == "seeds differ":
        return "|".join(_one(r) for r in runs)
    done = [r for r in runs if r["outcome"] == combined]
    if combined in ("incomplete", "diverged") or not done:
        text = ",".join(_one(r) for r in (done or runs)).replace(",div@", ",")
    else:
        text = f"{outcomes.SHORT[combined]}{sum(r['val_mlm_loss'] for r in done) / len(done):.3f}"
    return f"{text} ({len(done)})" if len(done) > 1 else text


def heading(args: GridConfig, label: str) -> str:
    """A model's heading in tables and heat maps: its label with "-LN" (pre-LN), a residual scheme's alone (pre-hc4)."""
    return f"{label}-LN" if args.models[label].scheme == STANDARD_LABEL else label


def _row_label(args: GridConfig, width: int, depth: int, warmup: int) -> str:
    return (f"h{width} " if len(args.hidden_sizes) > 1 else "") + f"depth {depth}, warm-up {warmup}"


def probe_settings(args: GridConfig, on_boundary: set[tuple]) -> list[tuple]:
    """At most 6 (width, depth, warm-up, lr) whose curves and probes are shown, deepest and fastest first: the
    boundary's, else the deepest, widest, highest-lr corner at each warm-up."""
    if on_boundary:
        corners = sorted({s[1:] for s in on_boundary}, key=lambda s: (-s[1], -s[3], s[2], -s[0]))
    else:
        _, widths, depths, warmups, lrs = args.axes
        corners = [(widths[-1], depths[-1], warmup, lrs[-1]) for warmup in warmups]
    return corners[:6]


def late_grads(first_last: list[list[float]]) -> tuple[float, float] | None:
    """Median FFN gradient norm of the lowest and the highest layer over the last tenth of the logged steps."""
    if not first_last:
        return None
    tail = first_last[-max(1, len(first_last) // 10) :]
    return tuple(float(torch.tensor([row[i] for row in tail]).median()) for i in (1, 2))


def probe_lines(args: GridConfig, results: dict[Cell, dict[str, Any]], shown: list[tuple]) -> list[list[Any]]:
    """Per shown setting, placement and seed: FFN gradient norm of the first and last layer at step 1 and their
    ratio, and the relative output change of each of the first updates."""
    rows = []
    for (width, depth, warmup, lr), placement in itertools.product(shown, args.variants):
        for r in _seed_results(results, (placement, width, depth, warmup, lr)):
            probe = r.get("probe") or {}
            grads = probe.get("first_grad_norms", {}).get("1", {}).get("ffn")
            steps = [grads[0], grads[-1], probes.ratio_last_to_first(grads)] if grads else []
            changes = [c["change"] for c in probe.get("output_changes", [])]
            late = late_grads(r.get("ffn_grad_first_last", []))
            rows.append([
                placement, f"d{depth} h{width} w{warmup} lr{lr:g}", _one(r),
                *([f"{v:.3g}" for v in steps] or ["-"] * 3), " ".join(f"{c:.3g}" for c in changes) or "-",
                f"{late[0]:.2g} / {late[1]:.2g}" if late else "-",
            ])  # fmt: skip
    return rows


def scalar_lines(args: GridConfig, results: dict[Cell, dict[str, Any]]) -> list[list[Any]]:
    """Per cell and kind of learned scalar: mean |x| [min, max] over the model's parameters of that kind (ReZero's
    gates take either sign) at step 0 and at each snapshot after the probed first steps."""
    rows = []
    for cell, r in sorted(results.items(), key=lambda kv: kv[0].name):
        found = (r.get("probe") or {}).get("learned_scalars") or {}
        steps = found.get("steps", [])
        for suffix, kind in probes.SCALAR_KINDS.items():
            if not (series := [v for name, v in found.get("values", {}).items() if name.endswith(suffix)]):
                continue
            shown = [i for i, step in enumerate(steps) if step == 0 or step > args.probe_steps]
            text = "  ".join(f"{steps[i]}: {sum(abs(v[i]) for v in series) / len(series):.3g} "
                             f"[{min(v[i] for v in series):.3g}, {max(v[i] for v in series):.3g}]" for i in shown)
            rows.append([cell.name, f"{kind} (x{len(series)})", text])
    return rows


def report_table(args: GridConfig, results: dict[Cell, dict[str, Any]], combined: dict[tuple, str],
                 on_boundary: set[tuple], shown: list[tuple]) -> str:  # fmt: skip
    refs = [r["probe"] for r in results.values() if r.get("probe")]
    reference = (f"unigram entropy of the training tokens {refs[0]['train_unigram_entropy']:.3f}, validation unigram "
                 f"cross-entropy {refs[0]['val_unigram_cross_entropy']:.3f} nats (seed of the first cell)"
                 if refs else "no cell ended yet")  # fmt: skip
    sections = [
        f"final val/mlm_loss after {args.max_steps} steps; heads {args.num_heads}; {reference}\n"
        f"'plateau X': failed to train (X > validation unigram cross-entropy - {args.trained_margin}); 'blew up X': "
        f"the last tenth of the loss curve stayed > {args.blowup_margin} nats above the unigram entropy and the "
        "run's best; div@N: non-finite loss or gradient at step N; (n): n seeds agree (mean); a|b: seeds differ"
    ]
    _, widths, depths, warmups, lrs = args.axes
    for placement in args.variants:
        rows = [[_row_label(args, *row), *(setting_text(results, combined, (placement, *row, lr)) for lr in lrs)]
                for row in itertools.product(widths, depths, warmups)]  # fmt: skip
        sections.append(titled_table(heading(args, placement), ["setting \\ lr", *(f"{lr:g}" for lr in lrs)], rows))
    names = sorted(f"{s[0]} d{s[2]} h{s[1]} w{s[3]} lr{s[4]:g}: {combined[s]}" for s in on_boundary)
    sections.append(f"boundary ({len(names)} settings):\n  " + ("\n  ".join(names) if names else "none"))
    what = "boundary" if on_boundary else "no boundary: the deepest, highest-lr corner"
    sections.append(titled_table(
        f"first steps of the shown settings ({what}); FFN gradient norm (raw, before clipping) of the first and last "
        f"layer at step 1; relative change of the encoder output on a fixed batch by updates 1..{args.probe_steps}; "
        "median FFN gradient norm of the first and last layer over the last tenth of the run",
        ["placement", "setting", "result", "grad L1", "grad Llast", "last/first", "output change per update",
         "late grad L1 / Llast"],
        probe_lines(args, results, shown),
    ))  # fmt: skip
    costs = [[cell.name, f"{r['train_seconds']:.0f}", f"{r['wall_seconds']:.0f}"]
             for cell, r in sorted(results.items(), key=lambda kv: kv[0].name)
             if r.get("train_seconds") is not None and r.get("wall_seconds") is not None]  # fmt: skip
    if costs:
        sections.append(titled_table(
            "cost per cell (seconds of wall clock; on a shared machine, what the cell got): its training steps, and "
            "the run from its start to its last status (evaluation, snapshots, checkpoints included)",
            ["cell", "training steps s", "run s"], costs))  # fmt: skip
    if scalars := scalar_lines(args, results):
        sections.append(titled_table(
            "learned scalars over the run (snapshots at step 0 and every train.snapshot_every steps): mean |x| "
            "[min, max] over the model's parameters of that kind (a vector, e.g. Admin's omega: its mean)",
            ["cell", "scalar", "per snapshot step: mean |x| [min, max]"], scalars))  # fmt: skip
    if failed := {cell.name: r["message"] for cell, r in results.items() if r["status"] not in ENDED}:
        sections.append("cells that did not complete:\n" + "\n".join(f"  {k}: {v}" for k, v in failed.items()))
    return "\n\n".join(sections)


def plot_grid(args: GridConfig, results: dict[Cell, dict[str, Any]], combined: dict[tuple, str], path: Path) -> None:
    """One heat map per placement (rows: width, depth, warm-up; columns: lr), coloured by the final validation
    loss on a shared scale (mean over seeds), gray where diverged; a red frame where seeds differ."""
    plt = pyplot()
    from matplotlib.patches import Rectangle

    def mean_loss(setting: tuple) -> float:
        losses = [r["val_mlm_loss"] for r in _seed_results(results, setting) if r["outcome"] in outcomes.OUTCOMES[:3]]
        return sum(losses) / len(losses) if losses else float("nan")

    _, widths, depths, warmups, lrs = args.axes
    row_keys = list(itertools.product(widths, depths, warmups))
    grids = {p: torch.tensor([[mean_loss((p, *row, lr)) for lr in lrs] for row in row_keys]) for p in args.variants}
    finite = torch.cat([g[~g.isnan()] for g in grids.values()])
    vmin, vmax = (finite.min().item(), finite.max().item()) if len(finite) else (0.0, 1.0)
    n = len(args.variants)
    n_cols, n_rows = min(n, 2), math.ceil(n / min(n, 2))
    # Constrained layout keeps labels and colour bar clear of the panels; inches: 1.3 per lr column, 0.45 per row.
    fig, axes = plt.subplots(n_rows, n_cols, squeeze=False, layout="constrained", figsize=(
        1.2 + (1.3 * len(lrs) + 1.3) * n_cols, (0.45 * len(row_keys) + 1.1) * n_rows))  # fmt: skip
    cmap = plt.get_cmap("viridis").with_extremes(bad="lightgray")
    image = None
    for ax, placement in zip(axes.flat, args.variants, strict=False):
        image = ax.imshow(grids[placement].numpy(), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
        for i, row in enumerate(row_keys):
            for j, lr in enumerate(lrs):
                setting = (placement, *row, lr)
                value = grids[placement][i, j].item()
                dark = not math.isnan(value) and value < (vmin + vmax) / 2  # the low end of viridis is dark
                text = setting_text(results, combined, setting)
                ax.text(j, i, text.replace(" (", "\n(").replace("|", "\n"), ha="center", va="center",
                        fontsize=8, color="white" if dark else "black")  # fmt: skip
                if combined.get(setting) == "seeds differ":
                    ax.add_patch(Rectangle((j - 0.48, i - 0.48), 0.96, 0.96, fill=False, edgecolor="red", lw=2))
        ax.set_xticks(range(len(lrs)), [f"{lr:g}" for lr in lrs])
        ax.set_yticks(range(len(row_keys)), [_row_label(args, *row).replace("depth ", "d").replace(", warm-up ", " w")
                                             for row in row_keys])  # fmt: skip
        ax.set(xlabel="peak learning rate", title=f"{heading(args, placement)}, {args.max_steps} steps")
    for ax in axes.flat[n:]:
        ax.axis("off")
    if image is not None:
        label = "final val MLM loss (gray: diverged; red frame: seeds differ; plateau: failed to train)"
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label=label)
    print(f"wrote {save_figure(fig, path, tight_layout=False)}")


def smoothed(curve: list[list[float]], window: int) -> tuple[list[float], list[float]]:
    """(steps, losses): the running mean of ``window`` points of a [[step, loss], ...] curve, at its windows' ends."""
    steps, losses = zip(*curve, strict=True)
    window = max(1, min(window, len(losses)))
    means = torch.tensor(losses, dtype=torch.float64).unfold(0, window, 1).mean(1).tolist()
    return list(steps[window - 1 :]), means


def plot_probes(args: GridConfig, results: dict[Cell, dict[str, Any]], shown: list[tuple], path: Path) -> None:
    """Per shown setting (a column): training loss curves of every placement and seed, the lowest layer's FFN
    gradient norm over the run, FFN gradient norm per layer at step 1 and the output change by the first updates."""
    if not shown:
        return
    fig, axes = pyplot().subplots(4, len(shown), figsize=(3.0 * len(shown), 10.4), squeeze=False)
    window = max(1, args.max_steps // 25)  # a loss per step of a small batch is too noisy to compare curves by
    colors = model_colors((name, args.models[name].placement) for name in args.variants)
    for col, corner in enumerate(shown):
        loss_ax, low_ax, grad_ax, change_ax = axes[:, col]
        width, depth, warmup, lr = corner
        for placement in args.variants:
            color = colors[placement]
            for k, r in enumerate(_seed_results(results, (placement, *corner))):
                label = f"{placement} {_one(r)}"
                style = ["-", "--", ":", "-."][k % 4]
                if r["train_curve"]:
                    steps, losses = smoothed(r["train_curve"], window)
                    loss_ax.plot(steps, losses, style, color=color, lw=0.9, label=label)
                if r.get("ffn_grad_first_last"):
                    steps, first, _ = zip(*r["ffn_grad_first_last"], strict=True)
                    low_ax.plot(steps, first, style, color=color, lw=0.8)
                probe = r.get("probe") or {}
                if k == 0 and probe:
                    loss_ax.axhline(probe["train_unigram_entropy"], color="gray", ls="--", lw=0.8)
                if grads := probe.get("first_grad_norms", {}).get("1", {}).get("ffn"):
                    grad_ax.plot(range(1, len(grads) + 1), grads, style, color=color, lw=0.9, marker=".", ms=3,
                                 label=label)  # fmt: skip
                if changes := probe.get("output_changes", []):
                    change_ax.plot([c["to"] for c in changes], [c["change"] for c in changes], "o" + style,
                                   color=color, ms=3, lw=0.9)  # fmt: skip
        loss_ax.set_title(f"d{depth} h{width} w{warmup} lr{lr:g}", fontsize=9)
        loss_ax.set_xlabel("step")
        loss_ax.set_ylabel(f"train MLM loss, mean of {window} steps (dashed: unigram)", fontsize=8)
        low_ax.set_xlabel("step")
        low_ax.set_ylabel("layer 1's FFN grad norm", fontsize=8)
        grad_ax.set(xlabel="layer", ylabel="FFN grad norm at step 1")
        change_ax.set(xlabel="update t", ylabel="||f(W_t) - f(W_t-1)|| / ||f(W_t-1)||")
        for ax in (low_ax, grad_ax, change_ax):
            if ax.has_data():
                ax.set_yscale("log")
        if loss_ax.get_legend_handles_labels()[0]:
            loss_ax.legend(fontsize=7)
    print(f"wrote {save_figure(fig, path)}")
