"""Pretraining data: corpus sources, the WordPiece tokenizer, BERT instances and dynamic masking.

The pipeline, top to bottom:

    sources (Hub / JSONL / Parquet / text / python_docs)  --weights-->  one stream of documents
      -> held-out documents (validation, split BY DOCUMENT before anything else, as the paper's 199:1)
      -> tokenizer (Hub / local folder, or WordPiece trained on the training documents)
      -> chunks of documents -> sentences -> token ids -> instances as in original BERT's
         ``create_pretraining_data.py`` ([CLS] A [SEP] B [SEP] with next-sentence labels, or packed
         full-length sequences for the "mlm" objective)
      -> cached with ``Dataset.save_to_disk`` under ``data.cache_dir``, keyed by a hash of the inputs
    MaskingCollator: pads a batch and applies BERT's 80/10/10 masking, a pure function of
    (seed, epoch, instance_id), so resumed runs and any number of DataLoader workers see the same masks.

Instances are made from chunks of ``DOCS_PER_CHUNK`` documents: the chunk is the unit of work of the
batched ``datasets.map`` (so ``num_proc`` workers never change the result) and the pool the random
"next sentence" documents are drawn from. Validation documents go through the same code.
"""

from __future__ import annotations

import ast
import codecs
import contextlib
import dataclasses
import gc
import glob
import hashlib
import json
import logging
import os
import random
import re
import shutil
import sys
import sysconfig
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from itertools import chain, islice
from pathlib import Path
from typing import Any, NamedTuple

import datasets
import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, BertTokenizerFast, PreTrainedTokenizerBase, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

SOURCE_KINDS: tuple[str, ...] = ("hub", "json", "parquet", "text", "python_docs")
OBJECTIVES: tuple[str, ...] = ("mlm_nsp", "mlm")
# Order fixes the ids of a trained tokenizer: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4.
SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# Documents per unit of instance creation (and pool for random next segments). Part of the cache key.
DOCS_PER_CHUNK = 256
# A tokenizer this small is a loading accident (transformers 5 can return a ~5-token stub), not a vocabulary.
MIN_PLAUSIBLE_VOCAB = 100
# instance_id = chunk_index << ID_SHIFT | position in chunk; validation chunks are offset by VALIDATION_ID_OFFSET.
ID_SHIFT = 24
VALIDATION_ID_OFFSET = 1 << 60
STREAMING_VALIDATION_DOCUMENTS = 1000
# Bump when the instance format or algorithm changes, so stale caches are never reused.
CACHE_FORMAT_VERSION = 3
LOCAL_SUFFIXES: dict[str, tuple[str, ...]] = {
    "json": (".json", ".jsonl", ".json.gz", ".jsonl.gz"),
    "parquet": (".parquet",),
    "text": (".txt", ".text"),
}


# ----------------------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class SourceConfig:
    """One corpus source."""

    kind: str = "python_docs"
    """"hub" (``datasets.load_dataset(path, name, split=split)``), "json" (JSON Lines), "parquet", "text"
    (plain text: documents separated by blank lines, one sentence or paragraph per line, as original BERT's
    input files) or "python_docs" (English documentation shipped with the Python interpreter; no download)."""
    path: str = ""
    """Hub dataset name (e.g. "wikipedia"), or a local file, glob or folder for json|parquet|text."""
    name: str | None = None
    """Hub dataset configuration name (e.g. "20220301.en"); only for kind "hub"."""
    split: str = "train"
    """Hub split to read; only for kind "hub" (local files form one split)."""
    text_column: str = "text"
    """Column holding the document text (json, parquet, hub)."""
    weight: float = 1.0
    """Relative sampling weight when several sources are mixed: documents are drawn from source i with
    probability weight_i / sum(weights) until the first source runs out (no document is repeated)."""

    def __post_init__(self) -> None:
        if self.kind not in SOURCE_KINDS:
            raise ValueError(f"data.sources[].kind={self.kind!r} is unknown; must be one of {', '.join(SOURCE_KINDS)}")
        if self.kind != "python_docs" and not self.path:
            raise ValueError(f"data.sources[].path is required for kind {self.kind!r} (a Hub dataset name or a file)")
        if not (self.weight > 0 and np.isfinite(self.weight)):
            raise ValueError(f"data.sources[].weight={self.weight} must be a positive number")
        if self.kind != "hub" and (self.name is not None or self.split != "train"):
            raise ValueError(
                f"data.sources[].name/split only apply to kind 'hub' (got kind {self.kind!r}, name={self.name!r}, "
                f"split={self.split!r}); local files form one split: point path at the files of the split you want"
            )
        if self.kind == "python_docs" and self.path:
            raise ValueError(f"data.sources[].path={self.path!r} is not used by kind 'python_docs'; remove it")
        if not self.text_column:
            raise ValueError("data.sources[].text_column must name the column holding the text (e.g. 'text')")


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


# ----------------------------------------------------------------------------------------------------------------------
# Sources -> documents
# ----------------------------------------------------------------------------------------------------------------------

_SKIPPED_STDLIB_DIRS = {
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "site-packages",
    "dist-packages",
    "turtledemo",
    "ensurepip",
    "__pycache__",
    "pydoc_data",
}
# Modules with a one-line docstring (or test strings such as "¶ π 😀") are not prose worth a document.
_MIN_PYTHON_DOC_WORDS = 20


