"""Fine-tuning one job: a classifier trained from a model on one GLUE task with one (lr, seed), scored on dev.

The recipe is original BERT's (batch 32, 3 epochs, 10% linear warm-up then linear decay, max length 128, AdamW
with weight decay 0.01 except on biases and norms); ``finetune`` is what a worker runs for each job.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from tqdm.auto import tqdm
from transformers import get_scheduler

from finetune.config import FinetuneConfig
from finetune.glue import Example, baseline_metrics, batches, compute_metrics, encode, get_task, load_task
from finetune.manifest import Results
from pretrain.common.device import pick_device
from pretrain.common.hardware import cpu_bf16_warning, device_name
from pretrain.modeling import CheckpointMismatch, LNBertPreTrainedModel  # and registers "lnbert" with the Auto classes
from pretrain.optim import build_adamw
from pretrain.run_folder.status import fault_point


@functools.cache  # once per process: a worker runs many jobs
def warn_emulated_bf16(device: torch.device, mixed_precision: str) -> None:
    """Say, before the first job's work, that bf16 autocast on this CPU is emulated (several times slower)."""
    if device.type != "cpu" or mixed_precision != "bf16":
        return
    if warning := cpu_bf16_warning("--recipe.mixed_precision=no"):
        print(f"warning: {warning}", file=sys.stderr, flush=True)


def make_optimizer(model: nn.Module, recipe: FinetuneConfig, lr: float) -> torch.optim.AdamW:
    """The recipe's AdamW (build_adamw's fused kernel: the fastest on CPU and CUDA) at peak learning rate ``lr``."""
    betas = (recipe.adam_beta1, recipe.adam_beta2)
    return build_adamw(model, lr=lr, betas=betas, eps=recipe.adam_eps, weight_decay=recipe.weight_decay)


def make_scheduler(optimizer: Optimizer, recipe: FinetuneConfig, total_steps: int) -> LRScheduler:
    """BERT's schedule, as pretraining's: linear from 0 over the first ``warmup_ratio`` of the steps, then to 0."""
    warmup_steps = int(recipe.warmup_ratio * total_steps)
    return get_scheduler("linear", optimizer, num_warmup_steps=warmup_steps, num_training_steps=total_steps)


def autocast(device: torch.device, mixed_precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast of the forward pass, or nothing in fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=mixed_precision == "bf16")


def train_step(model: nn.Module, batch: dict[str, torch.Tensor], optimizer: Optimizer, recipe: FinetuneConfig,
               device: torch.device) -> torch.Tensor:  # fmt: skip
    """One optimizer step on one batch (the learning-rate schedule is the caller's); returns the loss."""
    batch = {k: v.to(device) for k, v in batch.items()}
    with autocast(device, recipe.mixed_precision):
        loss = model(**batch).loss
    loss.backward()
    if recipe.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
    optimizer.step()
    if isinstance(model, LNBertPreTrainedModel):  # any Hugging Face classifier fine-tunes here too
        model.after_optimizer_step()  # nGPT's weights back on the unit sphere; nothing for the other placements
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


@torch.no_grad()
def evaluate(model: nn.Module, features: list[dict[str, Any]], batch_size: int, pad_id: int, device: torch.device,
             mixed_precision: str = "no") -> dict[str, Any]:  # fmt: skip
    """Dev loss, labels and predictions (in file order)."""
    model.eval()
    losses, labels, predictions = 0.0, [], []
    for batch in batches(features, batch_size, pad_id):
        batch = {k: v.to(device) for k, v in batch.items()}
        with autocast(device, mixed_precision):
            logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits.float()
        losses += F.cross_entropy(logits, batch["labels"], reduction="sum").item()
        labels.append(batch["labels"].cpu().numpy())
        predictions.append(logits.argmax(-1).cpu().numpy())
    return {"dev_loss": losses / len(features), "labels": np.concatenate(labels),
            "predictions": np.concatenate(predictions)}  # fmt: skip


@dataclass
class TaskData:
    """A task's examples tokenized for one tokenizer (kept across the jobs of one snapshot)."""

    train: list[dict[str, Any]]
    dev: list[dict[str, Any]]
    pad_id: int


class DataCache:
    """Loaded tasks, and the tokenized features of one snapshot, reused while a worker runs its jobs."""

    def __init__(self) -> None:
        self.load_task = functools.cache(load_task)  # each task's files read once
        self.key: tuple[Any, ...] | None = None
        self.data: TaskData | None = None

    def get(self, model_path: str, task: str, data_dir: str | None, recipe: FinetuneConfig) -> TaskData:
        key = (model_path, task, data_dir, recipe.max_length, recipe.max_train_examples, recipe.max_eval_examples)
        if self.data is None or key != self.key:  # one snapshot at a time: tokenized features are cheap to rebuild
            splits = self.load_task(task, data_dir)
            tokenizer = load_tokenizer(model_path, splits["dev"])
            self.key, self.data = key, TaskData(
                train=encode(tokenizer, splits["train"][: recipe.max_train_examples], recipe.max_length),
                dev=encode(tokenizer, splits["dev"][: recipe.max_eval_examples], recipe.max_length),
                pad_id=tokenizer.pad_token_id,
            )
        return self.data


UNKNOWN_SHARE = 0.5
"""More of a task's words read as the unknown token than this: the tokenizer is not the model's."""


