"""Pretraining BERT with a configurable normalization placement and norm type.

Importing this package registers the ``lnbert`` model type with the transformers Auto classes: it imports
``pretrain.modeling`` (torch and transformers, about 9 s of CPU). The project's own commands (``python -m
pretrain.run``, ``python pretrain/run.py``, ``python -m finetune.schedule``, ...) are the exception: they read and
check their options first and import the model after, so that a typo answers at once. The names below are then
imported on first use.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import pretrain._moved

_MODEL_NAMES = (
    "NORM_PLACEMENTS",
    "NORM_TYPES",
    "LNBertConfig",
    "LNBertForMaskedLM",
    "LNBertForPreTraining",
    "LNBertForSequenceClassification",
    "LNBertModel",
)
_COMMAND_PACKAGES = ("pretrain", "finetune")


def _main_module() -> str | None:
    """The dotted name of the module this process runs as ``__main__``, or its file's path; None for ``-c``, a
    REPL or an embedded interpreter."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None:
        return spec.name
    if sys.argv[:1] == ["-m"]:  # ``python -m X``: Python imports X's packages before X, with argv[0] "-m"
        args = sys.orig_argv
        return next((b for a, b in itertools.pairwise(args) if a == "-m"), None)
    return getattr(main, "__file__", None)


def _starting_a_command() -> bool:
    name = _main_module()
    if name is None:
        return False
    if name.endswith(".py"):  # a script: pretrain/run.py (what ``accelerate launch`` starts) or finetune/*.py
        folder = Path(name).resolve().parent
        return folder in {Path(__file__).resolve().parent.parent / p for p in _COMMAND_PACKAGES}
    return name.split(".")[0] in _COMMAND_PACKAGES


def __getattr__(name: str) -> Any:
    if name in _MODEL_NAMES:
        import pretrain.modeling

        return getattr(pretrain.modeling, name)
    raise AttributeError(f"module 'pretrain' has no attribute {name!r}")


if not _starting_a_command():
    import pretrain.modeling  # noqa: F401  (registers lnbert with the Auto classes)

__all__ = list(_MODEL_NAMES)