def _reflow(text: str) -> str:
    """Join hard-wrapped lines into one line per paragraph (blank-line separated), so that the sentence
    splitter, which treats every line as a paragraph, sees whole sentences."""
    paragraphs = (" ".join(p.split()) for p in re.split(r"\n\s*\n", text))
    return "\n".join(p for p in paragraphs if p)


_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _documented_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Module, class and function nodes in source order, descending only through statement lists (the bodies of
    classes, functions, if/try/with/for blocks): ast.walk into every expression costs several times more."""
    if isinstance(node, _DOCUMENTED):
        yield node
    for name in ("body", "orelse", "finalbody", "handlers"):
        for child in getattr(node, name, ()):
            if isinstance(child, ast.stmt | ast.excepthandler):
                yield from _documented_nodes(child)


def _module_docstrings(path: Path) -> str:
    """Module, class and function docstrings of one Python file, in source order."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError):  # a stdlib file for another Python version; not worth a crash
        return ""
    return "\n\n".join(d for d in (ast.get_docstring(n) for n in _documented_nodes(tree)) if d)


def iter_python_docs() -> Iterator[str]:
    """The "python_docs" corpus: English documentation shipped with the running Python interpreter, so a tiny
    model can be pretrained with no download.

    1. ``pydoc_data.topics.topics``: the language reference topics behind ``help("if")`` etc.
       (79 documents, about 465 KB in Python 3.11).
    2. One document per standard-library module: its module, class and function docstrings, parsed with
       ``ast`` (not imported) from the stdlib folder, skipping tests, idlelib, lib2to3 and site-packages
       (about 380 documents, 1.5 MB in Python 3.11).

    Lines are reflowed to one paragraph per line. Together about 460 documents, 2 MB of text, 0.3M words: enough for a
    few hundred steps of a tiny model, not for a real BERT.
    """
    from pydoc_data.topics import topics

    for name in sorted(topics):
        text = _reflow(topics[name])
        if len(text.split()) >= _MIN_PYTHON_DOC_WORDS:
            yield text
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for folder, subdirs, files in os.walk(stdlib):
        subdirs[:] = sorted(d for d in subdirs if d not in _SKIPPED_STDLIB_DIRS and not d.startswith("config-"))
        for file in sorted(f for f in files if f.endswith(".py")):
            text = _reflow(_module_docstrings(Path(folder) / file))
            if len(text.split()) >= _MIN_PYTHON_DOC_WORDS:
                yield text


def _python_docs_generator(max_documents: int | None, python_version: str) -> Iterator[dict[str, str]]:
    """Rows for ``datasets``' generator builders; ``python_version`` only keys datasets' cache (the stdlib changes
    with it), so later builds skip the few seconds of parsing."""
    for text in islice(iter_python_docs(), max_documents):
        yield {"text": text}


def resolve_local_files(source: SourceConfig, index: int) -> list[Path]:
    """The files of a json|parquet|text source: one file, a glob, or every matching file under a folder."""
    where = f"data.sources[{index}].path={source.path!r}"
    path = Path(source.path).expanduser()
    if glob.has_magic(source.path):
        files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(LOCAL_SUFFIXES[source.kind]))
    elif path.is_file():
        files = [path]
    else:
        raise FileNotFoundError(
            f"{where}: no such file or folder ({path.resolve()}); fix the path of the {source.kind} source"
        )
    if not files:
        raise FileNotFoundError(
            f"{where}: no {source.kind} files ({', '.join(LOCAL_SUFFIXES[source.kind])}) found; fix the path or glob"
        )
    return files


def check_utf8(path: Path, *, chunk_bytes: int = 1 << 24) -> None:
    """Raise a ValueError naming the file, byte offset and line of the first invalid UTF-8 sequence.

    Without this, the json/text readers fail deep inside pyarrow or silently drop text.
    """
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset, line = 0, 1
    with path.open("rb") as f:
        while True:
            chunk = f.read(chunk_bytes)
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                # e.object is the decoder's pending bytes from the previous chunk followed by this chunk.
                pending = len(e.object) - len(chunk)
                bad = offset - pending + e.start
                bad_line = line + e.object[pending : e.start].count(b"\n") if e.start >= pending else line
                raise ValueError(
                    f"{path}: invalid UTF-8 at byte offset {bad} (line {bad_line}): {e.reason}. The corpus must be "
                    f"UTF-8; re-encode it, e.g. `iconv -f latin1 -t utf-8 {path.name} > utf8-{path.name}`"
                ) from None
            if not chunk:
                return
            line += chunk.count(b"\n")
            offset += len(chunk)


