"""The pretraining driver behind ``pretrain/run.py`` (the command, which reads the options before importing this).

Plain functions, read top to bottom: ``pretrain`` -> ``build_accelerator`` -> ``build_*`` -> ``train`` (->
``train_step``, ``evaluate``, ``save_checkpoint``, ``save_snapshot``) -> final status. What a run writes is
described in docs/run_layout.md; the exit codes are in pretrain/run.py.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import (
    DataLoaderConfiguration,
    InitProcessGroupKwargs,
    ProjectConfiguration,
    is_compiled_module,
    set_seed,
)
from torch import nn
from tqdm.auto import tqdm
from transformers import get_scheduler

from pretrain.common.atomic import write_json
from pretrain.common.device import FP16_NEEDS_A_GPU, accelerate_uses_cpu, choose_cpu_threads, env_flag
from pretrain.common.formats import RUN_FORMAT, stamped
from pretrain.common.hardware import auto_mixed_precision, cpu_bf16_warning, mfu_peak
from pretrain.config import ConfigError, PretrainConfig, TrainConfig, resolved_config, to_dict
from pretrain.data.loaders import Loaders, build_dataloaders, copies_asynchronously
from pretrain.data.pipeline import build_pretraining_data
from pretrain.data.vocabulary import check_one_vocabulary, data_fingerprint, with_trained_vocabulary
from pretrain.flops import flops_per_token
from pretrain.modeling import LNBertForPreTraining
from pretrain.ngpt import ngpt_stats
from pretrain.optim import build_adamw, resolve_adamw_implementation
from pretrain.prepare import data_report, prepare_command
from pretrain.residual_streams import ResidualRecorder, ResidualStats, recording, residual_stats
from pretrain.run_folder.checkpointing import (
    TOKENIZER_ROOM,
    DiskFull,
    TrainState,
    as_disk_full,
    check_same_run,
    checkpoint_step,
    fault_point,
    follow_umask,
    free_space_problem,
    load_checkpoint,
    resolve_resume,
    room_problem,
    save_checkpoint,
    save_snapshot,
    saving,
    snapshot_is_complete,
)
from pretrain.run_folder.identity import ensure_run_id
from pretrain.run_folder.layout import (
    CHECKPOINTS,
    METRICS_FILE,
    RUN_CONFIG_FILE,
    SNAPSHOTS,
    STATUS_FILE,
    TENSORBOARD_DIR,
    TOKENIZER_DIR,
    WANDB_DIR,
    run_folder_of,
    step_dirname,
)
from pretrain.run_folder.status import Heartbeat, StopRequest, write_status
from pretrain.tracking.metrics import (
    clip_coefficient,
    init_trackers,
    layer_grad_norms,
    log_metrics,
    log_snapshot,
    model_flops_utilisation,
    record_outcome,
    residual_matrices,
    residual_scalars,
    rewind_metrics,
)
from pretrain.tracking.wandb_logging import check_credentials, wandb_mode


class TrainingFailed(RuntimeError):
    """An unexpected error after training started (status.json says failed); never a configuration error."""


# --------------------------------------------------------------------------------------------------
# Setup
# --------------------------------------------------------------------------------------------------


def say(message: str, file: TextIO | None = None) -> None:
    """Print once per run: on the first process (RANK 0 of the launcher, known before Accelerate starts)."""
    if os.environ.get("RANK", "0") == "0":
        print(message, file=file or sys.stdout, flush=True)


def resolve_mixed_precision(cfg: PretrainConfig) -> None:
    """train.mixed_precision=auto becomes no or bf16 for this hardware (said once), before anything reads it."""
    if cfg.train.mixed_precision != "auto":
        return
    cfg.train.mixed_precision, why = auto_mixed_precision(accelerate_uses_cpu())
    say(f"train.mixed_precision=auto: {cfg.train.mixed_precision} ({why})")


def check_environment(cfg: PretrainConfig) -> None:
    """Combinations that only the hardware/launcher can rule out; fail before any work."""
    on_cpu = accelerate_uses_cpu()
    if cfg.train.mixed_precision == "fp16" and on_cpu:
        raise ConfigError(FP16_NEEDS_A_GPU)
    if cfg.train.mixed_precision == "bf16" and on_cpu and (warning := cpu_bf16_warning("--train.mixed_precision=no")):
        say(f"warning: {warning}", sys.stderr)
    if cfg.train.compile and env_flag("ACCELERATE_USE_DEEPSPEED"):
        raise ConfigError("train.compile=true does not work with DeepSpeed; set --train.compile=false")
    if cfg.model.norm_placement == "ngpt" and env_flag("ACCELERATE_USE_DEEPSPEED"):
        # ZeRO steps its own copies of the weights, which would overwrite the re-normalised module parameters.
        raise ConfigError(
            "model.norm_placement=ngpt does not work with DeepSpeed (its optimizer keeps its own copies of the "
            "weights, which nGPT's re-normalisation after each step cannot reach); launch without DeepSpeed (DDP)"
        )
    if cfg.tracking.backend == "wandb":
        check_credentials(wandb_mode(cfg.tracking.wandb_mode), cfg.train.output_dir)


class _SkipTiedWeightsNote(logging.Filter):
    """Accelerate notes at every checkpoint that it left the tied MLM decoder weight out ("Removed shared
    tensor"); loading ties it again, so there is nothing for a user to act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Removed shared tensor" not in record.getMessage()


def build_accelerator(cfg: PretrainConfig) -> Accelerator:
    logging.getLogger("accelerate.utils.other").addFilter(_SkipTiedWeightsNote())
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1 or env_flag("ACCELERATE_USE_DEEPSPEED")
    kwargs_handlers = []
    if distributed:
        # DeepSpeed on CPU needs gloo (it would pick an accelerator backend); a single process needs none.
        # The timeout turns a frozen process into an error on the others instead of an endless wait.
        kwargs_handlers.append(
            InitProcessGroupKwargs(
                backend="gloo" if accelerate_uses_cpu() else "nccl",
                timeout=datetime.timedelta(seconds=cfg.train.collective_timeout_s),
            )
        )
    accelerator = Accelerator(
        mixed_precision=cfg.train.mixed_precision,
        gradient_accumulation_steps=cfg.train.gradient_accumulation_steps,
        log_with=None if cfg.tracking.backend == "none" else cfg.tracking.backend,
        project_config=ProjectConfiguration(
            project_dir=cfg.train.output_dir, logging_dir=str(Path(cfg.train.output_dir) / TENSORBOARD_DIR)
        ),
        # The scheduler is stepped once per optimizer step, and its horizon is train.max_steps.
        step_scheduler_with_optimizer=False,
        kwargs_handlers=kwargs_handlers,
        dataloader_config=DataLoaderConfiguration(non_blocking=copies_asynchronously()),
        # prepare() compiles last, after the DDP wrap; None keeps an `accelerate config` dynamo choice.
        dynamo_backend="inductor" if cfg.train.compile else None,
    )
    plugin = accelerator.state.deepspeed_plugin
    if plugin is not None and plugin.deepspeed_config.get("gradient_clipping") == "auto":
        # Accelerate would fill "auto" with 1.0; the value lives in the project config.
        plugin.deepspeed_config["gradient_clipping"] = cfg.optim.max_grad_norm
    return accelerator


def build_model(cfg: PretrainConfig, vocab_size: int) -> LNBertForPreTraining:
    """The model, uncompiled: train.compile is applied by ``accelerator.prepare`` after the DDP wrap
    (build_accelerator), so that DDP's all-reduces overlap the compiled backward (PyTorch's DDP + compile
    guidance); compiling first makes the backward one graph that the all-reduces wait for."""
    model = LNBertForPreTraining(cfg.model.to_lnbert(vocab_size))
    if cfg.data.objective != "mlm_nsp":
        # No NSP loss: the pooler and the NSP head get no gradient, which DDP (find_unused_parameters=False)
        # reports as an error at the second step. Frozen, they stay at their initial values, as before, and the
        # snapshots keep every key.
        model.bert.pooler.requires_grad_(False)
        model.cls.seq_relationship.requires_grad_(False)
    return model


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------


@dataclass
class TrainingSetup:
    """The prepared objects of one run (plain data; the functions below do the work)."""

    cfg: PretrainConfig
    resolved: dict[str, Any]
    accelerator: Accelerator
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    loaders: Loaders
    tokenizer: Any
    run_dir: Path
    flops_per_token: float
    peak_flops_per_device: float  # what train/mfu is measured against (hardware.mfu_peak)
    last_eval: dict[str, float] = field(default_factory=dict)


@dataclass
class StepStats:
    """Per-step sums over micro-batches and processes."""

    loss: float
    mlm_loss: float
    nsp_loss: float
    tokens: int
    slots: int  # sequence positions computed, padding included (what a fixed-shape benchmark counts)
    finite: bool  # the loss and the gradient norm
    overflow: bool  # a finite loss whose loss-scaled (fp16) gradients overflowed: the scaler skipped the step
    stop: bool
    grad_norm: float
    layer_grad_norms: dict[str, float]
    residual: ResidualStats | None = None  # what the residual scheme did, at log steps (None for the standard one)
    ngpt: dict[str, float] = field(default_factory=dict)  # nGPT's invariants and scalers, at log steps


def batch_iterator(setup: TrainingSetup, state: TrainState) -> Iterator[dict[str, torch.Tensor]]:
    """Micro-batches from the current position on, epoch after epoch, keeping state.epoch/batches_in_epoch."""
    while True:
        setup.loaders.train_collator.set_epoch(state.epoch)  # masks are a function of (seed, epoch, instance)
        if setup.loaders.sampler is not None:
            setup.loaders.sampler.epoch = state.epoch
        loader = setup.loaders.train
        if state.batches_in_epoch:
            loader = setup.accelerator.skip_first_batches(loader, state.batches_in_epoch)
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(state.epoch)  # for streaming datasets (shuffle buffer) and Accelerate's counters
        for batch in loader:
            state.batches_in_epoch += 1
            yield batch
        state.epoch += 1
        state.batches_in_epoch = 0


def train_step(
    setup: TrainingSetup, batches: Iterator[dict[str, torch.Tensor]], stop: StopRequest, log_step: bool
) -> StepStats:
    """Accumulate gradients over micro-batches until Accelerate syncs, check the loss, then step.

    When the loss is not finite on any process, no optimizer step is taken (under DeepSpeed the engine has
    already stepped inside ``backward``; no checkpoint is written from that state either way). When the loss is
    finite but fp16's loss-scaled gradients overflowed (an infinite norm), the scaler skips the update and lowers
    its scale (``optimizer.step`` is still called: that is where it does so); ``step_outcome`` judges the run.
    After the update the model's ``after_optimizer_step`` runs (nGPT re-normalises its matrices). A ``log_step``
    also measures the per-layer gradient norms, on the first micro-batch what the residual scheme does
    (``residual_recording``), and nGPT's invariants and scalers (``pretrain.ngpt.ngpt_stats``, from the parameters,
    between the update and the re-normalisation: ``ngpt/weight_norm_error`` is how far one step moved them).
    """
    accelerator, model = setup.accelerator, setup.model
    sums = torch.zeros(6, device=accelerator.device)  # loss, mlm, nsp, tokens, micro-batches, slots
    residual, ngpt = None, {}
    for batch in batches:
        with accelerator.accumulate(model):
            measure = log_step and residual is None  # the step's first micro-batch, at a log step
            with residual_recording(setup, batch) if measure else nullcontext() as recorder:
                out = model(**batch)
            if measure:
                residual = recorder.stats() if recorder is not None else residual_measurement(setup, batch)
            accelerator.backward(out.loss)
            nsp = out.nsp_loss.detach() if out.nsp_loss is not None else torch.zeros((), device=sums.device)
            sums += torch.stack(
                [
                    out.loss.detach().float(),
                    out.mlm_loss.detach().float(),
                    nsp.float(),
                    batch["attention_mask"].sum().float(),
                    torch.ones((), device=sums.device),
                    torch.tensor(float(batch["input_ids"].numel()), device=sums.device),
                ]
            )
            if not accelerator.sync_gradients:
                continue
            # One all-reduce per step: the losses for logging, the finite check and the stop request.
            flags = torch.tensor([float(bool(stop.signal_name))], device=sums.device)
            totals = accelerator.reduce(torch.cat([sums, flags]), reduction="sum")
            finite = bool(torch.isfinite(totals[:3]).all())
            grad_norm, layer_norms, overflow = float("nan"), {}, False
            if finite:
                max_norm = setup.cfg.optim.max_grad_norm
                norm = accelerator.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else float("inf"))
                grad_norm = float(norm) if norm is not None else float("nan")
                finite = math.isfinite(grad_norm) or norm is None
                overflow = not finite and accelerator.scaler is not None
                unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
                if finite and log_step and accelerator.state.deepspeed_plugin is None:  # ZeRO partitions
                    layer_norms = layer_grad_norms(unwrapped, 1 / clip_coefficient(grad_norm, max_norm))
                if finite or overflow:
                    setup.optimizer.step()  # on an overflow the scaler skips the update and lowers its scale
                    setup.scheduler.step()  # the learning rate stays a function of the step number
                    if log_step and unwrapped.config.norm_placement == "ngpt":
                        ngpt = ngpt_stats(unwrapped).scalars()  # before re-normalising: how far the step moved
                    unwrapped.after_optimizer_step()  # nGPT: its matrices back onto the sphere
            setup.optimizer.zero_grad(set_to_none=True)
            micro = totals[4].item()
            return StepStats(
                loss=totals[0].item() / micro,
                mlm_loss=totals[1].item() / micro,
                nsp_loss=totals[2].item() / micro,
                tokens=int(totals[3].item()),
                slots=int(totals[5].item()),
                finite=finite,
                overflow=overflow,
                stop=totals[6].item() > 0,
                grad_norm=grad_norm,
                layer_grad_norms=layer_norms,
                residual=residual,
                ngpt=ngpt,
            )
    raise RuntimeError("the training data ran out")  # batch_iterator loops over epochs forever


