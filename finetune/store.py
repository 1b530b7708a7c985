"""The results store: one SQLite row per fine-tuning job, which is also the job queue.

A job is (pretraining run, placement, pretraining step, snapshot hash, task, lr, seed, recipe). Its row
moves ``queued -> running -> done`` (or ``failed``, retried while ``attempts < max_attempts``). Several
processes, on one machine or on a cluster's shared file system, use one store safely:

- WAL journal and a busy timeout, so readers never block and writers wait instead of failing;
- a job is claimed inside a ``BEGIN IMMEDIATE`` transaction (one writer at a time), so two workers never
  claim the same row; the claim holds a lease (``lease_expires``) that a heartbeat keeps extending;
- a job whose worker died (lease expired, or its pid is gone on this host) is claimed again, and only
  the current claimant may complete it, so a crash loses no job and no job is completed twice;
- a row that is ``done`` is never recomputed.

Every claim, completion and failure is appended to ``events`` (an audit log the tests read).
The schema version is kept in ``PRAGMA user_version``; a store written by a newer version is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 120.0
STATUSES = ("queued", "running", "done", "failed")
# The columns that identify a job: a row with these values is computed at most once.
KEY_COLUMNS = ("run_name", "pretrain_step", "snapshot_hash", "task", "lr", "seed", "recipe_hash")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY,
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
    data_dir TEXT,
    status TEXT NOT NULL DEFAULT 'queued',
    attempts INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    claimed_by TEXT,
    lease_expires REAL,
    accuracy REAL,
    f1 REAL,
    dev_loss REAL,
    train_loss REAL,
    epochs INTEGER,
    train_steps INTEGER,
    wall_time_s REAL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    UNIQUE (run_name, pretrain_step, snapshot_hash, task, lr, seed, recipe_hash)
);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status, id);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    job_id INTEGER NOT NULL,
    event TEXT NOT NULL,
    worker TEXT NOT NULL,
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
    """The store was written by a newer version of this code."""


def recipe_hash(recipe: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def worker_id() -> str:
    """``host:pid`` of this process: who holds a claim (and how to tell it died, on this host)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


@dataclass(frozen=True)
class JobSpec:
    """Everything a worker needs to run one job, and the key it is stored under."""

    run_name: str
    run_dir: str
    placement: str
    pretrain_step: int
    """-1 for a model that is not a pretraining snapshot (e.g. a Hub model)."""
    tokens_seen: int | None
    model_path: str
    snapshot_hash: str
    task: str
    lr: float
    seed: int
    recipe: dict[str, Any]
    data_dir: str | None

    def row(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "recipe"}
        out["recipe"] = json.dumps(self.recipe, sort_keys=True)
        out["recipe_hash"] = recipe_hash(self.recipe)
        return out


@dataclass(frozen=True)
class ClaimedJob:
    """A claimed job: its row id, the spec, and the attempt number this claim is."""

    id: int
    spec: JobSpec
    attempt: int


def _spec_from_row(row: sqlite3.Row) -> JobSpec:
    return JobSpec(
        run_name=row["run_name"],
        run_dir=row["run_dir"],
        placement=row["placement"],
        pretrain_step=row["pretrain_step"],
        tokens_seen=row["tokens_seen"],
        model_path=row["model_path"],
        snapshot_hash=row["snapshot_hash"],
        task=row["task"],
        lr=row["lr"],
        seed=row["seed"],
        recipe=json.loads(row["recipe"]),
        data_dir=row["data_dir"],
    )


