"""What ``pretrain.modeling.LNBertSelfAttention`` and ``pretrain.ngpt.NgptSelfAttention`` share: the Q, K, V
projections, separate or fused, and the eager attention kernel (the fallback of transformers' table,
``ALL_ATTENTION_FUNCTIONS``, which each attention module reads at every call)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def eager_attention_forward(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Plain softmax attention; ``attention_mask`` is additive (0 / -inf), as transformers builds it."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, nh, T, T)
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = F.dropout(scores.softmax(dim=-1), p=dropout, training=module.training)
    out = torch.matmul(probs, value).transpose(1, 2).contiguous()  # (B, T, nh, hs)
    return out, probs


def project_qkv(hidden_states: torch.Tensor, projections: tuple[nn.Linear, ...], head_size: int,
                fused: bool) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """Q, K and V, each split into heads (B, nh, T, hs): three GEMMs, or with ``fused`` one (3H x H) GEMM over the
    weights concatenated at forward time (biases too where the projections have them). Concatenating copies 3·H²
    numbers per step (benchmarks/train_step.py); the result equals the separate projections within float rounding."""
    if fused:
        weights = [m.weight for m in projections]
        biases = [m.bias for m in projections if m.bias is not None]
        device_type = hidden_states.device.type
        if torch.is_autocast_enabled(device_type):
            # Concatenate in the compute dtype: each weight is cast once, as autocast would, and the copy is half-size.
            dtype = torch.get_autocast_dtype(device_type)
            weights, biases = [w.to(dtype) for w in weights], [b.to(dtype) for b in biases]
        bias = torch.cat(biases) if biases else None
        qkv = F.linear(hidden_states, torch.cat(weights), bias).chunk(3, dim=-1)  # 3 x (B, T, H), views
    else:
        qkv = tuple(linear(hidden_states) for linear in projections)
    return tuple(x.unflatten(-1, (-1, head_size)).transpose(1, 2) for x in qkv)
