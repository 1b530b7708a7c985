"""The identity of a pretraining run: an id written once into RUN/run_id when the run starts.

Fine-tuning results are keyed by this id, not by the run's name or path: two runs with the same name are two
runs, and a run folder moved to another path (or mounted elsewhere on a cluster) is the same run.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from pretrain.common.atomic import write_once
from pretrain.run_folder.layout import RUN_ID_FILE


def ensure_run_id(run_dir: str | Path) -> str:
    """The run's id (``20261201-000137-3f9a1c2e``: sortable, unique), written now unless the folder has one already."""
    new_id = f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
    write_once(Path(run_dir) / RUN_ID_FILE, new_id + "\n")  # two processes starting at once agree on one id
    return read_run_id(run_dir)


def read_run_id(run_dir: str | Path) -> str:
    """The id in RUN/run_id; FileNotFoundError that says what to pass when the folder has none."""
    path = Path(run_dir) / RUN_ID_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{run_dir} has no {RUN_ID_FILE}: it is not a pretraining run folder of this version (RUN/ of "
            "docs/run_layout.md); pass the folder pretrain/run.py wrote, the one that holds snapshots/ and status.json"
        )
    return path.read_text().strip()
