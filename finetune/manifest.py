"""The results folder: the one record of the fine-tuning jobs, shared by the scheduler and the tasks that run them.

Everything a task (a SLURM array task on another node, or a local worker process) needs or produces is a file in
one folder, ``results_dir``: one lock, manifests (a submission's jobs), and per job the files ``started/``, ``done/``
and ``failed/`` (layout and formats: docs/finetune_files.md). There is no other state: what a job is (queued,
submitted, done or failed, its attempts and its error) is derived from these files each time it is asked
(``ResultsFolder.jobs``), so a scheduler killed at any moment continues from the files alone. Files are written
atomically (pretrain/common/atomic.py); of a job that ran twice (same key), the first copy's result file stays.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import numbers
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pretrain.common import atomic
from pretrain.common.cli import writable_folder
from pretrain.common.formats import RESULTS_FORMAT, check_format, stamped
from pretrain.run_folder.lock import holder, holder_text, name_holder
from pretrain.run_folder.status import EXIT_HUNG

MANIFESTS, STARTED, DONE, FAILED, DAMAGED, LOCK = "manifests", "started", "done", "failed", "damaged", "lock"
MOVE_ASIDE = "move it aside and run the command again"
"""What to do with a file of the results folder that this code cannot use as it is, nor move aside itself."""
RESULTS_FIX = (
    "finish that results folder with the checkout that wrote it, or point --results_dir at a new folder (its jobs "
    "then run again)"
)
"""What to do with a results folder written by another version (pretrain/common/formats.py)."""
LOCK_NOTE = (
    "held (flock) by this process while it runs; a dead holder's lock is free: leave this file in place (deleted, "
    "it lets a second scheduler in beside a live one)"
)
"""What the lock file says beside its holder's name: a killed scheduler's file still names it."""

Status = Literal["queued", "submitted", "done", "failed"]
# Why a task ended without charging even the job it had started (finetune/backends.py gives the reasons).
SCHEDULER_STOPPED = "it ran in its scheduler's process, which has stopped"
INTERRUPTED = "an interrupt of its scheduler stopped it"
NOT_STARTED = "not started: "


def recipe_hash(recipe: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


# A job field's role, in its metadata: ``key`` fields are the job's identity (the same values give the same
# numbers); ``about`` fields name and place it (names and folders may change; the key does not).
KEY, ABOUT = {"role": "key"}, {"role": "about"}


@dataclass(frozen=True)
class Model:
    """The model of a job: a pretraining snapshot (its run, its step) or any other model folder or Hub name."""

    run_id: str = field(metadata=KEY)
    """Identity of the pretraining run (RUN/run_id, pretrain/run_folder/identity.py); not its name, not its path."""
    run_name: str = field(metadata=ABOUT)
    """The run's name, for tables and legends only."""
    run_dir: str = field(metadata=ABOUT)
    """Where the run folder was found (it may move; the key does not depend on it)."""
    placement: str = field(metadata=ABOUT)
    """The norm placement (post, pre, ...): follows from the snapshot."""
    pretrain_step: int = field(metadata=KEY)
    """-1 for a model that is not a pretraining snapshot (e.g. a Hub model)."""
    tokens_seen: int | None = field(metadata=ABOUT)
    """Pretraining tokens the snapshot has seen (None: unknown)."""
    model_path: str = field(metadata=ABOUT)
    """Where the snapshot was found (it may move; the key does not depend on it)."""
    snapshot_hash: str = field(metadata=KEY)
    """The snapshot's content: the hash of its manifest's file checksums (finetune.worker.snapshot_hash)."""


@dataclass(frozen=True)
class JobSpec(Model):
    """One fine-tuning job: a model, a task, a learning rate, a seed and a recipe."""

    task: str = field(metadata=KEY)
    """GLUE task (mrpc, rte)."""
    lr: float = field(metadata=KEY)
    """Peak learning rate."""
    seed: int = field(metadata=KEY)
    """Random seed (classifier init, dropout, data order)."""
    recipe: dict[str, Any] = field(metadata=KEY)
    """The recipe fields that change the numbers (FinetuneConfig.result_key())."""

    @cached_property  # a job's key is asked for often; its fields never change
    def recipe_hash(self) -> str:
        return recipe_hash(self.recipe)

    @property
    def label(self) -> str:
        """The job in a line of output: task, lr, seed, snapshot step and run name."""
        step = f" step={self.pretrain_step}" if self.pretrain_step >= 0 else ""
        return f"{self.task} lr={self.lr:g} seed={self.seed}{step} ({self.run_name})"

    @cached_property
    def key(self) -> str:
        """The job's identity: the same key means the same numbers, wherever and however often it ran."""
        identity = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata["role"] == "key"}
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


