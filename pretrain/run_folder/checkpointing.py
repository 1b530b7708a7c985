"""Full-state checkpoints (resumable) and weights-only snapshots, written atomically (docs/run_layout.md).

A checkpoint is ``accelerator.save_state`` (model, optimizer, scheduler, grad scaler, RNG of every process) plus
``train_state.json``, written into a hidden temp folder renamed into place once every process has written: a kill
during a save leaves the previous checkpoint as the latest, and the temp folder is cleaned up later.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import MODEL_NAME, gather_object
from transformers import PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from pretrain.common.atomic import follow_umask, no_room, publish_dir, write_json
from pretrain.run_folder.layout import (
    CHECKPOINTS,
    RUN_CONFIG_FILE,
    SNAPSHOT_INFO,
    SNAPSHOT_MARKER,
    SNAPSHOTS,
    TRAIN_STATE_FILE,
    folder_step,
    step_dirname,
)
from pretrain.run_folder.manifest import ManifestError, folder_size, verify_manifest, write_manifest
from pretrain.run_folder.same_run import RESUME_FIX, check_same_run, check_settings
from pretrain.run_folder.status import fault_point


@dataclass(kw_only=True)
class TrainState:
    """Where the run is; with the accelerate state this is all an exact resume needs."""

    step: int = 0
    """Optimizer steps taken."""
    epoch: int = 0
    """Current pass over the training split (selects the data order and the MLM masks)."""
    samples_in_epoch: int = 0
    """Sequences of the current epoch trained on, over all processes (skipped on resume, however many processes)."""
    tokens_seen: int = 0
    """Non-padding tokens trained on, summed over processes."""
    data_fingerprint: str = ""
    """Identifies the data config; on a change (e.g. the 512-token phase) the data position starts over."""
    global_batch_size: int = 0
    """Sequences per optimizer step (per device x processes x accumulation); the same run keeps it on resume."""
    num_processes: int = 1
    """Processes that trained it: DeepSpeed ZeRO partitions its optimizer state one way per process."""
    metrics_lines: int = 0
    """Lines of RUN/metrics.jsonl up to this step: a resume that reads fewer says how many were lost since."""


# Checkpoints


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints as (step, path), oldest first; the step comes from the folder's name (no file is read before
    its manifest is verified), and temp folders (".step_*") are left out."""
    root = Path(run_dir) / CHECKPOINTS
    paths = root.iterdir() if root.is_dir() else []
    return sorted((step, path) for path in paths
                  if (step := folder_step(path)) is not None and (path / TRAIN_STATE_FILE).is_file())


def latest_checkpoint(run_dir: Path) -> Path | None:
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1][1] if checkpoints else None


def save_checkpoint(accelerator: Accelerator, run_dir: Path, state: TrainState, keep_last: int) -> Path:
    """Save the full state atomically to RUN/checkpoints/step_X, keeping ``keep_last``; every process calls it."""
    root = Path(run_dir) / CHECKPOINTS
    final = root / step_dirname(state.step)
    tmp = root / f".{final.name}.tmp"
    main = accelerator.is_main_process

    def begin() -> None:
        if not main:
            return
        for path in root.iterdir() if root.is_dir() else []:  # what killed saves left: .step_*.tmp, .old
            if path.name.startswith("."):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        tmp.mkdir(parents=True)

    def publish() -> None:
        if not main:
            return
        fault_point("checkpoint_files", state.step)
        write_json(tmp / TRAIN_STATE_FILE, dataclasses.asdict(state))
        follow_umask(tmp)
        write_manifest(tmp)  # after every file, before the rename that makes the folder a checkpoint
        publish_dir(tmp, final, replace=True)  # the same step saved again (resumed and stopped at once): replaced
        fault_point("checkpoint_renamed", state.step)
        for _, path in list_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(path)

    agreed(accelerator, tmp, begin)
    agreed(accelerator, tmp, lambda: accelerator.save_state(str(tmp)))  # every process writes (its RNG, its shard)
    agreed(accelerator, final, publish)
    return final


def keep_model_names(accelerator: Accelerator) -> None:
    """Checkpoints hold the model's own parameter names, whatever wraps it (DDP's "module.", torch.compile's
    "_orig_mod."), and load into the unwrapped model: a run continues on another number of processes or with
    train.compile changed. Accelerate's save/load hooks, which see the model list of each call."""

    def unwrapped(models: list[torch.nn.Module]) -> list[torch.nn.Module]:
        return [accelerator.unwrap_model(model, keep_torch_compile=False) for model in models]

    def on_save(models: list[torch.nn.Module], weights: list[dict[str, Any]], output_dir: str) -> None:
        if weights:  # empty under DeepSpeed, whose engine saves its own files
            weights[:] = [model.state_dict() for model in unwrapped(models)]

    def on_load(models: list[torch.nn.Module], input_dir: str) -> None:
        models[:] = unwrapped(models)

    accelerator.register_save_state_pre_hook(on_save)
    accelerator.register_load_state_pre_hook(on_load)


