"""The corpus: sources read into one stream of documents, and the split into training and validation documents.

    sources (Hub / JSONL / Parquet / text / python_docs)
      -> documents: one row each, or rows_per_document consecutive rows joined (a sentence-per-row book corpus)
      --weights (per document, or per word: data.weight_by)-->  one dataset of documents (columns "text", "source")
      -> held-out documents (validation, split BY DOCUMENT before anything else, as the paper's 199:1)

Local json/text files are checked to be UTF-8 first (the readers fail deep inside pyarrow otherwise).
"""

from __future__ import annotations

import ast
import codecs
import dataclasses
import logging
import os
import re
import sys
import sysconfig
from collections.abc import Iterator
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from pretrain.data.config import LOCAL_SUFFIXES, DataConfig, SourceConfig, check_json_lines, corpus_file

logger = logging.getLogger(__name__)

# Documents, materialised or streamed.
Documents = datasets.Dataset | datasets.IterableDataset
DOCUMENT_FEATURES = datasets.Features({"text": datasets.Value("string"), "source": datasets.Value("int16")})
# Held-out documents of a streamed corpus of unknown size without max_documents or validation_documents.
STREAMING_VALIDATION_DOCUMENTS = 1000
# Documents sampled per source to estimate its mean words per document (data.weight_by="words"): the relative
# standard error of the mean is about (coefficient of variation) / sqrt(n), ~3% for Wikipedia's article lengths.
WORD_COUNT_SAMPLE = 2000

# The python_docs source. Modules with a one-line docstring (or test strings such as "¶ π 😀") are not prose.
_MIN_PYTHON_DOC_WORDS = 20
_SKIPPED_STDLIB_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "turtledemo",
                        "ensurepip", "__pycache__", "pydoc_data"}
_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _reflow(text: str) -> str:
    """One line per (blank-line separated) paragraph: the sentence splitter treats every line as a paragraph."""
    paragraphs = (" ".join(p.split()) for p in re.split(r"\n\s*\n", text))
    return "\n".join(p for p in paragraphs if p)


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
    """The "python_docs" corpus: English documentation shipped with the running Python, so a tiny model can be
    pretrained with no download. ``pydoc_data.topics`` (the language reference behind ``help("if")``), then one
    document per standard-library module: its docstrings, parsed with ``ast`` (not imported). About 460 documents,
    2 MB of text, 0.3M words in Python 3.11: a few hundred steps of a tiny model, not a real BERT."""
    from pydoc_data.topics import topics

    for name in sorted(topics):
        text = _reflow(topics[name])
        if len(text.split()) >= _MIN_PYTHON_DOC_WORDS:
            yield text
    for folder, subdirs, files in os.walk(Path(sysconfig.get_paths()["stdlib"])):
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


def check_utf8(path: Path, *, chunk_bytes: int = 1 << 24) -> None:
    """Raise a ValueError naming the file, byte offset and line of the first invalid UTF-8 sequence (the json/text
    readers would fail deep inside pyarrow or silently drop text)."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset, line = 0, 1
    with corpus_file(path, binary=True) as f:
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


def source_fingerprint(source: SourceConfig, index: int) -> dict[str, Any]:
    """What identifies a source's content for the cache key: files' paths, sizes and mtimes, or the Hub ids."""
    fields = dataclasses.asdict(source)
    if source.kind in LOCAL_SUFFIXES:
        stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in source.local_files(index)]
        return {**fields, "files": stats}
    if source.kind == "python_docs":
        return {**fields, "python": sys.version, "stdlib": sysconfig.get_paths()["stdlib"]}
    return fields


def corpus_bytes(cfg: DataConfig) -> int | None:
    """Size of the corpus's files (python_docs: 0, it is a few MB); None when a source is on the Hub (unknown)."""
    if any(source.kind == "hub" for source in cfg.sources):
        return None
    files = (p for i, s in enumerate(cfg.sources) if s.kind in LOCAL_SUFFIXES for p in s.local_files(i))
    return sum(p.stat().st_size for p in files)