@dataclass(frozen=True, kw_only=True)
class Results:
    """What a finished job measured on the dev set (finetune.train.finetune)."""

    accuracy: float
    """Share of dev examples classified right."""
    f1: float | None = None
    """MRPC's F1 of the positive class; None for a task scored by accuracy only (RTE)."""
    dev_loss: float
    """Mean cross-entropy over the dev set."""
    train_loss: float
    """Mean training loss over the last epoch."""
    epochs: int
    """Passes over the training set."""
    train_steps: int
    """Optimizer steps in all."""
    wall_time_s: float
    """Seconds of the whole job: loading, training and evaluating."""
    device: str
    """What it computed on (``pretrain.common.hardware.device_name``): the same job on another GPU or CPU generation
    differs in its last digits."""
    majority_accuracy: float
    """Accuracy of answering the dev set's most common label for every example (finetune.glue.baseline_metrics)."""
    majority_f1: float | None = None
    """F1 of that answer (MRPC); None for RTE."""
    top_class_share: float
    """Share of the job's dev predictions in its most predicted class (1.0: it answers one class)."""

    def __post_init__(self) -> None:
        """A file of done/ read back is checked here: a value of another type (null for a loss, text for a count)
        would fail the report's arithmetic later, far from the file."""
        for f in dataclasses.fields(self):
            value, kind = getattr(self, f.name), f.type.removesuffix(" | None")  # annotations are text here
            if value is None and kind != f.type:
                continue
            if isinstance(value, bool) or not isinstance(value, _KINDS[kind]):
                raise ValueError(f"{f.name} {value!r} is not {kind}")
        for name in ("accuracy", "f1", "majority_accuracy", "majority_f1", "top_class_share"):  # the shares
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 1:
                raise ValueError(f"{name} {value} is outside [0, 1]")


_KINDS = {"float": numbers.Real, "int": numbers.Integral, "str": str}
"""The types of Results's fields (numpy's scalars too, as the metrics computed are)."""


@dataclass(frozen=True)
class Runtime:
    """Inputs of a submission's jobs that do not change their numbers, from the command that submitted."""

    data_dir: str | None
    """GLUE folder in the original layout (absolute), or None: nyu-mll/glue from the Hub."""
    recipe: dict[str, Any]
    """The recipe's runtime fields (FinetuneConfig.runtime()): evaluation batch, threads, device, progress bar."""
    wandb: dict[str, Any] | None
    """The W&B settings of the job runs (pretrain.tracking.wandb_logging.WandbSettings), or None: not tracked."""


@dataclass(frozen=True)
class ManifestJob:
    """One line of a manifest: a job and which attempt of it this submission is."""

    spec: JobSpec
    attempt: int
    """The attempts the job had before this submission, plus one."""


@dataclass(frozen=True)
class Manifest:
    """What one submission runs: task ``t`` of ``tasks`` runs jobs ``t, t + tasks, t + 2 * tasks, ...``."""

    submission: int
    """Its number: 1 for the folder's first, then one more each time."""
    backend: str
    """The kind of backend that runs its tasks (inprocess, local, slurm): a later scheduler asks that kind."""
    tasks: int
    """How many tasks share its jobs."""
    runtime: Runtime
    jobs: list[ManifestJob]
    handle: str | None = None
    """How to find its tasks once they started: a SLURM array job id, or host:pid,pid,... of local workers."""
    ended: dict[int, str] = field(default_factory=dict)
    """The tasks that ended, with why (the backend's words: an exit code, a SLURM state, ...)."""

    def jobs_of_task(self, index: int) -> list[ManifestJob]:
        if not 0 <= index < self.tasks:
            raise ValueError(f"task index {index} is outside this manifest's 0..{self.tasks - 1}")
        return self.jobs[index :: self.tasks]

    @property
    def is_open(self) -> bool:
        return len(self.ended) < self.tasks


