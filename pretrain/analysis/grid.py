"""grid: warm-up x peak learning rate, each cell a short pretraining run through pretrain/run.py."""

from __future__ import annotations

import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pretrain.analysis.common import DEFAULT_OUT, write_outputs
from pretrain.cli import field_type, require, to_dict
from pretrain.layout import read_metrics, read_status
from pretrain.modeling import NormPlacement
from pretrain.reporting import format_table, pyplot, save_figure


@dataclass(kw_only=True)
class GridConfig:
    """Warm-up x peak-lr grid of short pretraining runs per placement (paper's warm-up claim).

    Each cell is a short pretraining run through the normal pipeline (python -m pretrain.run in a subprocess;
    jobs at once) with this cell's placement, optim.warmup_steps and optim.lr, evaluated once at the end.
    Reads the final val/mlm_loss from RUN/metrics.jsonl or the divergence step from RUN/status.json, prints a
    table per placement and draws annotated heat maps. Runs live in OUT/runs/<placement>-w<warmup>-lr<lr>, logs
    in OUT/logs; cells already finished or diverged are read, not rerun. Anything else of pretrain/run.py
    (data, batch size, sequence length, ...) goes through preset and overrides. Paper: Post-LN needs warm-up;
    Pre-LN trains without it. Writes table.txt, results.json, grid.png."""

    placements: list[NormPlacement] = field(default_factory=lambda: ["post", "pre"])
    """Placements, one heat map each."""
    warmup_steps: list[int] = field(default_factory=lambda: [0, 30, 100])
    """Warm-up steps, rows of the grid."""
    lrs: list[float] = field(default_factory=lambda: [1e-4, 3e-4, 1e-3, 3e-3])
    """Peak learning rates, columns of the grid."""
    max_steps: int = 300
    """Steps per run."""
    num_layers: int = 12
    """Depth."""
    hidden_size: int = 128
    """Hidden size."""
    num_heads: int = 2
    """Attention heads."""
    intermediate_size: int | None = None
    """FFN width; null: 4 * hidden_size."""
    preset: str | None = None
    """A pretrain/run.py preset YAML applied to every cell first."""
    overrides: list[str] = field(default_factory=list)
    """Extra pretrain/run.py overrides for every cell (they win), e.g. '[train.per_device_batch_size=16]'."""
    seed: int = 0
    """train.seed of every cell."""
    jobs: int = 1
    """Cells run at once, each its own process; on a CPU, set OMP_NUM_THREADS to cores / jobs."""
    out: str = str(DEFAULT_OUT / "grid")
    """Output folder (runs/, logs/, table.txt, results.json, grid.png)."""

    def __post_init__(self) -> None:
        for key in ("max_steps", "num_layers", "hidden_size", "num_heads", "jobs"):
            require(getattr(self, key) > 0, key, f"must be a positive integer; got {getattr(self, key)}")
        require(
            self.intermediate_size is None or self.intermediate_size > 0, "intermediate_size", "must be > 0 or null"
        )
        require(all(w >= 0 for w in self.warmup_steps), "warmup_steps", f"must be >= 0; got {self.warmup_steps}")
        require(bool(self.lrs) and all(lr > 0 for lr in self.lrs), "lrs", f"must be > 0; got {self.lrs}")
        from pretrain.config import PretrainConfig  # here: it imports the data pipeline, slow to import

        for item in self.overrides:
            key, eq, _ = item.removeprefix("--").partition("=")
            require(
                bool(eq) and "." in key,
                "overrides",
                f"item {item!r} is not KEY=VALUE with a dotted key, e.g. train.per_device_batch_size=16",
            )
            field_type(PretrainConfig, key)  # a typo fails now, not in every cell


def cell_name(placement: str, warmup: int, lr: float) -> str:
    return f"{placement}-w{warmup}-lr{lr:g}"


def cell_overrides(args: GridConfig, placement: str, warmup: int, lr: float, run_dir: Path) -> list[str]:
    """pretrain/run.py arguments of one cell: the grid's size and this cell's placement, warm-up and lr.

    Evaluation, checkpoint and snapshot happen once, at the end (only the final validation loss is read);
    ``overrides`` come last, so they win.
    """
    argv = [f"--config={args.preset}"] if args.preset else []
    argv += [
        f"--model.norm_placement={placement}",
        f"--optim.lr={lr}",
        f"--optim.warmup_steps={warmup}",
        f"--train.max_steps={args.max_steps}",
        f"--train.output_dir={run_dir}",
        f"--train.run_name=grid-{cell_name(placement, warmup, lr)}",
        f"--train.seed={args.seed}",
        f"--model.num_hidden_layers={args.num_layers}",
        f"--model.hidden_size={args.hidden_size}",
        f"--model.num_attention_heads={args.num_heads}",
        f"--model.intermediate_size={args.intermediate_size or 4 * args.hidden_size}",
        "--train.eval_every=0",
        "--train.checkpoint_every=0",
        "--train.snapshot_at_start=false",
        "--train.snapshot_at_end=false",
        "--tracking.backend=none",
    ]
    return argv + [f"--{item.removeprefix('--')}" for item in args.overrides]


def read_cell(run_dir: Path) -> dict[str, Any]:
    """Outcome of one finished cell: status, final validation MLM loss, divergence step (pretrain.layout)."""
    status = read_status(run_dir)
    val = [row for row in read_metrics(run_dir) if "val/mlm_loss" in row]
    return {
        "status": status.get("status", "unknown"),
        "diverged_at_step": status.get("diverged_at_step"),
        "val_mlm_loss": val[-1]["val/mlm_loss"] if val else None,
        "val_step": val[-1]["step"] if val else None,
        "message": status.get("message", ""),
    }