class ResultStore:
    """A connection to one results store (an SQLite file). One per process or thread."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode; transactions are opened explicitly where several statements must be atomic.
        self.db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        self.db.row_factory = sqlite3.Row
        self.db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        self._check_version()
        self.db.execute("PRAGMA journal_mode = WAL")
        with self._transaction():
            # Statement by statement: executescript() would commit the transaction first.
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self.db.execute(statement)
            self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _check_version(self) -> None:
        found = self.db.execute("PRAGMA user_version").fetchone()[0]
        if found > SCHEMA_VERSION:
            self.db.close()
            raise StoreVersionError(
                f"results store {self.path} has schema version {found}, newer than this code's {SCHEMA_VERSION}: "
                "it was written by a newer version of lnbert. Upgrade this checkout (git pull) or use another "
                "--store path."
            )

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE takes the write lock up front, so read-then-update sequences are atomic."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def _event(self, job_id: int, event: str, worker: str, detail: str | None = None) -> None:
        self.db.execute(
            "INSERT INTO events (job_id, event, worker, time, detail) VALUES (?, ?, ?, ?, ?)",
            (job_id, event, worker, time.time(), detail),
        )

    # ----------------------------------------------------------------------------------------------
    # Queue
    # ----------------------------------------------------------------------------------------------

    def enqueue(self, specs: Sequence[JobSpec]) -> tuple[list[int], int]:
        """Add jobs that are not in the store yet. Returns the row ids of all of them and how many were new."""
        ids, added = [], 0
        now = time.time()
        with self._transaction():
            for spec in specs:
                row = spec.row()
                cursor = self.db.execute(
                    f"INSERT OR IGNORE INTO jobs ({', '.join(row)}, status, created, updated) "
                    f"VALUES ({', '.join('?' * len(row))}, 'queued', ?, ?)",
                    (*row.values(), now, now),
                )
                added += cursor.rowcount
                key = " AND ".join(f"{c} = ?" for c in KEY_COLUMNS)
                ids.append(
                    self.db.execute(f"SELECT id FROM jobs WHERE {key}", [row[c] for c in KEY_COLUMNS]).fetchone()[0]
                )
        return ids, added

    def _release_dead_claims(self, now: float) -> None:
        """Expire at once the leases of workers on this host whose process is gone (killed, crashed)."""
        host = socket.gethostname()
        for row in self.db.execute("SELECT id, claimed_by FROM jobs WHERE status = 'running'").fetchall():
            claim_host, _, pid = (row["claimed_by"] or "").rpartition(":")
            if claim_host == host and pid.isdigit() and not _pid_alive(int(pid)):
                self.db.execute("UPDATE jobs SET lease_expires = ? WHERE id = ?", (now - 1, row["id"]))

    def claim(
        self, worker: str, lease_s: float, max_attempts: int, only_ids: Sequence[int] | None = None
    ) -> ClaimedJob | None:
        """Take the oldest job that is queued, failed with attempts left, or whose worker's lease expired."""
        now = time.time()
        with self._transaction():
            self._release_dead_claims(now)
            # A job whose worker died on its last allowed attempt is failed, not retried.
            for row in self.db.execute(
                "SELECT id, claimed_by FROM jobs WHERE status = 'running' AND lease_expires < ? AND attempts >= ?",
                (now, max_attempts),
            ).fetchall():
                self._fail_row(row["id"], worker, f"worker {row['claimed_by']} died or lost its lease")
            where = (
                "(status = 'queued' OR (status = 'failed' AND attempts < :max_attempts)"
                " OR (status = 'running' AND lease_expires < :now))"
            )
            params: dict[str, Any] = {"max_attempts": max_attempts, "now": now}
            if only_ids is not None:
                where += f" AND id IN ({', '.join(str(int(i)) for i in only_ids) or 'NULL'})"
            row = self.db.execute(f"SELECT * FROM jobs WHERE {where} ORDER BY id LIMIT 1", params).fetchone()
            if row is None:
                return None
            if row["status"] == "running":
                self._event(row["id"], "lease_expired", worker, f"was claimed by {row['claimed_by']}")
            self.db.execute(
                "UPDATE jobs SET status = 'running', claimed_by = ?, lease_expires = ?, attempts = attempts + 1,"
                " updated = ? WHERE id = ?",
                (worker, now + lease_s, now, row["id"]),
            )
            self._event(row["id"], "claimed", worker)
        return ClaimedJob(id=row["id"], spec=_spec_from_row(row), attempt=row["attempts"] + 1)

    def heartbeat(self, job_id: int, worker: str, lease_s: float) -> bool:
        """Extend the lease; False if this worker no longer holds the job."""
        now = time.time()
        cursor = self.db.execute(
            "UPDATE jobs SET lease_expires = ?, updated = ? WHERE id = ? AND claimed_by = ? AND status = 'running'",
            (now + lease_s, now, job_id, worker),
        )
        return cursor.rowcount == 1

    def complete(self, job_id: int, worker: str, results: dict[str, Any]) -> bool:
        """Record a finished job, if this worker still holds it (else the result is discarded: False)."""
        columns = ("accuracy", "f1", "dev_loss", "train_loss", "epochs", "train_steps", "wall_time_s")
        values = [results.get(c) for c in columns]
        with self._transaction():
            cursor = self.db.execute(
                f"UPDATE jobs SET status = 'done', error = NULL, lease_expires = NULL, updated = ?, "
                f"{', '.join(f'{c} = ?' for c in columns)} "
                "WHERE id = ? AND claimed_by = ? AND status = 'running'",
                (time.time(), *values, job_id, worker),
            )
            done = cursor.rowcount == 1
            self._event(job_id, "done" if done else "discarded", worker, json.dumps(results))
        return done

    def _fail_row(self, job_id: int, worker: str, error: str) -> None:
        self.db.execute(
            "UPDATE jobs SET status = 'failed', error = ?, lease_expires = NULL, updated = ? WHERE id = ?",
            (error, time.time(), job_id),
        )
        self._event(job_id, "failed", worker, error)

    def fail(self, job_id: int, worker: str, error: str) -> bool:
        """Record a failed attempt (retried later while attempts < max_attempts)."""
        with self._transaction():
            row = self.db.execute(
                "SELECT 1 FROM jobs WHERE id = ? AND claimed_by = ? AND status = 'running'", (job_id, worker)
            ).fetchone()
            if row is not None:
                self._fail_row(job_id, worker, error)
        return row is not None

    # ----------------------------------------------------------------------------------------------
    # Reading
    # ----------------------------------------------------------------------------------------------

    def rows(self, status: str | None = None) -> list[dict[str, Any]]:
        query = "SELECT * FROM jobs" + (" WHERE status = ?" if status else "") + " ORDER BY id"
        return [dict(r) for r in self.db.execute(query, (status,) if status else ())]

    def events(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.db.execute("SELECT * FROM events ORDER BY id")]

    def counts(self, max_attempts: int) -> dict[tuple[str, str], dict[str, int]]:
        """``{(run_name, task): {queued, running, done, failed, retrying}}``; ``failed`` counts final failures."""
        out: dict[tuple[str, str], dict[str, int]] = {}
        for r in self.db.execute(
            "SELECT run_name, task, status, attempts < ? AS retry, COUNT(*) AS n FROM jobs "
            "GROUP BY run_name, task, status, retry ORDER BY run_name, task",
            (max_attempts,),
        ):
            entry = out.setdefault((r["run_name"], r["task"]), dict.fromkeys((*STATUSES, "retrying"), 0))
            status = "retrying" if r["status"] == "failed" and r["retry"] else r["status"]
            entry[status] += r["n"]
        return out

    def claimable(self, max_attempts: int) -> int:
        """Jobs a worker could claim now: queued, failed with attempts left, or running on an expired lease."""
        with self._transaction():
            self._release_dead_claims(time.time())
        return self.db.execute(
            "SELECT COUNT(*) FROM jobs WHERE status = 'queued' OR (status = 'failed' AND attempts < ?)"
            " OR (status = 'running' AND lease_expires < ?)",
            (max_attempts, time.time()),
        ).fetchone()[0]

    def pending(self, max_attempts: int) -> int:
        """Jobs that still need work: queued, running, or failed with attempts left."""
        return self.db.execute(
            "SELECT COUNT(*) FROM jobs WHERE status IN ('queued', 'running') OR (status = 'failed' AND attempts < ?)",
            (max_attempts,),
        ).fetchone()[0]

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
