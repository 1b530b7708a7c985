"""Fine-tuning throughput (examples/s) on a GLUE task, our classifier against Hugging Face's, interleaved.

    python -m benchmarks.finetune_throughput --data_dir=PATH/TO/glue              # random-init small model
    python -m benchmarks.finetune_throughput --data_dir=PATH/TO/glue --model=runs/x/snapshots/step_00010000

One training step is ``finetune.train.train_step`` on a batch padded as in fine-tuning (``finetune.glue.batches``):
forward (bf16 autocast in the bf16 rows), backward, gradient clipping, fused AdamW with its weight-decay groups
(``finetune.train.make_optimizer``). Our
``LNBertForSequenceClassification`` and Hugging Face ``BertForSequenceClassification`` (same shape; same weights
when the model is Post-LN) take turns on the same batches; the median over ``--reps`` is reported, with the noise.
Without ``--model``, a random-init model of ``--shape`` is used with a WordPiece tokenizer trained on the task's
training sentences (throughput does not depend on the weights).
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass, field
from itertools import cycle, islice
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.common import (
    configure_device,
    machine_info,
    spread,
    timed_with_cpu,
    write_results,
)
from benchmarks.train_step import SHAPES, Precision, ShapeName
from finetune.config import FinetuneConfig
from finetune.glue import batches, encode, load_task
from finetune.train import make_optimizer, train_step
from pretrain.common.cli import parse, require, run_cli
from pretrain.common.device import pick_device
from pretrain.common.hardware import cpu_bf16_warning
from pretrain.common.reporting import format_table


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


def parse_args(argv: list[str] | None = None) -> FinetuneThroughputConfig:
    return parse(FinetuneThroughputConfig, argv, prog="python -m benchmarks.finetune_throughput", description=__doc__ or "")


def task_tokenizer(splits: dict[str, list], folder: Path) -> Any:
    """WordPiece trained on the task's training sentences, saved and reopened as AutoTokenizer would."""
    from transformers import AutoTokenizer

    from pretrain.data.tokenizer import train_wordpiece_tokenizer

    texts = [t for e in splits["train"] for t in (e.text_a, e.text_b) if t]
    train_wordpiece_tokenizer(texts, vocab_size=30522).save_pretrained(folder)
    return AutoTokenizer.from_pretrained(str(folder))


def build_models(args: FinetuneThroughputConfig, vocab_size: int) -> dict[str, nn.Module]:
    """Ours (from --model or random) and, unless --no-hf, Hugging Face's with the same shape (and Post-LN weights)."""
    from transformers import BertConfig, BertForSequenceClassification

    from pretrain.modeling import LNBertConfig, LNBertForSequenceClassification

    torch.manual_seed(args.seed)
    if args.model:
        ours = LNBertForSequenceClassification.from_pretrained(args.model, num_labels=2)
    else:
        shape = SHAPES[args.shape]
        ours = LNBertForSequenceClassification(
            LNBertConfig(
                vocab_size=vocab_size, hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
                num_attention_heads=shape["heads"], intermediate_size=4 * shape["hidden"], num_labels=2,
            )
        )  # fmt: skip
    models: dict[str, nn.Module] = {"ours": ours}
    if not args.no_hf:
        keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "type_vocab_size")  # fmt: skip
        hf_config = BertConfig(**{k: getattr(ours.config, k) for k in keys}, num_labels=2)
        hf = BertForSequenceClassification(hf_config)
        if ours.config.norm_placement == "post":
            hf.load_state_dict(ours.state_dict(), strict=True)
        models["hf"] = hf
    return models


def time_training(
    models: dict[str, nn.Module], features: list[dict], pad_id: int, args: FinetuneThroughputConfig, precision: str,
    device: torch.device,
) -> dict[str, Any]:  # fmt: skip
    recipe = FinetuneConfig(batch_size=args.batch, mixed_precision="bf16" if precision == "bf16" else "no")
    steps = {}
    for name, model in models.items():
        model.to(device).train()
        optimizer = make_optimizer(model, recipe, lr=2e-5)

        def step(batch: dict[str, torch.Tensor], model: nn.Module = model, optimizer: Any = optimizer) -> None:
            train_step(model, batch, optimizer, recipe, device)

        steps[name] = step
    order = torch.Generator().manual_seed(args.seed)
    stream = cycle(list(batches(features, args.batch, pad_id, generator=order)))
    for batch in islice(stream, args.warmup):
        for step in steps.values():
            step(batch)
    wall: dict[str, list[float]] = {n: [] for n in steps}
    cpu: dict[str, list[float]] = {n: [] for n in steps}
    examples = []
    names = list(steps)
    for rep, batch in enumerate(islice(stream, args.reps)):
        examples.append(batch["input_ids"].shape[0])
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            seconds, cpu_seconds = timed_with_cpu(lambda b=batch, n=name: steps[n](b), device)
            wall[name].append(seconds)
            cpu[name].append(cpu_seconds)
    rows = []
    for name in names:
        row = {"model": name, "step_s": spread(wall[name]), "step_cpu_s": spread(cpu[name])}
        row["examples_per_s"] = sum(examples) / sum(wall[name])
        if "hf" in wall and name != "hf":
            row["speedup_vs_hf"] = spread([h / o for o, h in zip(wall[name], wall["hf"], strict=True)])
            row["cpu_time_speedup_vs_hf"] = spread([h / o for o, h in zip(cpu[name], cpu["hf"], strict=True)])
        rows.append(row)
    return {"precision": precision, "rows": rows}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    configure_device(device)
    if device.type == "cpu" and "bf16" in args.precisions and (warning := cpu_bf16_warning("--precisions='[fp32]'")):
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    splits = load_task(args.task, args.data_dir)
    with tempfile.TemporaryDirectory(prefix="lnbert-ft-bench-") as tmp:
        if args.model:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(args.model)
        else:
            tokenizer = task_tokenizer(splits, Path(tmp))
    features = encode(tokenizer, splits["train"], max_length=128)
    lengths = [len(f["input_ids"]) for f in features]
    models = build_models(args, len(tokenizer))
    groups = []
    for precision in args.precisions:
        groups.append(time_training(models, features, tokenizer.pad_token_id, args, precision, device))
    print(f"\n## {args.task} fine-tuning steps, batch {args.batch}, mean length {sum(lengths) / len(lengths):.1f}")
    table = []
    for group in groups:
        for r in group["rows"]:
            speed, cpu_speed = r.get("speedup_vs_hf"), r.get("cpu_time_speedup_vs_hf")
            table.append([
                group["precision"], r["model"], f"{r['step_s']['median']:.3f}", f"{100 * r['step_s']['iqr_rel']:.0f}%",
                f"{r['examples_per_s']:.1f}", f"{speed['median']:.2f}" if speed else "-",
                f"{cpu_speed['median']:.2f}" if cpu_speed else "-",
            ])  # fmt: skip
    print(format_table(
        ["precision", "model", "step s (median)", "noise IQR", "examples/s", "x hf (wall)", "x hf (CPU time)"], table,
        style="markdown",
    ))  # fmt: skip
    payload = {
        "benchmark": "finetune_throughput",
        "machine": machine_info(device),
        "args": vars(args),
        "mean_length": sum(lengths) / len(lengths),
        "groups": groups,
    }
    path = write_results("finetune_throughput", payload, Path(args.out) if args.out else None)
    print(f"\nwrote {path}")
    return payload


def cli() -> int:
    """``main`` for the command line: bad options end with their message and exit code 2."""

    def run() -> int:
        main()
        return 0

    return run_cli(run)


if __name__ == "__main__":
    raise SystemExit(cli())
