"""The files between the scheduler and the tasks that run jobs: manifests in, result files out.

The scheduler is the only process that writes the results store (SQLite, finetune/store.py). Everything a task
(a SLURM array task on another node, or a local worker process) needs or produces is a file in one shared
folder, ``results_dir`` (docs/finetune_files.md):

    RESULTS/manifests/000007.json   written by the scheduler before it starts the tasks that read it
    RESULTS/started/KEY.7.json      written by a task as it starts a job of submission 7: only a started job's
                                    attempt counts when its task ends without a result (a killed scheduler's
                                    queue of jobs that never ran costs them nothing)
    RESULTS/done/KEY.json           one per finished job: the proof that it is done; never changes once there
    RESULTS/failed/KEY.N.TAG.json   one per failed attempt N of a job, with the error (TAG: host, pid, time)

Files are written atomically (a temporary name, then a rename or a hard link, both atomic on NFS and Lustre)
with the permissions the umask gives, so colleagues can read them. A job that runs twice (a requeued task,
two copies of one task) computes the same KEY; the first copy's file stays and the second is dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pretrain.common import atomic

MANIFEST_VERSION = 1
RESULT_VERSION = 1
MANIFESTS, STARTED, DONE, FAILED = "manifests", "started", "done", "failed"
# The result fields a finished job reports (the store has one column each).
RESULT_FIELDS = (
    "accuracy",
    "f1",
    "dev_loss",
    "train_loss",
    "epochs",
    "train_steps",
    "wall_time_s",
    # The dev set's majority-class scores and the job's most predicted class share (finetune.glue.baseline_metrics).
    "majority_accuracy",
    "majority_f1",
    "top_class_share",
)


def recipe_hash(recipe: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class JobSpec:
    """One fine-tuning job: what identifies its result, and where its model is now."""

    run_id: str
    """Identity of the pretraining run (RUN/run_id, pretrain/run_folder/identity.py); not its name, not its path."""
    run_name: str
    """The run's name, for tables and legends only."""
    run_dir: str
    """Where the run folder was found by this scheduler (it may move; the key does not depend on it)."""
    placement: str
    pretrain_step: int
    """-1 for a model that is not a pretraining snapshot (e.g. a Hub model)."""
    tokens_seen: int | None
    model_path: str
    """Where the snapshot was found by this scheduler (it may move; the key does not depend on it)."""
    snapshot_hash: str
    task: str
    lr: float
    seed: int
    recipe: dict[str, Any]
    """The recipe fields that change the numbers (FinetuneConfig.result_key())."""

    @property
    def recipe_hash(self) -> str:
        return recipe_hash(self.recipe)

    @property
    def key(self) -> str:
        """The job's identity: the same key means the same numbers, wherever and however often it ran."""
        identity = [self.run_id, self.pretrain_step, self.snapshot_hash, self.task, self.lr, self.seed]
        return hashlib.sha256(json.dumps([*identity, self.recipe_hash]).encode()).hexdigest()[:24]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> JobSpec:
        return cls(**values)


# --------------------------------------------------------------------------------------------------
# Writing files atomically, readable by colleagues
# --------------------------------------------------------------------------------------------------


# Through pretrain/common/atomic.py (a temporary file, fsync, the umask's mode, then a rename or a hard link).


def write_json(path: Path, payload: Any) -> None:
    """Replace ``path`` atomically: readers see the old file or the new one, never half of one."""
    atomic.write_json(path, payload, indent=1, default=None)


def write_json_once(path: Path, payload: Any) -> bool:
    """Create ``path`` atomically unless it exists; False (and nothing written) if it already did: the first copy
    wins, so a result file never changes."""
    return atomic.write_once(path, json.dumps(payload, indent=1, sort_keys=True))


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file, or None if it is gone or unreadable (e.g. cut short by a full disk: its job is redone)."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def worker_info() -> dict[str, Any]:
    """Where this attempt ran: host, pid and, under SLURM, the array job and task."""
    info: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
    for name in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_ID", "SLURM_RESTART_COUNT"):
        if name in os.environ:
            info[name.lower()] = os.environ[name]
    return info


# --------------------------------------------------------------------------------------------------
# The shared folder
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ManifestJob:
    """One line of a manifest: a job and which attempt of it this submission is."""

    spec: JobSpec
    attempt: int


