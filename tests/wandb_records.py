"""Read back what W&B actually logged offline: the records of RUN/wandb/offline-run-*/run-*.wandb.

A ``.wandb`` file is W&B's transaction log of ``wandb.proto`` records (run, config, history, summary, metric
definitions, artifacts, exit). wandb 0.31 no longer ships a Python reader for it; W&B's own reader is
``wandb leet inspect --json FILE`` (one JSON object per record, protobuf field names), used here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class LoggedRun:
    """One offline W&B run folder, as W&B would sync it."""

    path: Path
    id: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    project: str = ""
    tags: list[str] = field(default_factory=list)
    resumed: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    """define_metric records by name (or glob name)."""
    history: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int | None = None

    def logged(self, key: str) -> list[tuple[int, Any]]:
        """(W&B step, value) of every history row that holds ``key``."""
        return [(row["_step"], row[key]) for row in self.history if key in row]


def records(wandb_file: Path) -> list[dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(wandb_file)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def read_run(run_folder: Path) -> LoggedRun:
    """Replay the records of one offline run folder (``offline-run-*``)."""
    (wandb_file,) = run_folder.glob("run-*.wandb")
    run = LoggedRun(path=run_folder)
    for record in records(wandb_file):
        kind = record["type"]
        body = record.get(kind, {})
        if kind == "run":
            run.id, run.group, run.job_type = (
                body.get("run_id", ""),
                body.get("run_group", ""),
                body.get("job_type", ""),
            )
            run.name, run.project, run.tags = (
                body.get("display_name", ""),
                body.get("project", ""),
                body.get("tags", []),
            )
            run.resumed = bool(body.get("resume"))
            _merge(run.config, body.get("config", {}).get("update", {}))
        elif kind == "config":
            _merge(run.config, body.get("update", {}))
        elif kind == "summary":
            _merge(run.summary, body.get("update", {}))
        elif kind == "metric":
            run.metrics[body.get("name") or body.get("glob_name")] = body
        elif kind == "history":
            run.history.append(body["item"])
        elif kind == "artifact":
            run.artifacts.append(body)
        elif kind == "exit":
            run.exit_code = body.get("exit_code", 0)
    run.config.pop("_wandb", None)
    return run


def read_runs(wandb_dir: Path) -> list[LoggedRun]:
    """Every offline run under a ``wandb/`` folder, in the order they were started."""
    return [read_run(folder) for folder in sorted(Path(wandb_dir).glob("offline-run-*"))]