def has_residual_scheme(setup: TrainingSetup) -> bool:
    return setup.cfg.model.residual_scheme != "standard"


def residual_recording(
    setup: TrainingSetup, batch: dict[str, torch.Tensor]
) -> AbstractContextManager[ResidualRecorder | None]:
    """Records the residual scheme's measurements (``pretrain.residual_streams.recording``) during the training
    forward of ``batch`` itself, a few small reductions per sub-layer instead of a second forward pass (a third of
    a step: a grid cell logs every step). Yields None where nothing is recorded: the standard scheme, and a
    compiled model, whose graph would be traced again with the recorder in it (``residual_measurement`` then)."""
    if not has_residual_scheme(setup) or is_compiled_module(setup.model):
        return nullcontext()
    unwrapped = setup.accelerator.unwrap_model(setup.model, keep_torch_compile=False)
    return recording(unwrapped, batch["attention_mask"])


def residual_measurement(setup: TrainingSetup, batch: dict[str, torch.Tensor]) -> ResidualStats | None:
    """The residual scheme's measurements where the training forward does not record them (a compiled model): one
    eval-mode forward of the encoder without gradients on ``batch``, under the run's autocast. None for the
    standard scheme."""
    if not has_residual_scheme(setup):
        return None
    unwrapped = setup.accelerator.unwrap_model(setup.model, keep_torch_compile=False)
    with setup.accelerator.autocast():
        return residual_stats(unwrapped, batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))


