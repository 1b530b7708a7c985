"""Pretraining BERT with a configurable normalization placement and norm type.

Importing this package registers the ``lnbert`` model type with the transformers Auto classes.
"""

import pretrain._moved  # noqa: F401  (the flat layout's module paths still import: pretrain/_moved.py)
from pretrain.modeling import (
    NORM_PLACEMENTS,
    NORM_TYPES,
    LNBertConfig,
    LNBertForMaskedLM,
    LNBertForPreTraining,
    LNBertForSequenceClassification,
    LNBertModel,
)

__all__ = [
    "NORM_PLACEMENTS",
    "NORM_TYPES",
    "LNBertConfig",
    "LNBertForMaskedLM",
    "LNBertForPreTraining",
    "LNBertForSequenceClassification",
    "LNBertModel",
]
