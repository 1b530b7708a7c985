"""The results store: one SQLite row per fine-tuning job, written only by the scheduler process.

The store is the scheduler's book-keeping and the report's input; it is never shared between machines
(SQLite's WAL mode and its locks do not work over NFS). Work reaches the nodes as manifests, and comes back
as result files (finetune/manifest.py); on each pass the scheduler ingests those files here. A result file
is the proof that a job is done, so the store can always be rebuilt from the files: delete it and run
``python -m finetune.schedule ingest`` (or any pass) to get the same rows.

A row (keyed by JobSpec.key) moves ``queued -> submitted -> done``, or ``-> failed`` when its attempt wrote a
failure file or its task ended without a result file after starting it (preempted, killed, out of time); a job
its task never started goes back to ``queued`` with the attempts it had. The scheduler submits a failed job
again while ``attempts < max_attempts``. Every change is appended to ``events``.
One scheduler at a time holds a store: ``store_lock`` (an advisory lock file beside it) refuses a second.
The schema version is kept in ``PRAGMA user_version``; a store of another version is refused.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import os
import socket
import sqlite3
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from finetune.manifest import RESULT_FIELDS, JobSpec, ResultsFolder

SCHEMA_VERSION = 2
SCHEDULER_STOPPED = "the scheduler that ran it in-process stopped"
"""Why an in-process task ended without its results (backends.InProcess): its scheduler died with the job in hand."""
BUSY_TIMEOUT_S = 120.0
STATUSES = ("queued", "submitted", "done", "failed")
SPEC_COLUMNS = (
    "run_id",
    "run_name",
    "run_dir",
    "placement",
    "pretrain_step",
    "tokens_seen",
    "model_path",
    "snapshot_hash",
    "task",
    "lr",
    "seed",
    "recipe",
)

# Columns of RESULT_FIELDS that stores of this schema version may predate: added when such a store is opened.
ADDED_RESULT_COLUMNS = ("majority_accuracy", "majority_f1", "top_class_share")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    key TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    run_name TEXT NOT NULL,
    run_dir TEXT NOT NULL,
    placement TEXT NOT NULL,
    pretrain_step INTEGER NOT NULL,
    tokens_seen INTEGER,
    model_path TEXT NOT NULL,
    snapshot_hash TEXT NOT NULL,
    task TEXT NOT NULL,
    lr REAL NOT NULL,
    seed INTEGER NOT NULL,
    recipe_hash TEXT NOT NULL,
    recipe TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'queued',
    attempts INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    submission INTEGER,
    task_index INTEGER,
    accuracy REAL,
    f1 REAL,
    dev_loss REAL,
    train_loss REAL,
    epochs INTEGER,
    train_steps INTEGER,
    wall_time_s REAL,
    majority_accuracy REAL,
    majority_f1 REAL,
    top_class_share REAL,
    finished REAL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status);
CREATE TABLE IF NOT EXISTS submissions (
    id INTEGER PRIMARY KEY,
    backend TEXT NOT NULL,
    manifest TEXT,
    tasks INTEGER NOT NULL,
    handle TEXT,
    ended INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL,
    event TEXT NOT NULL,
    time REAL NOT NULL,
    detail TEXT
);
CREATE TABLE IF NOT EXISTS snapshot_hashes (
    path TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    hash TEXT NOT NULL
);
"""


class StoreVersionError(RuntimeError):
    """The store was written by another version of this code."""


class StoreBusy(RuntimeError):
    """Another scheduler holds the results store (the message names it and what to do)."""


def lock_path(store: str | Path) -> Path:
    return Path(store).with_name(Path(store).name + ".lock")


@contextmanager
def store_lock(store: str | Path) -> Iterator[None]:
    """Hold the store's advisory lock (flock on STORE.lock) for the block, or raise StoreBusy naming its holder.

    Two schedulers on one store would each submit the same jobs (and charge them attempts). The lock goes with
    its process, so a killed scheduler blocks nobody; the file keeps the holder's host, pid and start time for
    the message. The store lives on a local disk (see the module docstring), where flock is reliable."""
    path = lock_path(store)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise StoreBusy(_busy_message(store, f.read())) from None
        try:
            f.seek(0)
            f.truncate()
            since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
            holder = {"host": socket.gethostname(), "pid": os.getpid(), "since": since, "command": sys.argv}
            f.write(json.dumps(holder))
            f.flush()
            yield
        finally:
            f.seek(0)
            f.truncate()  # a released lock names nobody
            fcntl.flock(f, fcntl.LOCK_UN)