@dataclass(frozen=True)
class Manifest:
    """What one submission runs: task ``t`` of ``tasks`` runs jobs ``t, t + tasks, t + 2 * tasks, ...``."""

    submission: int
    tasks: int
    runtime: dict[str, Any]
    """Inputs that do not change the numbers, from the command that submitted: data_dir, threads, device, ..."""
    jobs: list[ManifestJob]

    def jobs_of_task(self, index: int) -> list[ManifestJob]:
        if not 0 <= index < self.tasks:
            raise ValueError(f"task index {index} is outside this manifest's 0..{self.tasks - 1}")
        return self.jobs[index :: self.tasks]

    def task_of(self, position: int) -> int:
        """The task that runs the manifest's ``position``-th job."""
        return position % self.tasks


class ResultsFolder:
    """The shared folder of manifests and result files (layout in the module docstring)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()

    def manifest_path(self, submission: int) -> Path:
        return self.root / MANIFESTS / f"{submission:06d}.json"

    def done_path(self, key: str) -> Path:
        return self.root / DONE / f"{key}.json"

    def write_manifest(self, manifest: Manifest) -> Path:
        path = self.manifest_path(manifest.submission)
        payload = {
            "version": MANIFEST_VERSION,
            "submission": manifest.submission,
            "tasks": manifest.tasks,
            "runtime": manifest.runtime,
            "jobs": [{"key": j.spec.key, "attempt": j.attempt, "spec": j.spec.to_dict()} for j in manifest.jobs],
        }
        write_json(path, payload)
        return path

    def is_done(self, key: str) -> bool:
        return self.done_path(key).is_file()

    def started_path(self, key: str, submission: int) -> Path:
        return self.root / STARTED / f"{key}.{submission}.json"

    def write_started(self, job: ManifestJob, submission: int) -> None:
        """Record that this attempt of a job began (before any of its work): its attempt then counts even if the
        task dies inside it, so a job that kills its process stops after max_attempts."""
        payload = {"version": RESULT_VERSION, "key": job.spec.key, "attempt": job.attempt, "submission": submission}
        payload.update(worker=worker_info(), started=time.time())
        write_json(self.started_path(job.spec.key, submission), payload)

    def was_started(self, key: str, submission: int) -> bool:
        return self.started_path(key, submission).is_file()

    def write_done(self, job: ManifestJob, results: dict[str, Any]) -> bool:
        """Record a finished job; False if another copy of it finished first (this copy is dropped)."""
        payload = {
            "version": RESULT_VERSION,
            "key": job.spec.key,
            "attempt": job.attempt,
            "spec": job.spec.to_dict(),
            "results": {k: results.get(k) for k in RESULT_FIELDS},
            "worker": worker_info(),
            "finished": time.time(),
        }
        return write_json_once(self.done_path(job.spec.key), payload)

    def write_failed(self, job: ManifestJob, submission: int, error: str) -> None:
        """Record a failed attempt (the submission tells an old attempt's failure from a retried job's)."""
        info = worker_info()
        tag = f"{info['host']}-{info['pid']}-{time.time_ns()}"
        path = self.root / FAILED / f"{job.spec.key}.{job.attempt}.{tag}.json"
        payload = {"version": RESULT_VERSION, "key": job.spec.key, "attempt": job.attempt, "spec": job.spec.to_dict()}
        payload.update(submission=submission, error=error, worker=info, failed=time.time())
        write_json(path, payload)

    def done_files(self, skip: set[str] = frozenset()) -> list[dict[str, Any]]:
        """Every readable result file but those of the keys in ``skip`` (temporary files are left out)."""
        return self._read(DONE, skip)

    def failed_files(self) -> list[dict[str, Any]]:
        return self._read(FAILED, frozenset())

    def _read(self, sub: str, skip: set[str]) -> list[dict[str, Any]]:
        folder = self.root / sub
        found = sorted(folder.glob("*.json")) if folder.is_dir() else []
        paths = [p for p in found if not p.name.startswith(".") and p.name.split(".")[0] not in skip]
        return [payload for payload in map(read_json, paths) if payload is not None and "key" in payload]


def load_manifest(path: str | Path) -> Manifest:
    """A manifest written by ResultsFolder.write_manifest (clear errors for a wrong or newer file)."""
    payload = read_json(Path(path))
    if payload is None:
        raise FileNotFoundError(f"manifest {path} is missing or not JSON; the scheduler writes it before submitting")
    if payload.get("version") != MANIFEST_VERSION:
        raise ValueError(
            f"manifest {path} has version {payload.get('version')}, this code reads {MANIFEST_VERSION}: "
            "run tasks with the checkout of the scheduler that wrote it"
        )
    jobs = [ManifestJob(spec=JobSpec.from_dict(j["spec"]), attempt=int(j["attempt"])) for j in payload["jobs"]]
    return Manifest(submission=payload["submission"], tasks=payload["tasks"], runtime=payload["runtime"], jobs=jobs)