def check_json_lines(path: Path, text_column: str, where: str) -> None:
    """Validate a JSON Lines file before ``datasets`` reads it: a line that is not JSON stops with the file and
    line (``datasets`` buries it in a long DatasetGenerationError); lines whose ``text_column`` is missing or
    not a string are counted and reported (they would be dropped or converted silently); a file where every
    line is like that is refused. A ``.json`` file that is one JSON document (not JSON Lines) is left alone."""
    bad, total, first_bad = 0, 0, None
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                if line_no == 1 and path.suffix == ".json":
                    return  # a pretty-printed JSON document: datasets reads it as a whole
                raise ValueError(
                    f"{where}: {path} line {line_no} is not valid JSON ({err.msg} at column {err.colno}); every "
                    "line of a JSON Lines corpus must be one JSON object"
                ) from None
            total += 1
            if not isinstance(record, dict) or not isinstance(record.get(text_column), str):
                bad += 1
                first_bad = first_bad or line_no
    if total and bad == total:
        raise ValueError(
            f"{where}: {path}: none of its {total} lines has a string {text_column!r} field; set "
            "data.sources[...].text_column to the field that holds the text"
        )
    if bad:
        print(
            f"warning: {where}: {path}: {bad} of {total} lines have no string {text_column!r} field (first: line "
            f"{first_bad}); they are skipped",
            file=sys.stderr,
        )


def source_fingerprint(source: SourceConfig, index: int) -> dict[str, Any]:
    """What identifies a source's content for the cache key: files' paths, sizes and mtimes, or the Hub ids."""
    fields = dataclasses.asdict(source)
    if source.kind in LOCAL_SUFFIXES:
        stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in resolve_local_files(source, index)]
        return {**fields, "files": stats}
    if source.kind == "python_docs":
        return {**fields, "python": sys.version, "stdlib": sysconfig.get_paths()["stdlib"]}
    return fields


def _load_source(source: SourceConfig, index: int, cfg: DataConfig) -> datasets.Dataset | datasets.IterableDataset:
    """One source as a dataset with a single string column "text", empty documents dropped."""
    where = (
        f"data.sources[{index}] ({source.kind} {source.path!r})"
        if source.path
        else f"data.sources[{index}] ({source.kind})"
    )
    hf_cache = str(Path(cfg.cache_dir) / "hf")
    if source.kind == "python_docs":
        if cfg.streaming:
            gen_kwargs = {"max_documents": None, "python_version": sys.version}
            ds = datasets.IterableDataset.from_generator(_python_docs_generator, gen_kwargs=gen_kwargs)
        else:
            gen_kwargs = {"max_documents": cfg.max_documents, "python_version": sys.version}
            ds = datasets.Dataset.from_generator(_python_docs_generator, gen_kwargs=gen_kwargs, cache_dir=hf_cache)
    elif source.kind == "hub":
        try:
            ds = datasets.load_dataset(
                source.path, source.name, split=source.split, streaming=cfg.streaming, cache_dir=hf_cache
            )
        except (FileNotFoundError, ConnectionError) as e:  # DatasetNotFoundError, or offline: name the config key
            raise FileNotFoundError(
                f"{where}: Hub dataset not found or not reachable ({e}); check data.sources[{index}].path and .name"
            ) from e
    else:
        files = resolve_local_files(source, index)
        if all(p.stat().st_size == 0 for p in files):
            raise ValueError(f"{where}: empty corpus, every file is empty: {', '.join(map(str, files))}")
        if source.kind in ("json", "text"):
            for p in files:
                if not p.name.endswith(".gz"):
                    check_utf8(p)
                    if source.kind == "json":
                        check_json_lines(p, source.text_column, where)
        # "text": blank-line separated blocks are documents, as in original BERT's input files.
        extra = {"sample_by": "paragraph"} if source.kind == "text" else {}
        ds = datasets.load_dataset(
            source.kind,
            data_files=[str(p) for p in files],
            split="train",
            streaming=cfg.streaming,
            cache_dir=hf_cache,
            **extra,
        )
    columns = ds.column_names
    if columns is None:  # a streamed source without declared features: look at the first record
        first = next(iter(ds), None)
        if first is None:
            raise ValueError(f"{where}: empty corpus, no documents")
        columns = list(first)
    if source.text_column not in columns:
        raise ValueError(
            f"{where}: text column {source.text_column!r} not found; columns are {columns}. "
            f"Set data.sources[{index}].text_column"
        )
    ds = ds.select_columns([source.text_column])
    if source.text_column != "text":
        ds = ds.rename_column(source.text_column, "text")
    if not cfg.streaming and source.kind != "python_docs" and cfg.max_documents is not None:
        ds = ds.select(range(min(len(ds), cfg.max_documents)))
    elif cfg.streaming and cfg.max_documents is not None:
        ds = ds.take(cfg.max_documents)
    ds = ds.filter(_has_text, batched=True)
    if cfg.streaming:
        if next(iter(ds), None) is None:
            raise ValueError(f"{where}: empty corpus, no document has text in column {source.text_column!r}")
    elif len(ds) == 0:
        raise ValueError(f"{where}: empty corpus, no document has text in column {source.text_column!r}")
    if ds.features is not None and ds.features["text"] != datasets.Value("string"):
        ds = ds.cast_column("text", datasets.Value("string"))
    return ds


def _has_text(batch: dict[str, list]) -> list[bool]:
    return [isinstance(t, str) and not t.isspace() and t != "" for t in batch["text"]]


def load_documents(cfg: DataConfig, *, seed: int) -> datasets.Dataset | datasets.IterableDataset:
    """All sources mixed by weight into one dataset of documents (column "text"), at most max_documents."""
    parts = [_load_source(s, i, cfg) for i, s in enumerate(cfg.sources)]
    if len(parts) == 1:
        docs = parts[0]
    else:
        weights = np.array([s.weight for s in cfg.sources], dtype=float)
        docs = datasets.interleave_datasets(
            parts, probabilities=(weights / weights.sum()).tolist(), seed=seed, stopping_strategy="first_exhausted"
        )
    if cfg.max_documents is not None:
        docs = docs.take(cfg.max_documents) if cfg.streaming else docs.select(range(min(len(docs), cfg.max_documents)))
    return docs


