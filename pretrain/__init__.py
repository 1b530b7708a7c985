"""Pretraining BERT with a configurable normalization placement and norm type.

Importing this package imports nothing heavy: every command reads and checks its options before it imports torch
and transformers. ``import pretrain.modeling`` registers the ``lnbert`` model type with the transformers Auto
classes, after which a snapshot opens with ``AutoModelForSequenceClassification.from_pretrained(path)``.
"""