def load_checkpoint(accelerator: Accelerator, checkpoint: Path) -> TrainState:
    """Restore model, optimizer, scheduler, scaler and RNG from ``checkpoint``; return its train state."""
    try:
        accelerator.load_state(str(checkpoint))
    except ValueError as err:  # torch.optim: "... a parameter group that doesn't match the size of optimizer's group"
        if "parameter group" not in str(err):
            raise
        raise ValueError(
            f"{checkpoint}: its optimizer state groups the parameters otherwise than this code does (which of them "
            "take weight decay changed since it was saved): finish the run with the checkout that started it, or "
            "start a new run in another --train.output_dir"
        ) from None
    # Accelerate restores its micro-batch counter (when to sync) as the checkpoint's launch counted it; a checkpoint is
    # at a step boundary, where the next micro-batch starts a step whatever the accumulation: a count of 0.
    accelerator.step = 0
    return read_train_state(checkpoint)


def read_train_state(checkpoint: Path) -> TrainState:
    return TrainState(**json.loads((Path(checkpoint) / TRAIN_STATE_FILE).read_text()))


def check_continuable(checkpoint: Path, same_run: bool, global_batch_size: int, num_processes: int,
                      deepspeed: bool) -> None:  # fmt: skip
    """Refuse, before any work, a checkpoint this launch cannot continue as its run: one of DeepSpeed ZeRO (its
    optimizer state is partitioned one way per process) on another number of processes or without DeepSpeed, or
    one without DeepSpeed under it; in the same run, another global batch (the recipe). Anything else continues:
    another number of processes, accumulation, per-device batch or train.compile, at the same global batch."""
    saved = read_train_state(checkpoint)
    zero = (Path(checkpoint) / MODEL_NAME).is_dir()  # the engine's own folder in accelerate's save_state
    if zero and (not deepspeed or saved.num_processes != num_processes):
        raise ValueError(
            f"{checkpoint} was saved by DeepSpeed ZeRO on {saved.num_processes} process(es): its optimizer state is "
            f"partitioned {saved.num_processes} ways and continues only under DeepSpeed on {saved.num_processes} "
            f"process(es) (accelerate launch --config_file configs/accelerate/deepspeed_zero2.yaml --num_processes "
            f"{saved.num_processes} ...), not on {num_processes}{'' if deepspeed else ' without DeepSpeed'}. Its "
            f"weights alone, consolidated in fp32, come from DeepSpeed's script beside them: python "
            f"{checkpoint}/zero_to_fp32.py {checkpoint} OUT_DIR (the run's snapshots hold the same fp32 weights)"
        )
    if deepspeed and not zero:
        raise ValueError(f"{checkpoint} was saved without DeepSpeed, whose engine cannot load it: continue it without "
                         "DeepSpeed (configs/accelerate/8gpu.yaml, DDP)")  # fmt: skip
    if same_run and saved.global_batch_size != global_batch_size:
        raise ValueError(
            f"{checkpoint} was trained with a global batch of {saved.global_batch_size} sequences per step; this launch "
            f"gives {global_batch_size} (train.per_device_batch_size x {num_processes} process(es) x "
            "train.gradient_accumulation_steps): set train.per_device_batch_size or train.gradient_accumulation_steps "
            f"so that the product is {saved.global_batch_size} (it is the recipe), or start a new run"
        )


# A full disk: one error for every save, which the driver answers with a clean stop

DISK_FULL_HINT = "Free space there, then continue with --train.resume=auto (from the latest checkpoint)"
TOKENIZER_ROOM = 16 << 20
"""Bytes a run's tokenizer folder may take (bert-base-uncased's are about 1 MB), checked before data preparation."""


class DiskFull(Exception):
    """No room on the disk for a save (found by the room check, or a write that hit ENOSPC/EDQUOT): the run stops as
    preempted, and the same command continues it once there is room."""


def free_space_problem(run_dir: Path, model: torch.nn.Module, checkpoint: bool, snapshot: bool, deepspeed: bool) -> str:
    """A message when the disk of ``run_dir`` lacks room for the saves due now, else "". A snapshot holds fp32
    weights (4 bytes a parameter, DeepSpeed's fp32 masters under bf16 too). A checkpoint takes what the latest one
    took, or before the first the module's weights plus fp32 AdamW moments (8 bytes) and, under DeepSpeed, its fp32
    master copy (4 more: 14 bytes a parameter in bf16 mixed precision)."""
    params = sum(p.numel() for p in model.parameters())
    needed = 4 * params if snapshot else 0
    if checkpoint:
        latest = latest_checkpoint(run_dir)
        module = sum(p.numel() * p.element_size() for p in model.parameters())
        needed += folder_size(latest) if latest else module + (12 if deepspeed else 8) * params
    return room_problem(run_dir, needed)