def split_documents(docs: datasets.Dataset, cfg: DataConfig, *, seed: int) -> tuple[datasets.Dataset, datasets.Dataset]:
    """(train, validation) documents: a seeded random validation_fraction of the documents (at least one) is held
    out before any instance is made, so no document contributes to both. Train documents come shuffled."""
    n = len(docs)
    if n < 2:
        raise ValueError(f"the corpus has {n} document(s); at least 2 are needed (one to train, one to validate)")
    n_val = cfg.validation_documents or max(1, round(cfg.validation_fraction * n))
    if n_val >= n:
        raise ValueError(f"data.validation_documents={n_val} leaves no training documents out of {n}; lower it")
    order = np.random.default_rng([seed, 0xD0C5]).permutation(n)
    return docs.select(order[n_val:]), docs.select(np.sort(order[:n_val]))


def _streaming_validation_count(cfg: DataConfig) -> int:
    if cfg.validation_documents is not None:
        return cfg.validation_documents
    if cfg.max_documents is not None:
        return max(1, round(cfg.validation_fraction * cfg.max_documents))
    return STREAMING_VALIDATION_DOCUMENTS


# ----------------------------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------------------------


def train_wordpiece_tokenizer(texts: Iterable[str], *, vocab_size: int, lowercase: bool = True) -> BertTokenizerFast:
    """A BERT WordPiece tokenizer trained on ``texts`` (BERT normaliser and pre-tokenizer, [CLS]/[SEP] template),
    with [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), min_frequency=2)
    tok.train_from_iterator(texts, trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return BertTokenizerFast(tokenizer_object=tok, do_lower_case=lowercase, strip_accents=lowercase)


def check_tokenizer(tokenizer: PreTrainedTokenizerBase, *, name: str, model_vocab_size: int | None = None) -> None:
    """Reject tokenizers that cannot feed BERT pretraining, with the fix in the message."""
    if not tokenizer.is_fast:
        raise ValueError(f"tokenizer {name!r} is not a fast (Rust) tokenizer; pretraining needs one")
    size = len(tokenizer)
    if size < MIN_PLAUSIBLE_VOCAB:
        raise ValueError(
            f"tokenizer {name!r} has only {size} tokens; that is not a real vocabulary (a wrong name or folder can "
            f"load a stub). Check data.tokenizer, or set it to null to train a WordPiece tokenizer"
        )
    missing = [t for t in ("cls_token", "sep_token", "mask_token", "pad_token") if getattr(tokenizer, t) is None]
    missing += [t for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]") if t not in tokenizer.get_vocab()]
    if missing:
        raise ValueError(f"tokenizer {name!r} lacks BERT special tokens {missing}; use a BERT (WordPiece) tokenizer")
    if model_vocab_size is not None and size > model_vocab_size:
        raise ValueError(
            f"tokenizer {name!r} has {size} tokens but the model's vocabulary has {model_vocab_size}; "
            f"set model.vocab_size >= {size} (or a smaller data.vocab_size for a trained tokenizer)"
        )


def _load_named_tokenizer(name: str) -> PreTrainedTokenizerFast:
    path = Path(name).expanduser()
    looks_local = path.is_absolute() or name.startswith((".", "~")) or path.exists()
    if looks_local and not path.is_dir():
        raise FileNotFoundError(f"data.tokenizer={name!r}: no such tokenizer folder ({path.resolve()})")
    try:
        return AutoTokenizer.from_pretrained(str(path) if looks_local else name)
    except (OSError, ValueError) as e:  # not on the Hub, offline, or no tokenizer files in the repo
        raise ValueError(
            f"data.tokenizer={name!r}: tokenizer not found (neither a local folder nor loadable from the Hugging Face "
            f"Hub: {e}). Fix the name, or set data.tokenizer to null to train a WordPiece tokenizer"
        ) from e


# DataConfig fields a trained tokenizer depends on (besides the sources and the seed, which pick the documents).
_TOKENIZER_KEY_FIELDS = ("vocab_size", "lowercase", "validation_fraction", "validation_documents", "max_documents",
                         "tokenizer_train_documents", "streaming")  # fmt: skip


def _tokenizer_cache_key(cfg: DataConfig, seed: int) -> str:
    sources = [source_fingerprint(s, i) for i, s in enumerate(cfg.sources)]
    fields = {k: getattr(cfg, k) for k in _TOKENIZER_KEY_FIELDS}
    return _hash({"version": CACHE_FORMAT_VERSION, "sources": sources, "seed": seed, **fields})


def load_or_train_tokenizer(
    cfg: DataConfig,
    *,
    save_dir: Path | None = None,
    model_vocab_size: int | None = None,
    seed: int = 0,
    training_texts: Callable[[], Iterable[str]] | None = None,
) -> PreTrainedTokenizerFast:
    """The tokenizer named by ``data.tokenizer`` (Hub name or local folder), or a WordPiece tokenizer trained on
    the training documents (cached under cache_dir, keyed by the corpus, seed and tokenizer fields).

    ``training_texts`` returns the training documents' texts (build_pretraining_data passes the ones it already
    read); by default the corpus is read and split here. Saved to ``save_dir`` (a folder AutoTokenizer opens).
    """
    if cfg.tokenizer is not None:
        tokenizer = _load_named_tokenizer(cfg.tokenizer)
        name = cfg.tokenizer
    else:
        cached = Path(cfg.cache_dir) / f"tokenizer-{_tokenizer_cache_key(cfg, seed)}"
        name = f"WordPiece trained on the corpus ({cached})"
        if not (cached / "tokenizer.json").is_file():
            texts = training_texts() if training_texts is not None else _training_texts(cfg, seed)
            tokenizer = train_wordpiece_tokenizer(
                islice(texts, cfg.tokenizer_train_documents), vocab_size=cfg.vocab_size, lowercase=cfg.lowercase
            )
            with _atomic_dir(cached) as tmp:
                tokenizer.save_pretrained(tmp)
        tokenizer = AutoTokenizer.from_pretrained(str(cached))
    check_tokenizer(tokenizer, name=name, model_vocab_size=model_vocab_size)
    if save_dir is not None:
        tokenizer.save_pretrained(save_dir)
    return tokenizer


def _training_texts(cfg: DataConfig, seed: int) -> Iterator[str]:
    docs = load_documents(cfg, seed=seed)
    if cfg.streaming:
        train = docs.skip(_streaming_validation_count(cfg))
    else:
        train, _ = split_documents(docs, cfg, seed=seed)
    return _texts(train)


def _texts(docs: datasets.Dataset | datasets.IterableDataset) -> Iterator[str]:
    for batch in docs.iter(batch_size=1000):
        yield from batch["text"]


# ----------------------------------------------------------------------------------------------------------------------
# Documents -> sentences -> token ids -> instances
# ----------------------------------------------------------------------------------------------------------------------

# A sentence ends at . ! or ? (optionally followed by a closing quote or bracket) before whitespace and an
# upper-case letter, digit or opening quote/bracket. Crude, but sentence boundaries only need to be roughly right
# for NSP; original BERT's input was one sentence per line from a similar heuristic.
# The pattern starts with the punctuation (not a look-behind), so the regex engine can skip ahead: 3x faster.
_SENTENCE_END = re.compile(r"([.!?][\"')\]]?)\s+(?=[\"'(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Paragraphs (lines) split into sentences; empty pieces dropped (whitespace-only ones tokenise to nothing)."""
    # One regex pass over the whole document: a sentence end becomes a line break.
    return [s for s in _SENTENCE_END.sub("\\1\n", text).split("\n") if s]


