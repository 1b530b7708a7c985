"""The files a run writes when it starts and reads back whenever it starts again (run_config.json, run_id, the
tokenizer in RUN/tokenizer and wandb_run.json) have copies in each of its snapshots, whose files are checksummed (their
manifest). One that is missing or damaged since (each is written whole, atomically) is restored from the latest
snapshot that matches its manifest, before anything reads it: the damaged one is kept under RUN/damaged/, and a warning
names both. Without such a snapshot it stays as it is, and its reader's error names the fix. A missing wandb_run.json
is not restored: removing it is how a user logs the run to a new W&B run.

Every process of a command calls ``restore_from_snapshots`` before it reads the folder: each finds the same snapshot
and writes the same bytes, atomically, so the processes need not wait for one another. Standard library only (the
tokenizers library where a tokenizer file must be read): pretrain/run.py calls it before it imports torch."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pretrain.common.atomic import json_bytes, write_bytes, writing
from pretrain.common.formats import RUN_FORMAT, stamped
from pretrain.run_folder.identity import RUN_ID, read_run_id
from pretrain.run_folder.layout import (
    CHECKPOINTS,
    DAMAGED_DIR,
    RUN_CONFIG_FILE,
    RUN_ID_FILE,
    TOKENIZER_DIR,
    TOKENIZER_FILES,
    WANDB_RUN_FILE,
    Snapshot,
    folder_step,
    is_wandb_identity,
    list_snapshots,
    read_json_file,
    read_wandb_identity,
)
from pretrain.run_folder.manifest import ManifestError, listed_files, sha256_file, verify_manifest
from pretrain.run_folder.same_run import RESUME_FIX

Say = Callable[[str], None]


def restore_from_snapshots(run_dir: str | Path, warn: Say | None = None) -> None:
    """Restore each of the run's start-up files that is missing or damaged from the latest snapshot that matches its
    manifest; ``warn`` says what was restored (on stderr by default). The tokenizer and the W&B run only from a snapshot
    no later than the newest checkpoint: a later one may be of an attempt that started again from step 0, which trained
    another tokenizer and logged to a new W&B run."""
    run_dir = Path(run_dir)
    snapshots = list_snapshots(run_dir)
    if not snapshots:
        return
    say = warn or (lambda message: print(f"warning: {message}", file=sys.stderr, flush=True))
    verified: dict[Path, bool] = {}

    def intact(before: int | None = None) -> Iterator[Snapshot]:
        """The snapshots (up to step ``before``) that match their manifests, newest first, each verified once."""
        for snapshot in reversed(snapshots):
            if before is not None and snapshot.step > before:
                continue
            if snapshot.path not in verified:
                verified[snapshot.path] = _matches_manifest(snapshot)
            if verified[snapshot.path]:
                yield snapshot

    _restore(run_dir, RUN_CONFIG_FILE, _json_problem(run_dir / RUN_CONFIG_FILE), intact(), _run_config_copy, say)
    _restore(run_dir, RUN_ID_FILE, _run_id_problem(run_dir), intact(), _run_id_copy, say)
    newest_checkpoint = max((s for p in (run_dir / CHECKPOINTS).glob("step_*") if (s := folder_step(p)) is not None),
                            default=-1)  # fmt: skip
    wandb_problem = _json_problem(run_dir / WANDB_RUN_FILE, missing=None, read=read_wandb_identity)
    _restore(run_dir, WANDB_RUN_FILE, wandb_problem, intact(newest_checkpoint), _wandb_run_copy, say)
    newest = next((s for s in reversed(snapshots) if s.step <= newest_checkpoint), None)
    listed = listed_files(newest.path) if newest is not None else {}  # its manifest, read once for every file
    for name in TOKENIZER_FILES:
        problem = _tokenizer_problem(run_dir / TOKENIZER_DIR / name, listed.get(name),
                                     lambda: next(intact(newest_checkpoint), None))  # fmt: skip
        _restore(run_dir, f"{TOKENIZER_DIR}/{name}", problem, intact(newest_checkpoint),
                 lambda s, name=name: _file_copy(s, name), say)  # fmt: skip


def _restore(run_dir: Path, name: str, problem: str | None, snapshots: Iterator[Snapshot],
             copy_of: Callable[[Snapshot], bytes | None], say: Say) -> None:  # fmt: skip
    """Where RUN/``name`` has a ``problem``, its copy in the first of ``snapshots`` that holds one written in its place,
    the damaged file kept. A folder this user may not write is left as it is: its reader's error names the file."""
    if problem is None:
        return
    path = run_dir / name
    for snapshot in snapshots:
        if (copy := copy_of(snapshot)) is not None:
            try:
                kept = keep_damaged(run_dir, path)
                write_bytes(path, copy)
            except PermissionError:
                return
            say(f"{path} {problem}: restored from the snapshot {snapshot.path}"
                + (f"; the damaged file is kept as {kept}" if kept else ""))  # fmt: skip
            return