def _busy_message(store: str | Path, recorded: str) -> str:
    try:
        holder = json.loads(recorded)
        who = f"pid {holder['pid']} on {holder['host']}, running since {holder['since']}"
        stop = f"stop it (kill {holder['pid']} on {holder['host']})"
    except (ValueError, KeyError, TypeError):  # it took the lock this instant and has not written its name yet
        who, stop = "a process that has just started", "stop it"
    return (
        f"results store {store} is in use by another scheduler ({who}; lock file {lock_path(store)}). Two "
        f"schedulers on one store would run its jobs twice. Let that one finish, or {stop} and run this command "
        "again (it takes in what finished); to run other jobs side by side, give this one its own --store=PATH."
    )


class ResultStore:
    """The scheduler's connection to its results store (an SQLite file on a local disk)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode; transactions are opened explicitly where several statements must be atomic.
        self.db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        self.db.row_factory = sqlite3.Row
        self._check_version()
        with self._transaction():
            # Statement by statement: executescript() would commit the transaction first.
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self.db.execute(statement)
            self._add_result_columns()
            self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _add_result_columns(self) -> None:
        """Result columns added after a store was created (nullable: their old rows stay as they were, and the
        report shows those values as unknown)."""
        present = {r["name"] for r in self.db.execute("PRAGMA table_info(jobs)")}
        for column in ADDED_RESULT_COLUMNS:
            if column not in present:
                self.db.execute(f"ALTER TABLE jobs ADD COLUMN {column} REAL")

    def _check_version(self) -> None:
        found = self.db.execute("PRAGMA user_version").fetchone()[0]
        if found > SCHEMA_VERSION:
            self.db.close()
            raise StoreVersionError(
                f"results store {self.path} has schema version {found}, newer than this code's {SCHEMA_VERSION}: "
                "it was written by a newer version of lnbert. Upgrade this checkout (git pull) or use another "
                "--store path."
            )
        if 0 < found < SCHEMA_VERSION:
            self.db.close()
            raise StoreVersionError(
                f"results store {self.path} has schema version {found} (jobs keyed by run name, written by the "
                "workers themselves); this code keys jobs by run id and rebuilds the store from result files. "
                "Move the old file aside (it is not changed) and run the scheduler again with a new --store."
            )

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def _event(self, key: str, event: str, detail: str | None = None) -> None:
        self.db.execute(
            "INSERT INTO events (key, event, time, detail) VALUES (?, ?, ?, ?)", (key, event, time.time(), detail)
        )

    def _row(self, key: str) -> sqlite3.Row | None:
        return self.db.execute("SELECT * FROM jobs WHERE key = ?", (key,)).fetchone()

    def _insert(self, spec: JobSpec, now: float) -> bool:
        values = spec.to_dict()
        values["recipe"] = json.dumps(spec.recipe, sort_keys=True)
        values["recipe_hash"] = spec.recipe_hash
        values["key"] = spec.key
        cursor = self.db.execute(
            f"INSERT OR IGNORE INTO jobs ({', '.join(values)}, status, created, updated) "
            f"VALUES ({', '.join('?' * len(values))}, 'queued', ?, ?)",
            (*values.values(), now, now),
        )
        return cursor.rowcount == 1

    # ----------------------------------------------------------------------------------------------
    # Jobs in
    # ----------------------------------------------------------------------------------------------

    def enqueue(self, specs: Sequence[JobSpec]) -> int:
        """Add the jobs that are new; for the others, take the paths and name this scheduler found now."""
        added, now = 0, time.time()
        with self._transaction():
            for spec in specs:
                if self._insert(spec, now):
                    added += 1
                    self._event(spec.key, "queued")
                else:  # a moved run folder is the same run: its jobs read the snapshots where they are now
                    self.db.execute(
                        "UPDATE jobs SET run_name = ?, run_dir = ?, model_path = ? WHERE key = ?",
                        (spec.run_name, spec.run_dir, spec.model_path, spec.key),
                    )
        return added

    def retry_failed(self) -> int:
        """Queue every failed job again with a fresh count of attempts (after the cause was fixed)."""
        with self._transaction():
            keys = [r["key"] for r in self.db.execute("SELECT key FROM jobs WHERE status = 'failed'")]
            self.db.execute(
                "UPDATE jobs SET status = 'queued', attempts = 0, updated = ? WHERE status = 'failed'", (time.time(),)
            )
            for key in keys:
                self._event(key, "retry_failed")
        return len(keys)

    def runnable(self, max_attempts: int) -> list[tuple[JobSpec, int]]:
        """Jobs to submit now (queued, or failed with attempts left), with the attempts they had."""
        rows = self.db.execute(
            "SELECT * FROM jobs WHERE status = 'queued' OR (status = 'failed' AND attempts < ?) "
            "ORDER BY run_id, pretrain_step, task, lr, seed",
            (max_attempts,),
        ).fetchall()
        return [(spec_from_row(r), r["attempts"]) for r in rows]

    # ----------------------------------------------------------------------------------------------
    # Submissions
    # ----------------------------------------------------------------------------------------------

    def new_submission(self, backend: str, tasks: int) -> int:
        cursor = self.db.execute(
            "INSERT INTO submissions (backend, tasks, created) VALUES (?, ?, ?)", (backend, tasks, time.time())
        )
        return int(cursor.lastrowid)

    def mark_submitted(self, submission: int, manifest: str, jobs: Iterable[tuple[str, int, int]]) -> None:
        """Record a manifest's jobs as ``(key, attempt, task_index)`` before its tasks start."""
        now = time.time()
        with self._transaction():
            self.db.execute("UPDATE submissions SET manifest = ? WHERE id = ?", (manifest, submission))
            for key, attempt, task_index in jobs:
                self.db.execute(
                    "UPDATE jobs SET status = 'submitted', attempts = ?, submission = ?, task_index = ?, updated = ? "
                    "WHERE key = ? AND status != 'done'",
                    (attempt, submission, task_index, now, key),
                )
                self._event(key, "submitted", f"submission {submission} task {task_index} attempt {attempt}")

    def set_handle(self, submission: int, handle: str) -> None:
        """How to find the submission's tasks: a SLURM array job id, or host:pid,pid,... of local workers."""
        self.db.execute("UPDATE submissions SET handle = ? WHERE id = ?", (handle, submission))

    def open_submissions(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.db.execute("SELECT * FROM submissions WHERE ended = 0 ORDER BY id")]

    def tasks_ended(
        self, submission: int, task_indices: Iterable[int], reasons: dict[int, str], folder: ResultsFolder | None = None
    ) -> int:
        """Tasks that ended: their jobs still without a result failed this attempt. Returns how many.

        With the results ``folder``, only a job its task started (``started/`` file) is charged the attempt; one it
        never reached (its scheduler or worker was killed first, its array task was preempted or timed out) is
        queued again with the attempts it had. An in-process task (``--workers=1``) dies with its scheduler, so the
        job in hand is not charged either: otherwise a scheduler killed soon after each start would use up the
        attempts of the job it restarts with. A task that failed by itself (a non-zero exit, sacct FAILED) would
        fail again, so every job it left is charged (task_failed_itself): a broken environment still stops after
        max_attempts."""
        failed, now = 0, time.time()
        with self._transaction():
            for index in task_indices:
                rows = self.db.execute(
                    "SELECT key FROM jobs WHERE status = 'submitted' AND submission = ? AND task_index = ?",
                    (submission, index),
                ).fetchall()
                reason = reasons.get(index, "?")
                charge_all = folder is None or task_failed_itself(reason)
                charge_started = reason != SCHEDULER_STOPPED
                error = f"task {index} of submission {submission} ended without a result ({reason})"
                for row in rows:
                    started = folder is not None and folder.was_started(row["key"], submission)
                    if charge_all or (started and charge_started):
                        self.db.execute(
                            "UPDATE jobs SET status = 'failed', error = ?, updated = ? WHERE key = ?",
                            (error, now, row["key"]),
                        )
                        self._event(row["key"], "failed", error)
                        failed += 1
                    else:
                        self.db.execute(
                            "UPDATE jobs SET status = 'queued', attempts = attempts - 1, updated = ? WHERE key = ?",
                            (now, row["key"]),
                        )
                        why = "its scheduler died inside it" if started else "it never started"
                        self._event(row["key"], "not_started", f"{error}; {why}: attempt not counted")
        return failed

    def requeue_interrupted(self) -> int:
        """After a Ctrl-C that stopped this machine's workers: their jobs without a result are queued again and
        the stopped attempt is not counted (an interruption is not a failure); their submissions end. Returns
        how many jobs. Not for SLURM submissions, whose tasks keep running after the scheduler stops."""
        now = time.time()
        with self._transaction():
            local = [
                r["id"] for r in self.db.execute("SELECT id FROM submissions WHERE ended = 0 AND backend != 'slurm'")
            ]
            keys = []
            for submission in local:
                rows = self.db.execute(
                    "SELECT key FROM jobs WHERE status = 'submitted' AND submission = ?", (submission,)
                ).fetchall()
                keys += [r["key"] for r in rows]
                self.db.execute(
                    "UPDATE jobs SET status = 'queued', attempts = MAX(attempts - 1, 0), updated = ? "
                    "WHERE status = 'submitted' AND submission = ?",
                    (now, submission),
                )
                self.db.execute("UPDATE submissions SET ended = 1 WHERE id = ?", (submission,))
            for key in keys:
                self._event(key, "interrupted", "stopped by an interrupt of the scheduler; queued again")
        return len(keys)

    def end_submission(self, submission: int) -> None:
        self.db.execute("UPDATE submissions SET ended = 1 WHERE id = ?", (submission,))

    def submitted_tasks(self, submission: int) -> set[int]:
        """Task indices of a submission that still have jobs waiting for a result."""
        rows = self.db.execute(
            "SELECT DISTINCT task_index FROM jobs WHERE status = 'submitted' AND submission = ?", (submission,)
        )
        return {r["task_index"] for r in rows}

    # ----------------------------------------------------------------------------------------------
    # Results in
    # ----------------------------------------------------------------------------------------------

    def ingest(self, folder: ResultsFolder) -> tuple[int, int]:
        """Take in result and failure files (idempotent). Returns (jobs newly done, attempts newly failed)."""
        done, failed, now = 0, 0, time.time()
        finished = {r["key"] for r in self.db.execute("SELECT key FROM jobs WHERE status = 'done'")}
        results = folder.done_files(skip=finished)
        failures = folder.failed_files()
        with self._transaction():
            for payload in results:
                spec = JobSpec.from_dict(payload["spec"])
                self._insert(spec, now)  # a store rebuilt from the files alone
                row = self._row(payload["key"])
                if row is None or row["status"] == "done":
                    continue  # done is final: a second copy of a result changes nothing
                values = [payload["results"].get(c) for c in RESULT_FIELDS]
                self.db.execute(
                    f"UPDATE jobs SET status = 'done', error = NULL, attempts = ?, finished = ?, updated = ?, "
                    f"{', '.join(f'{c} = ?' for c in RESULT_FIELDS)} WHERE key = ?",
                    (max(row["attempts"], payload["attempt"]), payload["finished"], now, *values, payload["key"]),
                )
                self._event(payload["key"], "done", json.dumps(payload["worker"]))
                done += 1
            for payload in failures:
                self._insert(JobSpec.from_dict(payload["spec"]), now)
                row = self._row(payload["key"])
                attempt = payload["attempt"]
                older = attempt < row["attempts"] or (row["submission"] or 0) > payload["submission"]
                if row["status"] == "done" or older:
                    continue  # a job another attempt finished, or an earlier attempt's (or round's) failure
                if row["status"] == "failed" and row["attempts"] == attempt and row["error"] == payload["error"]:
                    continue  # already taken in
                self.db.execute(
                    "UPDATE jobs SET status = 'failed', attempts = ?, error = ?, updated = ? WHERE key = ?",
                    (attempt, payload["error"], now, payload["key"]),
                )
                self._event(payload["key"], "failed", payload["error"])
                failed += 1
        return done, failed

    # ----------------------------------------------------------------------------------------------
    # Reading
    # ----------------------------------------------------------------------------------------------

    def rows(self, status: str | None = None) -> list[dict[str, Any]]:
        query = "SELECT * FROM jobs" + (" WHERE status = ?" if status else "")
        query += " ORDER BY run_id, pretrain_step, task, lr, seed, recipe_hash"
        return [dict(r) for r in self.db.execute(query, (status,) if status else ())]

    def events(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.db.execute("SELECT * FROM events ORDER BY id")]

    def failures(self, max_attempts: int) -> list[dict[str, Any]]:
        """Jobs that failed every allowed attempt."""
        query = "SELECT * FROM jobs WHERE status = 'failed' AND attempts >= ? ORDER BY run_id, pretrain_step, task"
        return [dict(r) for r in self.db.execute(query, (max_attempts,))]

    def counts(self, max_attempts: int) -> dict[tuple[str, str, str], dict[str, int]]:
        """``{(run_name, run_id, task): {queued, submitted, done, failed, retrying}}``; failed: final failures."""
        out: dict[tuple[str, str, str], dict[str, int]] = {}
        for r in self.db.execute(
            "SELECT run_name, run_id, task, status, attempts < ? AS retry, COUNT(*) AS n FROM jobs "
            "GROUP BY run_name, run_id, task, status, retry ORDER BY run_name, run_id, task",
            (max_attempts,),
        ):
            entry = out.setdefault((r["run_name"], r["run_id"], r["task"]), dict.fromkeys((*STATUSES, "retrying"), 0))
            status = "retrying" if r["status"] == "failed" and r["retry"] else r["status"]
            entry[status] += r["n"]
        return out

    def step_time_s(self, recipe_hash: str) -> float | None:
        """Measured seconds per optimizer step of finished jobs of this recipe (training and evaluation)."""
        row = self.db.execute(
            "SELECT SUM(wall_time_s) AS t, SUM(train_steps) AS n FROM jobs WHERE status = 'done' AND recipe_hash = ?",
            (recipe_hash,),
        ).fetchone()
        return row["t"] / row["n"] if row["n"] else None

    # ----------------------------------------------------------------------------------------------
    # Snapshot hashes (cached: hashing BERT-base weights takes a second, and snapshots are polled)
    # ----------------------------------------------------------------------------------------------

    def snapshot_hash(self, model_dir: str | Path) -> str:
        """Content hash of a snapshot's weights and config, cached by (path, size, mtime)."""
        model_dir = Path(model_dir).resolve()
        files = weight_files(model_dir)
        stats = [f.stat() for f in files]
        size, mtime = sum(s.st_size for s in stats), max(s.st_mtime_ns for s in stats)
        row = self.db.execute(
            "SELECT size, mtime_ns, hash FROM snapshot_hashes WHERE path = ?", (str(model_dir),)
        ).fetchone()
        if row is not None and (row["size"], row["mtime_ns"]) == (size, mtime):
            return row["hash"]
        digest = hash_files(files)
        self.db.execute(
            "INSERT OR REPLACE INTO snapshot_hashes (path, size, mtime_ns, hash) VALUES (?, ?, ?, ?)",
            (str(model_dir), size, mtime, digest),
        )
        return digest