def tokenize_documents(texts: list[str], tokenizer: Tokenizer) -> list[list[list[int]]]:
    """Per document, its sentences as token ids (no special tokens), in one batched call of the Rust tokenizer."""
    per_doc = [split_sentences(t) for t in texts]
    flat = [s for sents in per_doc for s in sents]
    ids = [e.ids for e in tokenizer.encode_batch_fast(flat, add_special_tokens=False)] if flat else []
    out, pos = [], 0
    for sents in per_doc:
        doc = [s for s in ids[pos : pos + len(sents)] if s]
        pos += len(sents)
        if doc:
            out.append(doc)
    return out


def _truncated_lengths(len_a: int, len_b: int, max_total: int) -> tuple[int, int]:
    """Lengths after BERT's truncate_seq_pair: it removes one token at a time from the longer segment (B on ties)."""
    excess = len_a + len_b - max_total
    if excess <= 0:
        return len_a, len_b
    gap = min(excess, abs(len_a - len_b))
    if len_a > len_b:
        len_a -= gap
    else:
        len_b -= gap
    excess -= gap
    # Equal lengths from here: removals alternate, starting with B.
    return len_a - excess // 2, len_b - (excess + 1) // 2


def _truncate(tokens: list[int], keep: int, rng: random.Random) -> list[int]:
    """Keep ``keep`` tokens; as BERT, each removed token comes from the front or the back with probability 1/2."""
    removed = len(tokens) - keep
    if removed <= 0:
        return tokens
    front = rng.getrandbits(removed).bit_count()  # Binomial(removed, 1/2): one fair coin per removed token
    return tokens[front : front + keep]


