"""The norm types every norm of the model can take, and the learned scales some placements add.

``LNBertConfig.norm_type`` picks the module for every norm of the model; ``make_norm`` builds it. Each type keeps
``nn.LayerNorm``'s parameter names (``weight``, ``bias`` where it has one), so a norm sits at the Hugging Face name
of the LayerNorm it replaces.

    layernorm  (x - mean) / sqrt(var + eps) * weight + bias      Hugging Face BERT's (Ba et al. 2016)
    rmsnorm    x / sqrt(mean(x^2) + eps) * weight                 Zhang & Sennrich 2019, arXiv 1910.07467
    dyt        weight * tanh(alpha * x) + bias, alpha a scalar    Zhu et al. 2025, arXiv 2503.10622
    derf       weight * erf(alpha * x + shift) + bias, scalars    Chen et al. 2025, arXiv 2512.10938
    seednorm   (weight + tanh(<x, beta>) alpha) * rmsnorm(x)      Cai et al. 2025, arXiv 2510.22777

DyT, Derf and SeeDNorm have a ``preactivation``, what their saturating function ``squash`` reads (both logged in
training). Weight
decay never applies to these modules' parameters, nor to ``Scale``'s or ``GPAS``'s (``NO_DECAY_MODULES``, by type),
but for those a module names ``decayed`` (SeeDNorm's alpha and beta, as its paper).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pretrain.variants import DEFAULTS, NORM_TYPES


class RMSNorm(nn.Module):
    """Root-mean-square norm in float32 whatever the input dtype, as Hugging Face's ``LlamaRMSNorm`` (in bf16 the
    mean of squares would lose most of its digits; float64 stays float64); ``torch.nn.RMSNorm(size, eps)`` in float32."""

    # Whether the norm is a statistic of x times a gain (plus a bias), ``(x - mean) / std`` (True, as nn.LayerNorm)
    # or ``x / rms(x)`` (False), which ``residual_streams.normalized_projection`` folds into a projection; None: not.
    centred: bool | None = False

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def normalized(self, x: torch.Tensor) -> torch.Tensor:
        """``x / rms(x)`` in float32, or float64 for a float64 input; in ``x``'s dtype."""
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        return (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * self.normalized(x)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class DyT(nn.Module):
    """Dynamic Tanh: ``weight * tanh(alpha * x) + bias`` with one learnable scalar ``alpha`` (official code:
    ``jiachenzhu/DyT`` ``dynamic_tanh.py``, which swaps every LayerNorm for it; alpha 0.5 at init there)."""

    squash = staticmethod(torch.tanh)

    def __init__(self, size: int, alpha_init: float) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size))
        self.inits = {"alpha": alpha_init}  # beyond weight 1, bias 0: read by the model's _init_weights

    def preactivation(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha * x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * self.squash(self.preactivation(x)) + self.bias

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, inits={self.inits}"


class Derf(DyT):
    """Dynamic erf: ``weight * erf(alpha * x + shift) + bias``, learnable scalars ``alpha`` and ``shift`` (official
    code: ``zlab-princeton/Derf`` ``dynamic_erf.py``: alpha 0.5 and shift 0 at init, in the input's dtype)."""

    squash = staticmethod(torch.special.erf)

    def __init__(self, size: int, alpha_init: float) -> None:
        super().__init__(size, alpha_init)
        self.shift = nn.Parameter(torch.zeros(1))
        self.inits["shift"] = 0.0

    def preactivation(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha * x + self.shift


class SeeDNorm(RMSNorm):
    """Self-rescaled dynamic norm: ``(weight + tanh(<x, beta>) alpha) * x / rms(x)``, one dot product per token of
    the un-normalised input with ``beta`` (the paper's single-head form, its language models'), in float32 as
    ``RMSNorm``. The paper's init, weight 1, alpha 1, beta 0, is RMSNorm exactly; beta's gradient is not zero
    (alpha's is until beta moves). alpha and beta are decayed, the gain ``weight`` is not (docs/placements.md)."""

    decayed = frozenset({"alpha", "beta"})  # the paper decays both, for numerical stability; the gain as RMSNorm's
    centred = None  # its gain depends on x: not a statistic times a gain
    squash = staticmethod(torch.tanh)

    def __init__(self, size: int, eps: float) -> None:
        super().__init__(size, eps)
        self.alpha = nn.Parameter(torch.ones(size))
        self.beta = nn.Parameter(torch.zeros(size))
        self.inits = {"alpha": 1.0, "beta": 0.0}

    def preactivation(self, x: torch.Tensor) -> torch.Tensor:
        wide = torch.promote_types(x.dtype, torch.float32)  # elementwise, so autocast would leave it in bf16
        return (x.to(wide) * self.beta.to(wide)).sum(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight + self.squash(self.preactivation(x))[..., None] * self.alpha  # (..., size)
        return scale * self.normalized(x)


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


class GPAS(nn.Module):
    """Gradient-preserving activation scaling: ``x - SiLU(gate) * sg(x)``, the forward ``(1 - SiLU(gate)) x`` with
    the gradient to ``x`` unscaled (stop-gradient); one gate per layer, 0 at init (the identity), as the official
    ``GPASBlock`` (``dandingsky/GPAS`` ``modeling_llama.py``)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Parameter(torch.zeros(1))
        self.inits = {"gate": 0.0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - F.silu(self.gate) * x.detach()


# Each norm type's module over the last dimension of width ``size``, at its initial values; ``options``: the model's
# (an LNBertConfig: layer_norm_eps and the norm types' init options).
NORMS: dict[str, Callable[[int, Any], nn.Module]] = {
    "layernorm": lambda size, options: nn.LayerNorm(size, eps=options.layer_norm_eps),
    "rmsnorm": lambda size, options: RMSNorm(size, options.layer_norm_eps),
    "dyt": lambda size, options: DyT(size, options.dyt_alpha_init),
    "derf": lambda size, options: Derf(size, options.derf_alpha_init),
    "seednorm": lambda size, options: SeeDNorm(size, options.layer_norm_eps),
}
assert tuple(NORMS) == NORM_TYPES, "a norm type is named in pretrain/variants.py (read before torch) and built here"


def make_norm(options: Any, size: int) -> nn.Module:
    """The norm of ``options.norm_type`` (a config's) over the last dimension, of width ``size``, at its initial values."""
    return NORMS[options.norm_type](size, options)


_PROBE = SimpleNamespace(**vars(DEFAULTS), layer_norm_eps=1e-5)  # enough to build each norm type once
NORM_MODULES: tuple[type[nn.Module], ...] = tuple(type(build(1, _PROBE)) for build in NORMS.values())
# Weight decay skips every parameter of these but a module's ``decayed`` (pretrain.optim); torch's own norms for models
# from elsewhere.
NO_DECAY_MODULES: tuple[type[nn.Module], ...] = (*NORM_MODULES, Scale, GPAS, nn.GroupNorm, nn.BatchNorm1d, nn.RMSNorm)
