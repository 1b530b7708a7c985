"""The norm types every norm of the model can take, and the learned scales some placements add.

``LNBertConfig.norm_type`` picks the module for every norm of the model; ``make_norm`` builds it. Each type keeps
``nn.LayerNorm``'s parameter names (``weight``, ``bias`` where it has one), so a norm sits at the Hugging Face name
of the LayerNorm it replaces.

    layernorm  (x - mean) / sqrt(var + eps) * weight + bias      Hugging Face BERT's (Ba et al. 2016)
    rmsnorm    x / sqrt(mean(x^2) + eps) * weight                 Zhang & Sennrich 2019, arXiv 1910.07467
    dyt        weight * tanh(alpha * x) + bias, alpha a scalar    Zhu et al. 2025, arXiv 2503.10622

Weight decay never applies to these modules' parameters, nor to ``Scale``'s (``NO_DECAY_MODULES``, by type).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from pretrain.variants import NORM_TYPES, NormType


class RMSNorm(nn.Module):
    """Root-mean-square norm in float32 whatever the input dtype, as Hugging Face's ``LlamaRMSNorm`` (in bf16 the
    mean of squares would lose most of its digits); ``torch.nn.RMSNorm(size, eps)`` in float32."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class DyT(nn.Module):
    """Dynamic Tanh: ``weight * tanh(alpha * x) + bias`` with one learnable scalar ``alpha`` (official code:
    ``jiachenzhu/DyT`` ``dynamic_tanh.py``, which swaps every LayerNorm for it; alpha 0.5 at init there)."""

    def __init__(self, size: int, alpha_init: float) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size))
        self.alpha_init = alpha_init  # read by the model's _init_weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * torch.tanh(self.alpha * x) + self.bias

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, alpha_init={self.alpha_init}"


class Scale(nn.Module):
    """A learned elementwise scale ``x * weight`` (ReZero's gate, Admin's learnable omega, NormFormer's head and
    residual scales). Its own module so that weight decay skips it by type and each keeps a name of its own."""

    def __init__(self, shape: int, init: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((shape,), float(init)))
        self.init = init  # read by the model's _init_weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, init={self.init}"


# Each norm type's module over the last dimension of width ``size``, at its initial values: (size, eps, dyt_alpha_init).
NORMS: dict[str, Callable[[int, float, float], nn.Module]] = {
    "layernorm": lambda size, eps, alpha: nn.LayerNorm(size, eps=eps),
    "rmsnorm": lambda size, eps, alpha: RMSNorm(size, eps),
    "dyt": lambda size, eps, alpha: DyT(size, alpha),
}
assert tuple(NORMS) == NORM_TYPES, "a norm type is named in pretrain/variants.py (read before torch) and built here"


def make_norm(norm_type: NormType, size: int, eps: float, dyt_alpha_init: float = 0.5) -> nn.Module:
    """The norm of ``norm_type`` over the last dimension, of width ``size``, at its initial values."""
    return NORMS[norm_type](size, eps, dyt_alpha_init)


NORM_MODULES: tuple[type[nn.Module], ...] = tuple(type(build(1, 1e-5, 0.5)) for build in NORMS.values())
# Weight decay skips every parameter of these (pretrain.optim); torch's own norms for models from elsewhere.
NO_DECAY_MODULES: tuple[type[nn.Module], ...] = (*NORM_MODULES, Scale, nn.GroupNorm, nn.BatchNorm1d, nn.RMSNorm)