@dataclass(frozen=True)
class JobState:
    """A job as the results folder describes it."""

    spec: JobSpec
    status: Status
    attempts: int
    """Attempts charged (done: the attempt that finished it; submitted: the one under way)."""
    submission: int
    """The submission of its latest attempt."""
    error: str | None = None
    """Why its latest attempt failed (failed only)."""
    results: Results | None = None
    """What it measured (done only)."""
    permanent: bool = False
    """Failed for good: its snapshot was refused, which no retry changes while the snapshot's files stay as they are."""
    snapshot_stamp: str | None = None
    """The model folder's files_stamp when that attempt failed: a failure for good holds while it is unchanged."""

    def line(self, outcome: str = "") -> str:
        """What a researcher reads when the job ends: ``done TASK lr=.. seed=.. step=.. (RUN) acc 0.684 in 41 s``,
        or ``failed ..., attempt N{outcome}: ERROR``, where ``outcome`` says what happens next (the scheduler's)."""
        if self.results is not None:
            return f"done {self.spec.label} acc {self.results.accuracy:.3f} in {self.results.wall_time_s:.0f} s"
        return f"failed {self.spec.label}, attempt {self.attempts}{outcome}: {self.error}"

    def row(self) -> dict[str, Any]:
        """The flat view of tables and the report: the spec's fields, key, status, ... and the result fields."""
        spec = {f.name: getattr(self.spec, f.name) for f in dataclasses.fields(JobSpec)}  # asdict copies: slow
        results = {f.name: getattr(self.results, f.name, None) for f in dataclasses.fields(Results)}
        return {**spec, "key": self.spec.key, "recipe_hash": self.spec.recipe_hash, "status": self.status,
                "attempts": self.attempts, "error": self.error, "permanent": self.permanent, **results}  # fmt: skip


def charged(reason: str, started: bool) -> bool:
    """Whether a job its task left without a result is charged that attempt, given why the task ended: every job of
    a task that failed by itself or was cancelled; the job it had started when stopped from outside (killed,
    preempted) or by its own watchdog (exit code EXIT_HUNG); none after an interrupt or with its scheduler's process
    (docs/finetune_files.md)."""
    code = reason.removeprefix("exit code ")
    state = reason.removeprefix("sacct: ").split(" ")[0]
    stopped = code.strip() in ("0", str(EXIT_HUNG))
    failed_itself = (code != reason and not stopped) or (state != reason and state in ("FAILED", "CANCELLED"))
    if failed_itself or reason.startswith(NOT_STARTED):
        return True
    return started and reason not in (SCHEDULER_STOPPED, INTERRUPTED)


# --- Writing and reading files --------------------------------------------------------------------


def worker_info() -> dict[str, Any]:
    """Where this attempt ran: host, pid and, under SLURM, the array job and task."""
    slurm = ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_ID", "SLURM_RESTART_COUNT")
    info = {name.lower(): os.environ[name] for name in slurm if name in os.environ}
    return {"host": socket.gethostname(), "pid": os.getpid(), **info}


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Replace ``path`` atomically with ``payload`` and this code's format_version."""
    atomic.write_json(path, stamped(payload, RESULTS_FORMAT), indent=1, default=None)


class DamagedFile(ValueError):
    """A file of the results folder that is not what this code writes there: its writes are atomic, so it was
    damaged, edited or copied since."""


def read_json(path: Path) -> dict[str, Any]:
    """A file of the results folder, refused when it is unreadable or of another format version."""
    try:
        payload = json.loads(path.read_text())
    except ValueError as err:  # cut short or overwritten since: not used silently
        raise DamagedFile(f"{path} is not readable JSON ({err})") from None
    except (PermissionError, IsADirectoryError) as err:  # a colleague's file without read permission, a folder
        raise ValueError(f"{path} cannot be read ({err.strerror}): give it read permission or {MOVE_ASIDE}") from None
    if not isinstance(payload, dict):
        raise DamagedFile(f"{path} holds a JSON {type(payload).__name__}, not an object")
    check_format(payload, path, RESULTS_FORMAT, RESULTS_FIX)
    return payload


