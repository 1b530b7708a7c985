"""The report's time over a large results folder: synthetic result files, then the reads that the report and
``finetune.schedule status`` make, each in a fresh ResultsFolder (as a new process would), and the whole report.

    python -m benchmarks.finetune_report                     # 10,000 result files in a temporary folder
    python -m benchmarks.finetune_report --results=2000 --reps=3

Two pretraining runs (run id, status and validation curve only) with ``--results`` jobs between them: 2 tasks,
4 learning rates, 25 seeds, and as many snapshot steps as that takes. The results folder is the only record (no
index or cache on disk): every command reads each result file once. The files were just written, so they are in
the page cache; on a cluster file system the first read of each costs a round trip more.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import tempfile
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from finetune.manifest import JobSpec, ManifestJob, Results, ResultsFolder
from finetune.report import ReportConfig, report
from finetune.schedule import status_lines
from pretrain.common.atomic import write_json
from pretrain.common.cli import parse, require, run_cli
from pretrain.run_folder.identity import ensure_run_id, read_run_id

TASKS, LRS, SEEDS = ("mrpc", "rte"), (1e-5, 2e-5, 3e-5, 5e-5), range(25)


@dataclass(kw_only=True)
class ReportBenchmarkConfig:
    """Time the report and the status listing over synthetic result files (see the module docstring)."""

    results: int = 10_000
    """Result files to write (rounded up to whole snapshot steps)."""
    reps: int = 1
    """Timed repetitions of each read (the median is printed)."""
    folder: str | None = None
    """Where to write the runs and the results folder (kept); null: a temporary folder, removed at the end."""

    def __post_init__(self) -> None:
        require(self.results >= 1 and self.reps >= 1, "results/reps", "must be >= 1")


def write_runs(root: Path, steps: list[int]) -> list[Path]:
    """Two finished runs: their id, status and a validation curve (all the report reads of a run folder)."""
    runs = []
    for name, placement, per_step in (("post_ln", "post", 100), ("pre_ln", "pre", 60)):
        run_dir = root / name
        run_dir.mkdir(parents=True, exist_ok=True)
        ensure_run_id(run_dir)
        write_json(run_dir / "status.json", {"status": "finished", "run_name": name, "norm_placement": placement})
        lines = [{"step": s, "val/mlm_loss": 8 - s / per_step} for s in steps]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        runs.append(run_dir)
    return runs


def write_results(folder: ResultsFolder, runs: list[Path], steps: list[int]) -> int:
    """One result file per (run, step, task, lr, seed), as a task writes it."""
    written = 0
    for run_dir, step, task, lr, seed in itertools.product(runs, steps, TASKS, LRS, SEEDS):
        run_id = read_run_id(run_dir)
        spec = JobSpec(run_id=run_id, run_name=run_dir.name, run_dir=str(run_dir), placement=run_dir.name[:-3],
                       pretrain_step=step, tokens_seen=None, model_path=f"{run_dir}/s{step}",
                       snapshot_hash=f"{run_id}-{step}", task=task, lr=lr, seed=seed, recipe={"epochs": 3})  # fmt: skip
        accuracy = 0.6 + 0.1 * math.sin(step + seed) ** 2
        results = Results(accuracy=accuracy, f1=accuracy - 0.1 if task == "mrpc" else None, dev_loss=0.6,
                          train_loss=0.5, epochs=3, train_steps=345, wall_time_s=100.0, device="synthetic",
                          majority_accuracy=0.68, top_class_share=0.7)  # fmt: skip
        written += folder.write_done(ManifestJob(spec, 1), 1, results)
    return written


def timed(fn: Callable[[], object], reps: int) -> float:
    """The median wall-clock seconds of ``reps`` calls."""
    return statistics.median(timeit.repeat(fn, number=1, repeat=reps))


def main(argv: list[str] | None = None) -> int:
    config = parse(ReportBenchmarkConfig, argv, prog="python -m benchmarks.finetune_report", description=__doc__)
    with tempfile.TemporaryDirectory(prefix="finetune-report-") as scratch:
        root = Path(config.folder or scratch)
        per_step = 2 * len(TASKS) * len(LRS) * len(SEEDS)
        steps = [100 * (i + 1) for i in range(math.ceil(config.results / per_step))]
        runs = write_runs(root, steps)
        results_dir = root / "results.d"
        start = time.perf_counter()
        count = write_results(ResultsFolder(results_dir), runs, steps)
        print(f"wrote {count} result files in {time.perf_counter() - start:.1f} s ({results_dir})")
        read = timed(lambda: ResultsFolder(results_dir).done(), config.reps)
        status = timed(lambda: status_lines(ResultsFolder(results_dir).jobs(), 3), config.reps)
        whole = timed(lambda: report(ReportConfig(runs=[str(r) for r in runs], results_dir=str(results_dir),
                                                  out=str(root / "report"))), config.reps)  # fmt: skip
    print(f"reading {count} result files: {read:.2f} s")
    print(f"finetune.schedule status over them: {status:.2f} s")
    print(f"finetune.report over them (reading, statistics, 4 figures, summary.md): {whole:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
