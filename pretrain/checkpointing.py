"""Full-state checkpoints (resumable) and weights-only snapshots, written atomically (docs/run_layout.md).

A checkpoint is ``accelerator.save_state`` (model, optimizer, scheduler, grad scaler, RNG of every process)
plus ``train_state.json`` (step, epoch, position in the epoch, tokens seen). It is written into a hidden
temp folder and renamed into place only when every process has finished writing, so a kill during a save
leaves the previous checkpoint as the latest; leftover temp folders are ignored and cleaned up.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from transformers import PreTrainedTokenizerBase

from pretrain.config import RESUMABLE_CHANGES, flatten
from pretrain.layout import (
    RUN_CONFIG_FILE,
    SNAPSHOT_INFO,
    SNAPSHOT_MARKER,
    step_dirname,
    write_json_atomic,
)

TRAIN_STATE_FILE = "train_state.json"
TOKENIZER_DIR = "tokenizer"
CHECKPOINTS = "checkpoints"
SNAPSHOTS = "snapshots"


@dataclass(kw_only=True)
class TrainState:
    """Where the run is; with the accelerate state this is all an exact resume needs."""

    step: int = 0
    """Optimizer steps taken."""
    epoch: int = 0
    """Current pass over the training split (selects the data order and the MLM masks)."""
    batches_in_epoch: int = 0
    """Micro-batches of the current epoch each process has consumed (skipped on resume)."""
    tokens_seen: int = 0
    """Non-padding tokens trained on, summed over processes."""
    data_fingerprint: str = ""
    """Identifies the data config; on a change (e.g. the 512-token phase) the data position starts over."""

    @classmethod
    def read(cls, checkpoint: Path) -> TrainState:
        payload = json.loads((checkpoint / TRAIN_STATE_FILE).read_text())
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in payload.items() if k in names})


# --------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints as (step, path), oldest first. The step comes from train_state.json."""
    root = Path(run_dir) / CHECKPOINTS
    found = []
    for path in root.iterdir() if root.is_dir() else []:
        # Temp folders start with "." and have no train_state.json until they are complete.
        if path.name.startswith(".") or not (path / TRAIN_STATE_FILE).is_file():
            continue
        found.append((TrainState.read(path).step, path))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> Path | None:
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1][1] if checkpoints else None


def save_checkpoint(accelerator: Accelerator, run_dir: Path, state: TrainState, keep_last: int) -> Path:
    """Save the full training state atomically into RUN/checkpoints/step_XXXXXXXX; keep the last ``keep_last``.

    Every process calls this (each writes its own RNG state, and DeepSpeed its own shards).
    """
    root = Path(run_dir) / CHECKPOINTS
    final = root / step_dirname(state.step)
    tmp = root / f".{final.name}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)  # a leftover of a save that was killed
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        # train_state.json is written last: it is what makes a folder a complete checkpoint.
        write_json_atomic(tmp / TRAIN_STATE_FILE, dataclasses.asdict(state))
        if final.exists():  # the same step saved again (resumed and stopped at once): replace it
            old = root / f".{final.name}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old)
        else:
            os.replace(tmp, final)
        for _, path in list_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(path)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator: Accelerator, checkpoint: Path) -> TrainState:
    """Restore model, optimizer, scheduler, scaler and RNG from ``checkpoint``; return its train state."""
    accelerator.load_state(str(checkpoint))
    return TrainState.read(checkpoint)


