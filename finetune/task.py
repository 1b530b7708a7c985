"""One task of a submission: run this task's jobs of a manifest, one result file per job.

    python -m finetune.task RESULTS/manifests/000007.json              # under SLURM: SLURM_ARRAY_TASK_ID
    python -m finetune.task RESULTS/manifests/000007.json --index=2    # elsewhere

A SLURM array task and a local worker process run this same code. A task reads only its manifest and writes
only result files beside it (finetune/manifest.py); it never opens the results store. A job whose result file
exists is skipped, so a requeued or repeated task continues where the first copy stopped.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from finetune.config import FinetuneConfig
from finetune.manifest import Manifest, ManifestJob, ResultsFolder, load_manifest
from finetune.run import DataCache, finetune


def run_job(job: ManifestJob, manifest: Manifest, folder: ResultsFolder, cache: DataCache) -> str:
    """Run one job and write its result file (or its failure file). Returns done, duplicate or failed."""
    spec, runtime = job.spec, manifest.runtime
    try:
        recipe = FinetuneConfig(**spec.recipe, **runtime["recipe"])
        data = cache.get(spec.model_path, spec.task, runtime["data_dir"], recipe)
        results = finetune(spec.model_path, spec.task, data, spec.lr, spec.seed, recipe)
    except Exception as err:  # recorded for the scheduler, which retries it; go on with the next job
        error = f"{type(err).__name__}: {err}"
        folder.write_failed(job, manifest.submission, error)
        print(f"job {spec.key} ({spec.task} lr={spec.lr:g} seed={spec.seed}) failed: {error}", flush=True)
        return "failed"
    if not folder.write_done(job, results):
        print(f"job {spec.key} was finished first by another copy of this task: this result is dropped", flush=True)
        return "duplicate"
    return "done"


def run_task(manifest_path: str | Path, index: int, parent_pid: int | None = None) -> dict[str, int]:
    """Run task ``index`` of a manifest; returns how many of its jobs ended done, duplicate, skipped, failed.

    With ``parent_pid`` (a local worker), the task stops before its next job once that process is gone: a
    killed scheduler does not leave workers running on (the job in hand is finished and recorded).
    """
    manifest_path = Path(manifest_path).resolve()
    manifest = load_manifest(manifest_path)
    folder = ResultsFolder(manifest_path.parent.parent)
    cache = DataCache()
    counts = dict.fromkeys(("done", "duplicate", "skipped", "failed", "orphaned"), 0)
    for job in manifest.jobs_of_task(index):
        if parent_pid is not None and os.getppid() != parent_pid:
            counts["orphaned"] += 1
            continue
        if folder.is_done(job.spec.key):
            counts["skipped"] += 1
            continue
        counts[run_job(job, manifest, folder, cache)] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m finetune.task", description=__doc__.split("\n\n")[0])
    parser.add_argument("manifest", help="a manifest written by finetune.schedule (RESULTS/manifests/N.json)")
    parser.add_argument("--index", type=int, default=None, help="task index (default: $SLURM_ARRAY_TASK_ID)")
    parser.add_argument("--parent_pid", type=int, default=None, help="stop before the next job once it is gone")
    args = parser.parse_args(argv)
    index = args.index
    if index is None:
        if "SLURM_ARRAY_TASK_ID" not in os.environ:
            parser.error("no --index and no SLURM_ARRAY_TASK_ID: pass --index=N outside a SLURM array")
        index = int(os.environ["SLURM_ARRAY_TASK_ID"])
    try:
        counts = run_task(args.manifest, index, args.parent_pid)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"task {index} of {args.manifest}: " + ", ".join(f"{k} {v}" for k, v in counts.items()), flush=True)
    # A failed job is the scheduler's to retry (it reads the failure file); the task itself did its work.
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
