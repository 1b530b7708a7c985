"""AdamW as pretraining, fine-tuning and the benchmarks build it: one builder, weight decay chosen by module type."""

from __future__ import annotations

from typing import Any, Literal, get_args

import torch
from torch import nn

from pretrain.norms import NO_DECAY_MODULES

AdamWImplementation = Literal["auto", "fused", "foreach", "for_loop"]
ADAMW_IMPLEMENTATIONS: tuple[str, ...] = get_args(AdamWImplementation)

# Norms and learned scales are exempt by module type (pretrain.norms.NO_DECAY_MODULES): a name-substring rule
# ("LayerNorm.weight") silently misses norms named otherwise (final_layer_norm, ...). nGPT's ``weight_decay_exempt``
# follows its paper (weight decay 0), whatever the recipe's value. A module's ``decayed`` names the parameters its
# paper decays though its type is exempt (SeeDNorm's alpha and beta).


def weight_decay_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW groups: decay on weight matrices and embeddings; none on biases, norms, learned scales, the
    parameters a module marks ``no_weight_decay`` and everything under a module marked ``weight_decay_exempt``; decay
    on the parameters a module marks ``decayed``, whatever its type. Trainable parameters only, each once (tied weights
    such as BERT's decoder/embedding appear once)."""
    no_decay: set[int] = set()
    for module in model.modules():
        if getattr(module, "weight_decay_exempt", False):
            no_decay.update(id(p) for p in module.parameters())
        exempt = getattr(type(module), "no_weight_decay", frozenset())
        decayed = getattr(type(module), "decayed", frozenset())
        for name, param in module.named_parameters(recurse=False):
            if name not in decayed and (isinstance(module, NO_DECAY_MODULES) or name == "bias" or name in exempt):
                no_decay.add(id(param))
    params = [p for p in model.parameters() if p.requires_grad]  # de-duplicated by nn.Module
    return [
        {"params": [p for p in params if id(p) not in no_decay], "weight_decay": weight_decay},
        {"params": [p for p in params if id(p) in no_decay], "weight_decay": 0.0},
    ]


def resolve_adamw_implementation(implementation: AdamWImplementation, device: torch.device) -> AdamWImplementation:
    """``auto`` is the fused kernel on CUDA (one launch; PyTorch would pick foreach), PyTorch's choice elsewhere."""
    return "fused" if implementation == "auto" and device.type == "cuda" else implementation


def build_adamw(model: nn.Module, *, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                implementation: AdamWImplementation = "fused") -> torch.optim.AdamW:  # fmt: skip
    """AdamW over ``weight_decay_groups``. ``implementation``: "auto" (PyTorch's choice: foreach on CUDA, the
    for-loop on CPU), "fused" (one kernel, CPU and CUDA, the fastest on both: BENCHMARKS.md; equal to the for-loop
    to rounding), "foreach" or "for_loop" (the reference loop)."""
    if implementation not in ADAMW_IMPLEMENTATIONS:
        raise ValueError(
            f"AdamW implementation {implementation!r} is not valid; valid choices: {', '.join(ADAMW_IMPLEMENTATIONS)}"
        )
    kernel = {} if implementation == "auto" else {name: implementation == name for name in ("fused", "foreach")}
    return torch.optim.AdamW(weight_decay_groups(model, weight_decay), lr=lr, betas=betas, eps=eps, **kernel)
