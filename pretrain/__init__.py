"""Pretraining BERT with a configurable LayerNorm placement.

Importing this package registers the ``lnbert`` model type with the transformers Auto classes.
"""

from pretrain.modeling import (
    NORM_PLACEMENTS,
    LNBertConfig,
    LNBertForMaskedLM,
    LNBertForPreTraining,
    LNBertForSequenceClassification,
    LNBertModel,
)

__all__ = [
    "NORM_PLACEMENTS",
    "LNBertConfig",
    "LNBertForMaskedLM",
    "LNBertForPreTraining",
    "LNBertForSequenceClassification",
    "LNBertModel",
]
