"""The job queue's side of fine-tuning: the jobs of a model (their key in the results store), and the worker that
claims jobs from the store, runs each with a heartbeat that keeps its lease, and records the result.

``python -m finetune.run`` enqueues one model's grid and works on it here; ``python -m finetune.schedule`` enqueues
every snapshot of its runs and starts workers (local processes or SLURM array tasks) that call ``work``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.config import FinetuneConfig
from finetune.store import ClaimedJob, JobSpec, ResultStore, worker_id
from finetune.train import DataCache, finetune
from pretrain.layout import SNAPSHOT_INFO

# Recipe fields that say how a worker runs, not what it computes (left out of a job's key).
RUNTIME_FIELDS = ("eval_batch_size", "torch_threads", "device", "progress")


# --------------------------------------------------------------------------------------------------
# Jobs: what a model's jobs are and the key they are stored under
# --------------------------------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _placement(info: dict[str, Any], config: dict[str, Any]) -> str:
    """The norm placement from the snapshot info, else the model config; Hugging Face BERT is Post-LN."""
    placement = info.get("norm_placement") or config.get("norm_placement")
    if placement is None:
        placement = "post" if config.get("model_type") == "bert" else "unknown"
    return str(placement)


def describe_model(model: str | Path, store: ResultStore) -> dict[str, Any]:
    """The job-key fields of a model: run name and folder, placement, pretraining step, tokens seen, path, and a
    content hash. A pretraining snapshot (RUN/snapshots/step_*, with snapshot.json) belongs to its run; any other
    folder is a run of its own, and a name that is not a folder is a Hub model (step -1, hashed by name)."""
    path = Path(model)
    if not path.is_dir():
        from transformers import AutoConfig

        name = str(model)
        if path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
            raise FileNotFoundError(f"--model {name!r}: no such model folder (a Hub name is NAME or ORG/NAME)")
        try:
            config = AutoConfig.from_pretrained(name).to_dict()
        except (OSError, ValueError) as err:  # offline, unknown name, or a name the Hub rejects
            raise FileNotFoundError(
                f"--model {name!r} is neither a model folder nor a model found on the Hugging Face Hub: "
                f"{str(err).splitlines()[0]}"
            ) from None
        return {
            "run_name": str(model),
            "run_dir": str(model),
            "placement": _placement({}, config),
            "pretrain_step": -1,
            "tokens_seen": None,
            "model_path": str(model),
            "snapshot_hash": f"hub:{model}",
        }
    info = _read_json(path / SNAPSHOT_INFO)
    run_dir = path.resolve().parent.parent if info else path.resolve()
    return {
        "run_name": str(info.get("run_name", run_dir.name)),
        "run_dir": str(run_dir),
        "placement": _placement(info, _read_json(path / "config.json")),
        "pretrain_step": int(info.get("step", -1)),
        "tokens_seen": info.get("tokens_seen"),
        "model_path": str(path.resolve()),
        "snapshot_hash": store.snapshot_hash(path),
    }


def job_specs(
    description: dict[str, Any],
    task: str,
    lrs: Sequence[float],
    seeds: Sequence[int],
    recipe: FinetuneConfig,
    data_dir: str | None,
) -> list[JobSpec]:
    """One job per (lr, seed) for a described model and a task."""
    return [
        JobSpec(**description, task=task, lr=float(lr), seed=int(seed), recipe=recipe.result_key(), data_dir=data_dir)
        for lr in lrs
        for seed in seeds
    ]


# --------------------------------------------------------------------------------------------------
# The worker: claim from the store, run with a heartbeat, record
# --------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class WorkerSettings:
    """How a worker process runs claimed jobs (not part of a job's identity)."""

    store: str
    lease_s: float
    max_attempts: int
    runtime: dict[str, Any]
    """The recipe's runtime fields (threads, device, progress, eval batch size) for this worker."""
    exit_with_parent: bool = False
    """Pool workers stop when the scheduler that started them dies (its lease-holding jobs then expire)."""


def _heartbeat(settings: WorkerSettings, job: ClaimedJob, worker: str, stop: threading.Event, parent: int) -> None:
    """Keep the job's lease alive from a thread with its own connection (sqlite connections are per thread)."""
    store = ResultStore(settings.store)
    try:
        while not stop.wait(settings.lease_s / 4):
            if settings.exit_with_parent and os.getppid() != parent:
                os._exit(1)  # the scheduler died: stop at once; the expired lease hands the job to another worker
            store.heartbeat(job.id, worker, settings.lease_s)
    finally:
        store.close()


def execute(job: ClaimedJob, store: ResultStore, settings: WorkerSettings, cache: DataCache, worker: str) -> bool:
    """Run one claimed job; record its results or its error. True if it completed."""
    spec = job.spec
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(settings, job, worker, stop, os.getppid()), daemon=True)
    beat.start()
    try:
        recipe = FinetuneConfig(**spec.recipe, **settings.runtime)
        data = cache.get(spec.model_path, spec.task, spec.data_dir, recipe)
        results = finetune(spec.model_path, spec.task, data, spec.lr, spec.seed, recipe)
    except Exception as err:  # recorded in the store and retried; the worker goes on with other jobs
        stop.set()
        beat.join()
        store.fail(job.id, worker, f"{type(err).__name__}: {err}")
        print(f"[{worker}] job {job.id} failed (attempt {job.attempt}): {type(err).__name__}: {err}", flush=True)
        return False
    stop.set()
    beat.join()
    return store.complete(job.id, worker, results)


def work(settings: WorkerSettings, only_ids: Sequence[int] | None = None) -> int:
    """Claim and run jobs until none is left to claim; returns how many this worker completed."""
    worker = worker_id()
    cache = DataCache()
    completed = 0
    with ResultStore(settings.store) as store:
        while (job := store.claim(worker, settings.lease_s, settings.max_attempts, only_ids)) is not None:
            completed += execute(job, store, settings, cache, worker)
    return completed
