"""Fine-tuning throughput (examples/s) on a GLUE task, our classifier against Hugging Face's, interleaved.

    python -m benchmarks.finetune_throughput --data_dir=PATH/TO/glue              # random-init small model
    python -m benchmarks.finetune_throughput --data_dir=PATH/TO/glue --model=runs/x/snapshots/step_00010000

One training step is ``finetune.train.train_step`` on a batch padded as in fine-tuning (``finetune.glue.batches``):
forward (bf16 autocast in the bf16 rows), backward, gradient clipping, fused AdamW with its weight-decay groups
(``finetune.train.make_optimizer``). Our ``LNBertForSequenceClassification`` and Hugging Face
``BertForSequenceClassification`` (same shape; same weights when the model is Post-LN) take turns on the same
batches; the median over ``--reps`` is reported, with the noise. Without ``--model``, a random-init model of
``--shape`` with a WordPiece tokenizer trained on the task's training sentences (throughput does not depend on the
weights).
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass, field
from itertools import cycle, islice
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from benchmarks.common import command, machine_info, paired_speedup, spread, start_device, timed_with_cpu, write_results
from benchmarks.train_step import SHAPES, Precision, ShapeName, hf_config_kwargs
from finetune.config import FinetuneConfig
from finetune.glue import batches, encode, load_task
from finetune.train import make_optimizer, train_step
from pretrain.common.cli import parse, require
from pretrain.common.reporting import format_table
from pretrain.data.tokenizer import train_wordpiece_tokenizer
from pretrain.modeling import LNBertConfig, LNBertForSequenceClassification


@dataclass(kw_only=True)
class FinetuneThroughputConfig:
    """Fine-tuning throughput of our classifier against Hugging Face's (see the module docstring)."""

    data_dir: str
    """GLUE folder holding MRPC/ and RTE/ (the original download layout)."""
    task: str = "mrpc"
    """GLUE task (mrpc or rte)."""
    model: str | None = None
    """Snapshot folder (save_pretrained + tokenizer); null: a random-init model of shape."""
    shape: ShapeName = "small"
    """Model shape without model."""
    batch: int = 32
    """Training batch (BERT's GLUE recipe: 32)."""
    precisions: list[Precision] = field(default_factory=lambda: ["fp32", "bf16"])
    """fp32 and/or bf16 (autocast)."""
    reps: int = 5
    """Timed steps per model (interleaved)."""
    warmup: int = 1
    """Untimed steps per model first."""
    no_hf: bool = False
    """Time our model only."""
    device: str = "auto"
    """auto (CUDA when available), cpu or cuda."""
    threads: int | None = None
    """torch.set_num_threads (CPU); 1 gives steady CPU-time ratios; null: torch's choice."""
    seed: int = 0
    """Seed of the models and the batch order."""
    out: str | None = None
    """JSON path; null: benchmarks/results/finetune_throughput-<time>.json."""

    def __post_init__(self) -> None:
        require(self.reps >= 1 and self.batch >= 1, "reps/batch", "must be >= 1")
        require(self.warmup >= 0, "warmup", "must be >= 0")
        require(bool(self.precisions), "precisions", "must not be empty")
        require(self.threads is None or self.threads >= 1, "threads", "must be >= 1 or null")


def task_tokenizer(splits: dict[str, list], folder: Path) -> Any:
    """WordPiece trained on the task's training sentences, saved and reopened as AutoTokenizer would."""
    texts = [t for e in splits["train"] for t in (e.text_a, e.text_b) if t]
    train_wordpiece_tokenizer(texts, vocab_size=30522).save_pretrained(folder)
    return AutoTokenizer.from_pretrained(str(folder))


def build_models(args: FinetuneThroughputConfig, vocab_size: int) -> dict[str, nn.Module]:
    """Ours (from --model or random) and, unless --no-hf, Hugging Face's with the same shape (and Post-LN weights)."""
    torch.manual_seed(args.seed)
    if args.model:
        ours = LNBertForSequenceClassification.from_pretrained(args.model, num_labels=2)
    else:
        config = LNBertConfig(**hf_config_kwargs(dict(SHAPES[args.shape], vocab=vocab_size)), num_labels=2)
        ours = LNBertForSequenceClassification(config)
    models: dict[str, nn.Module] = {"ours": ours}
    if not args.no_hf:
        keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "type_vocab_size")  # fmt: skip
        hf = BertForSequenceClassification(BertConfig(**{k: getattr(ours.config, k) for k in keys}, num_labels=2))
        if hf.state_dict().keys() == ours.state_dict().keys():  # Post-LN's parameters: the same weights
            hf.load_state_dict(ours.state_dict(), strict=True)
        models["hf"] = hf
    return models


