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
from pretrain.corpus import SourceConfig, document_texts, load_documents, split_documents
from pretrain.instances import OBJECTIVES, cached_instances, make_instances, stream_instances
from pretrain.tokenizer import MIN_PLAUSIBLE_VOCAB, load_or_train_tokenizer


@dataclass(kw_only=True)
class DataConfig:
    """Corpus, tokenizer and instance creation for pretraining."""

    sources: list[SourceConfig] = field(default_factory=lambda: [SourceConfig()])
    """Corpus sources; several are mixed by weight."""
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

    def __post_init__(self) -> None:
        # Configs parsed from YAML arrive as dicts.
        self.sources = [SourceConfig(**s) if isinstance(s, dict) else s for s in self.sources]
        if not self.sources:
            raise ValueError("data.sources must list at least one source (e.g. [{kind: python_docs}])")
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
        for key in ("tokenizer_train_documents", "shuffle_buffer_size", "num_proc"):
            if getattr(self, key) < 1:
                raise ValueError(f"data.{key}={getattr(self, key)} must be >= 1")


class PretrainingData(NamedTuple):
    train: datasets.Dataset | datasets.IterableDataset
    """input_ids, token_type_ids, next_sentence_label (mlm_nsp only), instance_id (unique)."""
    validation: datasets.Dataset
    """Same columns, from held-out documents; always materialised."""
    tokenizer: PreTrainedTokenizerFast


def build_pretraining_data(
    cfg: DataConfig,
    *,
    seed: int,
    save_tokenizer_to: Path | None = None,
    main_process_first: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    model_vocab_size: int | None = None,
) -> PretrainingData:
    """Tokenizer, training and validation instances; built once (inside ``main_process_first()``), then reused
    from ``cfg.cache_dir`` by every later call with the same inputs. In streaming mode the training instances
    are made on the fly and only the validation instances are materialised. The corpus is read only when
    something is not cached, and then once."""

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
        )
        if cfg.streaming:
            train_docs, val_docs = documents()
            validation = make_instances(val_docs, tokenizer, cfg, seed=seed, validation=True)
            train = stream_instances(train_docs, tokenizer, cfg, seed=seed)
        else:
            train, validation = cached_instances(documents, tokenizer, cfg, seed=seed)
    return PretrainingData(train=train, validation=validation, tokenizer=tokenizer)


__all__ = ["DataConfig", "MaskingCollator", "PretrainingData", "SourceConfig", "build_pretraining_data"]