@torch.no_grad()
def evaluate(setup: TrainingSetup) -> dict[str, float]:
    """Validation MLM loss and accuracy (over masked tokens) and NSP accuracy, over all processes."""
    accelerator, model = setup.accelerator, setup.model
    model.eval()
    totals = torch.zeros(5, dtype=torch.float64, device=accelerator.device)
    for batch in setup.loaders.validation:
        out = model(**batch)
        labels = batch["labels"]
        selected = labels != -100  # (B, T)
        logits = out.prediction_logits
        if logits.dim() == 3:  # dense MLM head: (B, T, V); the sparse head already gives (num_masked, V)
            logits = logits[selected]
        targets = labels[selected]
        rows = selected.nonzero()[:, 0]  # example of each masked token, in the sparse head's row-major order
        per_example = torch.zeros(labels.shape[0], 4, device=labels.device)
        token_loss = F.cross_entropy(logits.float(), targets, reduction="none")
        per_example[:, 0].index_add_(0, rows, token_loss)
        per_example[:, 1].index_add_(0, rows, (logits.argmax(-1) == targets).float())
        per_example[:, 2] = selected.sum(1).float()
        if "next_sentence_label" in batch:
            nsp_right = out.seq_relationship_logits.argmax(-1) == batch["next_sentence_label"].view(-1)
            per_example[:, 3] = nsp_right.float()
        # gather_for_metrics drops the samples Accelerate duplicated to even out the last batch.
        gathered = accelerator.gather_for_metrics(per_example)
        totals += torch.cat([gathered.sum(0).double(), torch.tensor([len(gathered)], device=totals.device)])
    model.train()
    loss_sum, correct, masked, nsp_correct, examples = totals.tolist()
    metrics = {
        "val/mlm_loss": loss_sum / max(masked, 1),
        "val/mlm_accuracy": correct / max(masked, 1),
    }
    if setup.cfg.data.objective == "mlm_nsp":
        metrics["val/nsp_accuracy"] = nsp_correct / max(examples, 1)
    return metrics


