"""The data config: what the data pipeline reads, and the checks that keep its values sound.

A leaf of the data pipeline: every stage imports its config (and the constants its checks need) from here, and it
imports none of them. Each field declares its role and the data keys that hold its value (``role(...)``,
pretrain/common/roles.py), from which the cache keys and the resume checks take their fields.
"""

from __future__ import annotations

import contextlib
import glob
import gzip
import json
import math
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import IO

from pretrain.common.roles import role

SOURCE_KINDS: tuple[str, ...] = ("hub", "json", "parquet", "text", "python_docs")
# The kinds read from local files, and the file names a folder of each is searched for.
LOCAL_SUFFIXES: dict[str, tuple[str, ...]] = {
    "json": (".json", ".jsonl", ".json.gz", ".jsonl.gz"),
    "parquet": (".parquet",),
    "text": (".txt", ".text"),
}
WEIGHT_UNITS: tuple[str, ...] = ("documents", "words")
OBJECTIVES: tuple[str, ...] = ("mlm_nsp", "mlm")
# The data keys of a field that shapes the trained tokenizer, and so everything made with it.
EVERY_KEY: tuple[str, ...] = ("tokenizer", "instances", "batches")
# A tokenizer this small is a loading accident (transformers 5 can return a ~5-token stub), not a vocabulary.
MIN_PLAUSIBLE_VOCAB = 100
FIRST_LINES = 10
"""Lines of each JSON Lines file the commands check before importing torch (all are checked when the corpus is read)."""


@dataclass(kw_only=True)
class SourceConfig:
    """One corpus source."""

    kind: str = "python_docs"
    """"hub", "json" (JSON Lines), "parquet", "text" (documents separated by blank lines, as original BERT's input
    files) or "python_docs" (the documentation shipped with the Python interpreter; no download)."""
    path: str = ""
    """Hub dataset name (e.g. "wikipedia"), or a local file, glob or folder for json|parquet|text."""
    name: str | None = None
    """Hub dataset configuration name (e.g. "20220301.en"); only for kind "hub"."""
    split: str = "train"
    """Hub split to read; only for kind "hub" (local files form one split)."""
    text_column: str = "text"
    """Column holding the document text (json, parquet, hub)."""
    weight: float = 1.0
    """Relative share in the mixture (in ``data.weight_by`` units), drawn until the first source runs out."""
    rows_per_document: int = 1
    """Consecutive rows joined (one per line) into one document: more than 1 for a corpus stored one sentence per
    row (bookcorpus/bookcorpus), or NSP has no real next sentence to learn from."""

    def __post_init__(self) -> None:
        if self.kind not in SOURCE_KINDS:
            raise ValueError(f"data.sources[].kind={self.kind!r} is unknown; must be one of {', '.join(SOURCE_KINDS)}")
        if self.kind != "python_docs" and not self.path:
            raise ValueError(f"data.sources[].path is required for kind {self.kind!r} (a Hub dataset name or a file)")
        if not (self.weight > 0 and math.isfinite(self.weight)):
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
        if self.rows_per_document < 1:
            raise ValueError(f"data.sources[].rows_per_document={self.rows_per_document} must be >= 1")

    def local_files(self, index: int) -> list[Path]:
        """The files of a json|parquet|text source (``index``: its place in data.sources): one file, a glob, or every
        matching file under a folder; none, or only empty ones, are FileNotFoundError/ValueError naming the key."""
        where = f"data.sources[{index}].path={self.path!r}"
        path = Path(self.path).expanduser()
        if glob.has_magic(self.path):
            files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
        elif path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(LOCAL_SUFFIXES[self.kind]))
        elif path.is_file():
            files = [path]
        else:
            raise FileNotFoundError(
                f"{where}: no such file or folder ({path.resolve()}); fix the path of the {self.kind} source"
            )
        if not files:
            raise FileNotFoundError(
                f"{where}: no {self.kind} files ({', '.join(LOCAL_SUFFIXES[self.kind])}) found; fix the path or glob"
            )
        if all(f.stat().st_size == 0 for f in files):
            named = str(files[0]) if len(files) == 1 else f"all {len(files)} files, e.g. {files[0]}"
            raise ValueError(f"{where}: empty corpus: {named} holds no bytes; fix the path or the file")
        return files


