"""Fine-tune one model on one GLUE task (MRPC or RTE) over a grid of learning rates and seeds.

    python -m finetune.run --model runs/pre_ln/snapshots/step_00010000 --task mrpc --data-dir path/to/glue
    python -m finetune.run --model bert-base-uncased --task rte            # a Hub model, GLUE from the Hub
    python -m finetune.run --config configs/finetune/bert_glue.yaml --model ... --lrs 2e-5 --seeds 0,1

The model is any folder written by pretraining (``snapshots/step_*``; ``import pretrain`` registers the
``lnbert`` Auto classes) or any BERT-like model that ``AutoModelForSequenceClassification`` opens. Each
(lr, seed) is one job in the results store (``--store``): a job already done is skipped, so the command can
be re-run after an interruption. The recipe is original BERT's (batch 32, 3 epochs, 10% linear warm-up then
linear decay, max length 128, AdamW with weight decay 0.01 except on biases and norms), evaluated on dev.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

import pretrain  # noqa: F401  (registers the "lnbert" model type with the Auto classes)
from finetune.config import DEFAULT_LRS, DEFAULT_SEEDS, FinetuneConfig, parse_config, validate_grid
from finetune.glue import Example, batches, compute_metrics, encode, get_task, load_task
from finetune.manifest import ResultsFolder
from finetune.store import ResultStore, run_cli
from pretrain.artifacts import SNAPSHOT_INFO
from pretrain.identity import read_run_id
from pretrain.optim import weight_decay_groups


@dataclass(kw_only=True)
class RunConfig:
    """Fine-tune one model on one GLUE task over a grid of learning rates and seeds; results go to the store."""

    model: str
    """A snapshot folder written by pretraining (RUN/snapshots/step_*) or a model name on the Hugging Face Hub."""
    task: str = "mrpc"
    """GLUE task: mrpc or rte."""
    data_dir: str | None = None
    """Folder in the original GLUE layout (MRPC/train.tsv, RTE/dev.tsv, ...); unset: nyu-mll/glue from the Hub."""
    lrs: list[float] = field(default_factory=lambda: list(DEFAULT_LRS))
    """Peak learning rates to try (one job each per seed)."""
    seeds: list[int] = field(default_factory=lambda: list(DEFAULT_SEEDS))
    """Random seeds (classifier init, dropout, data order); the paper uses 6 per point."""
    store: str = "outputs/finetune/results.sqlite"
    """Results store (SQLite file), shared with the scheduler and read by the report."""
    results_dir: str | None = None
    """Folder of manifests and result files; unset: beside the store, STORE_STEM.d/ (as finetune.schedule)."""
    max_attempts: int = 2
    """Tries per job before it stays failed."""
    retry_failed: bool = False
    """Try again the jobs of this grid that failed every attempt (after fixing the cause)."""
    recipe: FinetuneConfig = field(default_factory=FinetuneConfig)
    """The fine-tuning recipe."""

    def __post_init__(self) -> None:
        get_task(self.task)
        validate_grid(self.lrs, self.seeds)
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts={self.max_attempts} must be >= 1")


# --------------------------------------------------------------------------------------------------
# Model description, optimizer, training, evaluation
# --------------------------------------------------------------------------------------------------


def describe_model(model: str, store: ResultStore) -> dict[str, Any]:
    """Run name, placement, step and content hash of a snapshot folder, or of a Hub model (step -1)."""
    path = Path(model)
    if path.is_dir():
        info_path = path / SNAPSHOT_INFO
        info = json.loads(info_path.read_text()) if info_path.is_file() else {}
        config = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
        run_dir = path.resolve().parent.parent if info else path.resolve()
        snapshot_hash = store.snapshot_hash(path)
        # A snapshot belongs to its run; a loose model folder (or a snapshot copied out of its run) is its own
        # "run", named by its content.
        try:
            run_id = read_run_id(run_dir) if info else f"model-{snapshot_hash}"
        except FileNotFoundError:
            run_id = f"model-{snapshot_hash}"
        return {
            "run_id": run_id,
            "run_name": str(info.get("run_name", path.resolve().name)),
            "run_dir": str(run_dir),
            "placement": str(info.get("norm_placement", config.get("norm_placement", "post"))),
            "pretrain_step": int(info.get("step", -1)),
            "tokens_seen": info.get("tokens_seen"),
            "model_path": str(path.resolve()),
            "snapshot_hash": snapshot_hash,
        }
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    # Hugging Face BERT is Post-LN; an lnbert model on the Hub says so in its config.
    placement = getattr(config, "norm_placement", "post" if config.model_type == "bert" else config.model_type)
    return {
        "run_id": f"hub-{model}",
        "run_name": model,
        "run_dir": model,
        "placement": placement,
        "pretrain_step": -1,
        "tokens_seen": None,
        "model_path": model,
        "snapshot_hash": f"hub:{model}",
    }


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("recipe.device=cuda but no CUDA device is available; use recipe.device=auto or cpu")
    return torch.device("cuda" if name == "cuda" or (name == "auto" and torch.cuda.is_available()) else "cpu")


def make_optimizer(model: nn.Module, recipe: FinetuneConfig, lr: float) -> torch.optim.AdamW:
    """AdamW; weight decay on every weight except biases and the parameters of normalisation layers."""
    groups = weight_decay_groups(model, recipe.weight_decay)
    # The fused kernel (CPU and CUDA) is the fastest; it agrees with the for-loop one to rounding.
    return torch.optim.AdamW(
        groups, lr=lr, betas=(recipe.adam_beta1, recipe.adam_beta2), eps=recipe.adam_eps, fused=True
    )


def autocast(device: torch.device, mixed_precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast of the forward pass, or nothing in fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=mixed_precision == "bf16")


def train_step(
    model: nn.Module,
    batch: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    recipe: FinetuneConfig,
    device: torch.device,
) -> torch.Tensor:
    """One optimizer step on one batch (the learning-rate schedule is the caller's); returns the loss."""
    batch = {k: v.to(device) for k, v in batch.items()}
    with autocast(device, recipe.mixed_precision):
        loss = model(**batch).loss
    loss.backward()
    if recipe.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def linear_warmup_decay(warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """LR multiplier: linear from 0 to 1 over warm-up, then linear to 0 at the last step (BERT)."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return factor


@torch.no_grad()
def evaluate(
    model: nn.Module,
    features: list[dict[str, Any]],
    batch_size: int,
    pad_id: int,
    device: torch.device,
    mixed_precision: str = "no",
) -> dict[str, Any]:
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
    return {
        "dev_loss": losses / len(features),
        "labels": np.concatenate(labels),
        "predictions": np.concatenate(predictions),
    }


@dataclass
class TaskData:
    """A task's examples tokenized for one tokenizer (kept across the jobs of one snapshot)."""

    train: list[dict[str, Any]]
    dev: list[dict[str, Any]]
    pad_id: int


class DataCache:
    """Loaded tasks and tokenized features, reused while a worker runs jobs of the same snapshot."""

    def __init__(self) -> None:
        self.tasks: dict[tuple[str, str | None], dict[str, list[Example]]] = {}
        self.features: dict[tuple[Any, ...], TaskData] = {}

    def get(self, model_path: str, task: str, data_dir: str | None, recipe: FinetuneConfig) -> TaskData:
        from transformers import AutoTokenizer

        key = (model_path, task, data_dir, recipe.max_length, recipe.max_train_examples, recipe.max_eval_examples)
        if key not in self.features:
            if (task, data_dir) not in self.tasks:
                self.tasks[(task, data_dir)] = load_task(task, data_dir)
            splits = self.tasks[(task, data_dir)]
            tokenizer = AutoTokenizer.from_pretrained(model_path)
            if tokenizer.pad_token_id is None:
                raise ValueError(f"the tokenizer of {model_path} has no padding token; save one with the model")
            self.features.clear()  # one snapshot at a time: tokenized features are cheap to rebuild
            self.features[key] = TaskData(
                train=encode(tokenizer, splits["train"][: recipe.max_train_examples], recipe.max_length),
                dev=encode(tokenizer, splits["dev"][: recipe.max_eval_examples], recipe.max_length),
                pad_id=tokenizer.pad_token_id,
            )
        return self.features[key]


def finetune(
    model_path: str, task: str, data: TaskData, lr: float, seed: int, recipe: FinetuneConfig
) -> dict[str, Any]:
    """Train a classifier from ``model_path`` on ``data.train`` and score it on ``data.dev``."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, set_seed
    from transformers.utils import logging as hf_logging

    start = time.perf_counter()
    if recipe.torch_threads:
        torch.set_num_threads(recipe.torch_threads)
    device = resolve_device(recipe.device)
    set_seed(seed)  # python, numpy, torch: the classifier's init and dropout
    # The load report lists the pretraining heads as unused and the classifier as new: expected here, and
    # an lnbert snapshot of another placement still fails loudly (LNBertPreTrainedModel.from_pretrained).
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        if recipe.random_init:
            config = AutoConfig.from_pretrained(model_path, num_labels=2)
            model = AutoModelForSequenceClassification.from_config(config).to(device)
        else:
            model = AutoModelForSequenceClassification.from_pretrained(model_path, num_labels=2).to(device)
    finally:
        hf_logging.set_verbosity(verbosity)
    optimizer = make_optimizer(model, recipe, lr)
    steps_per_epoch = math.ceil(len(data.train) / recipe.batch_size)
    total_steps = steps_per_epoch * recipe.epochs
    warmup_steps = int(recipe.warmup_ratio * total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_warmup_decay(warmup_steps, total_steps))
    order = torch.Generator().manual_seed(seed)  # data order, independent of the model's RNG use
    bar = tqdm(total=total_steps, desc=f"{task} lr={lr:g} seed={seed}", disable=not recipe.progress, leave=False)
    epoch_loss = 0.0
    for _ in range(recipe.epochs):
        model.train()
        epoch_loss = 0.0
        for batch in batches(data.train, recipe.batch_size, data.pad_id, generator=order):
            loss = train_step(model, batch, optimizer, recipe, device)
            scheduler.step()
            epoch_loss += loss.item()
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.3f}")
    bar.close()
    result = evaluate(model, data.dev, recipe.eval_batch_size, data.pad_id, device, recipe.mixed_precision)
    metrics = compute_metrics(get_task(task), result["labels"], result["predictions"])
    return {
        **metrics,
        "dev_loss": result["dev_loss"],
        "train_loss": epoch_loss / steps_per_epoch,  # mean over the last epoch
        "epochs": recipe.epochs,
        "train_steps": total_steps,
        "wall_time_s": time.perf_counter() - start,
    }


# --------------------------------------------------------------------------------------------------
# Jobs: through a manifest and result files, in this process (the scheduler's path with one worker)
# --------------------------------------------------------------------------------------------------


def run(config: RunConfig) -> list[dict[str, Any]]:
    """Queue the grid for one model and task, run what is not done, and return the grid's rows."""
    from finetune.backends import InProcess
    from finetune.schedule import RUNTIME_FIELDS, collect, job_specs, results_dir, submit

    data_dir = str(Path(config.data_dir).resolve()) if config.data_dir else None
    if data_dir is not None:
        load_task(config.task, data_dir)  # fail now, on the user's input, rather than inside every job
    folder = ResultsFolder(results_dir(config.store, config.results_dir))
    runtime = {"data_dir": data_dir, "recipe": {k: getattr(config.recipe, k) for k in RUNTIME_FIELDS}}
    with ResultStore(config.store) as store:
        specs = job_specs(describe_model(config.model, store), config.task, config.lrs, config.seeds, config.recipe)
        added = store.enqueue(specs)
        backend = InProcess()
        collect(store, folder, backend)  # results written since, and the jobs of an earlier run that was killed
        if config.retry_failed:
            store.retry_failed()
        keys = {spec.key for spec in specs}
        print(f"{len(specs)} jobs for {config.model} on {config.task}: {added} new, in {config.store}")
        # The store may hold other work (a scheduler's): this command runs only its own grid.
        while submit(store, folder, backend, runtime, config.max_attempts, only=keys):
            collect(store, folder, backend)
        return [r for r in store.rows() if r["key"] in keys]


def summarize(rows: list[dict[str, Any]]) -> str:
    """Mean and standard deviation over seeds, per learning rate."""
    lines = ["lr        seeds  accuracy        f1              status"]
    for lr in sorted({r["lr"] for r in rows}):
        group = [r for r in rows if r["lr"] == lr]
        done = [r for r in group if r["status"] == "done"]
        stats = []
        for key in ("accuracy", "f1"):
            values = [r[key] for r in done if r[key] is not None]
            stats.append(f"{np.mean(values):.4f}±{np.std(values):.4f}" if values else "-")
        statuses = ", ".join(
            f"{s} {sum(r['status'] == s for r in group)}" for s in sorted({r["status"] for r in group})
        )
        lines.append(f"{lr:<9g} {len(done):<6d} {stats[0]:<15} {stats[1]:<15} {statuses}")
    errors = {r["error"] for r in rows if r["status"] == "failed"}
    lines += [f"error: {e}" for e in sorted(errors)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    config = parse_config(RunConfig, argv, prog="python -m finetune.run", description=__doc__)
    rows = run(config)
    print(summarize(rows))
    return 0 if all(r["status"] == "done" for r in rows) else 1


def cli() -> int:
    """``main`` for the command line: bad input ends with its message and exit code 2, not a traceback."""
    return run_cli(main)


if __name__ == "__main__":
    raise SystemExit(cli())