def save(setup: TrainingSetup, state: TrainState, *, snapshot: bool, checkpoint: bool) -> None:
    """The saves due at this step, once the main process found room for them (DiskFull otherwise, as from a write
    that finds the disk full). The snapshot first: a kill between the two leaves the previous checkpoint as the
    latest, and the resumed run passes this step again and writes the snapshot again (docs/run_layout.md)."""
    if not (snapshot or checkpoint):
        return
    ensure_room(setup.accelerator, lambda: free_space_problem(setup.run_dir, setup.model, checkpoint, snapshot))
    if snapshot:
        info = {
            "step": state.step,
            "tokens_seen": state.tokens_seen,
            "run_name": setup.cfg.train.run_name,
            "norm_placement": setup.cfg.model.norm_placement,
            "metrics": dict(setup.last_eval),
            "pretrain_config": setup.resolved,
        }
        with saving(snapshot_path(setup, state.step)):
            path = save_snapshot(setup.accelerator, setup.model, setup.tokenizer, setup.run_dir, info)
        log_snapshot(setup.accelerator, setup.run_dir, path, state.step)
    if checkpoint:
        with saving(setup.run_dir / CHECKPOINTS / step_dirname(state.step)):
            save_checkpoint(setup.accelerator, setup.run_dir, state, setup.cfg.train.keep_last_checkpoints)


def ensure_room(accelerator: Accelerator, problem: Callable[[], str]) -> None:
    """Raise DiskFull on every process when the main process's room check (``problem``: a message, or "" when
    there is room) fails: one reduce, so that all stop together."""
    found = problem() if accelerator.is_main_process else ""
    full = accelerator.reduce(torch.tensor([float(bool(found))], device=accelerator.device), reduction="sum")
    if full.item() > 0:
        raise DiskFull(found or "disk full at the main process's run directory")


def set_status(
    accelerator: Accelerator, cfg: PretrainConfig, status: str, step: int, message: str = "",
    diverged_at: int | None = None,
) -> None:
    """The run's status, on the main process: RUN/status.json and the tracker's summary (the outcome columns)."""
    if accelerator.is_main_process:
        write_status(cfg, status, step, message, diverged_at)
        record_outcome(accelerator, status, step, diverged_at)


def record_stop(accelerator: Accelerator, cfg: PretrainConfig, status: str, step: int, message: str) -> None:
    """``set_status`` for a run that stops on a full disk or an error: when the status file does not fit either,
    say so, and the stop (or the error) stands."""
    try:
        set_status(accelerator, cfg, status, step, message)
    except OSError as err:
        print(f"error: could not record status {status} in {Path(cfg.train.output_dir) / STATUS_FILE}: {err}",
              file=sys.stderr)  # fmt: skip


