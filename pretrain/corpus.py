"""The corpus: sources read into one stream of documents, and the split into training and validation documents.

    sources (Hub / JSONL / Parquet / text / python_docs)  --weights-->  one dataset of documents (column "text")
      -> held-out documents (validation, split BY DOCUMENT before anything else, as the paper's 199:1)

Local json/text files are checked to be UTF-8 first (the readers fail deep inside pyarrow otherwise). The
"python_docs" source is built from the documentation shipped with the running Python, so a tiny model can be
pretrained with no download.
"""

from __future__ import annotations

import ast
import codecs
import dataclasses
import glob
import json
import os
import re
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets
import numpy as np

if TYPE_CHECKING:
    from pretrain.data import DataConfig

SOURCE_KINDS: tuple[str, ...] = ("hub", "json", "parquet", "text", "python_docs")
LOCAL_SUFFIXES: dict[str, tuple[str, ...]] = {
    "json": (".json", ".jsonl", ".json.gz", ".jsonl.gz"),
    "parquet": (".parquet",),
    "text": (".txt", ".text"),
}
# Held-out documents of a streamed corpus of unknown size without max_documents or validation_documents.
STREAMING_VALIDATION_DOCUMENTS = 1000


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


# ----------------------------------------------------------------------------------------------------------------------
# The python_docs source
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


# ----------------------------------------------------------------------------------------------------------------------
# Local files: which, their encoding, their fingerprint for the cache key
# ----------------------------------------------------------------------------------------------------------------------


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
    bad, total, first_bad, columns = 0, 0, None, None
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
            if columns is None and isinstance(record, dict):
                columns = list(record)
            if not isinstance(record, dict) or not isinstance(record.get(text_column), str):
                bad += 1
                first_bad = first_bad or line_no
    if total and bad == total:
        raise ValueError(
            f"{where}: text column {text_column!r} not found; columns are {columns or []} (none of the {total} "
            f"lines of {path} has a string {text_column!r} field). Set data.sources[...].text_column to the field "
            "that holds the text"
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


# ----------------------------------------------------------------------------------------------------------------------
# Sources -> documents -> (train, validation)
# ----------------------------------------------------------------------------------------------------------------------


def load_source(source: SourceConfig, index: int, cfg: DataConfig) -> datasets.Dataset | datasets.IterableDataset:
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
    parts = [load_source(s, i, cfg) for i, s in enumerate(cfg.sources)]
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


def split_documents(
    docs: datasets.Dataset | datasets.IterableDataset, cfg: DataConfig, *, seed: int
) -> tuple[datasets.Dataset | datasets.IterableDataset, datasets.Dataset]:
    """(train, validation) documents, split BY DOCUMENT before any instance is made, so no document contributes to
    both. Materialised: a seeded random validation_fraction (at least one document) is held out, and the train
    documents come shuffled. Streamed: the first documents of the stream are held out (and materialised)."""
    if isinstance(docs, datasets.IterableDataset):
        n_val = _streaming_validation_count(cfg)
        val = datasets.Dataset.from_list(
            list(docs.take(n_val)), features=datasets.Features({"text": datasets.Value("string")})
        )
        if len(val) < 1:
            raise ValueError("the streamed corpus has no documents to hold out for validation")
        return docs.skip(n_val), val
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


def document_texts(docs: datasets.Dataset | datasets.IterableDataset) -> Iterator[str]:
    """The texts of a dataset of documents, read in batches."""
    for batch in docs.iter(batch_size=1000):
        yield from batch["text"]
