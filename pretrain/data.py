"""Pretraining data: the data config and ``build_pretraining_data``, which runs the pipeline; each stage has its
own module.

    pretrain/corpus.py     sources (Hub / JSONL / Parquet / text / python_docs) --weights--> one stream of documents
                           -> held-out documents (validation, split BY DOCUMENT before anything else, paper: 199:1)
    pretrain/tokenizer.py  -> tokenizer (Hub / local folder, or WordPiece trained on the training documents)
    pretrain/instances.py  -> chunks of documents -> sentences -> token ids -> instances as in original BERT's
                              ``create_pretraining_data.py`` ([CLS] A [SEP] B [SEP] with next-sentence labels, or
                              packed full-length sequences for the "mlm" objective), cached under ``data.cache_dir``
                              (pretrain/cache.py), or made on the fly from a streamed corpus
    pretrain/collator.py   MaskingCollator: pads a batch and applies BERT's 80/10/10 masking, a pure function of
                           (seed, epoch, instance_id), so resumed runs and any number of DataLoader workers see the
                           same masks.

The training loop imports from here: DataConfig, build_pretraining_data, PretrainingData and MaskingCollator.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import datasets
from transformers import PreTrainedTokenizerFast

from pretrain.collator import MaskingCollator
from pretrain.corpus import SourceConfig, corpus_bytes, document_texts, load_documents, split_documents
from pretrain.instances import (
    OBJECTIVES,
    SUMMARY_FILE,
    cached_instances,
    make_instances,
    prepared_dir,
    stream_instances,
)
from pretrain.tokenizer import MIN_PLAUSIBLE_VOCAB, load_or_train_tokenizer, trained_tokenizer_dir

WEIGHT_UNITS: tuple[str, ...] = ("documents", "words")


@dataclass(kw_only=True)
class DataConfig:
    """Corpus, tokenizer and instance creation for pretraining."""

    sources: list[SourceConfig] = field(default_factory=lambda: [SourceConfig()])
    """Corpus sources; several are mixed by weight."""
    weight_by: str = "documents"
    """What the sources' weights count: "documents" (source i supplies weight_i / sum(weights) of the documents)
    or "words" (of the words, estimated from a sample of each source's documents; what matches original BERT's
    2.5B words of Wikipedia to 0.8B of BookCorpus whatever the sources' document lengths)."""
    tokenizer: str | None = None
    """Hub name (e.g. "bert-base-uncased") or local folder; None: train WordPiece on the training documents.
    WordPiece training is not bit-reproducible (tokenizers issue #1794: hash-map order breaks ties), so a trained
    tokenizer is cached under cache_dir and saved with the run; to resume elsewhere, point this at RUN/tokenizer."""
    vocab_size: int = 30522
    """Vocabulary size of a trained tokenizer (ignored when ``tokenizer`` is set)."""
    lowercase: bool = True
    """Lowercase and strip accents in a trained tokenizer, as bert-base-uncased (ignored when ``tokenizer`` is set)."""
    max_seq_length: int = 128
    """Tokens per instance including [CLS]/[SEP]."""
    objective: str = "mlm_nsp"
    """"mlm_nsp" (BERT: segment pairs + next-sentence prediction) or "mlm" (full-length packed sequences, no NSP)."""
    short_seq_prob: float = 0.1
    """Probability of a shorter random target length (BERT: lessens the pretrain/fine-tune length mismatch);
    mlm_nsp only."""
    nsp_random_prob: float = 0.5
    """Probability that segment B is a random segment from another document (next_sentence_label 1); mlm_nsp only."""
    mlm_probability: float = 0.15
    """Share of the non-special tokens chosen for masked-LM prediction (used by MaskingCollator)."""
    validation_fraction: float = 0.005
    """Share of documents held out for validation, BY DOCUMENT (paper: 199:1); at least one document."""
    validation_documents: int | None = None
    """Exact number of held-out documents; overrides ``validation_fraction``. In streaming mode, where the total
    is unknown, the default is validation_fraction * max_documents, or 1000 documents without max_documents."""
    max_documents: int | None = None
    """Cap on documents read from each source and from the mixture (small runs, tests)."""
    tokenizer_train_documents: int = 100_000
    """Cap on the training documents a WordPiece tokenizer is trained on."""
    cache_dir: str = "runs/.cache/data"
    """Where tokenised instances and trained tokenizers are cached (keyed by a hash of their inputs)."""
    streaming: bool = False
    """Build training instances on the fly from a streamed corpus (larger than memory); validation is materialised."""
    shuffle_buffer_size: int = 10_000
    """Documents in the shuffle buffer of a streamed corpus."""
    num_proc: int = 1
    """Worker processes for tokenisation (the result does not depend on it)."""
    max_inline_preparation_mb: float = 64.0
    """Largest corpus (MiB of local files) that a run of several processes prepares itself, its other processes
    waiting at a barrier; a larger one (or a Hub dataset) must be prepared first with ``python -m
    pretrain.prepare`` (the run stops with that command otherwise). 64 MiB take under two minutes at the data
    path's ~0.6 MB/s per core (BENCHMARKS.md), far inside the barrier's timeout (NCCL: 10 minutes)."""

    def __post_init__(self) -> None:
        # Configs parsed from YAML arrive as dicts.
        self.sources = [SourceConfig(**s) if isinstance(s, dict) else s for s in self.sources]
        if not self.sources:
            raise ValueError("data.sources must list at least one source (e.g. [{kind: python_docs}])")
        if self.weight_by not in WEIGHT_UNITS:
            raise ValueError(f"data.weight_by={self.weight_by!r} must be one of {', '.join(WEIGHT_UNITS)}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"data.objective={self.objective!r} must be one of {', '.join(OBJECTIVES)}")
        if self.max_seq_length < 8:
            raise ValueError(f"data.max_seq_length={self.max_seq_length} is too short; use at least 8 (BERT: 128/512)")
        if self.vocab_size < MIN_PLAUSIBLE_VOCAB:
            raise ValueError(f"data.vocab_size={self.vocab_size} must be at least {MIN_PLAUSIBLE_VOCAB}")
        for key in ("short_seq_prob", "nsp_random_prob"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"data.{key}={getattr(self, key)} must be between 0 and 1")
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"data.mlm_probability={self.mlm_probability} must be in (0, 1) (BERT: 0.15)")
        if not 0.0 < self.validation_fraction < 1.0:
            raise ValueError(f"data.validation_fraction={self.validation_fraction} must be in (0, 1) (paper: 0.005)")
        if self.validation_documents is not None and self.validation_documents < 1:
            raise ValueError(f"data.validation_documents={self.validation_documents} must be >= 1 or null")
        if self.max_documents is not None and self.max_documents < 2:
            raise ValueError(f"data.max_documents={self.max_documents} must be >= 2 (one to train, one to validate)")
        if not self.max_inline_preparation_mb >= 0:
            raise ValueError(f"data.max_inline_preparation_mb={self.max_inline_preparation_mb} must be >= 0")
        for key in ("tokenizer_train_documents", "shuffle_buffer_size", "num_proc"):
            if getattr(self, key) < 1:
                raise ValueError(f"data.{key}={getattr(self, key)} must be >= 1")


class PretrainingData(NamedTuple):
    train: datasets.Dataset | datasets.IterableDataset
    """input_ids, token_type_ids, next_sentence_label (mlm_nsp only), instance_id (unique)."""
    validation: datasets.Dataset
    """Same columns, from held-out documents; always materialised."""
    tokenizer: PreTrainedTokenizerFast


class PreparationRequired(ValueError):
    """Several processes would wait at a barrier while one prepares a large corpus; the message names the command
    that prepares it first."""


def is_prepared(cfg: DataConfig, *, seed: int) -> bool:
    """Whether everything the training needs from ``cfg.cache_dir`` is there: the trained tokenizer (when one is
    trained) and, unless streaming, the prepared instances."""
    if cfg.tokenizer is None and not (trained_tokenizer_dir(cfg, seed) / "tokenizer.json").is_file():
        return False
    if cfg.streaming:
        return True
    tokenizer = load_or_train_tokenizer(cfg, seed=seed)  # loads; nothing is trained when the line above passed
    return (prepared_dir(cfg, tokenizer, seed=seed) / SUMMARY_FILE).is_file()


def check_prepared_for_distributed(cfg: DataConfig, *, seed: int, num_processes: int, prepare_command: str) -> None:
    """Raise PreparationRequired when ``num_processes`` > 1 and a corpus too large to prepare under a barrier is
    not prepared yet."""
    if num_processes <= 1 or is_prepared(cfg, seed=seed):
        return
    size = corpus_bytes(cfg)
    if size is not None and size <= cfg.max_inline_preparation_mb * 2**20:
        return
    what = "a Hugging Face Hub dataset" if size is None else f"{size / 2**20:,.0f} MiB of files"
    raise PreparationRequired(
        f"the data is not prepared: data.cache_dir={cfg.cache_dir} holds no prepared instances for this config, and "
        f"the corpus ({what}) is too large to prepare while {num_processes - 1} other process(es) wait at a barrier "
        f"(data.max_inline_preparation_mb={cfg.max_inline_preparation_mb:g}; NCCL's barrier times out after 10 "
        f"minutes). Prepare it once, on any machine that sees data.cache_dir "
        f"(a CPU node will do), with the same arguments:\n    {prepare_command}\nthen start the training again"
    )


def build_pretraining_data(
    cfg: DataConfig,
    *,
    seed: int,
    save_tokenizer_to: Path | None = None,
    main_process_first: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    model_vocab_size: int | None = None,
    num_processes: int = 1,
    prepare_command: str = "python -m pretrain.prepare [the same arguments]",
    progress: bool = False,
    trained_tokenizer: Path | None = None,
) -> PretrainingData:
    """Tokenizer, training and validation instances; built once (inside ``main_process_first()``), then reused
    from ``cfg.cache_dir`` by every later call with the same inputs. In streaming mode the training instances
    are made on the fly and only the validation instances are materialised. The corpus is read only when
    something is not cached, and then once.

    With several processes (``num_processes``) a large corpus must have been prepared by ``pretrain/prepare.py``
    (``prepare_command``): otherwise PreparationRequired is raised before any process waits at a barrier.
    ``trained_tokenizer``: where the main process saved the tokenizer it trained (for the other processes, whose
    own cache may not have it: another node's)."""
    check_prepared_for_distributed(cfg, seed=seed, num_processes=num_processes, prepare_command=prepare_command)

    @functools.cache
    def documents() -> tuple[datasets.Dataset | datasets.IterableDataset, datasets.Dataset]:
        return split_documents(load_documents(cfg, seed=seed), cfg, seed=seed)

    with main_process_first():
        tokenizer = load_or_train_tokenizer(
            cfg,
            save_dir=save_tokenizer_to,
            model_vocab_size=model_vocab_size,
            seed=seed,
            training_texts=lambda: document_texts(documents()[0]),
            trained_elsewhere=trained_tokenizer if trained_tokenizer is not None and trained_tokenizer.is_dir() else None,
        )
        if cfg.streaming:
            train_docs, val_docs = documents()
            validation = make_instances(val_docs, tokenizer, cfg, seed=seed, validation=True)
            train = stream_instances(train_docs, tokenizer, cfg, seed=seed)
        else:
            train, validation = cached_instances(documents, tokenizer, cfg, seed=seed, progress=progress)
    return PretrainingData(train=train, validation=validation, tokenizer=tokenizer)


__all__ = [
    "DataConfig",
    "MaskingCollator",
    "PreparationRequired",
    "PretrainingData",
    "SourceConfig",
    "build_pretraining_data",
    "is_prepared",
]
