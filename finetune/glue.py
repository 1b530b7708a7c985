"""GLUE sentence-pair tasks (MRPC, RTE): loading, tokenizing, batching, and their metrics.

Data comes either from the Hugging Face Hub (``nyu-mll/glue``) or from a local folder in the layout of the
original GLUE download (``download_glue_data.py``)::

    DATA_DIR/MRPC/train.tsv, dev.tsv   Quality, #1 ID, #2 ID, #1 String, #2 String   (label 0/1)
    DATA_DIR/RTE/train.tsv, dev.tsv    index, sentence1, sentence2, label            (entailment/not_entailment)

MRPC files start with a UTF-8 byte-order mark and contain unbalanced ``"``, so they are read with quoting
disabled. RTE's string labels map as on the Hub: entailment = 0, not_entailment = 1.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

# torch (collate, batches) and scikit-learn (compute_metrics) are imported where they are used: the commands read
# the task table from here while they check their options, before the seconds those imports take.


@dataclass(frozen=True)
class GlueTask:
    """Where a task's columns are, and how it is scored."""

    name: str
    folder: str
    columns: tuple[str, str, str]
    """TSV header names of (sentence 1, sentence 2, label)."""
    label_names: tuple[str, ...]
    """Label strings in id order, as on the Hub; numeric labels in the TSV are taken as ids."""
    metrics: tuple[str, ...]
    header: tuple[str, ...]
    """The TSV header line of the original GLUE download."""


TASKS: dict[str, GlueTask] = {
    "mrpc": GlueTask("mrpc", "MRPC", ("#1 String", "#2 String", "Quality"), ("not_equivalent", "equivalent"),
                     ("accuracy", "f1"), ("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String")),
    "rte": GlueTask("rte", "RTE", ("sentence1", "sentence2", "label"), ("entailment", "not_entailment"),
                    ("accuracy",), ("index", "sentence1", "sentence2", "label")),
}  # fmt: skip
SPLIT_FILES = {"train": "train.tsv", "dev": "dev.tsv"}
HUB_DATASET = "nyu-mll/glue"
HUB_SPLITS = {"train": "train", "dev": "validation"}


@dataclass(frozen=True)
class Example:
    text_a: str
    text_b: str
    label: int


def get_task(name: str) -> GlueTask:
    """A task by its name as jobs and results record it, in lower case: "MRPC" would key the same jobs apart."""
    if name not in TASKS:
        hint = f" (did you mean {name.lower()!r}?)" if name.lower() in TASKS else ""
        raise ValueError(f"unknown GLUE task {name!r}{hint}; valid tasks: {', '.join(TASKS)}")
    return TASKS[name]


def expected_layout(task: GlueTask) -> str:
    header = "\t".join(task.header)
    return f"{task.folder}/train.tsv and {task.folder}/dev.tsv, tab-separated with the header line: {header}"


def _label_id(raw: str, task: GlueTask, where: str) -> int:
    raw = raw.strip()
    if raw in task.label_names:
        return task.label_names.index(raw)
    if raw.isdigit() and int(raw) < len(task.label_names):
        return int(raw)
    raise ValueError(f"{where}: label {raw!r} is not one of {task.label_names} or 0..{len(task.label_names) - 1}")