def start_snapshot_due(setup: TrainingSetup, state: TrainState) -> bool:
    """A snapshot is written before the first step: at step 0 (train.snapshot_at_start), or on resume when the
    checkpoint's step has a scheduled snapshot that is not complete (damaged or removed since, or scheduled by a
    resume that changed train.snapshot_steps): the checkpoint holds the same weights."""
    train_cfg = setup.cfg.train
    if state.step == 0:
        return train_cfg.snapshot_at_start
    last_step = train_cfg.stop_at_step or train_cfg.max_steps
    return snapshot_due(train_cfg, state.step, last_step) and not snapshot_is_complete(snapshot_path(setup, state.step))


def snapshot_path(setup: TrainingSetup, step: int) -> Path:
    return setup.run_dir / SNAPSHOTS / step_dirname(step)


def snapshot_due(train_cfg: TrainConfig, step: int, last_step: int) -> bool:
    """A snapshot is scheduled at ``step`` (the final one only when the run ends at train.max_steps)."""
    final = step == last_step == train_cfg.max_steps and train_cfg.snapshot_at_end
    return train_cfg.is_snapshot_step(step) or final


VAL_MLM_LOSS = "val/mlm_loss"


def progress_postfix(loss: float | None, lr: float | None, last_eval: dict[str, float]) -> dict[str, str]:
    """The progress bar's postfix: train loss and lr of the last logged step, and the latest validation MLM loss
    (the number the placements are compared by; without it the console never shows it)."""
    postfix = {}
    if loss is not None:
        postfix["loss"] = f"{loss:.3f}"
    if lr is not None:
        postfix["lr"] = f"{lr:.2e}"
    if last_eval.get(VAL_MLM_LOSS) is not None:
        postfix["val"] = f"{last_eval[VAL_MLM_LOSS]:.3f}"
    return postfix


def final_validation(last_eval: dict[str, float]) -> str:
    """The end-of-run summary's validation line ("" before any evaluation)."""
    if last_eval.get(VAL_MLM_LOSS) is None:
        return ""
    accuracy = last_eval.get("val/mlm_accuracy")
    return f"\n  validation   MLM loss {last_eval[VAL_MLM_LOSS]:.4f}" + (
        f", MLM accuracy {accuracy:.4f}" if accuracy is not None else ""
    )


def step_outcome(stats: StepStats, skipped_in_a_row: int, max_skipped_steps: int) -> str:
    """stepped, skipped (an fp16 overflow: routine while the loss scale settles, in the first steps above all)
    or diverged (a non-finite loss or gradient without a loss scaler, or more than ``max_skipped_steps`` overflows
    in a row: the scale keeps falling because the gradients themselves are not finite)."""
    if stats.finite:
        return "stepped"
    if stats.overflow and skipped_in_a_row < max_skipped_steps:
        return "skipped"
    return "diverged"


def divergence_message(stats: StepStats, step: int, skipped_in_a_row: int) -> str:
    if stats.overflow:
        return (
            f"the fp16 gradients overflowed in {skipped_in_a_row + 1} steps in a row up to step {step}, more than "
            f"train.max_skipped_steps={skipped_in_a_row} (loss {stats.loss}); the run diverged. No checkpoint or "
            "snapshot was written from this state."
        )
    return (
        f"loss or gradient not finite at step {step} (loss {stats.loss}); the run diverged. "
        "No checkpoint or snapshot was written from this state."
    )


def run_evaluation(setup: TrainingSetup, state: TrainState) -> None:
    setup.last_eval = evaluate(setup)
    log_metrics(setup.accelerator, setup.run_dir, {"tokens_seen": state.tokens_seen, **setup.last_eval}, state.step)


def step_metrics(
    setup: TrainingSetup, state: TrainState, stats: StepStats, tokens: int, slots: int, seconds: float, skipped: int
) -> dict[str, float]:
    """One metrics line: the last step's losses and gradient norms, throughput over the window since the last line
    (``tokens`` real, ``slots`` with padding, in ``seconds`` of training steps), fp16's skipped steps."""
    accelerator = setup.accelerator
    tokens_per_s = tokens / max(seconds, 1e-9)
    metrics = {
        "tokens_seen": state.tokens_seen,
        "train/loss": stats.loss,
        "train/mlm_loss": stats.mlm_loss,
        "train/lr": setup.scheduler.get_last_lr()[0],
        "train/grad_norm": stats.grad_norm,
        "train/tokens_per_s": tokens_per_s,
        # Padding included: comparable with benchmarks.train_step, which counts every slot of its batch.
        "train/slot_tokens_per_s": slots / max(seconds, 1e-9),
        "train/mfu": model_flops_utilisation(
            tokens_per_s, setup.flops_per_token, setup.peak_flops_per_device, accelerator.num_processes
        ),
        "train/epoch": state.epoch,
    }
    if setup.cfg.data.objective == "mlm_nsp":
        metrics["train/nsp_loss"] = stats.nsp_loss
    if accelerator.scaler is not None:  # fp16: steps the scaler skipped since the last line, and its scale
        metrics["train/skipped_steps"] = skipped
        metrics["train/loss_scale"] = accelerator.scaler.get_scale()
    metrics.update(stats.layer_grad_norms)
    if stats.residual is not None:
        metrics.update(residual_scalars(stats.residual))
    metrics.update({f"ngpt/{key}": value for key, value in stats.ngpt.items()})
    return metrics