@dataclass(kw_only=True)
class DataConfig:
    """Corpus, tokenizer and instance creation for pretraining."""

    sources: list[SourceConfig] = role("recipe", keyed_in=EVERY_KEY, default_factory=lambda: [SourceConfig()])
    """Corpus sources; several are mixed by weight."""
    weight_by: str = role("recipe", keyed_in=EVERY_KEY, default="documents")
    """What the sources' weights count: "documents" or "words" (estimated from a sample; original BERT: 2.5B words of
    Wikipedia to 0.8B of BookCorpus)."""
    tokenizer: str | None = role("recipe", keyed_in=(), default=None)
    """Hub name (e.g. "bert-base-uncased") or local folder; None: train WordPiece on the training documents (not
    bit-reproducible, tokenizers #1794: cached under cache_dir and saved as RUN/tokenizer, which a resume loads)."""
    vocab_size: int = role("recipe", keyed_in=EVERY_KEY, default=30522)
    """Vocabulary size of a trained tokenizer (ignored when ``tokenizer`` is set)."""
    lowercase: bool = role("recipe", keyed_in=EVERY_KEY, default=True)
    """Lowercase and strip accents in a trained tokenizer, as bert-base-uncased (ignored when ``tokenizer`` is set)."""
    max_seq_length: int = role("recipe", keyed_in=("instances", "batches"), default=128)
    """Tokens per instance including [CLS]/[SEP]."""
    objective: str = role("recipe", keyed_in=("instances", "batches"), default="mlm_nsp")
    """"mlm_nsp" (BERT: segment pairs + next-sentence prediction) or "mlm" (full-length packed sequences, no NSP)."""
    short_seq_prob: float = role("recipe", keyed_in=("instances", "batches"), default=0.1)
    """Probability of a shorter random target length (BERT: less pretrain/fine-tune mismatch); mlm_nsp only."""
    nsp_random_prob: float = role("recipe", keyed_in=("instances", "batches"), default=0.5)
    """Probability that segment B is a random segment from another document (next_sentence_label 1); mlm_nsp only."""
    mlm_probability: float = role("recipe", keyed_in=("batches",), default=0.15)
    """Share of the non-special tokens chosen for masked-LM prediction (used by MaskingCollator)."""
    validation_fraction: float = role("recipe", keyed_in=EVERY_KEY, default=0.005)
    """Share of documents held out for validation, BY DOCUMENT (paper: 199:1); at least one document."""
    validation_documents: int | None = role("recipe", keyed_in=EVERY_KEY, default=None)
    """Exact number of held-out documents, over ``validation_fraction`` (streamed without max_documents: 1000)."""
    max_documents: int | None = role("recipe", keyed_in=EVERY_KEY, default=None)
    """Cap on documents read from each source and from the mixture (small runs, tests)."""
    tokenizer_train_documents: int = role("recipe", keyed_in=EVERY_KEY, default=100_000)
    """Cap on the training documents a WordPiece tokenizer is trained on."""
    cache_dir: str = role("mechanics", keyed_in=(), default="runs/.cache/data")
    """Where tokenised instances and trained tokenizers are cached (keyed by a hash of their inputs)."""
    streaming: bool = role("recipe", keyed_in=("tokenizer", "batches"), default=False)
    """Build training instances on the fly from a streamed corpus (larger than memory); validation is materialised."""
    shuffle_buffer_size: int = role("recipe", keyed_in=("batches",), default=10_000)
    """Documents in the shuffle buffer of a streamed corpus."""
    num_proc: int = role("mechanics", keyed_in=(), default=1)
    """Worker processes for tokenisation (the result does not depend on it)."""
    max_inline_preparation_mb: float = role("limit", keyed_in=(), default=64.0)
    """Largest corpus (MiB of local files) a run of several processes prepares itself behind a barrier; a larger one
    needs ``python -m pretrain.prepare`` first. 64 MiB: under two minutes (BENCHMARKS.md); the others wait at most
    train.collective_timeout_s."""

    def __post_init__(self) -> None:
        # A saved run_config.json's sources arrive as dicts (DataConfig(**saved["data"]): analysis/probes.py).
        self.sources = [SourceConfig(**s) if isinstance(s, dict) else s for s in self.sources]
        if not self.sources:
            raise ValueError("data.sources must list at least one source (e.g. [{kind: python_docs}])")
        for key, choices in (("weight_by", WEIGHT_UNITS), ("objective", OBJECTIVES)):
            if getattr(self, key) not in choices:
                raise ValueError(f"data.{key}={getattr(self, key)!r} must be one of {', '.join(choices)}")
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

    def check_local_files(self) -> list[str]:
        """Every local source names existing, non-empty files, and a JSON Lines file's first lines are JSON with the
        text column: checked by the commands before they import torch, not at parse time (a saved run's config stays
        readable after its corpus moved). Returns a line per source read from several files, saying how many."""
        found = []
        for index, source in enumerate(self.sources):
            if source.kind not in LOCAL_SUFFIXES:
                continue
            files = source.local_files(index)
            where = f"data.sources[{index}] ({source.kind} {source.path!r})"
            if len(files) > 1:
                found.append(f"{where}: {len(files)} {source.kind} files, read as one source: {files[0]}, ...")
            for path in files:
                if source.kind == "json":
                    check_json_lines(path, source.text_column, where, max_lines=FIRST_LINES)
        return found