def read_tsv(path: Path, task: GlueTask) -> list[Example]:
    """One GLUE TSV file. ``utf-8-sig`` drops MRPC's byte-order mark; QUOTE_NONE keeps its stray quotes. A file whose
    last line has no line break was cut short (GLUE's files end with one): MRPC's last field is a sentence, so a cut
    line still has all its fields, and its job's numbers would be of the cut sentence."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        text = f.read()
    rows = list(csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows:
        raise ValueError(f"{path} is empty; expected a header line and examples ({expected_layout(task)})")
    if not text.endswith(("\n", "\r")):
        raise ValueError(f"{path}:{len(rows)} ends without a line break: the file was cut short; copy it again (or, "
                         "if that line is whole, end it with one)")  # fmt: skip
    header = rows[0]
    missing = [c for c in task.columns if c not in header]
    if missing:
        raise ValueError(f"{path} lacks the column(s) {missing}; found {header}; expected {expected_layout(task)}")
    a, b, y = (header.index(c) for c in task.columns)
    examples = []
    for line_no, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise ValueError(f"{path}:{line_no} has {len(row)} fields, the header has {len(header)}")
        examples.append(Example(row[a], row[b], _label_id(row[y], task, f"{path}:{line_no}")))
    if not examples:
        raise ValueError(f"{path} has its header line but no examples; expected {expected_layout(task)}")
    return examples


def load_local(task: GlueTask, data_dir: str | Path) -> dict[str, list[Example]]:
    folder = Path(data_dir) / task.folder
    paths = {split: folder / name for split, name in SPLIT_FILES.items()}
    absent = [str(p) for p in paths.values() if not p.is_file()]
    if absent:
        raise FileNotFoundError(
            f"GLUE {task.name.upper()} files not found: {', '.join(absent)}. Expected in --data_dir "
            f"{data_dir}: {expected_layout(task)} (the original GLUE download layout); leave --data_dir "
            "unset to download nyu-mll/glue from the Hugging Face Hub instead"
        )
    return {split: read_tsv(path, task) for split, path in paths.items()}


def load_hub(task: GlueTask) -> dict[str, list[Example]]:
    """GLUE from the Hub; its label ids equal the TSV mapping used by :func:`read_tsv`."""
    from datasets import load_dataset  # imported here: a slow import that local data does not need

    dataset = load_dataset(HUB_DATASET, task.name)
    return {
        split: [Example(r["sentence1"], r["sentence2"], int(r["label"])) for r in dataset[hub_split]]
        for split, hub_split in HUB_SPLITS.items()
    }


def load_task(name: str, data_dir: str | Path | None = None) -> dict[str, list[Example]]:
    """``{"train": [...], "dev": [...]}`` from ``data_dir`` (GLUE TSV layout) or, when None, from the Hub."""
    task = get_task(name)
    return load_local(task, data_dir) if data_dir is not None else load_hub(task)


# --- Tokenizing and batching ----------------------------------------------------------------------


def encode(tokenizer: Any, examples: list[Example], max_length: int) -> list[dict[str, Any]]:
    """Tokenize pairs without padding (batches are padded to their own longest sequence)."""
    pairs = [e.text_a for e in examples], [e.text_b for e in examples]
    enc = tokenizer(*pairs, truncation="longest_first", max_length=max_length, padding=False,
                    return_token_type_ids=True, return_attention_mask=True)  # fmt: skip
    keys = ("input_ids", "token_type_ids", "attention_mask")
    return [{**{k: enc[k][i] for k in keys}, "labels": e.label} for i, e in enumerate(examples)]


def collate(features: list[dict[str, Any]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Dynamic padding: pad every sequence of the batch to the batch's longest."""
    import torch

    longest = max(len(f["input_ids"]) for f in features)
    padding = {"input_ids": pad_token_id, "token_type_ids": 0, "attention_mask": 0}
    batch = {k: [f[k] + [pad] * (longest - len(f[k])) for f in features] for k, pad in padding.items()}
    batch["labels"] = [f["labels"] for f in features]
    return {k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()}


def batches(
    features: list[dict[str, Any]], batch_size: int, pad_token_id: int, generator: torch.Generator | None = None
) -> Iterator[dict[str, torch.Tensor]]:
    """Batches in a random order drawn from ``generator`` (training), or in file order when it is None."""
    import torch

    count = len(features)
    indices = range(count) if generator is None else torch.randperm(count, generator=generator).tolist()
    for start in range(0, len(indices), batch_size):
        yield collate([features[i] for i in indices[start : start + batch_size]], pad_token_id)


def compute_metrics(task: GlueTask, labels: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
    """GLUE's dev metrics: accuracy for both tasks, plus F1 of the positive class (paraphrase) for MRPC."""
    from sklearn.metrics import accuracy_score, f1_score

    out = {"accuracy": float(accuracy_score(labels, predictions))}
    if "f1" in task.metrics:
        out["f1"] = float(f1_score(labels, predictions, zero_division=0))
    return out


def baseline_metrics(task: GlueTask, labels: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
    """What a job's score means at small scale, from the dev set it was scored on: the accuracy (and MRPC's F1)
    of always answering the dev set's most common label, and the share of predictions in the job's most
    predicted class (1.0: the classifier answers one class whatever the input, as an untrained model does)."""
    from sklearn.metrics import f1_score

    classes = len(task.label_names)
    label_counts = np.bincount(labels, minlength=classes)
    majority = int(label_counts.argmax())
    out = {"majority_accuracy": float(label_counts[majority] / len(labels)),
           "top_class_share": float(np.bincount(predictions, minlength=classes).max() / len(predictions))}  # fmt: skip
    if "f1" in task.metrics:
        out["majority_f1"] = float(f1_score(labels, np.full_like(labels, majority), zero_division=0))
    return out
