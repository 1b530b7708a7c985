"""Data path: corpus -> instances throughput, padding waste, and how long training waits for data.

    python -m benchmarks.data_path --corpus=PATH/TO/wiki.jsonl --max_documents=400
    python -m benchmarks.data_path --corpus='corpus/*.jsonl' --tokenizer=PATH/TO/tokenizer --workers='[0, 2]'

1. Preprocessing: ``pretrain.data.instances.make_instances`` (sentence split, tokenise, BERT NSP instances) against a
   plain ``datasets.map`` tokenisation of the same documents with the same tokenizer, alternated ``--reps`` times;
   throughput is corpus tokens per second for both (the tokens the plain tokenisation produces).
2. Padding waste of the instances' real length distribution: share of padding positions in a batch padded to
   ``max_seq_length`` and to the batch's longest (rounded up to a multiple of 8, as ``MaskingCollator`` does),
   for BERT's NSP instances and for packed sequences (``data.objective=mlm``, made from the same documents).
3. Data wait: the small model trains ``--steps`` steps from a ``DataLoader`` over the instances with
   ``MaskingCollator``; the time in ``next(iterator)`` over the whole step time is the share lost to data.

The WordPiece tokenizer is trained on the subset first when ``--tokenizer`` is not given (timed separately).
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from benchmarks.common import command, machine_info, spread, start_device, synchronize, write_results
from benchmarks.train_step import SHAPES, Precision, ShapeName, make_runner, parse_variant
from pretrain.common.cli import parse, require
from pretrain.common.reporting import format_table
from pretrain.data.collator import MaskingCollator
from pretrain.data.config import DataConfig
from pretrain.data.corpus import SourceConfig, load_documents
from pretrain.data.instances import make_instances
from pretrain.data.tokenizer import load_or_train_tokenizer


@dataclass(kw_only=True)
class DataPathConfig:
    """Corpus -> instances throughput, padding waste and data wait (see the module docstring)."""

    corpus: str
    """JSON Lines file, glob or folder with a 'text' column."""
    max_documents: int = 400
    """Documents to read from the corpus."""
    tokenizer: str | None = None
    """Tokenizer folder; null: train WordPiece on the subset."""
    vocab_size: int = 30522
    """Vocabulary of a trained tokenizer."""
    max_seq_length: int = 128
    """Longest instance, in tokens."""
    reps: int = 3
    """Alternating repetitions of both preprocessing paths."""
    batch: int = 8
    """Sequences per batch in the data-wait part."""
    steps: int = 12
    """Training steps per worker setting (data wait); the first is not timed."""
    workers: list[int] = field(default_factory=lambda: [0, 1])
    """DataLoader num_workers settings to compare."""
    precision: Precision = "bf16"
    """fp32 or bf16 (autocast) in the data-wait part."""
    shape: ShapeName = "small"
    """Model trained in the data-wait part."""
    device: str = "auto"
    """auto (CUDA when available), cpu or cuda."""
    cache_dir: str | None = None
    """Scratch folder; null: a temporary folder."""
    seed: int = 0
    """Seed of the instances and the model."""
    out: str | None = None
    """JSON path; null: benchmarks/results/data_path-<time>.json."""

    def __post_init__(self) -> None:
        require(bool(self.workers) and min(self.workers) >= 0, "workers", f"must list numbers >= 0; got {self.workers}")
        require(self.reps >= 1, "reps", "must be >= 1")
        require(self.steps >= 2, "steps", "must be >= 2")
        for key in ("max_documents", "vocab_size", "max_seq_length", "batch"):
            require(getattr(self, key) >= 1, key, "must be >= 1")


def plain_tokenisation(docs: Any, tokenizer: Any) -> tuple[float, int]:
    """Seconds and tokens of ``datasets.map`` with the tokenizer alone: the floor any pipeline pays."""
    start = time.perf_counter()
    out = docs.map(lambda b: tokenizer(b["text"], add_special_tokens=False), batched=True,
                   remove_columns=docs.column_names, new_fingerprint=f"plain-{uuid.uuid4().hex}")  # fmt: skip
    return time.perf_counter() - start, int(sum(len(ids) for ids in out["input_ids"]))


def our_instances(docs: Any, tokenizer: Any, cfg: DataConfig, work_dir: Path, seed: int) -> tuple[float, Any]:
    work_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    made = make_instances(docs, tokenizer, cfg, seed=seed, validation=False, work_dir=work_dir)
    return time.perf_counter() - start, made


def padding_waste(lengths: np.ndarray, batch: int, max_len: int, seed: int, multiple: int = 8) -> dict[str, float]:
    """Share of padding positions over random batches: padded to max_len, or to the batch's longest."""
    order = np.random.default_rng(seed).permutation(len(lengths))
    n_batches = len(order) // batch
    if n_batches == 0:
        raise ValueError(f"only {len(lengths)} instances, fewer than one batch of {batch}; raise --max-documents")
    real = fixed = longest = 0
    for i in range(n_batches):
        rows = lengths[order[i * batch : (i + 1) * batch]]
        width = -(-int(rows.max()) // multiple) * multiple
        real += int(rows.sum())
        fixed += batch * max_len
        longest += batch * min(width, max_len)
    return {
        "pad_share_fixed_length": 1 - real / fixed,
        "pad_share_pad_to_longest": 1 - real / longest,
        "mean_length": float(lengths.mean()),
        "share_full_length": float((lengths == max_len).mean()),
    }


def data_wait(instances: Any, tokenizer: Any, args: DataPathConfig, workers: int,
              device: torch.device) -> dict[str, Any]:  # fmt: skip
    """Share of training time spent in ``next(loader)``: ``--shape`` model, sparse head, fused QKV, fused AdamW."""
    shape = dict(SHAPES[args.shape], vocab=len(tokenizer), seq=args.max_seq_length)
    runner = make_runner(parse_variant("post+qkv"), shape, args.precision, "fused", device, args.seed)
    loader = DataLoader(instances, batch_size=args.batch, shuffle=True,
                        collate_fn=MaskingCollator(tokenizer, seed=args.seed), drop_last=True, num_workers=workers,
                        pin_memory=device.type == "cuda", persistent_workers=False,
                        generator=torch.Generator().manual_seed(args.seed))  # fmt: skip
    iterator = iter(loader)
    waits, steps = [], []
    for step in range(args.steps):
        start = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            iterator = iter(loader)
            batch = next(iterator)
        got = time.perf_counter()
        runner.step({k: v.to(device, non_blocking=True) for k, v in batch.items()})
        synchronize(device)
        if step > 0:  # the first batch includes starting the workers
            waits.append(got - start)
            steps.append(time.perf_counter() - start)
    return {"workers": workers, "wait_share": sum(waits) / sum(steps), "wait_s": spread(waits), "step_s": spread(steps),
            "first_batch_included": False}  # fmt: skip


def print_tables(pre: dict[str, Any], waste: dict[str, float], waits: list[dict], args: DataPathConfig) -> None:
    print("\n## Preprocessing (corpus tokens/s, median of alternated reps)")
    paths = {"pretrain.data.instances.make_instances": "ours", "datasets.map(tokenizer)": "plain_map"}
    rows = [[path, f"{pre[key + '_s']['median']:.2f}", f"{100 * pre[key + '_s']['iqr_rel']:.0f}%",
             f"{pre[key + '_tokens_per_s']:.0f}"] for path, key in paths.items()]  # fmt: skip
    print(format_table(["path", "median s", "noise IQR", "corpus tok/s"], rows, style="markdown"))
    print(f"{pre['documents']} documents, {pre['corpus_tokens']} tokens -> {pre['instances']} instances")
    print("\n## Padding (share of positions that are padding)")
    headers = ["fixed max_seq_length", "pad to batch longest (x8)", "packed (objective mlm), to longest", "mean length",
               "full-length share"]  # fmt: skip
    row = [f"{100 * waste['pad_share_fixed_length']:.1f}%", f"{100 * waste['pad_share_pad_to_longest']:.1f}%",
           f"{100 * waste['pad_share_packed_pad_to_longest']:.1f}%", f"{waste['mean_length']:.1f}",
           f"{100 * waste['share_full_length']:.1f}%"]  # fmt: skip
    print(format_table(headers, [row], style="markdown"))
    print(f"\n## Data wait ({args.precision}, batch {args.batch}, {args.shape} model, {args.steps - 1} timed steps)")
    rows = [[w["workers"], f"{100 * w['wait_share']:.2f}%", f"{1e3 * w['wait_s']['median']:.2f}",
             f"{w['step_s']['median']:.3f}"] for w in waits]  # fmt: skip
    print(format_table(["num_workers", "wait share", "wait ms (median)", "step s (median)"], rows, style="markdown"))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(DataPathConfig, argv, prog="python -m benchmarks.data_path", description=__doc__ or "")
    device = start_device(args.device, None, args.precision == "bf16", "--precision=fp32")
    with tempfile.TemporaryDirectory(prefix="lnbert-data-bench-") as tmp:
        cache_dir = Path(args.cache_dir or tmp)
        cfg = DataConfig(sources=[SourceConfig(kind="json", path=args.corpus)], tokenizer=args.tokenizer,
                         vocab_size=args.vocab_size, max_seq_length=args.max_seq_length,
                         max_documents=args.max_documents, cache_dir=str(cache_dir))  # fmt: skip
        docs = load_documents(cfg, seed=args.seed)
        start = time.perf_counter()
        tokenizer = load_or_train_tokenizer(cfg, seed=args.seed)
        tokenizer_s = time.perf_counter() - start
        print(f"{len(docs)} documents; tokenizer ({len(tokenizer)} tokens) ready in {tokenizer_s:.1f} s")
        ours_s, plain_s = [], []
        for rep in range(args.reps):
            seconds, made = our_instances(docs, tokenizer, cfg, cache_dir / f"work-{rep}", args.seed)
            ours_s.append(seconds)
            seconds, corpus_tokens = plain_tokenisation(docs, tokenizer)
            plain_s.append(seconds)
        lengths = np.array([len(ids) for ids in made["input_ids"]])
        pre = {"documents": len(docs), "corpus_tokens": corpus_tokens, "instances": len(made),
               "instance_tokens": int(lengths.sum()), "tokenizer_s": tokenizer_s,
               "ours_s": spread(ours_s), "plain_map_s": spread(plain_s),
               "ours_tokens_per_s": corpus_tokens / statistics.median(ours_s),
               "plain_map_tokens_per_s": corpus_tokens / statistics.median(plain_s)}  # fmt: skip
        waste = padding_waste(lengths, args.batch, args.max_seq_length, args.seed)
        packed_cfg = replace(cfg, objective="mlm")
        _, packed = our_instances(docs, tokenizer, packed_cfg, cache_dir / "work-packed", args.seed)
        packed_lengths = np.array([len(ids) for ids in packed["input_ids"]])
        packed_waste = padding_waste(packed_lengths, args.batch, args.max_seq_length, args.seed)
        waste["pad_share_packed_pad_to_longest"] = packed_waste["pad_share_pad_to_longest"]
        waste["packed_mean_length"] = packed_waste["mean_length"]
        waits = [data_wait(made, tokenizer, args, w, device) for w in args.workers]
    print_tables(pre, waste, waits, args)
    payload = {"benchmark": "data_path", "machine": machine_info(device), "args": vars(args), "preprocessing": pre,
               "padding": waste, "data_wait": waits}  # fmt: skip
    print(f"\nwrote {write_results('data_path', payload, args.out)}")
    return payload


cli = command(main)

if __name__ == "__main__":
    raise SystemExit(cli())