def train(setup: TrainingSetup, state: TrainState, stop: StopRequest) -> str:
    """The run from its current step: the step-0 evaluation and the start snapshot, then the loop. Returns the
    outcome: finished, diverged or preempted (a full disk raises DiskFull)."""
    if state.step == 0:
        run_evaluation(setup, state)
    save(setup, state, snapshot=start_snapshot_due(setup, state), checkpoint=False)
    progress = tqdm(
        total=setup.cfg.train.max_steps,
        initial=state.step,
        disable=not setup.accelerator.is_local_main_process,
        desc="pretrain",
    )
    with progress:  # closed on every way out of the loop, an exception included
        return training_loop(setup, state, stop, progress)


def training_loop(setup: TrainingSetup, state: TrainState, stop: StopRequest, progress: tqdm) -> str:
    """Steps until train.stop_at_step or train.max_steps, a divergence or a stop request; returns the outcome as
    ``train`` does."""
    cfg, accelerator = setup.cfg, setup.accelerator
    train_cfg = cfg.train
    last_step = train_cfg.stop_at_step or train_cfg.max_steps
    batches = batch_iterator(setup, state)
    postfix = progress_postfix(None, None, setup.last_eval)  # a resumed run shows its last validation loss at once
    # Throughput counts the time spent in training steps only (not evaluation or saving).
    window_tokens, window_slots, window_time = 0, 0, 0.0
    skipped_in_a_row, window_skipped = 0, 0
    heartbeat = Heartbeat()
    while state.step < last_step:
        next_step = state.step + 1
        log_now = next_step % train_cfg.log_every == 0 or next_step == last_step
        started = time.perf_counter()
        stats = train_step(setup, batches, stop, log_step=log_now)
        window_time += time.perf_counter() - started
        outcome = step_outcome(stats, skipped_in_a_row, train_cfg.max_skipped_steps)
        if outcome == "diverged":
            message = divergence_message(stats, state.step + 1, skipped_in_a_row)
            set_status(accelerator, cfg, "diverged", state.step, message, diverged_at=state.step + 1)
            log_metrics(accelerator, setup.run_dir, {"tokens_seen": state.tokens_seen, "diverged": 1}, state.step + 1)
            accelerator.print(f"\n{message}")
            return "diverged"
        skipped_in_a_row = skipped_in_a_row + 1 if outcome == "skipped" else 0
        window_skipped += outcome == "skipped"
        state.step += 1
        state.tokens_seen += stats.tokens
        window_tokens += stats.tokens
        window_slots += stats.slots
        progress.update(1)
        if log_now:
            metrics = step_metrics(setup, state, stats, window_tokens, window_slots, window_time, window_skipped)
            matrices = residual_matrices(stats.residual) if stats.residual is not None else {}
            log_metrics(accelerator, setup.run_dir, metrics, state.step, file_only=matrices)
            postfix.update(progress_postfix(stats.loss, metrics["train/lr"], setup.last_eval))
            progress.set_postfix(postfix)
            window_tokens, window_slots, window_time, window_skipped = 0, 0, 0.0, 0
        done = state.step == last_step
        preempted = stats.stop and not done
        if (train_cfg.eval_every and state.step % train_cfg.eval_every == 0) or done:
            run_evaluation(setup, state)
            postfix.update(progress_postfix(None, None, setup.last_eval))
            progress.set_postfix(postfix)
        on_interval = bool(train_cfg.checkpoint_every) and state.step % train_cfg.checkpoint_every == 0
        save(setup, state, snapshot=snapshot_due(train_cfg, state.step, last_step),
             checkpoint=on_interval or done or preempted)  # fmt: skip
        fault_point("step", state.step)
        if heartbeat.due():
            set_status(accelerator, cfg, "running", state.step)
        if preempted:
            accelerator.print(f"\nstop requested ({stop.signal_name}) at step {state.step}; checkpoint saved")
            return "preempted"
    return "finished" if state.step >= train_cfg.max_steps else "preempted"


# --------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------


def decide_at_start(cfg: PretrainConfig, accelerator: Accelerator, tokenizer: Any, same_run: bool) -> dict[str, Any]:
    """What run_config.json holds: ``cfg`` with the values decided now that the tokenizer is known
    (RESOLVED_AT_START: the model's vocabulary, the peak FLOP/s train/mfu is measured against), after checking
    that every process has the vocabulary it trains with."""
    check_one_vocabulary(accelerator, tokenizer)
    vocab_size = cfg.model.vocab_size or len(tokenizer)
    if len(tokenizer) > vocab_size:
        raise ConfigError(
            f"model.vocab_size={vocab_size} is smaller than the tokenizer's {len(tokenizer)} tokens; "
            "raise model.vocab_size or set it to null (use the tokenizer's size)"
        )
    peak_flops, peak_note = mfu_peak(cfg.train.peak_flops_per_device, accelerator.device, cfg.train.mixed_precision)
    accelerator.print(peak_note)
    resolved = resolved_config(cfg, {"model.vocab_size": vocab_size, "train.peak_flops_per_device": peak_flops})
    # A run continued from its checkpoint must decide the vocabulary it was trained with (a Hub tokenizer can
    # change upstream); one that starts again from step 0 rewrites its run_config.json.
    if same_run:
        check_same_run(Path(cfg.train.output_dir), resolved)
    return resolved