def _read_source(source: SourceConfig, index: int, cfg: DataConfig, where: str) -> Documents:
    """One source's rows as ``datasets`` reads them, every column."""
    hf_cache = str(Path(cfg.cache_dir) / "hf")
    num_proc = cfg.num_proc if cfg.num_proc > 1 and not cfg.streaming else None
    if source.kind == "python_docs":
        gen_kwargs = {"max_documents": None if cfg.streaming else cfg.max_documents, "python_version": sys.version}
        if cfg.streaming:
            return datasets.IterableDataset.from_generator(_python_docs_generator, gen_kwargs=gen_kwargs)
        return datasets.Dataset.from_generator(_python_docs_generator, gen_kwargs=gen_kwargs, cache_dir=hf_cache)
    if source.kind == "hub":
        try:  # num_proc: one process per Parquet file
            return datasets.load_dataset(source.path, source.name, split=source.split, streaming=cfg.streaming,
                                         cache_dir=hf_cache, num_proc=num_proc)  # fmt: skip
        except (FileNotFoundError, ConnectionError) as e:  # DatasetNotFoundError, or offline: name the config key
            raise FileNotFoundError(
                f"{where}: Hub dataset not found or not reachable ({e}); check data.sources[{index}].path and .name"
            ) from e
    files = source.local_files(index)  # refuses a corpus whose files are all empty
    for p in files:
        if source.kind in ("json", "text"):
            check_utf8(p)
            if source.kind == "json":
                check_json_lines(p, source.text_column, where)
    # "text": blank-line separated blocks are documents, as in original BERT's input files. Reading into Arrow runs
    # one process per file: a single file gains nothing, a folder of shards does.
    extra = {"sample_by": "paragraph"} if source.kind == "text" else {}
    num_proc = min(num_proc, len(files)) if num_proc else None
    return datasets.load_dataset(source.kind, data_files=[str(p) for p in files], split="train",
                                 streaming=cfg.streaming, cache_dir=hf_cache, num_proc=num_proc, **extra)  # fmt: skip


def load_source(source: SourceConfig, index: int, cfg: DataConfig) -> Documents:
    """One source as a dataset of documents, columns "text" and "source" (its index), empty documents dropped."""
    label = f"{source.kind} {source.path!r}" if source.path else source.kind
    where = f"data.sources[{index}] ({label})"
    ds = _read_source(source, index, cfg, where)
    columns = ds.column_names
    if columns is None:  # a streamed source without declared features: look at the first record
        first = next(iter(ds), None)
        if first is None:
            raise ValueError(f"{where}: empty corpus, no documents")
        columns = list(first)
    if source.text_column not in columns:
        raise ValueError(f"{where}: text column {source.text_column!r} not found; columns are {columns}. "
                         f"Set data.sources[{index}].text_column")  # fmt: skip
    ds = ds.select_columns([source.text_column])
    if source.text_column != "text":
        ds = ds.rename_column(source.text_column, "text")
    if ds.features is not None and ds.features["text"] != datasets.Value("string"):
        ds = ds.cast_column("text", datasets.Value("string"))
    # The source of every document, for the per-source report after preparation (2 bytes a row).
    if cfg.streaming:
        ds = ds.map(partial(_tag_source, source=index), batched=True)
    else:
        ds = ds.add_column("source", np.full(len(ds), index, dtype=np.int16), feature=datasets.Value("int16"))
    if cfg.max_documents is None:
        ds = _documents_of(ds, source.rows_per_document)
    else:
        ds = _first_documents(ds, source.rows_per_document, cfg.max_documents)
    if (next(iter(ds), None) is None) if cfg.streaming else len(ds) == 0:
        raise ValueError(f"{where}: empty corpus, no document has text in column {source.text_column!r}")
    return ds