def _matches_manifest(snapshot: Snapshot) -> bool:
    try:
        verify_manifest(snapshot.path, RESUME_FIX)  # one of another format version: refused, as the run's checkpoints
    except ManifestError:
        return False
    return True


def keep_damaged(run_dir: Path, path: Path) -> Path | None:
    """A copy of the damaged ``path`` (RUN/NAME) as RUN/damaged/NS/NAME; None where there is none to keep."""
    if not path.is_file():
        return None
    kept = run_dir / DAMAGED_DIR / str(time.time_ns()) / path.relative_to(run_dir)
    with writing(kept) as tmp:  # whole or not at all, as every file the run writes
        shutil.copyfile(path, tmp)
    return kept


# What is wrong with the run's copy of a file (None: nothing, or nothing this module can tell), and the snapshot's copy
# of it (None: the snapshot holds none). A file the user may not read is not damaged: its reader says so.


def _json_problem(path: Path, missing: str | None = "is missing",
                  read: Callable[[Path], object] = read_json_file) -> str | None:  # fmt: skip
    if not path.exists():
        return missing
    if not os.access(path, os.R_OK):
        return None
    try:
        read(path)
    except ValueError:
        return "is damaged"
    return None


def _run_config_copy(snapshot: Snapshot) -> bytes | None:
    config = _snapshot_info(snapshot).get("pretrain_config")
    if not isinstance(config, dict):
        return None
    return json_bytes(stamped(config, RUN_FORMAT))


def _wandb_run_copy(snapshot: Snapshot) -> bytes | None:
    identity = _snapshot_info(snapshot).get("wandb_run")
    return json_bytes(identity) if is_wandb_identity(identity) else None


def _run_id_problem(run_dir: Path) -> str | None:
    if not os.access(run_dir / RUN_ID_FILE, os.R_OK) and (run_dir / RUN_ID_FILE).exists():
        return None
    try:
        read_run_id(run_dir)
    except FileNotFoundError:
        return "is missing"
    except ValueError:
        return "is damaged"
    return None


def _run_id_copy(snapshot: Snapshot) -> bytes | None:
    run_id = _snapshot_info(snapshot).get("run_id")
    return f"{run_id}\n".encode() if isinstance(run_id, str) and RUN_ID.fullmatch(run_id) else None


def _tokenizer_problem(path: Path, expected: dict | None, reference: Callable[[], Snapshot | None]) -> str | None:
    """A tokenizer file of the run: missing, or neither the bytes its snapshots hold nor the same content (another
    version of the libraries may have written the snapshot's copy). ``expected``: the file's entry in the newest
    snapshot's manifest, whose checksum clears it in the usual case; ``reference``: the snapshot to compare with
    otherwise (its files verified, which reads them all)."""
    if expected is None or (path.is_file() and not os.access(path, os.R_OK)):
        return None  # no tokenizer file of that name, or nothing this module can tell
    if path.is_file() and sha256_file(path) == expected.get("sha256"):
        return None
    snapshot = reference()
    if snapshot is None or path.name not in listed_files(snapshot.path):
        return None
    if not path.is_file():
        return "is missing"
    from tokenizers import Tokenizer  # here: a start that finds the files as its snapshots hold them imports nothing

    try:
        if path.name == "tokenizer.json":
            same = Tokenizer.from_file(str(path)).to_str() == Tokenizer.from_file(str(snapshot.path / path.name)).to_str()
            return None if same else "holds another tokenizer than the run's snapshots"
        if path.suffix == ".json":
            json.loads(path.read_text())
        return None
    except Exception:  # json's ValueError, or the tokenizers library's bare Exception for a file it cannot parse
        return "is damaged"


def _file_copy(snapshot: Snapshot, name: str) -> bytes | None:
    return (snapshot.path / name).read_bytes() if name in listed_files(snapshot.path) else None


def _snapshot_info(snapshot: Snapshot) -> dict:
    try:
        return snapshot.info
    except ValueError:
        return {}
