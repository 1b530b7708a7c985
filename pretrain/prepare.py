"""Data preparation as its own step, run once before a multi-process training (a CPU node will do):

    python -m pretrain.prepare --config configs/pretrain/bert_base_post_ln.yaml [--section.key=VALUE ...]

It takes pretrain/run.py's arguments (the ``data`` section, ``train.seed`` and ``model.vocab_size`` matter) and
builds what training reads from ``data.cache_dir``: the tokenizer (trained and cached when ``data.tokenizer`` is
null) and the training and validation instances, shard by shard with ``data.num_proc`` processes.

Interrupted, it resumes: finished shards are kept in ``instances-KEY.partial-N/`` and a rerun makes only the others;
the folder is renamed to ``instances-KEY/`` when complete. It prints a summary (documents, instances, tokens,
padding, disk size; per source the share of the tokens, the true-next fraction, the real tokens per instance) with
warnings for sources that cannot make real next-sentence pairs; the same report is in ``instances-KEY/summary.json``.

Training then finds the prepared instances (same arguments, same cache key); with several processes and an
unprepared large corpus it stops with exit code 2 and prints this command.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from typing import Any

from pretrain.common.cli import run_cli
from pretrain.common.reporting import format_table
from pretrain.config import PretrainConfig, parse_args
from pretrain.data.config import DataConfig

# The data pipeline (seconds of import) is imported by the functions that use it: the options are checked first.

PROG = "python -m pretrain.prepare"
MAX_SINGLE_SENTENCE_SHARE = 0.5  # above it, a source's one-sentence documents make no real next-sentence pairs
MIN_FILL = 0.5  # instances with fewer real tokens than this share of max_seq_length are mostly padding
# A source's token share off its weight's share by this factor (and by FAR_FROM_WEIGHT_MIN_POINTS percentage points)
# is not the mixture the weights ask for: weights counted in documents give long documents (books) most tokens.
FAR_FROM_WEIGHT = 1.5
FAR_FROM_WEIGHT_MIN_POINTS = 5.0
MIN_VALIDATION_DOCUMENTS = 10  # fewer make a validation loss that moves with a handful of documents


def prepare_command(argv: list[str] | None) -> str:
    """The command that prepares the data of a training run started with ``argv`` (its same arguments)."""
    if argv is None:
        return f"{PROG} [the arguments of this run]"
    return f"{PROG} {shlex.join(argv)}".strip()


def source_label(cfg: DataConfig, index: int) -> str:
    source = cfg.sources[index]
    rows = f" ({source.rows_per_document} rows/doc)" if source.rows_per_document > 1 else ""
    return f"{index}: {source.kind} {source.path}".rstrip() + rows


def source_checks(summary: dict[str, Any], cfg: DataConfig) -> tuple[list[dict[str, Any]], list[str]]:
    """Per source of the training instances: share of the corpus tokens (and the weight's target share), documents,
    sentences per document, share of one-sentence documents, instances, fraction of true-next pairs, mean real
    tokens per instance; and the warnings (documents too short for real next-sentence pairs, mostly padding)."""
    by_source = summary["train"]["by_source"]
    total_tokens = sum(s["document_tokens"] for s in by_source.values()) or 1
    weights = [s.weight for s in cfg.sources]
    rows, warnings = [], validation_warnings(summary, cfg)
    for index in range(len(cfg.sources)):
        s = by_source.get(str(index))
        if s is None or s["documents"] == 0:
            warnings.append(f"source {source_label(cfg, index)} contributed no training documents")
            continue
        row = {
            "source": source_label(cfg, index),
            "token_share": s["document_tokens"] / total_tokens,
            "target_share": weights[index] / sum(weights),
            "documents": s["documents"],
            "sentences_per_document": s["sentences"] / s["documents"],
            "single_sentence_documents": s["single_sentence_documents"] / s["documents"],
            "instances": s["instances"],
            "true_next": s["true_next"] / s["instances"] if s["instances"] else None,
            "real_tokens_per_instance": s["real_tokens"] / s["instances"] if s["instances"] else None,
        }
        rows.append(row)
        if len(cfg.sources) > 1 and far_from_weight(row["token_share"], row["target_share"]):
            fix = (
                "set data.weight_by=words to weigh the sources by words (the README's example and the small presets do)"
                if cfg.weight_by == "documents"
                else "the mixture stops when the first source runs out: check the sources' sizes and weights"
            )
            warnings.append(
                f"source {row['source']}: {100 * row['token_share']:.1f}% of the training tokens against its weight's "
                f"{100 * row['target_share']:.1f}% (mixed by {cfg.weight_by}); {fix}"
            )
        if cfg.objective != "mlm_nsp":
            continue
        if row["single_sentence_documents"] > MAX_SINGLE_SENTENCE_SHARE:
            warnings.append(
                f"source {row['source']}: {100 * row['single_sentence_documents']:.0f}% of its documents are one "
                f"sentence, too short to make real next-sentence pairs (the 'true next' segment of such a document "
                f"is the second half of its sentence). If it stores one sentence per row in reading order, set "
                f"data.sources[{index}].rows_per_document (the BERT-base presets use 256 for bookcorpus)"
            )
        fill = row["real_tokens_per_instance"]
        if fill is not None and fill < MIN_FILL * cfg.max_seq_length:
            warnings.append(
                f"source {row['source']}: its instances hold {fill:.0f} real tokens on "
                f"average out of data.max_seq_length={cfg.max_seq_length}: mostly padding (documents too short)"
            )
    return rows, warnings


def far_from_weight(token_share: float, target_share: float) -> bool:
    """Whether a source's share of the tokens is far from the share its weight asks for."""
    off_points = 100 * abs(token_share - target_share) > FAR_FROM_WEIGHT_MIN_POINTS
    off_factor = token_share > FAR_FROM_WEIGHT * target_share or token_share * FAR_FROM_WEIGHT < target_share
    return off_points and off_factor


def validation_warnings(summary: dict[str, Any], cfg: DataConfig) -> list[str]:
    """A warning when the held-out split is too small for its loss to tell runs apart."""
    part = summary["validation"]
    documents = sum(s["documents"] for s in part["by_source"].values())
    if documents >= MIN_VALIDATION_DOCUMENTS:
        return []
    return [
        f"the validation split is {documents:,} document(s) ({part['instances']:,} instances), fewer than "
        f"{MIN_VALIDATION_DOCUMENTS}: its loss moves with a few documents; raise data.validation_fraction (now "
        f"{cfg.validation_fraction:g}) or set data.validation_documents"
    ]


def format_report(summary: dict[str, Any], cfg: DataConfig, folder: os.PathLike | str) -> str:
    """The summary and the per-source check as text."""
    size = summary["disk_bytes"]
    on_disk = f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
    parts = []
    for name in ("train", "validation"):
        part = summary[name]
        documents = sum(s["documents"] for s in part["by_source"].values())
        parts.append([name, f"{documents:,}", f"{part['instances']:,}", f"{part['real_tokens']:,}",
                      f"{100 * part['padding_fraction']:.1f}%"])  # fmt: skip
    rows, warnings = source_checks(summary, cfg)
    sources = [
        [r["source"], f"{100 * r['token_share']:.1f}%", f"{100 * r['target_share']:.1f}%", f"{r['documents']:,}",
         f"{r['sentences_per_document']:.1f}", f"{100 * r['single_sentence_documents']:.1f}%", f"{r['instances']:,}",
         f"{100 * r['true_next']:.1f}%" if r["true_next"] is not None else "-",
         f"{r['real_tokens_per_instance']:.1f}" if r["real_tokens_per_instance"] is not None else "-"]
        for r in rows
    ]  # fmt: skip
    return "\n".join([
        f"prepared instances: {folder}  ({on_disk} on disk)",
        format_table(["", "documents", "instances", "tokens", "padding"], parts),
        f"(tokens: real tokens of the instances, [CLS]/[SEP] included; padding: share of the positions of "
        f"{cfg.max_seq_length}-token rows that are padding)",
        "",
        f"per source (training instances; mixture weighted by {cfg.weight_by}; target: the weights' share):",
        format_table(["source", "tokens", "target", "documents", "sent/doc", "1-sentence", "instances", "true next",
                      "real tokens"], sources),
        *[f"WARNING: {w}" for w in warnings],
    ])  # fmt: skip


def data_report(cfg: PretrainConfig, tokenizer: Any) -> str | None:
    """The prepared data's report as ``prepare`` prints it (so does pretraining at each start); None when streaming."""
    from pretrain.data.instance_cache import prepared_dir, read_summary

    if cfg.data.streaming:
        return None
    folder = prepared_dir(cfg.data, tokenizer, seed=cfg.train.seed)
    return format_report(read_summary(folder), cfg.data, folder)


def prepare(cfg: PretrainConfig, *, progress: bool = True) -> dict[str, Any]:
    """Prepare (or find prepared) the data of ``cfg``; print and return the summary."""
    from pretrain.data.instance_cache import SUMMARY_FILE, prepared_dir, read_summary
    from pretrain.data.pipeline import build_pretraining_data

    start = time.perf_counter()
    data = build_pretraining_data(cfg.data, seed=cfg.train.seed, model_vocab_size=cfg.model.vocab_size,
                                  progress=progress)
    if cfg.data.streaming:
        print(f"streaming: the tokenizer is ready ({len(data.tokenizer)} tokens) and {len(data.validation):,} "
              "validation instances are made; training instances are made on the fly, nothing else to prepare")
        return {"streaming": True, "validation_instances": len(data.validation)}
    folder = prepared_dir(cfg.data, data.tokenizer, seed=cfg.train.seed)
    summary = read_summary(folder)
    print(format_report(summary, cfg.data, folder))
    print(f"done in {time.perf_counter() - start:.0f} s; {folder / SUMMARY_FILE}")
    return summary


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(sys.argv[1:] if argv is None else argv, prog=PROG, description=__doc__ or "")
    for line in cfg.data.check_local_files():  # a missing or empty corpus answers now, before the heavy imports
        print(line, flush=True)
    prepare(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))  # bad input: the message on stderr and exit code 2
