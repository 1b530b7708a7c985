"""Fine-tuning throughput (examples/s) on a GLUE task, our classifier against Hugging Face's, interleaved.

    python -m benchmarks.finetune_throughput --data-dir PATH/TO/glue              # random-init small model
    python -m benchmarks.finetune_throughput --data-dir PATH/TO/glue --model runs/x/snapshots/step_00010000

One training step is ``finetune.train.train_step`` on a batch padded as in fine-tuning (``finetune.glue.batches``):
forward (bf16 autocast in the bf16 rows), backward, gradient clipping, fused AdamW with its weight-decay groups
(``finetune.train.make_optimizer``). Our
``LNBertForSequenceClassification`` and Hugging Face ``BertForSequenceClassification`` (same shape; same weights
when the model is Post-LN) take turns on the same batches; the median over ``--reps`` is reported, with the noise.
Without ``--model``, a random-init model of ``--shape`` is used with a WordPiece tokenizer trained on the task's
training sentences (throughput does not depend on the weights).
"""

from __future__ import annotations

import argparse
import tempfile
from itertools import cycle, islice
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.common import (
    configure_device,
    format_table,
    machine_info,
    spread,
    timed_with_cpu,
    write_results,
)
from benchmarks.train_step import PRECISIONS, SHAPES, parse_list
from finetune.config import FinetuneConfig
from finetune.glue import batches, encode, load_task
from finetune.train import make_optimizer, train_step
from pretrain.device import pick_device


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--data-dir", required=True, help="GLUE folder holding MRPC/ and RTE/ (the original download layout)"
    )
    parser.add_argument("--task", default="mrpc", help="GLUE task (mrpc or rte)")
    parser.add_argument("--model", help="snapshot folder (save_pretrained + tokenizer); default: random-init")
    parser.add_argument("--shape", default="small", choices=list(SHAPES), help="model shape without --model")
    parser.add_argument("--batch", type=int, default=32, help="training batch (BERT's GLUE recipe: 32)")
    parser.add_argument("--precisions", default="fp32,bf16", help="comma list of fp32, bf16 (autocast)")
    parser.add_argument("--reps", type=int, default=5, help="timed steps per model (interleaved)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--no-hf", action="store_true", help="time our model only")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (CPU); 1 gives steady CPU-time ratios")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, help="JSON path (default benchmarks/results/finetune_throughput-<time>.json)"
    )
    args = parser.parse_args(argv)
    args.precision_names = parse_list(args.precisions, PRECISIONS, "--precisions")
    if args.reps < 1 or args.warmup < 0 or args.batch < 1:
        parser.error("--reps and --batch must be >= 1, --warmup >= 0")
    return args


def task_tokenizer(splits: dict[str, list], folder: Path) -> Any:
    """WordPiece trained on the task's training sentences, saved and reopened as AutoTokenizer would."""
    from transformers import AutoTokenizer

    from pretrain.tokenizer import train_wordpiece_tokenizer

    texts = [t for e in splits["train"] for t in (e.text_a, e.text_b) if t]
    train_wordpiece_tokenizer(texts, vocab_size=30522).save_pretrained(folder)
    return AutoTokenizer.from_pretrained(str(folder))


def build_models(args: argparse.Namespace, vocab_size: int) -> dict[str, nn.Module]:
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
    models: dict[str, nn.Module], features: list[dict], pad_id: int, args: argparse.Namespace, precision: str,
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
    for precision in args.precision_names:
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
        ["precision", "model", "step s (median)", "noise IQR", "examples/s", "x hf (wall)", "x hf (CPU time)"], table
    ))  # fmt: skip
    payload = {
        "benchmark": "finetune_throughput",
        "machine": machine_info(device),
        "args": {k: v for k, v in vars(args).items() if k != "precision_names"},
        "mean_length": sum(lengths) / len(lengths),
        "groups": groups,
    }
    path = write_results("finetune_throughput", payload, args.out)
    print(f"\nwrote {path}")
    return payload


if __name__ == "__main__":
    main()