def run_cell(args: GridConfig, placement: str, warmup: int, lr: float) -> dict[str, Any]:
    """Run one cell in a subprocess (a fresh interpreter per run, as a user would launch it); a cell whose
    run directory already holds a finished or diverged run is read, not rerun, so a stopped grid continues."""
    name = cell_name(placement, warmup, lr)
    run_dir = Path(args.out) / "runs" / name
    if read_status(run_dir).get("status") in ("finished", "diverged"):
        print(f"{name}: already done, reading {run_dir}", flush=True)
        return read_cell(run_dir)
    argv = cell_overrides(args, placement, warmup, lr, run_dir)
    if run_dir.exists():
        argv.append("--train.resume=auto")  # an interrupted cell continues from its last checkpoint
    log = Path(args.out) / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"{name}: python -m pretrain.run {' '.join(argv)}  (log: {log})", flush=True)
    with log.open("w") as f:
        code = subprocess.run(
            [sys.executable, "-m", "pretrain.run", *argv], stdout=f, stderr=subprocess.STDOUT
        ).returncode
    cell = read_cell(run_dir)
    if code != 0:
        tail = log.read_text().strip().splitlines()[-3:]
        cell.update(status="failed", message=f"exit code {code}: {' | '.join(tail)}")
    return cell


def describe_cell(cell: dict[str, Any]) -> str:
    if cell["status"] == "diverged":
        return f"div@{cell['diverged_at_step']}"
    if cell["status"] == "finished" and cell["val_mlm_loss"] is not None:
        return f"{cell['val_mlm_loss']:.3f}"
    return cell["status"]


def run(args: GridConfig) -> int:
    out = Path(args.out)
    grid = [(p, w, lr) for p in args.placements for w in args.warmup_steps for lr in args.lrs]
    # Each cell is its own process, so threads only wait on them; give each process its share of the cores
    # (OMP_NUM_THREADS) when running several.
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        outcomes = pool.map(lambda cell: run_cell(args, *cell), grid)
        cells = {cell_name(*cell): outcome for cell, outcome in zip(grid, outcomes, strict=True)}
    sections = [
        f"final val/mlm_loss after {args.max_steps} steps (depth {args.num_layers}, hidden {args.hidden_size}); "
        "div@N: diverged (non-finite loss or gradient) at step N"
    ]
    for placement in args.placements:
        rows = [
            [warmup, *(describe_cell(cells[cell_name(placement, warmup, lr)]) for lr in args.lrs)]
            for warmup in args.warmup_steps
        ]
        sections.append(f"{placement}-LN\n" + format_table(["warm-up \\ lr", *(f"{lr:g}" for lr in args.lrs)], rows))
    failed = {name: cell["message"] for name, cell in cells.items() if cell["status"] not in ("finished", "diverged")}
    if failed:
        sections.append("cells that did not complete:\n" + "\n".join(f"  {k}: {v}" for k, v in failed.items()))
    write_outputs(out, "\n\n".join(sections), {"args": to_dict(args), "cells": cells})
    plot_grid(args, cells, out / "grid.png")
    return 1 if failed else 0


def plot_grid(args: GridConfig, cells: dict[str, dict[str, Any]], path: Path) -> None:
    """One heat map per placement (rows warm-up, columns lr) on a shared colour scale of the final val loss."""
    plt = pyplot()
    losses = [c["val_mlm_loss"] for c in cells.values() if c["status"] == "finished" and c["val_mlm_loss"] is not None]
    vmin, vmax = (min(losses), max(losses)) if losses else (0.0, 1.0)
    n = len(args.placements)
    fig, axes = plt.subplots(1, n, figsize=(1.6 + 1.3 * len(args.lrs) * n, 1.4 + 0.8 * len(args.warmup_steps)),
                             squeeze=False)  # fmt: skip
    cmap = plt.get_cmap("viridis").with_extremes(bad="lightgray")  # NaN: diverged / failed cells
    image = None
    for ax, placement in zip(axes[0], args.placements, strict=True):
        grid = torch.full((len(args.warmup_steps), len(args.lrs)), float("nan"))
        for i, warmup in enumerate(args.warmup_steps):
            for j, lr in enumerate(args.lrs):
                cell = cells[cell_name(placement, warmup, lr)]
                if cell["status"] == "finished" and cell["val_mlm_loss"] is not None:
                    grid[i, j] = cell["val_mlm_loss"]
                value = grid[i, j].item()
                dark = not math.isnan(value) and value < (vmin + vmax) / 2  # the low end of viridis is dark
                ax.text(j, i, describe_cell(cell), ha="center", va="center", fontsize=9,
                        color="white" if dark else "black")  # fmt: skip
        image = ax.imshow(grid.numpy(), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
        ax.set_xticks(range(len(args.lrs)), [f"{lr:g}" for lr in args.lrs])
        ax.set_yticks(range(len(args.warmup_steps)), [str(w) for w in args.warmup_steps])
        ax.set_xlabel("peak learning rate")
        ax.set_ylabel("warm-up steps")
        ax.set_title(f"{placement}-LN: final val MLM loss")
    if image is not None:
        fig.colorbar(image, ax=list(axes[0]), shrink=0.9, label="val/mlm_loss (gray: diverged)")
    print(f"wrote {save_figure(fig, path, tight_layout=False)}")

