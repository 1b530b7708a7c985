"""The versions of the file formats the project writes, declared once, and the one check every reader makes.

A file that other code reads later carries ``"format_version"``; a reader refuses another version (or none) with a
message that says what to do, instead of guessing at fields that moved. A changed format's number goes up by one.

    RUN_FORMAT       a pretraining run folder: run_config.json, checkpoints' and snapshots' manifest.json
    RESULTS_FORMAT   a fine-tuning results folder: manifests and the started, done and failed files
    STUDY_FORMAT     a comparison study's results.json (``pretrain.analysis compare``), which ``--follow`` reads

Standard library only: the commands read these files before they import torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FORMAT_KEY = "format_version"
RUN_FORMAT = 5  # 2: run_config.json gained the residual-scheme fields; 3: checkpoints hold the model's own parameter
# names (no "module."/"_orig_mod."), train_state.json the data position in sequences, the global batch, the processes;
# 4: train_state.json counts the lines of metrics.jsonl; 5: its data fingerprint covers the prepared instances
RESULTS_FORMAT = 3  # 3: a result names the device it computed on
STUDY_FORMAT = 2  # 1: each model names gpas, attention_gate and value_residual; 2: and qk_norm


class FormatVersionError(ValueError):
    """A file written in another format version than this code reads (the message says what to do)."""


def stamped(payload: dict[str, Any], version: int) -> dict[str, Any]:
    """``payload`` with ``format_version`` first."""
    return {FORMAT_KEY: version, **payload}


def check_format(payload: dict[str, Any], path: str | Path, version: int, fix: str) -> None:
    """Raise FormatVersionError naming ``path``, its version and this code's, and ``fix`` (what the user can do)."""
    found = payload.get(FORMAT_KEY)
    if found == version:
        return
    written = "no format_version (written before versions existed)" if found is None else f"format_version {found}"
    raise FormatVersionError(f"{path} has {written}; this code reads format_version {version}: {fix}")