_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}  # fmt: skip


@contextlib.contextmanager
def corpus_file(path: Path, *, binary: bool = False) -> Iterator[IO]:
    """A corpus file open for reading (text: UTF-8, invalid bytes replaced), through gzip where its name ends in .gz,
    so that a compressed file is checked as a plain one is; a gzip file cut short or not gzip is named with the fix."""
    text = {} if binary else {"encoding": "utf-8", "errors": "replace"}
    mode = "rb" if binary else "rt"
    try:
        with gzip.open(path, mode, **text) if path.name.endswith(".gz") else path.open(mode, **text) as f:
            yield f
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise ValueError(f"{path} is not a whole gzip file ({err}): copy it again, or decompress it") from None


def check_json_lines(path: Path, text_column: str, where: str, max_lines: int | None = None) -> None:
    """Validate a JSON Lines file (its first ``max_lines`` lines; None: all) before ``datasets`` reads it: a line that
    is not JSON stops with the file and line (``datasets`` buries it in a long DatasetGenerationError); lines whose
    ``text_column`` is missing or null are counted and reported (skipped); one that is no JSON object, or whose
    text is a number, an object or a list (datasets would convert it to text and train on it), is refused with its
    line; a file where no line read has the text is refused. A ``.json`` file that is one JSON document (not
    JSON Lines) is left alone."""
    bad, total, first_bad, columns, line_no = 0, 0, None, None, 0
    # Invalid UTF-8 is check_utf8's to name (corpus.py), with its byte offset, when the whole corpus is read.
    with corpus_file(path) as f:
        for line_no, line in enumerate(islice(f, max_lines), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                if line_no == 1 and path.name.removesuffix(".gz").endswith(".json"):
                    return  # a pretty-printed JSON document: datasets reads it as a whole
                raise ValueError(
                    f"{where}: {path} line {line_no} is not valid JSON ({err.msg} at column {err.colno}); every "
                    "line of a JSON Lines corpus must be one JSON object"
                ) from None
            if not isinstance(record, dict):
                if line_no == 1 and path.name.removesuffix(".gz").endswith(".json"):
                    return  # a JSON document on one line (an array of records): datasets reads it as a whole
                raise ValueError(f"{where}: {path} line {line_no} is a JSON {_JSON_TYPES[type(record)]}, not an "
                                 "object; every line of a JSON Lines corpus must be one JSON object")  # fmt: skip
            total += 1
            columns = columns or list(record)
            if (text := record.get(text_column)) is not None and not isinstance(text, str):
                # datasets would make it text ("12345", '{"a": 1}') and train on it
                raise ValueError(f"{where}: {path} line {line_no}: {text_column!r} is a JSON "
                                 f"{_JSON_TYPES[type(text)]} ({json.dumps(text)[:40]}), not text; make it a string, "
                                 "remove the line, or set data.sources[...].text_column to the field that holds the "
                                 "text")  # fmt: skip
            if text is None:
                bad += 1
                first_bad = first_bad or line_no
            elif not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:  # a lone surrogate escape ("\ud800"): JSON, but not text Arrow takes
                    raise ValueError(f"{where}: {path} line {line_no}: {text_column!r} holds a lone surrogate escape "
                                     "(\\ud800-\\udfff without its pair), which is not text; fix or remove the "
                                     "line") from None  # fmt: skip
    if not total and line_no and max_lines is None:  # an empty file is left to the source's own check
        raise ValueError(f"{where}: {path} holds no JSON line (blank lines only); remove it from the source, or "
                         "write its documents into it")  # fmt: skip
    if total and bad == total:
        lines = f"the {total}" if max_lines is None else f"the first {total}"
        raise ValueError(
            f"{where}: text column {text_column!r} not found; columns are {columns or []} (none of {lines} lines of "
            f"{path} has a string {text_column!r} field). Set data.sources[...].text_column to the field that holds "
            "the text"
        )
    if bad and max_lines is None:  # a few lines read: said once, when the whole file is
        print(f"warning: {where}: {path}: {bad} of {total} lines have no string {text_column!r} field (first: line "
              f"{first_bad}); they are skipped", file=sys.stderr)  # fmt: skip