def prepare_training(
    cfg: PretrainConfig, accelerator: Accelerator, resume_from: Path | None, same_run: bool, argv: list[str] | None
) -> tuple[TrainingSetup, TrainState]:
    """``same_run``: ``resume_from`` is a checkpoint of this run folder (not a run continued in a new folder);
    ``argv``: the run's arguments, which the data-preparation command it may print repeats."""
    run_dir = Path(cfg.train.output_dir)
    set_seed(cfg.train.seed)
    data_cfg, overrides = with_trained_vocabulary(cfg.data, resume_from)
    # The tokenizer is saved during data preparation, before the model's size is known: room for it first.
    ensure_room(accelerator, lambda: room_problem(run_dir, TOKENIZER_ROOM))
    with saving(Path(cfg.data.cache_dir)):
        data = build_pretraining_data(
            data_cfg,
            seed=cfg.train.seed,
            # A resumed run keeps the tokenizer it saved (never overwritten by a re-trained one).
            save_tokenizer_to=run_dir / TOKENIZER_DIR if accelerator.is_main_process and not same_run else None,
            main_process_first=accelerator.main_process_first,
            model_vocab_size=cfg.model.vocab_size,
            # Several processes: a large corpus must have been prepared by pretrain/prepare.py (not under a barrier).
            num_processes=accelerator.num_processes,
            prepare_command=prepare_command(None if argv is None else [*argv, *overrides]),
            progress=accelerator.is_main_process,
            # After main_process_first the main process's tokenizer is in the run folder, which every node sees.
            trained_tokenizer=None if accelerator.is_main_process else run_dir / TOKENIZER_DIR,
        )
    resolved = decide_at_start(cfg, accelerator, data.tokenizer, same_run)
    vocab_size, peak_flops = resolved["model"]["vocab_size"], resolved["train"]["peak_flops_per_device"]
    set_seed(cfg.train.seed)  # the same initial weights whatever data preparation drew
    model = build_model(cfg, vocab_size)
    optim = cfg.optim
    optimizer = build_adamw(
        model,
        lr=optim.lr,
        betas=optim.betas,
        eps=optim.eps,
        weight_decay=optim.weight_decay,
        implementation=resolve_adamw_implementation(optim.implementation, accelerator.device),
    )
    max_steps = cfg.train.max_steps
    scheduler = get_scheduler(
        cfg.optim.scheduler,
        optimizer,
        num_warmup_steps=cfg.optim.resolved_warmup_steps(max_steps),
        num_training_steps=max_steps,
    )
    loaders = build_dataloaders(cfg, data, accelerator.num_processes)
    model, optimizer, loaders.train, loaders.validation, scheduler = accelerator.prepare(
        model, optimizer, loaders.train, loaders.validation, scheduler
    )
    unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
    setup = TrainingSetup(
        cfg=cfg,
        resolved=resolved,
        accelerator=accelerator,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        loaders=loaders,
        tokenizer=data.tokenizer,
        run_dir=run_dir,
        flops_per_token=flops_per_token(
            unwrapped.config,
            cfg.data.max_seq_length,
            mlm_head_share=cfg.data.mlm_probability if unwrapped.config.sparse_mlm_head else 1.0,
        ),
        peak_flops_per_device=peak_flops,
    )
    fingerprint = data_fingerprint(cfg, accelerator.num_processes, data.tokenizer)
    state = TrainState(data_fingerprint=fingerprint)
    if resume_from is not None:
        state = load_checkpoint(accelerator, resume_from)
        if state.data_fingerprint != fingerprint:
            accelerator.print(
                f"resuming {resume_from} with different data or batch settings: the data starts from its beginning"
            )
            state = dataclasses.replace(state, epoch=0, batches_in_epoch=0, data_fingerprint=fingerprint)
    if accelerator.is_main_process:
        start_run_folder(setup, state.step if same_run else -1)
    return setup, state


def start_run_folder(setup: TrainingSetup, resumed_at: int) -> None:
    """The main process's files of a starting run: the data report, run_config.json, the run id, metrics.jsonl
    cut back to ``resumed_at`` (-1: a run from step 0, a new one or one killed before its first checkpoint, keeps
    no line of an earlier try)."""
    # What the run trains on, before it starts: a mixture that is not what the weights ask for, or a tiny
    # validation split, is seen now rather than after the run (the same report as pretrain.prepare's).
    report = data_report(setup.cfg, setup.tokenizer)
    if report is not None:
        print(report, flush=True)
    write_json(setup.run_dir / RUN_CONFIG_FILE, stamped(setup.resolved, RUN_FORMAT))
    ensure_run_id(setup.run_dir)  # once per run: fine-tuning results are keyed by it (pretrain/run_folder/identity.py)
    setup.last_eval = rewind_metrics(setup.run_dir, resumed_at)
    if (setup.run_dir / TOKENIZER_DIR).is_dir():
        follow_umask(setup.run_dir / TOKENIZER_DIR)