def create_nsp_instances(
    documents: list[list[list[int]]], cfg: DataConfig, rng: random.Random, *, cls_id: int, sep_id: int
) -> list[tuple[list[int], int, int]]:
    """BERT's create_instances_from_document over a pool of documents (each a list of token-id sentences).

    Returns (input_ids, length of "[CLS] A [SEP]", is_random_next) per instance. Sentences accumulate up to a
    target length (max_seq_length - 3, or with probability short_seq_prob a random shorter one); A is a random
    prefix of the accumulated chunk; B is the rest (label 0) or, with probability nsp_random_prob, a segment of
    another document in the pool (label 1), in which case the unused sentences are put back.
    """
    max_tokens = cfg.max_seq_length - 3
    instances = []
    for d, doc in enumerate(documents):
        target = max_tokens
        if rng.random() < cfg.short_seq_prob:
            target = rng.randint(2, max_tokens)
        chunk: list[list[int]] = []
        length, i = 0, 0
        while i < len(doc):
            chunk.append(doc[i])
            length += len(doc[i])
            if i == len(doc) - 1 or length >= target:
                if len(chunk) == 1 and len(chunk[0]) >= 2:
                    # One over-long sentence: split it at a random token. (BERT forces a random next here, which
                    # skews the labels towards 1 on corpora with long sentences.)
                    cut = rng.randrange(1, len(chunk[0]))
                    chunk, a_end, unused = [chunk[0][:cut], chunk[0][cut:]], 1, 0
                else:
                    a_end = rng.randrange(1, len(chunk)) if len(chunk) >= 2 else 1
                    unused = len(chunk) - a_end
                tokens_a = list(chain.from_iterable(chunk[:a_end]))
                random_next = len(documents) > 1 and (len(chunk) == 1 or rng.random() < cfg.nsp_random_prob)
                if random_next:
                    other = rng.randrange(len(documents) - 1)
                    other += other >= d  # any document but this one
                    pool = documents[other]
                    start = rng.randrange(len(pool))
                    tokens_b: list[int] = []
                    for sentence in pool[start:]:
                        tokens_b.extend(sentence)
                        if len(tokens_b) >= target - len(tokens_a):
                            break
                    i -= unused  # put the unused sentences back (the rest of a split sentence is dropped)
                else:
                    tokens_b = list(chain.from_iterable(chunk[a_end:]))
                if tokens_b:  # empty only for a one-sentence chunk with no other document to draw from
                    len_a, len_b = _truncated_lengths(len(tokens_a), len(tokens_b), max_tokens)
                    tokens_a, tokens_b = _truncate(tokens_a, len_a, rng), _truncate(tokens_b, len_b, rng)
                    instances.append(([cls_id, *tokens_a, sep_id, *tokens_b, sep_id], len_a + 2, int(random_next)))
                chunk, length = [], 0
            i += 1
    return instances


def create_packed_instances(
    documents: list[list[list[int]]], cfg: DataConfig, *, cls_id: int, sep_id: int
) -> list[list[int]]:
    """The "mlm" objective: documents joined with [SEP] and cut into full-length [CLS] ... [SEP] sequences
    (the last one of the pool may be shorter)."""
    stream = list(chain.from_iterable(chain(chain.from_iterable(doc), (sep_id,)) for doc in documents))
    body = cfg.max_seq_length - 2
    return [[cls_id, *stream[k : k + body], sep_id] for k in range(0, len(stream), body)]


def _stable_hash63(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def _instances_from_chunks(
    batch: dict[str, list], indices: list[int], *, tokenizer: Tokenizer, cfg: DataConfig, seed: int, part: str
) -> dict[str, list]:
    """Batched map function: each input row is a chunk of documents (column "text": list[str]); outputs instances.

    ``part`` is "train" or "validation" (materialised: instance_id = chunk index << ID_SHIFT | position, validation
    offset by VALIDATION_ID_OFFSET) or "stream" (ids and randomness keyed by the chunk's content, because stream
    positions restart in every DataLoader worker that reads a shard).
    """
    out: dict[str, list] = {"input_ids": [], "token_type_ids": [], "instance_id": []}
    if cfg.objective == "mlm_nsp":
        out["next_sentence_label"] = []
    with _gc_paused():
        for texts, chunk_index in zip(batch["text"], indices, strict=True):
            _add_chunk_instances(out, texts, chunk_index, tokenizer=tokenizer, cfg=cfg, seed=seed, part=part)
    return out


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: the millions of small acyclic lists made here would otherwise trigger
    collections that cost ~8% of the preprocessing time. Nothing made here forms a reference cycle."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _add_chunk_instances(
    out: dict[str, list],
    texts: list[str],
    chunk_index: int,
    *,
    tokenizer: Tokenizer,
    cfg: DataConfig,
    seed: int,
    part: str,
) -> None:
    """Append the instances of one chunk of documents to the columns in ``out``."""
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    documents = tokenize_documents(texts, tokenizer)
    if part == "stream":
        chunk_key = _stable_hash63(f"{len(texts)}/{texts[0]}")
        make_id = partial(_stream_instance_id, chunk_key)
    else:
        chunk_key = chunk_index
        make_id = ((VALIDATION_ID_OFFSET if part == "validation" else 0) + (chunk_index << ID_SHIFT)).__add__
    if cfg.objective == "mlm":
        for k, ids in enumerate(create_packed_instances(documents, cfg, cls_id=cls_id, sep_id=sep_id)):
            out["input_ids"].append(ids)
            out["token_type_ids"].append([0] * len(ids))
            out["instance_id"].append(make_id(k))
        return
    if len(documents) == 1:
        logger.warning("a chunk of %s documents has a single document: its next-sentence labels are all 0", part)
    # Python's generator: scalar draws cost ~0.1 us against ~2 us for numpy's. String seeds are stable.
    rng = random.Random(f"{seed}/{part}/{chunk_key}")
    for k, (ids, len_cls_a_sep, label) in enumerate(
        create_nsp_instances(documents, cfg, rng, cls_id=cls_id, sep_id=sep_id)
    ):
        out["input_ids"].append(ids)
        out["token_type_ids"].append([0] * len_cls_a_sep + [1] * (len(ids) - len_cls_a_sep))
        out["next_sentence_label"].append(label)
        out["instance_id"].append(make_id(k))


def _stream_instance_id(chunk_key: int, k: int) -> int:
    return _stable_hash63(f"{chunk_key}/{k}")