def task_failed_itself(reason: str) -> bool:
    """Whether a task's end reason (Backend.live_tasks) charges every job it left: an error of the task itself (a
    local worker's non-zero exit code, SLURM's FAILED state), or SLURM's CANCELLED (someone cancelled it: resubmitting
    it for free would never end). Killed, preempted, timed out, a lost node or a stopped scheduler: no."""
    code = reason.removeprefix("exit code ")
    state = reason.removeprefix("sacct: ").split(" ")[0]
    return (code != reason and code.strip() != "0") or (state != reason and state in ("FAILED", "CANCELLED"))


def spec_from_row(row: sqlite3.Row | dict[str, Any]) -> JobSpec:
    values = {c: row[c] for c in SPEC_COLUMNS}
    values["recipe"] = json.loads(values["recipe"])
    return JobSpec(**values)


def weight_files(model_dir: Path) -> list[Path]:
    """config.json plus the weight files of a save_pretrained folder (a re-written snapshot hashes differently)."""
    weights = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("*.bin"))
    if not weights or not (model_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"{model_dir} is not a model folder: expected config.json and model.safetensors (save_pretrained)"
        )
    return [model_dir / "config.json", *weights]


def hash_files(files: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        with open(path, "rb") as f:
            for chunk in iter(lambda f=f: f.read(1 << 22), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]