def load_tokenizer(model_path: str, examples: list[Example]) -> Any:
    """The model folder's tokenizer, refused where it cannot serve the model on ``examples`` (CheckpointMismatch,
    naming the fix: no retry changes it while the files stay as they are): no padding token, more tokens than the
    model has embeddings, or most of the text read as unknown (a folder without tokenizer files, where transformers
    builds a tokenizer of the special tokens alone)."""
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    name, fix = f"the tokenizer of {model_path}", "save the tokenizer the model was trained with beside it"
    if tokenizer.pad_token_id is None:
        raise CheckpointMismatch(f"{name} has no padding token: {fix}")
    if len(tokenizer) > (embeddings := AutoConfig.from_pretrained(model_path).vocab_size):
        raise CheckpointMismatch(f"{name} has {len(tokenizer)} tokens, more than the model's {embeddings} embeddings "
                                 f"(config.json vocab_size): {fix}")  # fmt: skip
    texts = [text for e in examples[:200] for text in (e.text_a, e.text_b) if text]
    ids = [i for row in tokenizer(texts, add_special_tokens=False)["input_ids"] for i in row]
    unknown = sum(i == tokenizer.unk_token_id for i in ids) / max(len(ids), 1)
    if unknown > UNKNOWN_SHARE:
        raise CheckpointMismatch(f"{name} ({len(tokenizer)} tokens) reads {unknown:.0%} of the task's text as "
                                 f"{tokenizer.unk_token}: the folder lacks the model's tokenizer files (tokenizer.json "
                                 f"or vocab.txt); {fix}")  # fmt: skip
    return tokenizer


def load_classifier(model_path: str, random_init: bool = False) -> nn.Module:
    """The model of a job as a two-class ``AutoModelForSequenceClassification``, in float32 whatever the checkpoint
    stores (transformers 5 loads the saved dtype: in bf16 most updates at lr 3e-5 round away; the recipe's autocast
    decides the compute dtype). A checkpoint that leaves part of the encoder as initialized, or holds encoder weights
    the model does not use (another architecture or depth, weight names changed), is refused, CheckpointMismatch:
    Hugging Face models load it with a warning, and the jobs would fine-tune a random or truncated encoder. The pooler
    and the heads may be new, or of another shape (a classifier of another task: a new one replaces it)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    # The load report (pretraining heads unused, the classifier new) is expected here, and the "Loading weights"
    # bar of every job would interleave with the scheduler's lines.
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        if random_init:
            config = AutoConfig.from_pretrained(model_path, num_labels=2)
            return AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
        # A classifier of another task (3 labels, MNLI's) is replaced by a new one; other mismatches are refused below.
        model, info = AutoModelForSequenceClassification.from_pretrained(
            model_path, num_labels=2, dtype=torch.float32, output_loading_info=True, ignore_mismatched_sizes=True
        )
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    base = f"{model.base_model_prefix}."
    missing, unused, mismatched = (
        sorted(name for k in info[kind] if (name := k[0] if isinstance(k, tuple) else k).startswith(base)
               and not name.startswith(f"{base}pooler."))  # mismatched keys are (name, shapes)
        for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")
    )  # fmt: skip
    if missing or unused or mismatched:
        raise CheckpointMismatch(f"the checkpoint of {model_path} does not fit the encoder of its config.json: "
                                 f"{len(missing)} weights missing {missing[:3]}, {len(unused)} unused {unused[:3]}, "
                                 f"{len(mismatched)} of another shape {mismatched[:3]}: its weights are of another "
                                 "architecture or size, or their names were changed; restore it from a copy.")  # fmt: skip
    return model


def finetune(model_path: str, task: str, data: TaskData, lr: float, seed: int, recipe: FinetuneConfig,
             on_step: Callable[[int, float, float], None] | None = None) -> Results:  # fmt: skip
    """Train a classifier from ``model_path`` on ``data.train`` and score it on ``data.dev``; ``on_step(step,
    loss, lr)`` is called after every optimizer step (the W&B job run's training curve)."""
    from transformers import set_seed

    start = time.perf_counter()
    if recipe.torch_threads:
        torch.set_num_threads(recipe.torch_threads)
    device = pick_device(recipe.device, flag="recipe.device")
    warn_emulated_bf16(device, recipe.mixed_precision)
    set_seed(seed)  # python, numpy, torch: the classifier's init and dropout
    model = load_classifier(model_path, recipe.random_init).to(device)
    recipe.check_fits(getattr(model.config, "max_position_embeddings", None), model_path)
    optimizer = make_optimizer(model, recipe, lr)
    steps_per_epoch = math.ceil(len(data.train) / recipe.batch_size)
    total_steps = steps_per_epoch * recipe.epochs
    scheduler = make_scheduler(optimizer, recipe, total_steps)
    order = torch.Generator().manual_seed(seed)  # data order, independent of the model's RNG use
    bar = tqdm(total=total_steps, desc=f"{task} lr={lr:g} seed={seed}", disable=not recipe.progress, leave=False)
    epoch_loss, step = 0.0, 0
    for _ in range(recipe.epochs):
        model.train()
        epoch_loss = 0.0
        for batch in batches(data.train, recipe.batch_size, data.pad_id, generator=order):
            loss = train_step(model, batch, optimizer, recipe, device).item()
            lr_used = scheduler.get_last_lr()[0]
            scheduler.step()
            epoch_loss += loss
            step += 1
            fault_point("finetune_step", step)
            if on_step is not None:
                on_step(step, loss, lr_used)
            bar.update()
            bar.set_postfix(loss=f"{loss:.3f}")
    bar.close()
    result = evaluate(model, data.dev, recipe.eval_batch_size, data.pad_id, device, recipe.mixed_precision)
    scored = get_task(task), result["labels"], result["predictions"]
    return Results(**compute_metrics(*scored), **baseline_metrics(*scored), dev_loss=result["dev_loss"],
                   train_loss=epoch_loss / steps_per_epoch, epochs=recipe.epochs, train_steps=total_steps,
                   wall_time_s=time.perf_counter() - start, device=device_name(device))  # fmt: skip