def load_manifest(path: str | Path) -> Manifest:
    """A manifest written by ResultsFolder.write_manifest."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"manifest {path} is missing; the scheduler writes it before submitting its tasks")
    try:
        p = read_json(path)
    except DamagedFile as err:  # only the scheduler writes manifests: one damaged since is for a person to look at
        raise ValueError(f"{err}: {MOVE_ASIDE}") from None
    try:
        jobs = [ManifestJob(JobSpec(**j["spec"]), j["attempt"]) for j in p["jobs"]]
        ended = {int(task): reason for task, reason in p["ended"].items()}
        return Manifest(submission=p["submission"], backend=p["backend"], tasks=p["tasks"],
                        runtime=Runtime(**p["runtime"]), jobs=jobs, handle=p["handle"], ended=ended)  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError) as err:  # edited or damaged: named, not a traceback
        problem = f"no field {err}" if isinstance(err, KeyError) else str(err)
        raise ValueError(f"{path} is not a manifest the scheduler writes ({problem}): {MOVE_ASIDE}") from None


class ResultsBusy(RuntimeError):
    """Another scheduler holds the results folder (the message names it and what to do)."""


class ResultsFolder:
    """The shared folder of manifests and result files (layout in the module docstring)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self._states: dict[Path, JobState] = {}  # of done/ and failed/ files, which never change: read once
        self._held: tuple[int, int] | None = None  # (device, inode) of the lock file while this object holds it

    def _read(self, sub: str) -> list[JobState]:
        """The jobs as the files of done/ or failed/ say, each file read and checked once (they never change)."""
        paths = self._files(sub)
        for path in paths:
            if path not in self._states:
                try:
                    self._states[path] = _file_state(path, read_json(path))
                except DamagedFile as err:
                    self._set_aside(path, str(err))
                except FileNotFoundError:  # set aside by another reader since it was listed
                    continue
        return [self._states[path] for path in paths if path in self._states]

    def _set_aside(self, path: Path, problem: str) -> None:
        """Move a damaged file of done/ or failed/ into damaged/ (``_aside_name``), where it is kept and never read,
        and say so: its job then counts as not done, and the scheduler runs it again without a person (``jobs``)."""
        aside = self.root / DAMAGED / _aside_name(path, self.next_submission() - 1)
        try:
            aside.parent.mkdir(exist_ok=True)
            path.rename(aside)
        except FileNotFoundError:  # another reader moved it first
            return
        except OSError as err:  # a colleague's folder this user cannot write; a full disk is run_cli's to say
            if atomic.no_room(err):
                raise
            raise ValueError(f"{problem}; cannot move it to {aside.parent} ({err.strerror}): {MOVE_ASIDE}") from None
        then = "its job runs again" if path.parent.name == DONE else "that attempt counts as ended without its result"
        print(f"warning: {problem}: moved to {aside}; {then}", file=sys.stderr, flush=True)

    def _files(self, sub: str) -> list[Path]:
        """The files of a subfolder, without the temporary files of writes in progress (``.NAME.XXXX.tmp``)."""
        folder = self.root / sub
        return [folder / name for name in _names(folder) if name.endswith(".json") and not name.startswith(".")]

    # --- The scheduler's files ---

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the folder's lock (flock on RESULTS/lock) for the block, or raise ResultsBusy naming its holder.
        The lock goes with its process (a killed scheduler blocks nobody); the file naming the holder is written in
        place, as a rename would put a new file beside the locked one. Only the holder writes manifests, so the
        temporary files of a killed holder's writes there go. NFS and Lustre: docs/finetune_files.md."""
        path = self.root / LOCK
        writable_folder(self.root, "results_dir")  # made now; one that cannot be written is named, not a traceback
        with open(path, "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ResultsBusy(_busy_message(self.root, holder(f))) from None
            except OSError as err:
                raise ResultsBusy(
                    f"cannot lock {path} ({err.strerror}): this file system does not support flock (Lustre: mount "
                    "it with -o flock); keep the results folder on one that does"
                ) from None
            try:
                name_holder(f, note=LOCK_NOTE)
                stat = os.fstat(f.fileno())
                self._held = (stat.st_dev, stat.st_ino)
                for tmp in (self.root / MANIFESTS).glob(".*.tmp"):
                    tmp.unlink(missing_ok=True)
                yield
            finally:
                self._held = None
                f.truncate(0)  # a released lock names nobody
                fcntl.flock(f, fcntl.LOCK_UN)

    def manifest_path(self, submission: int) -> Path:
        return self.root / MANIFESTS / f"{submission:06d}.json"

    def next_submission(self) -> int:
        return max((int(p.stem) for p in self._files(MANIFESTS)), default=0) + 1

    def check_lock(self) -> None:
        """Raise ResultsBusy if the lock file this object holds was deleted or replaced: another scheduler may then
        hold the new one, and two would run the same jobs. Nothing to check while this object holds no lock."""
        if self._held is None:
            return
        path = self.root / LOCK
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            stat = None
        if stat is None or (stat.st_dev, stat.st_ino) != self._held:
            raise ResultsBusy(
                f"the lock file {path} was deleted or replaced while this scheduler held it: another scheduler may "
                "now run on this folder, so this one stops before its next job or submission (the results written "
                f"stay). Leave that file in place ({LOCK_NOTE}). Run the same command again once no other scheduler "
                "runs on this folder."
            )

    def write_manifest(self, manifest: Manifest) -> Path:
        """Write (or rewrite, with its handle and ended tasks) a submission's manifest; its jobs never change.
        Under the lock, only while the lock file is still the one held."""
        self.check_lock()
        path = self.manifest_path(manifest.submission)
        payload = asdict(manifest)
        payload["jobs"] = [{"key": job.spec.key, **asdict(job)} for job in manifest.jobs]
        write_json(path, payload)
        return path

    def manifests(self) -> list[Manifest]:
        """Every submission, in order."""
        return [load_manifest(path) for path in self._files(MANIFESTS)]

    # --- The tasks' files: each names the job, its attempt and submission, and where it ran ---

    def started_path(self, key: str, submission: int) -> Path:
        return self.root / STARTED / f"{key}.{submission}.json"

    def done_path(self, key: str) -> Path:
        return self.root / DONE / f"{key}.json"

    def write_started(self, job: ManifestJob, submission: int) -> None:
        """Record that this attempt of a job began, before any of its work: a job that kills its task is charged."""
        path = self.started_path(job.spec.key, submission)
        write_json(path, _attempt(job, submission, worker_info(), started=time.time()))

    def write_done(self, job: ManifestJob, submission: int, results: Results) -> bool:
        """Record a finished job; False if another copy of it finished first (this copy is dropped)."""
        payload = _attempt(job, submission, worker_info(), spec=asdict(job.spec), results=asdict(results),
                           finished=time.time())  # fmt: skip
        text = json.dumps(stamped(payload, RESULTS_FORMAT), indent=1, sort_keys=True)
        return atomic.write_once(self.done_path(job.spec.key), text)  # the first copy wins: it never changes

    def write_failed(self, job: ManifestJob, submission: int, error: str, permanent: bool = False,
                     snapshot_stamp: str | None = None) -> None:  # fmt: skip
        """Record a failed attempt of a job (``permanent``, ``snapshot_stamp``: JobState's)."""
        info = worker_info()
        path = self.root / FAILED / f"{job.spec.key}.{submission}.{info['host']}-{info['pid']}-{time.time_ns()}.json"
        write_json(path, _attempt(job, submission, info, spec=asdict(job.spec), error=error, permanent=permanent,
                                  snapshot_stamp=snapshot_stamp, failed=time.time()))  # fmt: skip

    # --- What the files say ---

    def done(self) -> dict[str, JobState]:
        """The finished jobs, by key, from their result files."""
        return {state.spec.key: state for state in self._read(DONE)}

    def jobs(self) -> dict[str, JobState]:
        """Every job a file of the folder names, by key. A result file makes it done; else its latest submission
        decides: failed there (a failure file), under way, or its task ended without its result: a failed attempt
        if the task is ``charged`` for it, else queued again with the attempts it had."""
        states: dict[str, JobState] = {}
        done = self.done()  # first: damaged result files are set aside before the submissions are read
        lost = _results_lost(_names(self.root / DAMAGED))
        started = {name for name in _names(self.root / STARTED) if _charged_attempt(name, lost)}
        for manifest in self.manifests():
            for position, job in enumerate(manifest.jobs):
                states[job.spec.key] = _listed(manifest, position % manifest.tasks, job, started)
        for failed in self._read(FAILED):
            latest = states.get(failed.spec.key)
            if latest is None or failed.submission >= latest.submission:
                states[failed.spec.key] = failed
        return states | done


def _attempt(job: ManifestJob, submission: int, worker: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """The payload of a task's file about one attempt of a job."""
    return {"key": job.spec.key, "attempt": job.attempt, "submission": submission, **fields, "worker": worker}


def _file_state(path: Path, payload: dict[str, Any]) -> JobState:
    """The job a file of done/ or failed/ records, refused (naming the file) unless it is what a task writes there:
    every field, the results in their ranges, and the job its name starts with. Another job's result under this
    job's name would make every task skip this job while the folder counts the other: submitted for ever."""
    p = payload
    try:
        spec = JobSpec(**p["spec"])
        if path.parent.name == DONE:
            state = JobState(spec, "done", p["attempt"], p["submission"], results=Results(**p["results"]))
        else:
            state = JobState(spec, "failed", p["attempt"], p["submission"], p["error"], permanent=p["permanent"],
                             snapshot_stamp=p["snapshot_stamp"])  # fmt: skip
    except (KeyError, TypeError, ValueError) as err:
        problem = f"no field {err}" if isinstance(err, KeyError) else str(err)
        raise DamagedFile(f"{path} is not a file a task writes ({problem})") from None
    named = path.name.split(".")[0]
    if {named, p.get("key")} != {spec.key}:
        raise DamagedFile(f"{path} is the file of job {spec.key} ({spec.label}), not of job {named} as its name "
                          "says (a copied, renamed or edited file)")  # fmt: skip
    return state


def _names(folder: Path) -> list[str]:
    """The sorted names in ``folder``; none when it does not exist."""
    return sorted(os.listdir(folder)) if folder.is_dir() else []


def _aside_name(path: Path, submission: int) -> str:
    """The name in damaged/ of a file of done/ or failed/ set aside when ``submission`` was the latest:
    ``SUBFOLDER.NAME.SUBMISSION.NS`` (a result file: ``done.KEY.json.7.NS``)."""
    return f"{path.parent.name}.{path.name}.{submission}.{time.time_ns()}"


def _results_lost(aside: list[str]) -> dict[str, int]:
    """Of each job whose result file was set aside (``_aside_name``: ``done.KEY.json.SUBMISSION.NS``), the latest
    submission then."""
    lost: dict[str, int] = {}
    for sub, key, *_, submission, _ in (name.split(".") for name in aside if name.count(".") == 4):
        if sub == DONE:
            lost[key] = max(lost.get(key, 0), int(submission))
    return lost


def _charged_attempt(started: str, lost: dict[str, int]) -> bool:
    """Whether a started file (``KEY.SUBMISSION.json``) counts: not when its job's result was set aside later (the
    job ran, its result was lost). Set-aside files come only from damage from outside, so no job loops this way."""
    parts = started.split(".")
    return len(parts) == 3 and parts[2] == "json" and int(parts[1]) > lost.get(parts[0], 0)


def _listed(manifest: Manifest, task: int, job: ManifestJob, started: set[str]) -> JobState:
    """A job of ``task`` as its submission's manifest (and its started file) says."""
    submission = manifest.submission
    state = JobState(job.spec, "submitted", job.attempt, submission)
    reason = manifest.ended.get(task)
    if reason is None:
        return state
    if charged(reason, f"{job.spec.key}.{submission}.json" in started):
        error = f"task {task} of submission {submission} ended without a result ({reason})"
        return replace(state, status="failed", error=error)
    return replace(state, status="queued", attempts=job.attempt - 1)


def _busy_message(root: Path, named: dict[str, Any] | None) -> str:
    who = holder_text(named)
    known = named is not None and {"pid", "host"} <= named.keys()
    stop = f"stop it (kill {named['pid']} on {named['host']})" if known else "stop it"
    return (
        f"results folder {root} is in use by another scheduler ({who}; lock file {root / LOCK}). Two schedulers on "
        f"one folder would run its jobs twice. Let that one finish, or {stop} and run this command again (it "
        "continues from the files); to run other jobs side by side, give this one its own --results_dir=FOLDER."
    )