def time_training(models: dict[str, nn.Module], features: list[dict], pad_id: int, args: FinetuneThroughputConfig,
                  precision: str, device: torch.device) -> dict[str, Any]:  # fmt: skip
    recipe = FinetuneConfig(batch_size=args.batch, mixed_precision="bf16" if precision == "bf16" else "no")
    optimizers = {name: make_optimizer(model.to(device).train(), recipe, lr=2e-5) for name, model in models.items()}

    def step(name: str, batch: dict[str, torch.Tensor]) -> None:
        train_step(models[name], batch, optimizers[name], recipe, device)

    order = torch.Generator().manual_seed(args.seed)
    stream = cycle(list(batches(features, args.batch, pad_id, generator=order)))
    names = list(models)
    for batch in islice(stream, args.warmup):
        for name in names:
            step(name, batch)
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    examples = []
    for rep, batch in enumerate(islice(stream, args.reps)):
        examples.append(batch["input_ids"].shape[0])
        for name in names[rep % len(names) :] + names[: rep % len(names)]:  # rotate who goes first
            seconds, cpu_seconds = timed_with_cpu(lambda b=batch, n=name: step(n, b), device)
            wall[name].append(seconds)
            cpu[name].append(cpu_seconds)
    rows = []
    for name in names:
        row = {"model": name, "step_s": spread(wall[name]), "step_cpu_s": spread(cpu[name])}
        row["examples_per_s"] = sum(examples) / sum(wall[name])
        if "hf" in wall and name != "hf":
            row["speedup_vs_hf"] = paired_speedup(wall[name], wall["hf"])
            row["cpu_time_speedup_vs_hf"] = paired_speedup(cpu[name], cpu["hf"])
        rows.append(row)
    return {"precision": precision, "rows": rows}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    prog = "python -m benchmarks.finetune_throughput"
    args = parse(FinetuneThroughputConfig, argv, prog=prog, description=__doc__ or "")
    device = start_device(args.device, args.threads, "bf16" in args.precisions, "--precisions='[fp32]'")
    splits = load_task(args.task, args.data_dir)
    if args.model:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
    else:
        with tempfile.TemporaryDirectory(prefix="lnbert-ft-bench-") as tmp:
            tokenizer = task_tokenizer(splits, Path(tmp))
    features = encode(tokenizer, splits["train"], max_length=128)
    mean_length = statistics.fmean(len(f["input_ids"]) for f in features)
    models = build_models(args, len(tokenizer))
    groups = [time_training(models, features, tokenizer.pad_token_id, args, p, device) for p in args.precisions]
    print(f"\n## {args.task} fine-tuning steps, batch {args.batch}, mean length {mean_length:.1f}")
    table = []
    for group in groups:
        for r in group["rows"]:
            speed, cpu_speed = r.get("speedup_vs_hf"), r.get("cpu_time_speedup_vs_hf")
            table.append([
                group["precision"], r["model"], f"{r['step_s']['median']:.3f}", f"{100 * r['step_s']['iqr_rel']:.0f}%",
                f"{r['examples_per_s']:.1f}", f"{speed['median']:.2f}" if speed else "-",
                f"{cpu_speed['median']:.2f}" if cpu_speed else "-",
            ])  # fmt: skip
    headers = ["precision", "model", "step s (median)", "noise IQR", "examples/s", "x hf (wall)", "x hf (CPU time)"]
    print(format_table(headers, table, style="markdown"))
    payload = {"benchmark": "finetune_throughput", "machine": machine_info(device), "args": vars(args),
               "mean_length": mean_length, "groups": groups}  # fmt: skip
    print(f"\nwrote {write_results('finetune_throughput', payload, args.out)}")
    return payload


cli = command(main)

if __name__ == "__main__":
    raise SystemExit(cli())