# --------------------------------------------------------------------------------------------------
# Which run lives in the output directory
# --------------------------------------------------------------------------------------------------


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ, ignoring those a resumed run may change (RESUMABLE_CHANGES)."""
    old, new = flatten(saved), flatten(current)
    keys = sorted(set(old) | set(new))
    return [
        k for k in keys if k not in RESUMABLE_CHANGES and not k.startswith("tracking.") and old.get(k) != new.get(k)
    ]


def resolve_resume(run_dir: Path, resolved: dict[str, Any], resume: str) -> Path | None:
    """The checkpoint to resume from (None: a fresh run), or a ValueError/FileNotFoundError that says what
    to do. Called on every process before any work."""
    run_dir = Path(run_dir)
    config_file = run_dir / RUN_CONFIG_FILE
    holds_run = config_file.is_file() or bool(list_checkpoints(run_dir))
    if resume == "":
        if holds_run:
            raise ValueError(
                f"train.output_dir={str(run_dir)!r} already holds a run ({config_file.name} or checkpoints "
                "found). Continue it with --train.resume=auto, or start a new run in another directory with "
                "--train.output_dir=NEW_DIR."
            )
        return None
    if resume == "auto":
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint is None:
            raise FileNotFoundError(
                f"--train.resume=auto: nothing to resume in {str(run_dir)!r} (no complete checkpoint under "
                f"{run_dir / CHECKPOINTS}). Drop --train.resume to start a new run there, or point "
                "--train.output_dir at the run to continue."
            )
        _check_same_run(run_dir, resolved)
        return checkpoint
    checkpoint = Path(resume).resolve()
    if not (checkpoint / TRAIN_STATE_FILE).is_file():
        raise FileNotFoundError(
            f"--train.resume={resume!r} is not a complete checkpoint (no {TRAIN_STATE_FILE}); pass a folder "
            f"RUN/{CHECKPOINTS}/step_XXXXXXXX, or --train.resume=auto for the latest one of train.output_dir"
        )
    if checkpoint.parent == (run_dir / CHECKPOINTS).resolve():
        _check_same_run(run_dir, resolved)
    elif holds_run:
        raise ValueError(
            f"train.output_dir={str(run_dir)!r} already holds a run; continuing {resume!r} there would mix two "
            "runs. Choose a new --train.output_dir for the continued run."
        )
    return checkpoint


def _check_same_run(run_dir: Path, resolved: dict[str, Any]) -> None:
    config_file = run_dir / RUN_CONFIG_FILE
    if not config_file.is_file():
        return
    saved = json.loads(config_file.read_text())
    if resolved["model"]["vocab_size"] is None:  # null means "the tokenizer's size", saved resolved
        resolved = {**resolved, "model": {**resolved["model"], "vocab_size": saved["model"]["vocab_size"]}}
    tokenizer = resolved["data"]["tokenizer"]
    if saved["data"]["tokenizer"] is None and tokenizer and Path(tokenizer).resolve() == (run_dir / TOKENIZER_DIR).resolve():
        # The run's own trained tokenizer, named explicitly (to resume where the data cache is gone): the same run.
        resolved = {**resolved, "data": {**resolved["data"], "tokenizer": None}}
    diff = config_differences(saved, resolved)
    if diff:
        raise ValueError(
            f"train.output_dir={str(run_dir)!r} holds a different run: {', '.join(diff[:8])} differ from its "
            f"{RUN_CONFIG_FILE}. Resume it with its own settings, or choose a new --train.output_dir."
        )


# --------------------------------------------------------------------------------------------------
# Weights-only snapshots
# --------------------------------------------------------------------------------------------------


def save_snapshot(
    accelerator: Accelerator,
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    run_dir: Path,
    info: dict[str, Any],
) -> Path | None:
    """``save_pretrained`` folder + tokenizer + snapshot.json, then the COMPLETE marker last.

    Every process calls this (gathering a sharded state dict is collective); only the main process writes.
    """
    state_dict = accelerator.get_state_dict(model)  # full, unwrapped keys (no "module."/"_orig_mod.")
    path = Path(run_dir) / SNAPSHOTS / step_dirname(info["step"])
    if accelerator.is_main_process:
        shutil.rmtree(path, ignore_errors=True)  # an incomplete (or superseded) folder of the same step
        unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
        unwrapped.save_pretrained(path, state_dict=state_dict)
        tokenizer.save_pretrained(path)
        write_json_atomic(path / SNAPSHOT_INFO, info)
        (path / SNAPSHOT_MARKER).write_text("")
    accelerator.wait_for_everyone()
    return path if accelerator.is_main_process else None