def room_problem(folder: Path, needed: int) -> str:
    """A message when the disk of ``folder`` (or its nearest existing parent) lacks ``needed`` bytes + 10%, else ""."""
    existing = Path(folder).absolute()
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if free >= 1.1 * needed:
        return ""
    needs = f"the next save needs about {needed / 1e9:.2f} GB"
    return f"disk full: {free / 1e9:.2f} GB free at {folder}, {needs}. {DISK_FULL_HINT}"


def as_disk_full(err: BaseException, where: Path) -> DiskFull | None:
    """``err`` as a DiskFull: itself, or one naming the file (else ``where``) when it or what caused it is an
    OSError with ENOSPC/EDQUOT or a library's error that wraps one; None for any other error."""
    if isinstance(err, DiskFull):
        return err
    if (seen := no_room(err)) is None:
        return None
    path = getattr(seen, "filename", None) or where
    return DiskFull(f"disk full: no space left while writing {path} ({type(seen).__name__}). {DISK_FULL_HINT}")


@contextlib.contextmanager
def saving(path: Path) -> Iterator[None]:
    """A save of ``path``: a full disk in it raises DiskFull naming the file, or ``path`` when a library names none."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as err:
        if (full := as_disk_full(err, path)) is not None:
            raise full from err
        raise


def agreed(accelerator: Accelerator, where: Path, write: Callable[[], None]) -> None:
    """This process's part of a save of ``where`` (``write``), then one collective on how it went on every process,
    in place of the barrier that followed the writes: a full disk on any process (the main one's snapshot, any
    process's RNG state or ZeRO shard) raises DiskFull on all of them, naming the file; any other error is raised
    where it happened and stops the others with its message. So no process waits at the next collective for one
    that left (until train.collective_timeout_s). A DeepSpeed save fails alone inside the engine, whose own barrier
    the others then wait at: the free-space check before every save is what prevents that."""
    error: Exception | None = None
    try:
        with saving(where):
            write()
    except Exception as err:  # shared below, then raised
        error = err
    mine = None if error is None else (isinstance(error, DiskFull), str(error))
    failures = [outcome for outcome in gather_object([mine]) if outcome is not None]  # one entry per process
    full = [message for is_full, message in failures if is_full]
    if full:
        raise DiskFull(full[0]) from error
    if error is not None:
        raise error
    if failures:
        raise RuntimeError(f"another process failed while saving {where}: {failures[0][1]}")


@contextlib.contextmanager
def main_process_first(accelerator: Accelerator, where: Path) -> Iterator[None]:
    """Accelerate's ``main_process_first`` (the main process's part, e.g. preparing the data into ``where``, then the
    others'), its barrier replaced by ``agreed``: how the main process's part went reaches the others before theirs
    (an error or a full disk there stops them at once, instead of at the barrier for train.collective_timeout_s),
    and how theirs went reaches every process."""
    main = accelerator.is_main_process
    if not main:
        agreed(accelerator, where, lambda: None)  # answered once the main process's part is done
    error: Exception | None = None
    try:
        yield
    except Exception as err:  # shared by agreed, then raised
        error = err

    def outcome() -> None:
        if error is not None:
            raise error

    agreed(accelerator, where, outcome)
    if main:
        agreed(accelerator, where, lambda: None)  # the others' parts


# Which run lives in the output directory


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def resolve_resume(
    run_dir: Path, requested: dict[str, Any], resume: str, warn: Callable[[str], None] = _warn
) -> Path | None:
    """The checkpoint to resume from (None: step 0), or a ValueError/FileNotFoundError that says what to do; every
    process calls it first, with the config as requested. ``resume=""``: a new run in an empty folder, or the identical
    run there continued (newest verified checkpoint, or step 0); else refused. ``"auto"``: the same, but keys in
    RESUMABLE_CHANGES may differ (an empty folder gets a run, with a warning). A path: that checkpoint, verified."""
    run_dir = Path(run_dir)
    config_file = run_dir / RUN_CONFIG_FILE
    checkpoints = list_checkpoints(run_dir)
    holds_run = config_file.is_file() or bool(checkpoints)
    if resume in ("", "auto"):
        if not holds_run:
            if resume == "auto":  # e.g. killed while preparing data, before run_config.json: the same run, anew
                warn(f"--train.resume=auto: nothing to resume in {run_dir} (no {RUN_CONFIG_FILE}, no checkpoint): "
                     "starting the run")
            return None
        check_settings(run_dir, requested, resume)
        checkpoint = None
        for _, path in reversed(checkpoints):  # the newest whose files match its manifest
            try:
                verify_manifest(path, RESUME_FIX)
                checkpoint = path
                break
            except ManifestError as err:
                warn(f"skipping a damaged checkpoint: {err}")
        if checkpoint is None and checkpoints:
            raise ValueError(
                f"no checkpoint under {run_dir / CHECKPOINTS} matches its manifest (see the warnings above); "
                "resuming would not reproduce the run. Resume from another copy with --train.resume=PATH, or start "
                "again in a new --train.output_dir."
            )
        if checkpoint is None:
            warn(f"{run_dir} holds this run but no checkpoint yet (it stopped before the first one): starting it again")
        return checkpoint
    checkpoint = Path(resume).resolve()
    if not (checkpoint / TRAIN_STATE_FILE).is_file():
        raise FileNotFoundError(
            f"--train.resume={resume!r} is not a complete checkpoint (no {TRAIN_STATE_FILE}); pass a folder "
            f"RUN/{CHECKPOINTS}/step_XXXXXXXX, or --train.resume=auto for the latest one of train.output_dir"
        )
    try:
        verify_manifest(checkpoint, RESUME_FIX)
    except ManifestError as err:
        raise ValueError(f"--train.resume={resume!r} is damaged: {err}. Pass another checkpoint.") from None
    if checkpoint.parent == (run_dir / CHECKPOINTS).resolve():
        check_same_run(run_dir, requested)
    elif holds_run:
        raise ValueError(
            f"train.output_dir={str(run_dir)!r} already holds a run; continuing {resume!r} there would mix two "
            "runs. Choose a new --train.output_dir for the continued run."
        )
    return checkpoint


# Weights-only snapshots


def deepspeed_fp32_weights(accelerator: Accelerator, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The fp32 master weights of a DeepSpeed model by parameter name (tied names each), on the CPU: under bf16/fp16
    the engine casts the module, so ``get_state_dict`` returns 16-bit weights. Collective (every process assembles
    each parameter, in ``named_parameters`` order). Empty without masters (fp32: the module's weights are them)."""
    from deepspeed.utils import safe_get_full_fp32_param

    unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
    masters: dict[int, torch.Tensor | None] = {}
    out: dict[str, torch.Tensor] = {}
    for name, param in unwrapped.named_parameters(remove_duplicate=False):
        if id(param) not in masters:
            full = safe_get_full_fp32_param(param)
            masters[id(param)] = None if full is None else full.detach().float().cpu()
        if masters[id(param)] is not None:
            out[name] = masters[id(param)]
    return out


def save_snapshot(accelerator: Accelerator, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, run_dir: Path,
                  info: dict[str, Any]) -> Path | None:  # fmt: skip
    """``save_pretrained`` folder + tokenizer + snapshot.json, then the COMPLETE marker last. Every process calls
    this (gathering a sharded state dict is collective); only the main process writes."""
    # Full, unwrapped keys: no "module."; and no "_orig_mod.", which get_state_dict keeps for a model that
    # accelerator.prepare compiled (train.compile) and which from_pretrained would not find.
    state_dict = {k.removeprefix("_orig_mod."): v for k, v in accelerator.get_state_dict(model).items()}
    masters = deepspeed_fp32_weights(accelerator, model) if accelerator.state.deepspeed_plugin is not None else {}
    state_dict.update(masters)
    path = Path(run_dir) / SNAPSHOTS / step_dirname(info["step"])

    def write() -> None:
        if not accelerator.is_main_process:
            return
        shutil.rmtree(path, ignore_errors=True)  # an incomplete (or superseded) folder of the same step
        unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
        # transformers' "Writing model shards" bar, twice on the first screen of a short run: the run's own bar says
        # where it is (transformers' documented switch, restored after).
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            unwrapped.save_pretrained(path, state_dict=state_dict)
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        if masters:  # config.json takes the (16-bit) module's dtype, and from_pretrained would load in it
            unwrapped.config.dtype = torch.float32
            unwrapped.config.save_pretrained(path)
        tokenizer.save_pretrained(path)
        write_json(path / SNAPSHOT_INFO, info)
        follow_umask(path)
        write_manifest(path)
        fault_point("snapshot_files", info["step"])
        (path / SNAPSHOT_MARKER).write_text("")

    agreed(accelerator, path, write)
    return path if accelerator.is_main_process else None


def snapshot_is_complete(path: Path) -> bool:
    """A snapshot folder with its COMPLETE marker whose files match its manifest."""
    if not (Path(path) / SNAPSHOT_MARKER).is_file():
        return False
    try:
        verify_manifest(path, RESUME_FIX)  # read on resume: a snapshot of another version is refused like the run
    except ManifestError:
        return False
    return True