def _documents_of(ds: Documents, rows_per_document: int) -> Documents:
    """Rows as documents: ``rows_per_document`` consecutive rows joined, blank rows and documents dropped.

    Joined in one process, in order: a map batch always starts at a multiple of its size, a multiple of
    rows_per_document, so groups never straddle batches (workers would cut the rows at arbitrary shard boundaries).
    """
    if rows_per_document == 1:
        return ds.filter(_has_text, batched=True)
    streamed = isinstance(ds, datasets.IterableDataset)
    kwargs = {} if streamed else {"desc": f"Joining {rows_per_document} rows a document"}
    return ds.map(partial(_join_rows, rows_per_document=rows_per_document), batched=True,
                  batch_size=rows_per_document * max(1, 1000 // rows_per_document), remove_columns=["text", "source"],
                  **kwargs)  # fmt: skip


def _first_documents(ds: Documents, rows_per_document: int, n: int) -> Documents:
    """The first ``n`` documents that have text: data.max_documents counts documents after blank ones are
    dropped, so a cap of 4 on a file with blank lines gives 4 documents. Streamed: lazily. Materialised: only as
    many rows as it takes (read in doubling chunks), never every row of a large source for a small cap."""
    if isinstance(ds, datasets.IterableDataset):
        return _documents_of(ds, rows_per_document).take(n)
    rows = n * rows_per_document
    while True:
        docs = _documents_of(ds.select(range(min(len(ds), rows))), rows_per_document)
        if len(docs) >= n or rows >= len(ds):
            return docs.select(range(min(len(docs), n)))
        rows *= 2


def _has_text(batch: dict[str, list]) -> list[bool]:
    return [isinstance(t, str) and not t.isspace() and t != "" for t in batch["text"]]


def _tag_source(batch: dict[str, list], *, source: int) -> dict[str, list]:
    return {"source": [source] * len(batch["text"])}


def _join_rows(batch: dict[str, list], *, rows_per_document: int) -> dict[str, list]:
    """Batched map function: every rows_per_document consecutive rows become one document, one row per line (the
    sentence splitter treats a line as a paragraph, so a sentence per row stays a sentence); empty rows are
    left out, and a group of empty rows makes no document."""
    texts, sources = batch["text"], batch["source"]
    out: dict[str, list] = {"text": [], "source": []}
    for k in range(0, len(texts), rows_per_document):
        text = "\n".join(t for t in texts[k : k + rows_per_document] if t and not t.isspace())
        if text:
            out["text"].append(text)
            out["source"].append(sources[k])
    return out


def mean_words_per_document(ds: Documents, *, seed: int) -> float:
    """Mean whitespace-separated words per document, from a seeded random sample (streamed: the first documents)."""
    if isinstance(ds, datasets.IterableDataset):
        texts = [row["text"] for row in ds.take(WORD_COUNT_SAMPLE)]
    else:
        rng = np.random.default_rng([seed, 0x30D5])
        n = min(len(ds), WORD_COUNT_SAMPLE)
        texts = ds.select(np.sort(rng.choice(len(ds), size=n, replace=False)))["text"]
    return float(np.mean([len(t.split()) for t in texts]))


def mixture_probabilities(parts: list[Documents], cfg: DataConfig, *, seed: int) -> np.ndarray:
    """Per source, the probability that the next document comes from it. weight_by "documents": the weights
    themselves; "words": weight / mean words per document, so that source i supplies weight_i / sum(weights)
    of the mixture's words (a source of long articles gets fewer draws than one of short documents)."""
    weights = np.array([s.weight for s in cfg.sources], dtype=float)
    if cfg.weight_by == "words":
        words = np.array([mean_words_per_document(p, seed=seed) for p in parts])
        logger.info("mean words per document by source: %s", ", ".join(f"{w:.0f}" for w in words))
        weights = weights / words
    return weights / weights.sum()


def load_documents(cfg: DataConfig, *, seed: int) -> Documents:
    """All sources mixed by weight into one dataset of documents (columns "text" and "source"), at most
    max_documents."""
    parts = [load_source(s, i, cfg) for i, s in enumerate(cfg.sources)]
    docs = parts[0]
    if len(parts) > 1:
        probabilities = mixture_probabilities(parts, cfg, seed=seed).tolist()
        docs = datasets.interleave_datasets(parts, probabilities=probabilities, seed=seed,
                                            stopping_strategy="first_exhausted")  # fmt: skip
    if cfg.max_documents is not None:
        docs = docs.take(cfg.max_documents) if cfg.streaming else docs.select(range(min(len(docs), cfg.max_documents)))
    return docs


def split_corpus(cfg: DataConfig, *, seed: int) -> tuple[Documents, datasets.Dataset]:
    """The corpus read, mixed and split: (train, validation) documents. The one route to them, for the instances
    and for the tokenizer's training texts."""
    return split_documents(load_documents(cfg, seed=seed), cfg, seed=seed)


def split_documents(docs: Documents, cfg: DataConfig, *, seed: int) -> tuple[Documents, datasets.Dataset]:
    """(train, validation) documents, split BY DOCUMENT before any instance is made, so no document contributes to
    both. Materialised: a seeded random validation_fraction (at least one document) is held out, and the train
    documents come shuffled. Streamed: the first documents of the stream are held out (and materialised)."""
    if isinstance(docs, datasets.IterableDataset):
        n_val = cfg.validation_documents
        if n_val is None:
            n_val = STREAMING_VALIDATION_DOCUMENTS
            if cfg.max_documents is not None:
                n_val = max(1, round(cfg.validation_fraction * cfg.max_documents))
        val = datasets.Dataset.from_list(list(docs.take(n_val)), features=DOCUMENT_FEATURES)
        if len(val) < 1:
            raise ValueError("the streamed corpus has no documents to hold out for validation")
        return docs.skip(n_val), val
    n = len(docs)
    if n < 2:
        raise ValueError(f"the corpus has {n} document(s); at least 2 are needed (one to train, one to validate)")
    n_val = cfg.validation_documents or max(1, round(cfg.validation_fraction * n))
    if n_val >= n:
        raise ValueError(
            f"data.validation_documents={n_val} leaves no training documents out of {n} (documents with text, after "
            "blank ones were dropped); lower it, or raise data.max_documents"
        )
    order = np.random.default_rng([seed, 0xD0C5]).permutation(n)
    return docs.select(order[n_val:]), docs.select(np.sort(order[:n_val]))


def document_texts(docs: Documents) -> Iterator[str]:
    """The texts of a dataset of documents, read in batches."""
    for batch in docs.iter(batch_size=1000):
        yield from batch["text"]
