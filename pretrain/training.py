"""The pretraining driver behind ``pretrain/run.py`` (the command, which reads the options before importing this).

Plain functions, read top to bottom: ``pretrain`` -> ``build_accelerator`` -> ``build_*`` -> ``train`` (->
``train_step``, ``evaluate``, ``save_checkpoint``, ``save_snapshot``) -> final status. What a run writes is
described in docs/run_layout.md; the exit codes are in pretrain/run.py.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import gc
import logging
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import (
    DataLoaderConfiguration,
    InitProcessGroupKwargs,
    ProjectConfiguration,
    is_compiled_module,
    is_deepspeed_available,
    set_seed,
)
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from tqdm.auto import tqdm
from transformers import get_scheduler

from pretrain.common.atomic import follow_umask, write_json
from pretrain.common.cli import ConfigError, to_dict
from pretrain.common.device import FP16_NEEDS_A_GPU, accelerate_uses_cpu, choose_cpu_threads, env_flag
from pretrain.common.formats import RUN_FORMAT, stamped
from pretrain.common.hardware import auto_mixed_precision, cpu_bf16_warning, mfu_peak
from pretrain.config import PretrainConfig, TrainConfig, resolved_config
from pretrain.data.loaders import Loaders, build_dataloaders, copies_asynchronously
from pretrain.data.pipeline import build_pretraining_data
from pretrain.data.vocabulary import check_one_vocabulary, data_fingerprint, with_trained_vocabulary
from pretrain.flops import flops_per_token
from pretrain.modeling import LNBertForPreTraining
from pretrain.optim import build_adamw, resolve_adamw_implementation
from pretrain.placements import PLACEMENTS
from pretrain.prepare import data_report, prepare_command
from pretrain.residual_streams import ResidualStats
from pretrain.run_folder import layout
from pretrain.run_folder.checkpointing import (
    DISK_FULL_HINT,
    TOKENIZER_ROOM,
    DiskFull,
    TrainState,
    as_disk_full,
    check_continuable,
    free_space_problem,
    keep_model_names,
    load_checkpoint,
    main_process_first,
    resolve_resume,
    room_problem,
    save_checkpoint,
    save_snapshot,
    saving,
    snapshot_is_complete,
)
from pretrain.run_folder.identity import ensure_run_id
from pretrain.run_folder.same_run import check_same_run
from pretrain.run_folder.status import Heartbeat, StopRequest, fault_point, watchdog, write_status
from pretrain.tracking.design_stats import LayerMeasurement, gpas_alarms, measure, measuring, where_token
from pretrain.tracking.metrics import (
    clip_coefficient,
    init_trackers,
    layer_grad_norms,
    log_metrics,
    residual_matrices,
    residual_scalars,
    rewind_metrics,
    rounded,
)
from pretrain.tracking.wandb_logging import log_snapshot, record_outcome


class TrainingFailed(RuntimeError):
    """An unexpected error after training started (status.json says failed); never a configuration error."""


# Setup


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
    deepspeed = env_flag("ACCELERATE_USE_DEEPSPEED")
    if cfg.train.compile and deepspeed:
        raise ConfigError("train.compile=true does not work with DeepSpeed; set --train.compile=false")
    if (why := PLACEMENTS[cfg.model.norm_placement].deepspeed) and deepspeed:
        raise ConfigError(f"model.norm_placement={cfg.model.norm_placement} does not work with DeepSpeed ({why}); "
                          "launch without DeepSpeed (DDP)")


def build_accelerator(cfg: PretrainConfig) -> Accelerator:
    # Accelerate notes at every checkpoint that it left out the tied MLM decoder weight; loading ties it again.
    note = "Removed shared tensor"
    logging.getLogger("accelerate.utils.other").addFilter(lambda record: note not in record.getMessage())
    kwargs_handlers, several = [], int(os.environ.get("WORLD_SIZE", "1")) > 1
    if several and is_deepspeed_available():
        # Imported before the group exists: DeepSpeed's barrier functions take the world group as a default argument,
        # which, bound after init_process_group (Accelerate imports DeepSpeed in unwrap_model), holds the group for good.
        import deepspeed  # noqa: F401
    if several or env_flag("ACCELERATE_USE_DEEPSPEED"):
        # DeepSpeed on CPU needs gloo (it would pick an accelerator backend); a single process needs none.
        # The timeout turns a frozen process into an error on the others instead of an endless wait.
        backend, timeout = "gloo" if accelerate_uses_cpu() else "nccl", cfg.train.collective_timeout_s
        kwargs_handlers.append(InitProcessGroupKwargs(backend=backend, timeout=datetime.timedelta(seconds=timeout)))
    accelerator = Accelerator(
        mixed_precision=cfg.train.mixed_precision,
        gradient_accumulation_steps=cfg.train.gradient_accumulation_steps,
        log_with=None if cfg.tracking.backend == "none" else cfg.tracking.backend,
        project_config=ProjectConfiguration(
            project_dir=cfg.train.output_dir, logging_dir=str(Path(cfg.train.output_dir) / layout.TENSORBOARD_DIR)
        ),
        # The scheduler is stepped once per optimizer step, and its horizon is train.max_steps.
        step_scheduler_with_optimizer=False,
        kwargs_handlers=kwargs_handlers,
        dataloader_config=DataLoaderConfiguration(non_blocking=copies_asynchronously()),
        # prepare() compiles last, after the DDP wrap; None keeps an `accelerate config` dynamo choice.
        dynamo_backend="inductor" if cfg.train.compile else None,
    )
    if torch.distributed.is_initialized() and torch.distributed.get_backend() == "gloo":
        atexit.register(end_gloo_group, accelerator.state, [torch.distributed.group.WORLD])
    use_tf32_for_fp32(accelerator.device, cfg.train.mixed_precision)
    plugin = accelerator.state.deepspeed_plugin
    if plugin is not None and plugin.deepspeed_config.get("gradient_clipping") == "auto":
        # Accelerate would fill "auto" with 1.0; the value lives in the project config.
        plugin.deepspeed_config["gradient_clipping"] = cfg.optim.max_grad_norm
    return accelerator


def end_gloo_group(state: AcceleratorState, group: list[torch.distributed.ProcessGroup]) -> None:
    """At exit, before the interpreter finalizes: end the gloo group and join its worker threads. A worker frees the
    tensors of its last collective under the GIL, and a thread that asks for the GIL once finalization has begun
    aborts the process ("terminate called without an active exception", SIGABRT, the exit code lost;
    pytorch/pytorch#190489). destroy_process_group joins the workers only when it drops the group's last reference.
    A DDP model in a reference cycle not yet collected holds one: gc frees it first, else its reducer would drop the
    last reference at teardown, with the GIL held while joining. ``group``'s reference is the last:
    Python drops it with the GIL released, so a worker waiting for the GIL finishes and is joined."""
    if (uncaught := getattr(sys, "last_traceback", None)) is not None:
        traceback.clear_frames(uncaught)  # an uncaught error's frames, already printed, would keep the model alive
    gc.collect()
    state.destroy_process_group()
    group.clear()


def use_tf32_for_fp32(device: torch.device, mixed_precision: str) -> None:
    """fp32 training on a GPU computes its matmuls in TF32 (10-bit mantissa, tensor cores), set here whatever
    train.compile says (Accelerate turns TF32 on for a compiled fp32 model only): the same numerics with and without
    compile, what benchmarks.train_step measures as fp32, and the TF32 peak for train/mfu (hardware.mfu_peak)."""
    if device.type == "cuda" and mixed_precision == "no":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True


def build_model(cfg: PretrainConfig, vocab_size: int) -> LNBertForPreTraining:
    """The model, uncompiled: ``accelerator.prepare`` compiles it after the DDP wrap, so that DDP's all-reduces overlap
    the compiled backward (compiled first, the backward is one graph they wait for)."""
    model = LNBertForPreTraining(cfg.model.to_lnbert(vocab_size))
    if cfg.train.gradient_checkpointing:
        model.activation_checkpointing_enable()
    if cfg.data.objective != "mlm_nsp":
        # No NSP loss: the pooler and the NSP head get no gradient, which DDP (find_unused_parameters=False)
        # reports as an error at the second step. Frozen, they keep their initial values and the snapshots every key.
        model.bert.pooler.requires_grad_(False)
        model.cls.seq_relationship.requires_grad_(False)
    return model


# Training


@dataclass
class TrainingSetup:
    """The prepared objects of one run (plain data; the functions below do the work)."""

    cfg: PretrainConfig
    resolved: dict[str, Any]
    accelerator: Accelerator
    model: nn.Module
    unwrapped: nn.Module  # the model without its DDP, DeepSpeed or compile wrapper
    optimizer: torch.optim.Optimizer
    scheduler: Any
    loaders: Loaders
    tokenizer: Any
    run_dir: Path
    flops_per_token: float
    peak_flops_per_device: float  # what train/mfu is measured against (hardware.mfu_peak)
    last_eval: dict[str, float] = field(default_factory=dict)
    run_id: str = ""  # the main process's (start_run_folder): what its snapshots record
    wandb_run: dict[str, Any] = field(default_factory=dict)  # the main process's W&B identity (RUN/wandb_run.json), idem
    alarmed: set[str] = field(default_factory=set)  # the metrics an alarm was printed for (once each)


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
    disk_full: bool  # a process met a full disk in a write of its own (a metrics line, the heartbeat) before the step
    grad_norm: float
    layer_grad_norms: dict[str, float]
    residual: ResidualStats | None = None  # what the residual scheme did, at log steps (None for the standard one)
    # At log steps: what the layers showed (pretrain/tracking/design_stats.py) and the placement's step_stats (nGPT's).
    design: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, list[float]] = field(default_factory=dict)  # the layers' histograms, metrics.jsonl only


def batch_iterator(setup: TrainingSetup, state: TrainState) -> Iterator[dict[str, torch.Tensor]]:
    """Micro-batches from the current position on, epoch after epoch, keeping state.epoch/samples_in_epoch. The
    processes' micro-batches of one step are consecutive in the epoch's order (Accelerate's sharding), so a position
    in sequences holds for any number of processes."""
    per_micro_step = setup.cfg.train.micro_batch_size(setup.accelerator.num_processes)
    while True:
        setup.loaders.train_collator.set_epoch(state.epoch)  # masks are a function of (seed, epoch, instance)
        if setup.loaders.sampler is not None:
            setup.loaders.sampler.epoch = state.epoch
        loader = setup.loaders.train
        if state.samples_in_epoch:
            loader = setup.accelerator.skip_first_batches(loader, state.samples_in_epoch // per_micro_step)
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(state.epoch)  # for streaming datasets (shuffle buffer) and Accelerate's counters
        for batch in loader:
            state.samples_in_epoch += per_micro_step
            yield batch
        state.epoch += 1
        state.samples_in_epoch = 0


def train_step(
    setup: TrainingSetup, batches: Iterator[dict[str, torch.Tensor]], stop: StopRequest, log_step: bool,
    disk_full: bool = False,
) -> StepStats:
    """Accumulate gradients over micro-batches until Accelerate syncs, check the loss, then step. A loss not finite on
    any process takes no step (DeepSpeed's engine stepped in ``backward``; no checkpoint is written from that state);
    with fp16 gradients that overflowed, ``optimizer.step`` lets the scaler skip the update and lower its scale;
    ``step_outcome`` judges the run. A ``log_step`` also measures the layers' gradient norms, the residual scheme and
    nGPT's invariants. ``disk_full``: this process met a full disk since the last step (``StepStats.disk_full``)."""
    accelerator, model = setup.accelerator, setup.model
    sums = torch.zeros(6, device=accelerator.device)  # loss, mlm, nsp, tokens, micro-batches, slots
    residual, design, histograms, step_stats = None, None, {}, {}
    for batch in batches:
        with accelerator.accumulate(model):
            measure_now = log_step and design is None  # the step's first micro-batch, at a log step
            # The step's own forward is measured, except a compiled model's (traced again with the hooks in it).
            hooked = measure_now and not is_compiled_module(model)
            sep = where_token(batch["input_ids"], setup.tokenizer.sep_token_id) if hooked else None
            with measuring(setup.unwrapped, batch["attention_mask"], sep) if hooked else nullcontext() as measured:
                out = model(**batch)
            if measure_now:
                found = measured() if hooked else measured_forward(setup, batch)
                residual, design, histograms = found.residual, found.design, found.histograms
            accelerator.backward(out.loss)
            nsp = out.nsp_loss if out.nsp_loss is not None else 0.0
            parts = (out.loss, out.mlm_loss, nsp, batch["attention_mask"].sum(), 1.0, float(batch["input_ids"].numel()))
            sums += torch.stack([torch.as_tensor(x, device=sums.device).detach().float() for x in parts])
            if not accelerator.sync_gradients:
                continue
            # One all-reduce per step: the losses for logging, the finite check, the stop request and a full disk.
            asked = bool(stop.reason(accelerator.is_main_process))
            flags = torch.tensor([float(asked), float(disk_full)], device=sums.device)
            totals = accelerator.reduce(torch.cat([sums, flags]), reduction="sum")
            finite = bool(torch.isfinite(totals[:3]).all())
            grad_norm, layer_norms, overflow = float("nan"), {}, False
            if finite:
                max_norm = setup.cfg.optim.max_grad_norm
                norm = accelerator.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else float("inf"))
                grad_norm = float(norm) if norm is not None else float("nan")
                finite = math.isfinite(grad_norm) or norm is None
                overflow = not finite and accelerator.scaler is not None
                unwrapped = setup.unwrapped
                if finite and log_step and accelerator.state.deepspeed_plugin is None:  # ZeRO partitions
                    layer_norms = layer_grad_norms(unwrapped, 1 / clip_coefficient(grad_norm, max_norm))
                if finite or overflow:
                    setup.optimizer.step()  # on an overflow the scaler skips the update and lowers its scale
                    setup.scheduler.step()  # the learning rate stays a function of the step number
                    if log_step and (measure_step := unwrapped.config.placement.step_stats):
                        step_stats = measure_step(unwrapped)  # before nGPT re-normalises: how far the step moved
                    unwrapped.after_optimizer_step()  # nGPT: its matrices back onto the sphere
            setup.optimizer.zero_grad(set_to_none=True)
            loss, mlm_loss, nsp_loss, tokens, micro, slots, stops, full = totals.tolist()
            return StepStats(
                loss=loss / micro, mlm_loss=mlm_loss / micro, nsp_loss=nsp_loss / micro, tokens=int(tokens),
                slots=int(slots), finite=finite, overflow=overflow, stop=stops > 0, disk_full=full > 0,
                grad_norm=grad_norm, layer_grad_norms=layer_norms, residual=residual,
                design={**(design or {}), **step_stats}, histograms=histograms,
            )
    raise RuntimeError("the training data ran out")  # batch_iterator loops over epochs forever


def measured_forward(setup: TrainingSetup, batch: dict[str, torch.Tensor]) -> LayerMeasurement:
    """What the layers show, by one extra forward without gradients (a compiled model's log step)."""
    with setup.accelerator.autocast():
        return measure(setup.unwrapped, batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                       setup.tokenizer.sep_token_id)  # fmt: skip


@torch.no_grad()
def evaluate(setup: TrainingSetup) -> dict[str, float]:
    """Validation MLM loss and accuracy (over masked tokens) and NSP accuracy, over all processes; the MLM loss of as
    many training instances, evaluated alike, and the gap between the two (Derf's claim: a lower validation loss from
    better generalization, not a better fit)."""
    setup.model.eval()
    loss_sum, correct, masked, nsp_correct, examples = evaluation_totals(setup, setup.loaders.validation)
    metrics = {VAL_MLM_LOSS: loss_sum / max(masked, 1), "val/mlm_accuracy": correct / max(masked, 1)}
    if setup.cfg.data.objective == "mlm_nsp":
        metrics["val/nsp_accuracy"] = nsp_correct / max(examples, 1)
    if setup.loaders.train_sample is not None:
        fit_sum, _, fit_masked, _, _ = evaluation_totals(setup, setup.loaders.train_sample)
        metrics["val/train_split_mlm_loss"] = fit_sum / max(fit_masked, 1)
        metrics["val/generalization_gap"] = metrics[VAL_MLM_LOSS] - metrics["val/train_split_mlm_loss"]
    setup.model.train()
    return metrics


def evaluation_totals(setup: TrainingSetup, loader: Iterable[dict[str, torch.Tensor]]) -> list[float]:
    """Over ``loader`` and all processes: the masked tokens' summed loss, how many were right, how many there were,
    right NSP answers, examples."""
    accelerator, model = setup.accelerator, setup.model
    totals = torch.zeros(5, dtype=torch.float64, device=accelerator.device)
    for batch in loader:
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
    return totals.tolist()


def save(setup: TrainingSetup, state: TrainState, *, snapshot: bool, checkpoint: bool) -> None:
    """The saves due at this step, once the main process found room for them (else DiskFull). The snapshot first: a kill
    between the two leaves the previous checkpoint, and the resumed run writes the snapshot again."""
    if not (snapshot or checkpoint):
        return
    deepspeed = setup.accelerator.state.deepspeed_plugin is not None
    ensure_room(setup.accelerator,
                lambda: free_space_problem(setup.run_dir, setup.model, checkpoint, snapshot, deepspeed))  # fmt: skip
    if snapshot:
        # The run's id, config and W&B run as well: what pretrain/run_folder/repair.py restores a damaged RUN/ file from.
        info = {"step": state.step, "tokens_seen": state.tokens_seen, "run_name": setup.cfg.train.run_name,
                "norm_placement": setup.cfg.model.norm_placement, "metrics": dict(setup.last_eval),
                "pretrain_config": setup.resolved, "run_id": setup.run_id, "wandb_run": setup.wandb_run}
        path = save_snapshot(setup.accelerator, setup.model, setup.tokenizer, setup.run_dir, info)
        log_snapshot(setup.accelerator, path, state.step)
    if checkpoint:
        save_checkpoint(setup.accelerator, setup.run_dir, state, setup.cfg.train.keep_last_checkpoints)


def ensure_room(accelerator: Accelerator, problem: Callable[[], str]) -> None:
    """DiskFull on every process when the main process's room check (``problem``: a message or "") fails: all stop."""
    found = problem() if accelerator.is_main_process else ""
    full = accelerator.reduce(torch.tensor([float(bool(found))], device=accelerator.device), reduction="sum")
    if full.item() > 0:
        raise DiskFull(found or "disk full at the main process's run directory")


def set_status(accelerator: Accelerator, cfg: PretrainConfig, status: str, step: int, message: str = "",
               diverged_at: int | None = None) -> None:
    """The run's status, on the main process: RUN/status.json and the tracker's summary (the outcome columns)."""
    if accelerator.is_main_process:
        write_status(cfg, status, step, message, diverged_at)
        record_outcome(accelerator, status, step, diverged_at)


def record_stop(accelerator: Accelerator, cfg: PretrainConfig, status: str, step: int, message: str,
                every_process: bool = False) -> None:  # fmt: skip
    """``set_status`` for a run stopping on a full disk, an error or a hang (its watchdog's thread: status hung at the
    last step finished, not an end); a status file that does not fit is reported. ``every_process``: a stop that
    the main process may be unable to record, being the process that froze (a hang, a collective's timeout), is
    written by every process that meets it, over a status of running: an end the main process recorded stands (one
    it writes in the instant between this read and this write is replaced, by a status as true of the run)."""
    try:
        if every_process and not accelerator.is_main_process:
            if layout.read_status(cfg.train.output_dir)["status"] in ("running", "unknown"):
                write_status(cfg, status, step, message)
        else:
            set_status(accelerator, cfg, status, step, message)
    except OSError as err:
        print(f"error: could not record status {status} in {Path(cfg.train.output_dir) / layout.STATUS_FILE}: {err}",
              file=sys.stderr)  # fmt: skip


def start_snapshot_due(setup: TrainingSetup, state: TrainState) -> bool:
    """A snapshot before the first step: at step 0 (train.snapshot_at_start), or on resume when the checkpoint's step
    has a scheduled snapshot that is not complete (the checkpoint holds the same weights)."""
    train_cfg = setup.cfg.train
    if state.step == 0:
        return train_cfg.snapshot_at_start
    last_step = train_cfg.stop_at_step or train_cfg.max_steps
    return snapshot_due(train_cfg, state.step, last_step) and not snapshot_is_complete(snapshot_path(setup, state.step))


def snapshot_path(setup: TrainingSetup, step: int) -> Path:
    return setup.run_dir / layout.SNAPSHOTS / layout.step_dirname(step)


def snapshot_due(train_cfg: TrainConfig, step: int, last_step: int) -> bool:
    """A snapshot is scheduled at ``step`` (the final one only when the run ends at train.max_steps)."""
    on_interval = train_cfg.snapshot_every > 0 and step % train_cfg.snapshot_every == 0
    final = step == last_step == train_cfg.max_steps and train_cfg.snapshot_at_end
    return on_interval or step in train_cfg.snapshot_steps or (step == 0 and train_cfg.snapshot_at_start) or final


VAL_MLM_LOSS = "val/mlm_loss"


def progress_postfix(loss: float | None, lr: float | None, last_eval: dict[str, float]) -> dict[str, str]:
    """The progress bar's postfix: the last logged train loss and lr, and the latest validation MLM loss."""
    shown = {"loss": (loss, ".3f"), "lr": (lr, ".2e"), "val": (last_eval.get(VAL_MLM_LOSS), ".3f")}
    return {name: format(value, spec) for name, (value, spec) in shown.items() if value is not None}


def final_validation(last_eval: dict[str, float]) -> str:
    """The end-of-run summary's validation line ("" before any evaluation)."""
    if last_eval.get(VAL_MLM_LOSS) is None:
        return ""
    accuracy = last_eval.get("val/mlm_accuracy")
    return f"\n  validation   MLM loss {last_eval[VAL_MLM_LOSS]:.4f}" + (
        f", MLM accuracy {accuracy:.4f}" if accuracy is not None else ""
    )


def step_outcome(stats: StepStats, skipped_in_a_row: int, max_skipped_steps: int) -> str:
    """stepped, skipped (an fp16 overflow: routine while the loss scale settles) or diverged (not finite without a loss
    scaler, or more than ``max_skipped_steps`` overflows in a row: the gradients themselves are not finite)."""
    if stats.finite:
        return "stepped"
    if stats.overflow and skipped_in_a_row < max_skipped_steps:
        return "skipped"
    return "diverged"


def divergence_message(stats: StepStats, step: int, skipped_in_a_row: int) -> str:
    what = f"loss or gradient not finite at step {step}"
    if stats.overflow:
        what = (f"the fp16 gradients overflowed in {skipped_in_a_row + 1} steps in a row up to step {step}, more than "
                f"train.max_skipped_steps={skipped_in_a_row}")
    return f"{what} (loss {stats.loss}); the run diverged. No checkpoint or snapshot was written from this state."


def record_divergence(setup: TrainingSetup, state: TrainState, stats: StepStats, skipped_in_a_row: int) -> str:
    """The status and a metrics line of a run that diverged in the step after ``state.step``; returns "diverged"."""
    message = divergence_message(stats, state.step + 1, skipped_in_a_row)
    set_status(setup.accelerator, setup.cfg, "diverged", state.step, message, diverged_at=state.step + 1)
    log_line(setup, state, {"tokens_seen": state.tokens_seen, "diverged": 1}, state.step + 1)
    setup.accelerator.print(f"\n{message}")
    return "diverged"


def run_evaluation(setup: TrainingSetup, state: TrainState) -> None:
    setup.last_eval = evaluate(setup)
    log_line(setup, state, {"tokens_seen": state.tokens_seen, **setup.last_eval}, state.step)


def log_line(setup: TrainingSetup, state: TrainState, metrics: dict[str, Any], step: int,
             file_only: dict[str, Any] | None = None) -> None:  # fmt: skip
    """``metrics`` to the trackers and one line of RUN/metrics.jsonl, counted in the state a checkpoint saves."""
    log_metrics(setup.accelerator, setup.run_dir, metrics, step, file_only=file_only)
    state.metrics_lines += 1


def step_metrics(setup: TrainingSetup, state: TrainState, stats: StepStats, tokens: int, slots: int, seconds: float,
                 skipped: int) -> dict[str, float]:  # fmt: skip
    """One metrics line: the last step's losses and gradient norms, the window's throughput and fp16's skipped steps.
    Prints an alarm the first time in this process a logged value calls for one (a GPAS gate past 1.2)."""
    accelerator = setup.accelerator
    tokens_per_s = tokens / max(seconds, 1e-9)
    peak = setup.peak_flops_per_device * accelerator.num_processes  # 0: MFU not measured
    metrics = {
        "tokens_seen": state.tokens_seen,
        "train/loss": stats.loss,
        "train/mlm_loss": stats.mlm_loss,
        "train/lr": setup.scheduler.get_last_lr()[0],
        "train/grad_norm": stats.grad_norm,
        "train/tokens_per_s": tokens_per_s,
        # Padding included: comparable with benchmarks.train_step, which counts every slot of its batch.
        "train/slot_tokens_per_s": slots / max(seconds, 1e-9),
        "train/mfu": tokens_per_s * setup.flops_per_token / peak if peak > 0 else 0.0,
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
    metrics.update(stats.design)
    alarms = gpas_alarms(stats.design)
    for key in sorted(alarms.keys() - setup.alarmed):
        accelerator.print(f"\nalarm at step {state.step}: {alarms[key]}")
    setup.alarmed.update(alarms)
    return metrics


def train(setup: TrainingSetup, state: TrainState, stop: StopRequest, heartbeat: Heartbeat) -> str:
    """The run from its current step: the step-0 evaluation and the start snapshot, then steps until the last step, a
    divergence or a stop request, ``heartbeat`` beating once a step. Returns finished, diverged or preempted (a full
    disk raises DiskFull). A full disk in a write of the main process alone is told to every process by the next
    step's all-reduce, so that all stop there: raised at once, it would leave the others at their next collective."""
    full: list[DiskFull] = []  # what this process's own writes met (held)
    if state.step == 0:
        with held(full, setup.run_dir):
            run_evaluation(setup, state)
    save(setup, state, snapshot=start_snapshot_due(setup, state), checkpoint=False)
    cfg, accelerator = setup.cfg, setup.accelerator
    progress = tqdm(total=cfg.train.max_steps, initial=state.step, disable=not accelerator.is_local_main_process,
                    desc="pretrain")
    with progress:  # closed on every way out of the loop, an exception included
        train_cfg = cfg.train
        last_step = train_cfg.stop_at_step or train_cfg.max_steps
        batches = batch_iterator(setup, state)
        postfix = progress_postfix(None, None, setup.last_eval)  # a resumed run shows its last validation loss at once
        # Throughput counts the time spent in training steps only (not evaluation or saving).
        window_tokens, window_slots, window_time = 0, 0, 0.0
        skipped_in_a_row, window_skipped = 0, 0
        while state.step < last_step:
            next_step = state.step + 1
            log_now = next_step % train_cfg.log_every == 0 or next_step == last_step
            started = time.perf_counter()
            stats = train_step(setup, batches, stop, log_step=log_now, disk_full=bool(full))
            if stats.disk_full:
                raise full[0] if full else DiskFull(f"disk full on another process. {DISK_FULL_HINT}")
            window_time += time.perf_counter() - started
            outcome = step_outcome(stats, skipped_in_a_row, train_cfg.max_skipped_steps)
            if outcome == "diverged":
                return record_divergence(setup, state, stats, skipped_in_a_row)
            skipped_in_a_row = skipped_in_a_row + 1 if outcome == "skipped" else 0
            window_skipped += outcome == "skipped"
            state.step += 1
            state.tokens_seen += stats.tokens
            window_tokens += stats.tokens
            window_slots += stats.slots
            progress.update(1)
            if log_now:
                metrics = step_metrics(setup, state, stats, window_tokens, window_slots, window_time, window_skipped)
                file_only = residual_matrices(stats.residual) | rounded(stats.histograms)
                with held(full, setup.run_dir):
                    log_line(setup, state, metrics, state.step, file_only=file_only)
                postfix.update(progress_postfix(stats.loss, metrics["train/lr"], setup.last_eval))
                progress.set_postfix(postfix)
                window_tokens, window_slots, window_time, window_skipped = 0, 0, 0.0, 0
            done = state.step == last_step
            preempted = stats.stop and not done
            if (train_cfg.eval_every and state.step % train_cfg.eval_every == 0) or done:
                with held(full, setup.run_dir):
                    run_evaluation(setup, state)
                postfix.update(progress_postfix(None, None, setup.last_eval))
                progress.set_postfix(postfix)
            on_interval = bool(train_cfg.checkpoint_every) and state.step % train_cfg.checkpoint_every == 0
            save(setup, state, snapshot=snapshot_due(train_cfg, state.step, last_step),
                 checkpoint=on_interval or done or preempted)  # fmt: skip
            fault_point("step", state.step)
            if heartbeat.beat(state.step):
                with held(full, setup.run_dir):
                    set_status(accelerator, cfg, "running", state.step)
            if preempted:
                why = stop.reason(accelerator.is_main_process) or "by another process"
                accelerator.print(f"\nstop requested ({why}) at step {state.step}; checkpoint saved")
                break
        if full:  # met at the last step: the others have no collective left to wait at
            raise full[0]
        return "finished" if state.step >= train_cfg.max_steps else "preempted"


@contextmanager
def held(full: list[DiskFull], where: Path) -> Iterator[None]:
    """A write of this process alone: a full disk in it is kept in ``full`` (for the next step's all-reduce) instead
    of raised; any other error is raised."""
    try:
        yield
    except Exception as err:
        if (found := as_disk_full(err, where)) is None:
            raise
        full.append(found)


# Entry point


def decide_at_start(cfg: PretrainConfig, accelerator: Accelerator, tokenizer: Any, same_run: bool) -> dict[str, Any]:
    """What run_config.json holds: ``cfg`` with the values decided now that the tokenizer is known (RESOLVED_AT_START),
    after checking that every process has the vocabulary it trains with."""
    check_one_vocabulary(accelerator, tokenizer)
    vocab_size = cfg.model.vocab_size or len(tokenizer)
    if len(tokenizer) > vocab_size:
        raise ConfigError(f"model.vocab_size={vocab_size} is smaller than the tokenizer's {len(tokenizer)} tokens; "
                          "raise model.vocab_size or set it to null (use the tokenizer's size)")  # fmt: skip
    peak_flops, peak_note = mfu_peak(cfg.train.peak_flops_per_device, accelerator.device, cfg.train.mixed_precision)
    accelerator.print(peak_note)
    resolved = resolved_config(cfg, {"model.vocab_size": vocab_size, "train.peak_flops_per_device": peak_flops})
    # A run continued from its checkpoint must decide the vocabulary it was trained with (a Hub tokenizer can
    # change upstream); one that starts again from step 0 rewrites its run_config.json.
    if same_run:
        check_same_run(Path(cfg.train.output_dir), resolved)
    return resolved


def prepare_training(cfg: PretrainConfig, accelerator: Accelerator, resume_from: Path | None, same_run: bool,
                     argv: list[str] | None) -> tuple[TrainingSetup, TrainState]:  # fmt: skip
    """``same_run``: ``resume_from`` is in this run folder; ``argv``: what the data-preparation hint repeats."""
    run_dir = Path(cfg.train.output_dir)
    set_seed(cfg.train.seed)
    data_cfg, overrides = with_trained_vocabulary(cfg.data, resume_from)
    # The tokenizer is saved during data preparation, before the model's size is known: room for it first.
    ensure_room(accelerator, lambda: room_problem(run_dir, TOKENIZER_ROOM))
    is_main, tokenizer_dir = accelerator.is_main_process, run_dir / layout.TOKENIZER_DIR
    with saving(Path(cfg.data.cache_dir)):
        data = build_pretraining_data(
            data_cfg, seed=cfg.train.seed, model_vocab_size=cfg.model.vocab_size, progress=is_main,
            # A resumed run keeps the tokenizer it saved (never overwritten by a re-trained one).
            save_tokenizer_to=tokenizer_dir if is_main and not same_run else None,
            main_process_first=lambda: main_process_first(accelerator, Path(cfg.data.cache_dir)),
            # Several processes: a large corpus must have been prepared by pretrain/prepare.py (not under a barrier).
            num_processes=accelerator.num_processes, barrier_timeout_s=cfg.train.collective_timeout_s,
            prepare_command=prepare_command(None if argv is None else [*argv, *overrides]),
            # After main_process_first the main process's tokenizer is in the run folder, which every node sees.
            trained_tokenizer=None if is_main else tokenizer_dir,
        )
    resolved = decide_at_start(cfg, accelerator, data.tokenizer, same_run)
    vocab_size, peak_flops = resolved["model"]["vocab_size"], resolved["train"]["peak_flops_per_device"]
    set_seed(cfg.train.seed)  # the same initial weights whatever data preparation drew
    model = build_model(cfg, vocab_size)
    optim, max_steps = cfg.optim, cfg.train.max_steps
    optimizer = build_adamw(model, lr=optim.lr, betas=optim.betas, eps=optim.eps, weight_decay=optim.weight_decay,
                            implementation=resolve_adamw_implementation(optim.implementation, accelerator.device))
    scheduler = get_scheduler(optim.scheduler, optimizer, num_warmup_steps=optim.resolved_warmup_steps(max_steps),
                              num_training_steps=max_steps)
    loaders = build_dataloaders(cfg, data, accelerator.num_processes)
    # One call, as DeepSpeed's engine sizes its batch from the loaders (a None loader comes back as it went).
    prepared = accelerator.prepare(model, optimizer, loaders.train, loaders.validation, loaders.train_sample, scheduler)
    model, optimizer, loaders.train, loaders.validation, loaders.train_sample, scheduler = prepared
    keep_model_names(accelerator)
    unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
    mlm_head_share = cfg.data.mlm_probability if unwrapped.config.sparse_mlm_head else 1.0
    setup = TrainingSetup(
        cfg=cfg, resolved=resolved, accelerator=accelerator, model=model, unwrapped=unwrapped, optimizer=optimizer,
        scheduler=scheduler, loaders=loaders, tokenizer=data.tokenizer, run_dir=run_dir,
        flops_per_token=flops_per_token(unwrapped.config, cfg.data.max_seq_length, mlm_head_share=mlm_head_share),
        peak_flops_per_device=peak_flops,
    )
    state = start_state(cfg, accelerator, resume_from, data_fingerprint(cfg, data.tokenizer, data.instances))
    if accelerator.is_main_process:
        start_run_folder(setup, state, same_run)
    return setup, state


def start_state(cfg: PretrainConfig, accelerator: Accelerator, resume_from: Path | None, fingerprint: str) -> TrainState:
    """Step 0's state, or the checkpoint's (loaded) with this launch's batch split. The data position starts over
    where the data differs. Where this launch's micro-batches (per device x processes) cannot start at it (another
    split after a step that spanned an epoch's end), it goes back to their last start in the epoch: fewer than one
    micro-batch of sequences trained again, in place of the whole epoch."""
    state = TrainState(data_fingerprint=fingerprint)
    if resume_from is not None:
        state = load_checkpoint(accelerator, resume_from)
        per_micro_step = cfg.train.micro_batch_size(accelerator.num_processes)
        if state.data_fingerprint != fingerprint:
            accelerator.print(f"resuming {resume_from} with other data (its settings, or a corpus file changed in "
                              "place: other prepared instances): the data starts over")  # fmt: skip
            state = dataclasses.replace(state, epoch=0, samples_in_epoch=0, data_fingerprint=fingerprint)
        elif extra := state.samples_in_epoch % per_micro_step:
            accelerator.print(f"resuming {resume_from} at sequence {state.samples_in_epoch} of epoch {state.epoch}, "
                              f"where micro-batches of {per_micro_step} sequences cannot start: {extra} sequences "
                              "trained again")  # fmt: skip
            state = dataclasses.replace(state, samples_in_epoch=state.samples_in_epoch - extra)
    return dataclasses.replace(state, global_batch_size=cfg.train.global_batch_size(accelerator.num_processes),
                               num_processes=accelerator.num_processes)  # fmt: skip


def start_run_folder(setup: TrainingSetup, state: TrainState, same_run: bool) -> None:
    """The main process's files of a starting run: the data report, run_config.json, the run id, metrics.jsonl cut back
    to the step it resumes at (a run from step 0, or from another run's checkpoint, keeps no line of an earlier try)
    and its lines counted in ``state``."""
    # What the run trains on, before it starts: a mixture that is not what the weights ask for, or a tiny
    # validation split, is seen now rather than after the run (the same report as pretrain.prepare's).
    report = data_report(setup.cfg, setup.tokenizer)
    if report is not None:
        print(report, flush=True)
    write_json(setup.run_dir / layout.RUN_CONFIG_FILE, stamped(setup.resolved, RUN_FORMAT))
    setup.run_id = ensure_run_id(setup.run_dir)  # once per run: fine-tuning results are keyed by it (run_folder/identity.py)
    resumed_at, logged = (state.step, state.metrics_lines) if same_run else (-1, 0)
    setup.last_eval, state.metrics_lines = rewind_metrics(setup.run_dir, resumed_at, logged)
    if (setup.run_dir / layout.TOKENIZER_DIR).is_dir():
        follow_umask(setup.run_dir / layout.TOKENIZER_DIR)


def pretrain(cfg: PretrainConfig, argv: list[str] | None = None, stop: StopRequest | None = None) -> str:
    """Run one pretraining job described by ``cfg`` (parsed from ``argv``, which the data-preparation hint repeats);
    returns finished, diverged, preempted or "preempted (disk full)". ``stop``: the command's stop request, installed
    at its first line (pretrain/run.py). The one place a full disk is answered: DiskFull from a save, or ENOSPC from
    any other write, stops the run as preempted until there is room."""
    stop = stop or StopRequest()
    resolve_mixed_precision(cfg)
    check_environment(cfg)
    accelerator = build_accelerator(cfg)
    run_dir = Path(cfg.train.output_dir)
    stop.file = run_dir / layout.STOP_FILE
    resume_from = resolve_resume(run_dir, to_dict(cfg), cfg.train.resume, lambda m: say(f"warning: {m}", sys.stderr))
    same_run = resume_from is not None and layout.run_folder_of(resume_from) == run_dir.resolve()
    if resume_from is not None:
        check_continuable(resume_from, same_run, cfg.train.global_batch_size(accelerator.num_processes),
                          accelerator.num_processes, deepspeed=env_flag("ACCELERATE_USE_DEEPSPEED"))  # fmt: skip
    state = TrainState(step=layout.folder_step(resume_from) if resume_from else 0)  # until the checkpoint is loaded
    # A collective: every process has checked the directory before the main one writes.
    if reason := stop_reason(accelerator, stop):
        return stopped_before_training(accelerator, cfg, state.step, reason, stop)
    setup = None
    try:
        setup, state = prepare_training(cfg, accelerator, resume_from, same_run, argv)
        if reason := stop_reason(accelerator, stop):
            return stopped_before_training(accelerator, cfg, state.step, reason, stop)
        outcome = run_training(setup, state, resume_from, stop)
    except BaseException as err:
        full = as_disk_full(err, run_dir) if isinstance(err, Exception) else None
        if full is None and setup is None:  # bad input found while preparing: nothing started, no status
            raise
        message = str(full) if full is not None else failure_message(err, accelerator, cfg)
        frozen_peer = full is None and collective_timeout(err, accelerator)
        record_stop(accelerator, cfg, "failed" if full is None else "preempted", state.step, message, frozen_peer)
        accelerator.end_training()
        if full is not None:
            accelerator.print(f"\nstopped at step {state.step}: {full}")
            return "preempted (disk full)"
        if isinstance(err, Exception):
            raise TrainingFailed(f"training failed at step {state.step}: {message}") from err
        raise
    accelerator.end_training()  # after the final status, which the W&B summary records
    files = {"checkpoints": layout.CHECKPOINTS, "snapshots": layout.SNAPSHOTS, "metrics": layout.METRICS_FILE,
             "status": layout.STATUS_FILE, "tensorboard": layout.TENSORBOARD_DIR, "wandb": layout.WANDB_DIR}
    shown = [name for name in files if name not in ("tensorboard", "wandb") or name == cfg.tracking.backend]
    listing = "".join(f"\n  {name:<12} {run_dir / files[name]}" for name in shown) + final_validation(setup.last_eval)
    accelerator.print(f"\n{outcome} at step {state.step}. Run directory {run_dir}:{listing}")
    return outcome


def stop_reason(accelerator: Accelerator, stop: StopRequest) -> str:
    """Collective: why a process was asked to stop (the main process's reason, else "by another process"), or ""."""
    own = stop.reason(accelerator.is_main_process)
    asked = accelerator.reduce(torch.tensor([float(bool(own))], device=accelerator.device), reduction="sum")
    return (own or "by another process") if asked.item() > 0 else ""


def stopped_before_training(accelerator: Accelerator, cfg: PretrainConfig, step: int, reason: str,
                            stop: StopRequest) -> str:  # fmt: skip
    """A stop requested during start-up: nothing trained since the checkpoint (or step 0), so nothing to save; the
    run ends preempted, as it would at a step boundary (a finished run stays finished)."""
    status = "finished" if step >= cfg.train.max_steps else "preempted"
    message = f"stop requested ({reason}) before training"
    if status == "preempted":
        message += "; continue with --train.resume=auto"
    record_stop(accelerator, cfg, status, step, message)
    if accelerator.is_main_process:
        stop.served()
    accelerator.end_training()
    accelerator.print(f"\n{message}")
    return status


def run_training(setup: TrainingSetup, state: TrainState, resume_from: Path | None, stop: StopRequest) -> str:
    """From the trackers' start to the final status; returns the outcome as ``train`` does."""
    cfg, accelerator = setup.cfg, setup.accelerator
    accelerator.print(
        f"run {cfg.train.run_name}: {cfg.model.variant}, {accelerator.num_processes} process(es), global batch "
        f"{cfg.train.global_batch_size(accelerator.num_processes)}"
        + (f", resuming at step {state.step} from {resume_from}" if resume_from else "")
    )
    if state.step >= cfg.train.max_steps:
        accelerator.print(f"run {cfg.train.run_name} has already finished (step {state.step}); nothing to train")
    setup.wandb_run = init_trackers(accelerator, cfg, setup.resolved, setup.model, resume_from)
    set_status(accelerator, cfg, "running", state.step)
    heartbeat, timeout_s = Heartbeat(step=state.step), cfg.train.hang_timeout_s
    with watchdog(heartbeat, timeout_s, lambda step: hang_message(timeout_s, step),
                  lambda message: record_stop(accelerator, cfg, "hung", heartbeat.step, message, True)):  # fmt: skip
        outcome = train(setup, state, stop, heartbeat)
    final = {"finished": "training finished",
             "preempted": "stopped with a checkpoint; continue with --train.resume=auto"}
    if outcome in final:  # a diverged run has recorded its status
        set_status(accelerator, cfg, outcome, state.step, final[outcome])
    if accelerator.is_main_process:
        stop.served()
    return outcome


def hang_message(timeout_s: float, step: int) -> str:
    return (f"no step finished for {timeout_s:g} s after step {step} (train.hang_timeout_s): stopped as hung; the "
            "same command continues from the last checkpoint")  # fmt: skip


LOST_PEER = ("connection closed by peer", "connection reset by peer", "remote process exited")
"""How gloo and NCCL say that another process of the run has gone (lower case)."""


def failure_message(err: BaseException, accelerator: Accelerator, cfg: PretrainConfig) -> str:
    """What status.json says of an unexpected error. An error of a collective, with several processes: a timeout
    names the key, and another process's end says where that process's own error is."""
    message = f"{type(err).__name__}: {err}"
    if accelerator.num_processes == 1 or not collective_error(err):  # not, e.g., a tracker's lost HTTP connection
        return message
    if collective_timeout(err, accelerator):
        timeout = cfg.train.collective_timeout_s
        message += (f" (no answer from another process within train.collective_timeout_s={timeout} s: a process "
                    "froze or died, or its file system hung)")
    elif any(words in str(err).lower() for words in LOST_PEER):
        message += (" (another process of the run ended first: the launcher's summary at the end of its node's job "
                    "log names it, its exit code and its error)")
    return message


def collective_timeout(err: BaseException, accelerator: Accelerator) -> bool:
    """No answer from another process at a collective, with several processes."""
    timed_out = any(word in str(err).lower() for word in ("timed out", "timeout"))
    return accelerator.num_processes > 1 and collective_error(err) and timed_out


def collective_error(err: BaseException) -> bool:
    """Raised by torch.distributed: its own errors (NCCL's, the store's), or gloo's, RuntimeErrors that name its
    source file."""
    return isinstance(err, getattr(torch.distributed, "DistError", ())) or "/gloo/" in str(err)


def run(cfg: PretrainConfig, argv: list[str], stop: StopRequest) -> None:
    """``pretrain`` with torch's CPU threads chosen first (pretrain/run.py's ``main``, once the options are read)."""
    if accelerate_uses_cpu():
        say(choose_cpu_threads())
        # Accelerate imports DeepSpeed wherever it is installed, which then warns that it found no GPU: say it is none.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # Under torchrun (accelerate launch with several processes), an error is also written to the file the launcher
    # reads: its summary at the end of the job's log then names the process that failed first, with its traceback
    # (only the main process writes status.json, where another process's error shows as a lost connection).
    under_torchrun = bool(os.environ.get("TORCHELASTIC_ERROR_FILE"))
    (record(pretrain) if under_torchrun else pretrain)(cfg, argv, stop)