def instance_features(objective: str) -> datasets.Features:
    features = {
        "input_ids": datasets.List(datasets.Value("int32")),
        "token_type_ids": datasets.List(datasets.Value("int8")),
        "instance_id": datasets.Value("int64"),
    }
    if objective == "mlm_nsp":
        features["next_sentence_label"] = datasets.Value("int8")
    return datasets.Features(features)


def _plain_backend(tokenizer: PreTrainedTokenizerFast) -> Tokenizer:
    """A copy of the Rust tokenizer with truncation and padding off (a loaded tokenizer.json may enable them)."""
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    return backend


def make_instances(
    docs: datasets.Dataset,
    tokenizer: PreTrainedTokenizerFast,
    cfg: DataConfig,
    *,
    seed: int,
    validation: bool,
    work_dir: Path | None = None,
) -> datasets.Dataset:
    """Instances from materialised documents, in chunks of DOCS_PER_CHUNK documents, num_proc workers."""
    chunks = docs.batch(batch_size=DOCS_PER_CHUNK)
    num_proc = min(cfg.num_proc, len(chunks)) if cfg.num_proc > 1 else None
    name = "validation" if validation else "train"
    return chunks.map(
        _instances_from_chunks,
        batched=True,
        batch_size=1,
        with_indices=True,
        remove_columns=chunks.column_names,
        features=instance_features(cfg.objective),
        fn_kwargs={"tokenizer": _plain_backend(tokenizer), "cfg": cfg, "seed": seed, "part": name},
        num_proc=num_proc,
        # Our own cache key decides reuse; skip datasets' function hashing and keep its files in our work dir.
        new_fingerprint=f"lnbert-{name}-{uuid.uuid4().hex}",
        cache_file_name=str(work_dir / f"{name}.arrow") if work_dir is not None else None,
        desc=f"Tokenising and making {name} instances",
    )


def stream_instances(
    docs: datasets.IterableDataset, tokenizer: PreTrainedTokenizerFast, cfg: DataConfig, *, seed: int
) -> datasets.IterableDataset:
    """Training instances made on the fly from a document stream (shuffled with a buffer; set_epoch reshuffles)."""
    chunks = docs.shuffle(seed=seed, buffer_size=cfg.shuffle_buffer_size).batch(batch_size=DOCS_PER_CHUNK)
    return chunks.map(
        _instances_from_chunks,
        batched=True,
        batch_size=1,
        with_indices=True,
        remove_columns=["text"],
        features=instance_features(cfg.objective),
        fn_kwargs={"tokenizer": _plain_backend(tokenizer), "cfg": cfg, "seed": seed, "part": "stream"},
    )


# ----------------------------------------------------------------------------------------------------------------------
# Cache and entry point
# ----------------------------------------------------------------------------------------------------------------------


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:20]


# DataConfig fields that do not change the instances: masking is dynamic, the rest are mechanics, and the
# tokenizer's name (it enters the key by content, so a run handed a trained tokenizer's folder reuses its instances).
_FIELDS_NOT_IN_KEY = {"mlm_probability", "cache_dir", "num_proc", "streaming", "shuffle_buffer_size", "tokenizer"}


def data_cache_key(cfg: DataConfig, tokenizer: PreTrainedTokenizerFast, *, seed: int) -> str:
    """Hash of everything the instances depend on: sources' content ids, the tokenizer, the config, the seed."""
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in _FIELDS_NOT_IN_KEY}
    fields["sources"] = [source_fingerprint(s, i) for i, s in enumerate(cfg.sources)]
    vocab_hash = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()
    return _hash(
        {
            "version": CACHE_FORMAT_VERSION,
            "docs_per_chunk": DOCS_PER_CHUNK,
            "config": fields,
            "tokenizer": vocab_hash,
            "seed": seed,
        }
    )


