"""The on-disk layout of a pretraining run (see docs/run_layout.md), shared by pretraining and fine-tuning: every
name under RUN/ and the readers of its files."""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pretrain.common.formats import FORMAT_KEY, RUN_FORMAT, check_format

# Every name under RUN/ (docs/run_layout.md), declared here once.
RUN_ID_FILE = "run_id"
STATUS_FILE = "status.json"
RUN_CONFIG_FILE = "run_config.json"
METRICS_FILE = "metrics.jsonl"
WANDB_RUN_FILE = "wandb_run.json"
WANDB_DIR = "wandb"
TENSORBOARD_DIR = "tensorboard"
TOKENIZER_DIR = "tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt")
"""The files a tokenizer's ``save_pretrained`` may write, in RUN/tokenizer and in every snapshot."""
DAMAGED_DIR = "damaged"
"""Where a damaged start-up file restored from a snapshot is kept (RUN/damaged/NS/NAME, pretrain/run_folder/repair.py)."""
CHECKPOINTS = "checkpoints"
SNAPSHOTS = "snapshots"
TRAIN_STATE_FILE = "train_state.json"
"""In each checkpoint, beside accelerate's files: step, epoch, data position, tokens seen."""
SNAPSHOT_INFO = "snapshot.json"
MANIFEST_FILE = "manifest.json"
"""In each checkpoint and snapshot: its files with sizes and checksums (pretrain/run_folder/manifest.py)."""
SNAPSHOT_MARKER = "COMPLETE"
"""Written last into a snapshot: a reader ignores a folder without it."""
LOCK_FILE = "lock"
"""Held (flock) by the main process of the command training in the folder, and naming it (run_folder/lock.py)."""
STOP_FILE = "STOP"
"""Present: the run stops at its next step boundary with a checkpoint (launch/slurm_pretrain.sbatch writes it on
SLURM's warning signal; anyone may); the run removes it when it stops."""
TERMINAL_STATUSES = ("finished", "diverged", "failed")
HEARTBEAT_EVERY_S = 10
"""A running job rewrites status.json (its "updated" time and "step") at least this often while training."""
DEAD_AFTER_S = 30 * 60
"""A status "running" whose "updated" time is older than this belongs to a dead process (killed, node lost)."""


def step_dirname(step: int) -> str:
    return f"step_{step:08d}"


def folder_step(path: str | Path) -> int | None:
    """The step of a checkpoint or snapshot folder named by ``step_dirname``, else None: no file of it is read."""
    digits = Path(path).name.removeprefix("step_")
    return int(digits) if Path(path).name.startswith("step_") and digits.isdigit() else None


def run_folder_of(step_dir: str | Path) -> Path:
    """The run folder a checkpoint or snapshot belongs to (RUN/checkpoints/step_X, RUN/snapshots/step_X), resolved."""
    return Path(step_dir).resolve().parent.parent


def read_json_file(path: str | Path) -> dict[str, Any]:
    """A JSON file written whole, atomically ({} when absent); one that cannot be read was damaged since: ValueError
    naming it (the caller says what to do)."""
    path = Path(path)
    try:
        payload = json.loads(path.read_text())
    except FileNotFoundError:  # also when removed between a look and the read
        return {}
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is damaged ({err})") from None
    except PermissionError as err:  # a colleague's file: written with their umask
        raise ValueError(f"{path} cannot be read ({err.strerror}): its owner can give read permission") from None
    if not isinstance(payload, dict):
        raise ValueError(f"{path} is damaged (not a JSON object)")
    return payload


WANDB_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
"""A run id W&B accepts (this project writes 12 hex digits: pretrain/tracking/wandb_logging.py)."""


def is_wandb_identity(identity: Any) -> bool:
    """What RUN/wandb_run.json must hold: an object with a W&B run ``id``."""
    run_id = identity.get("id") if isinstance(identity, dict) else None
    return isinstance(run_id, str) and WANDB_RUN_ID.fullmatch(run_id) is not None


def read_wandb_identity(path: str | Path) -> dict[str, Any]:
    """RUN/wandb_run.json at ``path`` ({} when absent: the run never logged to W&B); ValueError when it cannot be read
    or names no W&B run (``{}`` written by hand, a cut id), which would otherwise log the run to a new W&B run."""
    identity = read_json_file(path)
    if (identity or Path(path).exists()) and not is_wandb_identity(identity):
        raise ValueError(f"{path} is damaged (no W&B run id)")
    return identity


@dataclass(frozen=True)
class Snapshot:
    """A complete weights-only snapshot of a pretraining run."""

    path: Path
    step: int
    """From the folder's name: listing snapshots reads none of their files."""

    @property
    def info(self) -> dict[str, Any]:
        """The snapshot's snapshot.json (run name, norm placement, tokens seen, metrics, ...)."""
        return read_json_file(self.path / SNAPSHOT_INFO)


def list_snapshots(run_dir: str | Path) -> list[Snapshot]:
    """Complete snapshots of a run, by step. Folders without the marker (still being written) are skipped."""
    root = Path(run_dir) / SNAPSHOTS
    found = [Snapshot(path, step) for path in root.glob("step_*")
             if (step := folder_step(path)) is not None and (path / SNAPSHOT_MARKER).is_file()]  # fmt: skip
    return sorted(found, key=lambda s: s.step)


def read_run_config(run_dir: str | Path, fix: str) -> dict[str, Any]:
    """RUN/run_config.json without format_version ({} if absent); another version: FormatVersionError with ``fix``."""
    path = Path(run_dir) / RUN_CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        payload = read_json_file(path)
    except ValueError as err:
        raise ValueError(f"{err}: the run's settings are unknown; restore it from a copy") from None
    check_format(payload, path, RUN_FORMAT, fix)
    return {k: v for k, v in payload.items() if k != FORMAT_KEY}


def read_status(run_dir: str | Path) -> dict[str, Any]:
    """RUN/status.json; status "unknown" when absent, or damaged (its message says so): the run rewrites it whenever it
    runs, so a reader that waits for the run is not stopped by it."""
    try:
        return read_json_file(Path(run_dir) / STATUS_FILE) or {"status": "unknown"}
    except ValueError as err:
        return {"status": "unknown", "message": str(err)}


def is_dead(status: dict[str, Any], now: float | None = None, after_s: float = DEAD_AFTER_S) -> bool:
    """True when ``status`` (from read_status) says running but its heartbeat is older than ``after_s``: a live run
    refreshes "updated" every HEARTBEAT_EVERY_S while it trains, and a save between two takes far less."""
    if status.get("status") != "running" or "updated" not in status:
        return False
    updated = datetime.datetime.fromisoformat(status["updated"]).timestamp()
    return (time.time() if now is None else now) - updated > after_s


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """All lines of metrics.jsonl; a line that is no JSON object (the torn last line of a killed run, bytes damaged
    since) is left out."""
    return metrics_and_damage(run_dir)[0]


def metrics_and_damage(run_dir: str | Path) -> tuple[list[dict[str, Any]], int]:
    """The lines of metrics.jsonl that are JSON objects, and how many others there are but a last line cut short (a
    kill or a full disk in the middle of an append): lines damaged since."""
    path = Path(run_dir) / METRICS_FILE
    text = path.read_text(errors="replace") if path.is_file() else ""
    lines = text.splitlines()
    rows = []
    for line in lines:
        with contextlib.suppress(json.JSONDecodeError):
            rows.append(json.loads(line))
    rows = [row for row in rows if isinstance(row, dict)]
    torn = bool(text) and not text.endswith("\n")
    return rows, len(lines) - len(rows) - torn
