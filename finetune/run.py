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
import os
import threading
import time
from collections.abc import Callable, Sequence
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
from finetune.store import Job, JobSpec, ResultStore, run_cli, worker_id
from pretrain.artifacts import SNAPSHOT_INFO, SNAPSHOT_MARKER
from pretrain.manifest import ManifestError, verify_manifest
from pretrain.optim import weight_decay_groups

RUNTIME_FIELDS = ("eval_batch_size", "torch_threads", "device", "progress")


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
    max_attempts: int = 2
    """Tries per job before it stays failed."""
    lease_s: float = 300.0
    """Seconds a claim stays valid without a heartbeat (a dead worker's job is retried after this)."""
    recipe: FinetuneConfig = field(default_factory=FinetuneConfig)
    """The fine-tuning recipe."""

    def __post_init__(self) -> None:
        get_task(self.task)
        validate_grid(self.lrs, self.seeds)
        if self.max_attempts < 1 or self.lease_s <= 0:
            raise ValueError("max_attempts must be >= 1 and lease_s > 0")


# --------------------------------------------------------------------------------------------------
# Model description, optimizer, training, evaluation
# --------------------------------------------------------------------------------------------------


def check_snapshot(path: Path) -> None:
    """A pretraining snapshot is used only when complete (COMPLETE marker) and its files match its manifest."""
    if not (path / SNAPSHOT_MARKER).is_file():
        raise ValueError(
            f"--model {str(path)!r} is a snapshot without its {SNAPSHOT_MARKER} marker: it is still being written, "
            "or its run was killed while writing it (the resumed run writes it again). Use a complete snapshot."
        )
    try:
        verify_manifest(path)
    except ManifestError as err:
        raise ValueError(f"--model {str(path)!r} is a damaged snapshot: {err}") from None


def describe_model(model: str, store: ResultStore) -> dict[str, Any]:
    """Run name, placement, step and content hash of a snapshot folder, or of a Hub model (step -1)."""
    path = Path(model)
    if path.is_dir():
        info_path = path / SNAPSHOT_INFO
        if info_path.is_file():  # a pretraining snapshot (a plain Hugging Face folder has no snapshot.json)
            check_snapshot(path)
        info = json.loads(info_path.read_text()) if info_path.is_file() else {}
        config = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
        run_dir = path.resolve().parent.parent if info else path.resolve()
        return {
            "run_name": str(info.get("run_name", path.resolve().name)),
            "run_dir": str(run_dir),
            "placement": str(info.get("norm_placement", config.get("norm_placement", "post"))),
            "pretrain_step": int(info.get("step", -1)),
            "tokens_seen": info.get("tokens_seen"),
            "model_path": str(path.resolve()),
            "snapshot_hash": store.snapshot_hash(path),
        }
    from transformers import AutoConfig

    if path.exists() or model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise FileNotFoundError(f"--model {model!r}: no such model folder (a Hub name is NAME or ORG/NAME)")
    try:
        config = AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as err:  # offline, unknown name, or a name the Hub rejects
        raise FileNotFoundError(
            f"--model {model!r} is neither a model folder nor a model found on the Hugging Face Hub: "
            f"{str(err).splitlines()[0]}"
        ) from None
    # Hugging Face BERT is Post-LN; an lnbert model on the Hub says so in its config.
    placement = getattr(config, "norm_placement", "post" if config.model_type == "bert" else config.model_type)
    return {
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
# Jobs: claim from the store, run with a heartbeat, record
# --------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class WorkerSettings:
    """How a worker process runs claimed jobs (not part of a job's identity)."""

    store: str
    lease_s: float
    max_attempts: int
    runtime: dict[str, Any]
    """The recipe's runtime fields (threads, device, progress, eval batch size) for this worker."""
    exit_with_parent: bool = False
    """Pool workers stop when the scheduler that started them dies (its lease-holding jobs then expire)."""


def _heartbeat(settings: WorkerSettings, job: Job, worker: str, stop: threading.Event, parent: int) -> None:
    """Keep the job's lease alive from a thread with its own connection (sqlite connections are per thread)."""
    store = ResultStore(settings.store)
    try:
        while not stop.wait(settings.lease_s / 4):
            if settings.exit_with_parent and os.getppid() != parent:
                os._exit(1)  # the scheduler died: stop at once; the expired lease hands the job to another worker
            store.heartbeat(job.id, worker, settings.lease_s)
    finally:
        store.close()


def execute(job: Job, store: ResultStore, settings: WorkerSettings, cache: DataCache, worker: str) -> bool:
    """Run one claimed job; record its results or its error. True if it completed."""
    spec = job.spec
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(settings, job, worker, stop, os.getppid()), daemon=True)
    beat.start()
    try:
        recipe = FinetuneConfig(**spec.recipe, **settings.runtime)
        data = cache.get(spec.model_path, spec.task, spec.data_dir, recipe)
        results = finetune(spec.model_path, spec.task, data, spec.lr, spec.seed, recipe)
    except Exception as err:  # recorded in the store and retried; the worker goes on with other jobs
        stop.set()
        beat.join()
        store.fail(job.id, worker, f"{type(err).__name__}: {err}")
        print(f"[{worker}] job {job.id} failed (attempt {job.attempt}): {type(err).__name__}: {err}", flush=True)
        return False
    stop.set()
    beat.join()
    return store.complete(job.id, worker, results)


def work(settings: WorkerSettings, only_ids: Sequence[int] | None = None) -> int:
    """Claim and run jobs until none is left to claim; returns how many this worker completed."""
    worker = worker_id()
    cache = DataCache()
    completed = 0
    with ResultStore(settings.store) as store:
        while (job := store.claim(worker, settings.lease_s, settings.max_attempts, only_ids)) is not None:
            completed += execute(job, store, settings, cache, worker)
    return completed


def job_specs(
    description: dict[str, Any],
    task: str,
    lrs: Sequence[float],
    seeds: Sequence[int],
    recipe: FinetuneConfig,
    data_dir: str | None,
) -> list[JobSpec]:
    """One job per (lr, seed) for a described model and a task."""
    return [
        JobSpec(**description, task=task, lr=float(lr), seed=int(seed), recipe=recipe.result_key(), data_dir=data_dir)
        for lr in lrs
        for seed in seeds
    ]


def run(config: RunConfig) -> list[dict[str, Any]]:
    """Enqueue the grid for one model and task, run what is not done, and return the grid's rows."""
    data_dir = str(Path(config.data_dir).resolve()) if config.data_dir else None
    if data_dir is not None:
        load_task(config.task, data_dir)  # fail now, on the user's input, rather than inside every job
    with ResultStore(config.store) as store:
        specs = job_specs(
            describe_model(config.model, store), config.task, config.lrs, config.seeds, config.recipe, data_dir
        )
        ids, added = store.enqueue(specs)
    print(
        f"{len(ids)} jobs for {config.model} on {config.task}: {added} new, {len(ids) - added} already in {config.store}"
    )
    runtime = {k: getattr(config.recipe, k) for k in RUNTIME_FIELDS}
    work(
        WorkerSettings(store=config.store, lease_s=config.lease_s, max_attempts=config.max_attempts, runtime=runtime),
        ids,
    )
    with ResultStore(config.store) as store:
        rows = [r for r in store.rows() if r["id"] in set(ids)]
    return rows


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
