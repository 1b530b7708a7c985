"""Whether a command's config is the run its folder already holds (its run_config.json), without torch: pretrain/run.py
asks before it imports the training, so a changed option on a finished run answers at once, and the resume
(checkpointing.resolve_resume) asks again once the hardware has decided what the run left to it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pretrain.common.cli import flatten
from pretrain.common.roles import keys_where
from pretrain.config import RESOLVED_AT_START, RESUMABLE_CHANGES, PretrainConfig
from pretrain.run_folder.layout import RUN_CONFIG_FILE, TOKENIZER_DIR, read_run_config

# Keys that may differ when the same command is run again in the same folder (it then continues that run): the
# mechanics fields (pretrain/common/roles.py), train.peak_flops_per_device among them (run_config.json records it).
IDENTICAL_RUN_IGNORES = keys_where(PretrainConfig, lambda rules: rules.rerun)
# What the user of a run folder (its run_config.json, its checkpoints) of another format version can do.
RESUME_FIX = "finish the run with the checkout that started it, or start a new run in another --train.output_dir"
NEW_RUN = "start a new run in another directory with --train.output_dir=NEW_DIR"
"""How a command line starts a new run instead (a script that sets the folder itself names its own knob)."""


def _compared(run_dir: Path, config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(saved, requested) by dotted key, the requested values the run decides at its start taken as decided."""
    saved = read_run_config(run_dir, RESUME_FIX)
    tokenizer = config["data"]["tokenizer"]
    own = run_dir / TOKENIZER_DIR
    if saved and saved["data"]["tokenizer"] is None and tokenizer and Path(tokenizer).resolve() == own.resolve():
        # The run's own trained tokenizer, named explicitly (to resume where the data cache is gone): the same run.
        config = {**config, "data": {**config["data"], "tokenizer": None}}
    old, new = flatten(saved), flatten(config)
    for key in RESOLVED_AT_START:
        if new.get(key) is None:
            new[key] = old.get(key)
    if new.get("train.mixed_precision") == "auto":  # the run decides it at its start; the resume compares that
        new["train.mixed_precision"] = old.get("train.mixed_precision")
    return old, new


def config_differences(run_dir: Path, config: dict[str, Any], ignored: frozenset[str]) -> list[str]:
    """Dotted keys whose values differ from the folder's run_config.json, apart from ``ignored`` and tracking;
    ``config`` is the request or the resolved config (a null at a key of RESOLVED_AT_START matches the saved value)."""
    if not (Path(run_dir) / RUN_CONFIG_FILE).is_file():
        return []
    old, new = _compared(Path(run_dir), config)
    keys = sorted(set(old) | set(new))
    return [k for k in keys if k not in ignored and not k.startswith("tracking.") and old.get(k) != new.get(k)]


def changes_text(run_dir: Path, config: dict[str, Any], keys: list[str]) -> str:
    """``optim.lr 0.0003 -> 0.001, ...``: each key's value in the run, then in ``config`` (the first 8 keys)."""
    old, new = _compared(Path(run_dir), config)
    shown = [f"{key} {json.dumps(old.get(key))} -> {json.dumps(new.get(key))}" for key in keys[:8]]
    return ", ".join(shown) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")


def check_same_run(run_dir: Path, config: dict[str, Any], derived: frozenset[str] = frozenset(),
                   new_run: str = NEW_RUN) -> None:  # fmt: skip
    """Refuse ``config`` for ``run_dir``'s run where a key outside RESUMABLE_CHANGES differs from run_config.json;
    ``derived`` and ``new_run``: as in check_settings."""
    if diff := config_differences(run_dir, config, RESUMABLE_CHANGES):
        asked = [key for key in diff if key not in derived] or diff
        raise ValueError(
            f"train.output_dir={str(run_dir)!r} holds a different run: {changes_text(run_dir, config, asked)} (its "
            f"{RUN_CONFIG_FILE}, then this command). Run it with its own settings, or {new_run}."
        )


def check_settings(run_dir: Path, requested: dict[str, Any], resume: str, *, derived: frozenset[str] = frozenset(),
                   new_run: str = NEW_RUN) -> None:  # fmt: skip
    """The settings of a run continued in its own folder (``resume`` "" or "auto"; a checkpoint path is checked where
    it is resolved): a ValueError when ``requested`` is another run, or (``resume=""``) the same one with other
    settings. ``derived``: keys the caller computed from others, named only when nothing else differs; ``new_run``:
    how the caller starts a new run instead."""
    if resume not in ("", "auto"):
        return
    check_same_run(run_dir, requested, derived, new_run)
    if changed := config_differences(run_dir, requested, IDENTICAL_RUN_IGNORES) if resume == "" else []:
        asked = [key for key in changed if key not in derived] or changed
        raise ValueError(
            f"train.output_dir={str(run_dir)!r} already holds this run with other settings "
            f"({changes_text(run_dir, requested, asked)}: its {RUN_CONFIG_FILE}, then this command). Continue it with "
            f"them with --train.resume=auto, or {new_run}."
        )
