"""The identity of a pretraining run: an id written once into RUN/run_id when the run starts.

Fine-tuning results are keyed by this id, not by the run's name or path: two runs with the same name are two
runs, and a run folder moved to another path (or mounted elsewhere on a cluster) is the same run.

Runs written before the id existed have no ``run_id`` file; their id is derived from the bytes of
``run_config.json`` (written once at start, and it records the original output folder, so it neither
changes when the folder moves nor matches another run's).
"""

from __future__ import annotations

import hashlib
import time
import uuid
from pathlib import Path

from pretrain.common.atomic import write_once
from pretrain.run_folder.layout import RUN_CONFIG_FILE, RUN_ID_FILE


def new_run_id() -> str:
    """Sortable by start time and unique: ``20261201-000137-3f9a1c2e``."""
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"


def ensure_run_id(run_dir: str | Path) -> str:
    """The run's id; written now if the folder has none (a resumed run keeps the id it started with)."""
    write_once(Path(run_dir) / RUN_ID_FILE, new_run_id() + "\n")  # two processes starting at once agree on one id
    return read_run_id(run_dir)


def read_run_id(run_dir: str | Path) -> str:
    """The id in RUN/run_id, or for a run written before run ids existed, one derived from run_config.json."""
    run_dir = Path(run_dir)
    path = run_dir / RUN_ID_FILE
    if path.is_file():
        run_id = path.read_text().strip()
        if run_id:
            return run_id
    legacy = run_dir / RUN_CONFIG_FILE
    if legacy.is_file():
        return "legacy-" + hashlib.sha256(legacy.read_bytes()).hexdigest()[:16]
    raise FileNotFoundError(
        f"{run_dir} has neither {RUN_ID_FILE} nor {RUN_CONFIG_FILE}: it is not a pretraining run folder "
        "(RUN/ of docs/run_layout.md); pass the folder that holds snapshots/ and status.json"
    )
