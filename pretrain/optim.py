"""AdamW parameter groups shared by pretraining and fine-tuning."""

from __future__ import annotations

from typing import Any

from torch import nn

# Normalisation layers get no weight decay, selected by module type: names differ between models, and a
# name-substring rule ("LayerNorm.weight") silently misses norms called otherwise (final_layer_norm, ...).
NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.LayerNorm,
    nn.GroupNorm,
    nn.BatchNorm1d,
    *([nn.RMSNorm] if hasattr(nn, "RMSNorm") else []),
)


def weight_decay_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW groups: decay on weight matrices and embeddings; none on biases and normalisation parameters.

    Trainable parameters only, each once (tied weights such as BERT's decoder/embedding appear once).
    """
    no_decay: set[int] = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if isinstance(module, NORM_TYPES) or name == "bias":
                no_decay.add(id(param))
    params = [p for p in model.parameters() if p.requires_grad]  # de-duplicated by nn.Module
    return [
        {"params": [p for p in params if id(p) not in no_decay], "weight_decay": weight_decay},
        {"params": [p for p in params if id(p) in no_decay], "weight_decay": 0.0},
    ]