def pretrain(cfg: PretrainConfig, argv: list[str] | None = None) -> str:
    """Run one pretraining job described by ``cfg`` (parsed from ``argv``, which the message naming the data
    preparation command repeats); returns finished, diverged, preempted or "preempted (disk full)".

    The one place a full disk is answered: DiskFull from a save (its room check, or a write that hit ENOSPC), or
    a "No space left on device" from any other write, stops the run as preempted with the message; the same
    command continues it once there is room."""
    resolve_mixed_precision(cfg)
    check_environment(cfg)
    accelerator = build_accelerator(cfg)
    run_dir = Path(cfg.train.output_dir)
    resume_from = resolve_resume(run_dir, to_dict(cfg), cfg.train.resume, lambda m: say(f"warning: {m}", sys.stderr))
    accelerator.wait_for_everyone()  # every process has checked the directory before the main one writes
    same_run = resume_from is not None and run_folder_of(resume_from) == run_dir.resolve()
    state = TrainState(step=checkpoint_step(resume_from) if resume_from else 0)  # until the checkpoint is loaded
    setup = None
    try:
        setup, state = prepare_training(cfg, accelerator, resume_from, same_run, argv)
        outcome = run_training(setup, state, resume_from)
    except BaseException as err:
        full = as_disk_full(err, run_dir) if isinstance(err, Exception) else None
        if full is None:
            if setup is None:  # bad input found while preparing: nothing started, no status
                raise
            message = failure_message(err, accelerator, cfg)
            record_stop(accelerator, cfg, "failed", state.step, message)
            accelerator.end_training()
            if isinstance(err, Exception):
                raise TrainingFailed(f"training failed at step {state.step}: {message}") from err
            raise
        record_stop(accelerator, cfg, "preempted", state.step, str(full))
        accelerator.print(f"\nstopped at step {state.step}: {full}")
        accelerator.end_training()
        return "preempted (disk full)"
    accelerator.end_training()  # after the final status, which the W&B summary records
    tracker_dir = {"tensorboard": run_dir / TENSORBOARD_DIR, "wandb": run_dir / WANDB_DIR}.get(cfg.tracking.backend)
    accelerator.print(
        f"\n{outcome} at step {state.step}. Run directory {run_dir}:\n"
        f"  checkpoints  {run_dir / CHECKPOINTS}\n"
        f"  snapshots    {run_dir / SNAPSHOTS}\n"
        f"  metrics      {run_dir / METRICS_FILE}\n"
        f"  status       {run_dir / STATUS_FILE}"
        + (f"\n  {cfg.tracking.backend:<12} {tracker_dir}" if tracker_dir else "")
        + final_validation(setup.last_eval)
    )
    return outcome


def run_training(setup: TrainingSetup, state: TrainState, resume_from: Path | None) -> str:
    """From the trackers' start to the final status; returns the outcome as ``train`` does."""
    cfg, accelerator = setup.cfg, setup.accelerator
    accelerator.print(
        f"run {cfg.train.run_name}: {cfg.model.variant}, {accelerator.num_processes} process(es), global batch "
        f"{cfg.train.global_batch_size(accelerator.num_processes)}"
        + (f", resuming at step {state.step} from {resume_from}" if resume_from else "")
    )
    if state.step >= cfg.train.max_steps:
        accelerator.print(f"run {cfg.train.run_name} has already finished (step {state.step}); nothing to train")
    init_trackers(accelerator, cfg, setup.resolved, setup.model, resume_from)
    set_status(accelerator, cfg, "running", state.step)
    with StopRequest().installed() as stop:
        outcome = train(setup, state, stop)
    if outcome == "finished":
        set_status(accelerator, cfg, "finished", state.step, "training finished")
    elif outcome == "preempted":
        set_status(
            accelerator, cfg, "preempted", state.step, "stopped with a checkpoint; continue with --train.resume=auto"
        )
    return outcome


def failure_message(err: BaseException, accelerator: Accelerator, cfg: PretrainConfig) -> str:
    """What status.json says of an unexpected error; a timeout with several processes names the key."""
    message = f"{type(err).__name__}: {err}"
    if accelerator.num_processes > 1 and any(word in str(err).lower() for word in ("timed out", "timeout")):
        message += (
            f" (no answer from another process within train.collective_timeout_s={cfg.train.collective_timeout_s}"
            " s: a process froze or died, or its file system hung)"
        )
    return message


def run(cfg: PretrainConfig, argv: list[str]) -> None:
    """``pretrain`` with torch's CPU threads chosen first (pretrain/run.py's ``main``, once the options are read)."""
    if accelerate_uses_cpu():
        say(choose_cpu_threads())
    pretrain(cfg, argv)
