"""The identity of a pretraining run: an id written once into RUN/run_id when the run starts.

Fine-tuning results are keyed by this id, not by the run's name or path: two runs with the same name are two
runs, and a run folder moved to another path (or mounted elsewhere on a cluster) is the same run.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

from pretrain.common.atomic import write_once
from pretrain.run_folder.layout import RUN_ID_FILE

RUN_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{8}")
"""What ensure_run_id writes: the UTC start time and 8 random hex digits."""


def ensure_run_id(run_dir: str | Path) -> str:
    """The run's id (``20261201-000137-3f9a1c2e``: sortable, unique), written now unless the folder has one already."""
    new_id = f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
    write_once(Path(run_dir) / RUN_ID_FILE, new_id + "\n")  # two processes starting at once agree on one id
    return read_run_id(run_dir)


def read_run_id(run_dir: str | Path, recorded: object = None) -> str:
    """The id in RUN/run_id; FileNotFoundError that says what to pass when the folder has none. ``recorded``: the copy
    a snapshot's snapshot.json holds, taken where RUN/run_id was damaged since (the run restores it when it next
    starts, pretrain/run_folder/repair.py)."""
    path = Path(run_dir) / RUN_ID_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{run_dir} has no {RUN_ID_FILE}: it is not a pretraining run folder of this version (RUN/ of "
            "docs/run_layout.md); pass the folder pretrain/run.py wrote, the one that holds snapshots/ and status.json"
        )
    run_id = path.read_text(errors="replace").strip()
    if not RUN_ID.fullmatch(run_id) and isinstance(recorded, str) and RUN_ID.fullmatch(recorded):
        return recorded
    if not RUN_ID.fullmatch(run_id):  # written once, atomically: damaged since
        raise ValueError(f"{path} is damaged (it holds {run_id[:40]!r}, not a run id such as "
                         "20261201-000137-3f9a1c2e): restore it from a copy; fine-tuning results are keyed by it")  # fmt: skip
    return run_id