@contextlib.contextmanager
def _atomic_dir(final: Path) -> Iterator[Path]:
    """Write into a temporary sibling folder and rename it into place, so readers never see a half-written cache."""
    tmp = final.with_name(f"{final.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if final.exists():  # another process finished first; its result is identical
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
    are made on the fly and only the validation instances are materialised."""
    docs_memo: dict[str, Any] = {}

    def documents() -> datasets.Dataset | datasets.IterableDataset:
        if "docs" not in docs_memo:
            docs_memo["docs"] = load_documents(cfg, seed=seed)
        return docs_memo["docs"]

    def split() -> tuple[Any, datasets.Dataset]:
        if "split" not in docs_memo:
            docs = documents()
            if cfg.streaming:
                n_val = _streaming_validation_count(cfg)
                val = datasets.Dataset.from_list(
                    list(docs.take(n_val)), features=datasets.Features({"text": datasets.Value("string")})
                )
                if len(val) < 1:
                    raise ValueError("the streamed corpus has no documents to hold out for validation")
                docs_memo["split"] = (docs.skip(n_val), val)
            else:
                docs_memo["split"] = split_documents(docs, cfg, seed=seed)
        return docs_memo["split"]

    with main_process_first():
        tokenizer = load_or_train_tokenizer(
            cfg,
            save_dir=save_tokenizer_to,
            model_vocab_size=model_vocab_size,
            seed=seed,
            training_texts=lambda: _texts(split()[0]),
        )
        if cfg.streaming:
            train_docs, val_docs = split()
            validation = make_instances(val_docs, tokenizer, cfg, seed=seed, validation=True)
            train = stream_instances(train_docs, tokenizer, cfg, seed=seed)
            return PretrainingData(train=train, validation=validation, tokenizer=tokenizer)
        cached = Path(cfg.cache_dir) / f"instances-{data_cache_key(cfg, tokenizer, seed=seed)}"
        if not (cached / "validation").is_dir():
            train_docs, val_docs = split()
            with _atomic_dir(cached) as tmp:
                work = tmp / "work"
                work.mkdir()
                for name, part in (("train", train_docs), ("validation", val_docs)):
                    made = make_instances(
                        part, tokenizer, cfg, seed=seed, validation=name == "validation", work_dir=work
                    )
                    if len(made) == 0:
                        raise ValueError(f"no {name} instances could be made: the {name} documents hold no tokens")
                    made.save_to_disk(str(tmp / name))
                    del made
                shutil.rmtree(work)
        train = datasets.load_from_disk(str(cached / "train"))
        validation = datasets.load_from_disk(str(cached / "validation"))
    return PretrainingData(train=train, validation=validation, tokenizer=tokenizer)


# ----------------------------------------------------------------------------------------------------------------------
# Dynamic masking
# ----------------------------------------------------------------------------------------------------------------------


class MaskingCollator:
    """Pads a list of instances to the batch's longest (rounded up to a multiple of pad_to_multiple_of) and
    applies BERT's dynamic masking: mlm_probability of the non-special, non-padding tokens (rounded, at least
    one, as original BERT) are chosen; 80% -> [MASK], 10% -> a random non-special token, 10% unchanged; labels
    are -100 elsewhere. Masks are a pure function of (seed, epoch, instance_id), so a resumed run (and any
    number of DataLoader workers) reproduces exactly the same masks; set_epoch gives each epoch new ones."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        mlm_probability: float = 0.15,
        seed: int = 0,
        pad_to_multiple_of: int | None = 8,
    ) -> None:
        if not 0.0 < mlm_probability < 1.0:
            raise ValueError(f"mlm_probability={mlm_probability} must be in (0, 1) (BERT: 0.15)")
        if tokenizer.mask_token_id is None or tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer needs [MASK] and [PAD] tokens for masked-LM pretraining")
        self.mlm_probability = mlm_probability
        self.seed = seed
        self.pad_to_multiple_of = pad_to_multiple_of
        self.epoch = 0
        self.mask_id = tokenizer.mask_token_id
        self.pad_id = tokenizer.pad_token_id
        self.special_ids = np.array(sorted(set(tokenizer.all_special_ids)), dtype=np.int64)
        self.random_ids = np.setdiff1d(np.arange(len(tokenizer), dtype=np.int64), self.special_ids)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def mask(self, input_ids: np.ndarray, instance_id: int) -> tuple[np.ndarray, np.ndarray]:
        """(masked input_ids, labels) for one unpadded instance."""
        rng = np.random.default_rng([self.seed, self.epoch, int(instance_id)])
        labels = np.full(input_ids.shape, -100, dtype=np.int64)
        candidates = np.flatnonzero(~np.isin(input_ids, self.special_ids))
        if len(candidates) == 0:
            return input_ids, labels
        n_chosen = max(1, round(self.mlm_probability * len(candidates)))
        chosen = rng.choice(candidates, size=n_chosen, replace=False)
        labels[chosen] = input_ids[chosen]
        masked = input_ids.copy()
        action = rng.random(n_chosen)
        masked[chosen[action < 0.8]] = self.mask_id
        to_random = chosen[(action >= 0.8) & (action < 0.9)]
        masked[to_random] = rng.choice(self.random_ids, size=len(to_random))
        return masked, labels

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        lengths = [len(e["input_ids"]) for e in examples]
        width = max(lengths)
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        n = len(examples)
        input_ids = np.full((n, width), self.pad_id, dtype=np.int64)  # (B, T)
        labels = np.full((n, width), -100, dtype=np.int64)
        token_type_ids = np.zeros((n, width), dtype=np.int64)
        attention_mask = np.zeros((n, width), dtype=np.int64)
        for row, (example, length) in enumerate(zip(examples, lengths, strict=True)):
            ids = np.asarray(example["input_ids"], dtype=np.int64)
            input_ids[row, :length], labels[row, :length] = self.mask(ids, int(example["instance_id"]))
            token_type_ids[row, :length] = np.asarray(example["token_type_ids"], dtype=np.int64)
            attention_mask[row, :length] = 1
        batch = {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(attention_mask),
            "token_type_ids": torch.from_numpy(token_type_ids),
            "labels": torch.from_numpy(labels),
        }
        if "next_sentence_label" in examples[0]:
            batch["next_sentence_label"] = torch.tensor(
                [int(e["next_sentence_label"]) for e in examples], dtype=torch.long
            )
        return batch


__all__ = [
    "OBJECTIVES",
    "SOURCE_KINDS",
    "SPECIAL_TOKENS",
    "DataConfig",
    "MaskingCollator",
    "PretrainingData",
    "SourceConfig",
    "build_pretraining_data",
    "check_tokenizer",
    "load_documents",
    "load_or_train_tokenizer",
    "train_wordpiece_tokenizer",
]
