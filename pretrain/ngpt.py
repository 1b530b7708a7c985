"""nGPT, the normalized Transformer, as a BERT: ``norm_placement="ngpt"`` (Loshchilov, Hsieh, Sun, Ginsburg,
ICLR 2025, arXiv 2410.01131; official code ``NVIDIA/ngpt`` ``model.py`` and ``train.py``).

Every hidden state, and every weight vector along the embedding dimension, lies on the unit sphere; there is no
LayerNorm, RMSNorm or DyT anywhere, no bias in the encoder and no dropout. With Norm(x) = x / ||x|| (no eps, no
gain), d the hidden size, d_k the head size:

    h_0 = Norm(E_tok[x] + E_type[t] + E_pos[p])                      BERT's three embeddings, each row unit norm
    q, k = Norm(W_q h) s_qk, Norm(W_k h) s_qk   per head             softmax scale sqrt(d_k), not 1/sqrt(d_k)
    h_A = Norm(W_o Attn(q, k, W_v h))
    h   = Norm(h + |alpha_A| (h_A - h))                              Eq. 10: the eigen learning rate alpha_A
    h_M = Norm(W_out GELU(s_u sqrt(d) (W_in h)))                     GELU kept for SwiGLU (A.1's sqrt(d) argument)
    h   = Norm(h + |alpha_M| (h_M - h))                              Eq. 11
    z   = s_z (E_out h_L)                                            Eq. 3: the MLM logits, no transform, no bias

The learned vectors alpha_A, alpha_M, s_qk, s_u, s_z are stored with the paper's scale trick (§2.5, ``Scaler``).
The matrices are normalised along the embedding dimension at init and after every optimizer step
(``normalize_matrices``, as train.py's, through ``after_optimizer_step``): the rows of the three embeddings, W_q,
W_k, W_v, W_in and an untied E_out, the columns of W_o and W_out (``nn.Linear``'s (out, in) layout). Names are
Hugging Face BERT's for the projections, the official code's for the scalers. ``pretrain.modeling`` holds the
embeddings (``UnitNorm`` their norm), the layer stack and BERT's pooler and heads, which read sqrt(d) h.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn
from transformers import BertConfig
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from pretrain.attention import eager_attention_forward, project_qkv

# The ``config`` arguments below are the model's LNBertConfig (pretrain/modeling.py), typed as its Hugging Face base
# class: this module sits below the model file, which imports it.

# The effective values at init (§2.6; model.py's *_init_value).
ALPHA_INIT = 0.05  # alpha_A, alpha_M: "in order of 1/n_layers"
SQK_INIT = 1.0
SU_INIT = 1.0
SZ_INIT = 1.0


def base_scale(hidden_size: int) -> float:
    """1 / sqrt(d): the official ``base_scale`` (train.py sets it from n_embd), the stored value of most scalers."""
    return hidden_size**-0.5


@dataclass(frozen=True)
class Scaler:
    """How a learned vector is stored (the paper's scale trick, §2.5): ``scale`` * ones at init, used as stored *
    (``init`` / ``scale``), so an Adam step of about lr moves the effective value by about lr * init / scale."""

    init: float
    """s_init: the effective value at init."""
    scale: float
    """s_scale: the stored value at init."""

    def initial(self, size: int) -> torch.Tensor:
        return torch.full((size,), self.scale)

    def effective(self, stored: torch.Tensor) -> torch.Tensor:
        return stored * (self.init / self.scale)


class _UnitNorm(torch.autograd.Function):
    """y = x / ||x|| with the backward written out, dx = (g - y (g . y)) / ||x||: three elementwise passes, not six,
    1.8x faster on CPU at (8, 128, 768); nGPT normalises six times per layer, its largest cost after the GEMMs."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        y = x / norm
        ctx.save_for_backward(y, norm)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        y, norm = ctx.saved_tensors
        return (grad - y * (grad * y).sum(-1, keepdim=True)) / norm


def unit(x: torch.Tensor) -> torch.Tensor:
    """Norm(x) = x / ||x|| over the last dimension, in at least float32 (the result's dtype). No eps, as the
    paper and the official ``justnorm``: Norm(0) is NaN, which is why the word embeddings have no ``padding_idx``."""
    return _UnitNorm.apply(x.to(torch.promote_types(x.dtype, torch.float32)))


SphereModule = TypeVar("SphereModule", nn.Linear, nn.Embedding)


def on_sphere(module: SphereModule, dim: int) -> SphereModule:
    """Mark ``module``'s weight as unit norm along ``dim``, the embedding dimension (1: rows, 0: columns of
    ``nn.Linear``'s (out, in) weight), for the model's ``_init_weights`` and ``normalize_matrices``."""
    module.unit_norm_dim = dim
    return module


def sphere_matrices(model: nn.Module) -> list[tuple[nn.Parameter, int]]:
    """Every weight marked by ``on_sphere`` under ``model`` (any wrapper: DDP, Accelerate) with its dimension, each
    once (a tied decoder is the word embeddings)."""
    found = {id(m.weight): (m.weight, m.unit_norm_dim) for m in model.modules() if hasattr(m, "unit_norm_dim")}
    return list(found.values())


def _normalized(weight: torch.Tensor, dim: int) -> torch.Tensor:
    w = weight.to(torch.promote_types(weight.dtype, torch.float32))
    return w / torch.linalg.vector_norm(w, dim=dim, keepdim=True)


@torch.no_grad()
def normalize_matrices(model: nn.Module) -> None:
    """Re-normalise every matrix on the sphere to unit norm along its embedding dimension, in place, computed in
    float32 (train.py's ``normalize_matrices()``); what ``after_optimizer_step`` runs for nGPT."""
    for weight, dim in sphere_matrices(model):
        weight.copy_(_normalized(weight, dim))


def init_on_sphere(weight: torch.Tensor, dim: int, std: float) -> None:
    """normal(0, std) (the official 1/sqrt(d); a Gaussian's direction does not depend on it), then unit norm along
    ``dim``. Through ``transformers.initialization``, so weights loaded by ``from_pretrained`` are left as they are."""
    init.normal_(weight, mean=0.0, std=std)
    init.copy_(weight, _normalized(weight, dim))


class UnitNorm(nn.Module):
    """Norm(x) in ``x``'s dtype, without parameters: the embedding output h_0 (``LNBertEmbeddings.LayerNorm``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return unit(x).to(x.dtype)


class NgptSelfAttention(nn.Module):
    """Q, K, V without biases; each head's queries and keys normalised and scaled by s_qk (``sqk``, d numbers
    viewed as (heads, d_k)); softmax scale sqrt(d_k), as the official code's ``softmax_scale``."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.head_size = d // config.num_attention_heads
        self.query = on_sphere(nn.Linear(d, d, bias=False), dim=1)
        self.key = on_sphere(nn.Linear(d, d, bias=False), dim=1)
        self.value = on_sphere(nn.Linear(d, d, bias=False), dim=1)
        self.sqk_scaler = Scaler(SQK_INIT, base_scale(d))
        self.sqk = nn.Parameter(self.sqk_scaler.initial(d))
        self.is_causal = False  # read by transformers' SDPA / flash attention interfaces

    def init_parameters(self) -> None:
        init.copy_(self.sqk, self.sqk_scaler.initial(self.sqk.numel()))

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        q, k, v = project_qkv(hidden_states, (self.query, self.key, self.value), self.head_size, self.config.fused_qkv)
        s_qk = self.sqk_scaler.effective(self.sqk).view(-1, 1, self.head_size)  # (nh, 1, hs) against (B, nh, T, hs)
        q, k = ((unit(x) * s_qk).to(v.dtype) for x in (q, k))
        scaling = self.head_size**0.5
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        out, probs = attend(self, q, k, v, attention_mask, dropout=0.0, scaling=scaling)
        return out.flatten(2), probs  # out: (B, T, nh, hs)


class NgptProjection(nn.Module):
    """``attention.output`` and ``output``: a projection to the hidden size without bias, columns on the sphere."""

    def __init__(self, in_features: int, hidden_size: int) -> None:
        super().__init__()
        self.dense = on_sphere(nn.Linear(in_features, hidden_size, bias=False), dim=0)


class NgptAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = NgptSelfAttention(config)
        self.output = NgptProjection(config.hidden_size, config.hidden_size)


class NgptIntermediate(nn.Module):
    """GELU(s_u sqrt(d) (W_in h)): the FFN input without bias, scaled per channel by s_u (``su``, stored 1, used
    1: §2.6) and by sqrt(d), which moves the activation's input, a cosine, into GELU's non-linear range (A.1)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = on_sphere(nn.Linear(config.hidden_size, config.intermediate_size, bias=False), dim=1)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]
        self.su_scaler = Scaler(SU_INIT, 1.0)
        self.su = nn.Parameter(self.su_scaler.initial(config.intermediate_size))
        self.input_scale = math.sqrt(config.hidden_size)

    def init_parameters(self) -> None:
        init.copy_(self.su, self.su_scaler.initial(self.su.numel()))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        u = self.dense(hidden_states)
        scale = self.su_scaler.effective(self.su) * self.input_scale  # (d_ff,): one vector, not one more full pass
        return self.intermediate_act_fn(u * scale.to(u.dtype))


class NgptLayer(GradientCheckpointingLayer):
    """One nGPT layer at Hugging Face BERT's module names, plus the eigen learning rates ``attn_alpha`` and
    ``mlp_alpha`` (d each, stored 1/sqrt(d), used |stored * 0.05 sqrt(d)|); ``ngpt_block`` is its data flow.
    Checkpointed as ``LNBertLayer`` is."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.attention = NgptAttention(config)
        self.intermediate = NgptIntermediate(config)
        self.output = NgptProjection(config.intermediate_size, d)
        self.alpha_scaler = Scaler(ALPHA_INIT, base_scale(d))
        self.attn_alpha = nn.Parameter(self.alpha_scaler.initial(d))
        self.mlp_alpha = nn.Parameter(self.alpha_scaler.initial(d))

    def init_parameters(self) -> None:
        for alpha in (self.attn_alpha, self.mlp_alpha):
            init.copy_(alpha, self.alpha_scaler.initial(alpha.numel()))

    # What the block reads.
    def attend(self, h: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """W_o Attn(h), before its Norm."""
        out, probs = self.attention.self(h, attention_mask)
        return self.attention.output.dense(out), probs

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        """W_out GELU(s_u sqrt(d) W_in h), before its Norm."""
        return self.output.dense(self.intermediate(h))

    def eigen_lr(self, alpha: nn.Parameter) -> torch.Tensor:
        """|alpha|, the effective eigen learning rate of ``attn_alpha`` or ``mlp_alpha`` (A.2: the sign is free)."""
        return self.alpha_scaler.effective(alpha).abs()

    def forward(self, h: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return ngpt_block(self, h, attention_mask)


def ngpt_block(
    layer: NgptLayer, h: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """nGPT: each sub-layer moves the unit-norm h toward its normalised output by the eigen learning rate (a LERP
    for the paper's SLERP), then back onto the sphere. No norm module; ``h`` itself is not normalised again
    (it is unit norm already: the official ``justnorm(h)`` is there "normally not needed").

        h ──┬─────────────────────────────┐
            Attn                          │
            Norm = h_A                    │
            └── h + |alpha_A| (h_A - h) ──┘
                Norm
        h ──┬─────────────────────────────┐
            FFN                           │
            Norm = h_M                    │
            └── h + |alpha_M| (h_M - h) ──┘
                Norm

    The stream stays in its dtype (float32 under bf16 autocast, as Pre-LN's sum); every Norm is in at least float32.
    """
    dtype = h.dtype
    branch, probs = layer.attend(h, mask)
    h = unit(torch.lerp(h, unit(branch).to(dtype), layer.eigen_lr(layer.attn_alpha).to(dtype))).to(dtype)
    branch = layer.feed_forward(h)
    h = unit(torch.lerp(h, unit(branch).to(dtype), layer.eigen_lr(layer.mlp_alpha).to(dtype))).to(dtype)
    return h, probs


class NgptLMPredictionHead(nn.Module):
    """z = s_z (E_out h): the decoder without bias (tied to the word embeddings, as BERT, or its own rows on the
    sphere), times s_z per vocabulary token (``sz``, stored 1/sqrt(d), used 1). No transform (it leaves the sphere)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.decoder = on_sphere(nn.Linear(config.hidden_size, config.vocab_size, bias=False), dim=1)
        self.sz_scaler = Scaler(SZ_INIT, base_scale(config.hidden_size))
        self.sz = nn.Parameter(self.sz_scaler.initial(config.vocab_size))

    def init_parameters(self) -> None:
        init.copy_(self.sz, self.sz_scaler.initial(self.sz.numel()))

    def set_decoder(self, decoder: nn.Linear) -> None:
        self.decoder = on_sphere(decoder, dim=1)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # Float32 logits (under autocast the product promotes), as the loss takes them.
        return self.decoder(hidden_states) * self.sz_scaler.effective(self.sz)


# Modules with learned scalers, initialised by their own ``init_parameters`` (the model's ``_init_weights``).
NGPT_MODULES: tuple[type[nn.Module], ...] = (NgptSelfAttention, NgptIntermediate, NgptLayer, NgptLMPredictionHead)


@dataclass
class NgptStats:
    """nGPT's invariants and its learned scalers at one moment, L layers. Effective values (after the scale trick)
    are means over each vector's entries."""

    weight_norm_error: float
    """The largest |‖w‖ - 1| over the embedding-dimension vectors of every matrix on the sphere: float32 rounding
    right after ``after_optimizer_step``; read between ``optimizer.step()`` and it, how far one step moved them."""
    attn_alpha: torch.Tensor
    """(L,): mean |alpha_A| per layer."""
    mlp_alpha: torch.Tensor
    """(L,): mean |alpha_M| per layer."""
    sqk: torch.Tensor
    """(L,): mean s_qk per layer."""
    su: torch.Tensor
    """(L,): mean s_u per layer (without the constant sqrt(d))."""
    sz: float | None
    """Mean s_z (None without an MLM head)."""
    hidden_norm_error: float | None = None
    """The largest |‖h‖ - 1| over the hidden states given to ``ngpt_stats`` (None when none were)."""

    def scalars(self) -> dict[str, float]:
        """Flat names for a logger: ``weight_norm_error``, ``attn_alpha/ll``, ``mlp_alpha/ll``, ``sqk/ll``,
        ``su/ll`` (ll the layer, two digits), ``sz``, ``hidden_norm_error`` where measured."""
        out = {"weight_norm_error": self.weight_norm_error}
        for name in ("attn_alpha", "mlp_alpha", "sqk", "su"):
            out.update({f"{name}/{i:02d}": float(v) for i, v in enumerate(getattr(self, name))})
        for name in ("sz", "hidden_norm_error"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


@torch.no_grad()
def ngpt_stats(model: nn.Module, hidden_states: tuple[torch.Tensor, ...] | None = None) -> NgptStats:
    """``NgptStats`` of ``model`` (any wrapper), from its parameters alone: no forward pass; about one read of the
    sphere matrices, in float32. ``hidden_states`` (a forward's ``output_hidden_states``) adds their norm error."""
    errors = [(torch.linalg.vector_norm(w.float(), dim=dim) - 1).abs().max() for w, dim in sphere_matrices(model)]
    if not errors:
        raise ValueError("the model has no nGPT matrices (norm_placement is not 'ngpt')")
    layers = [m for m in model.modules() if isinstance(m, NgptLayer)]
    heads = [m for m in model.modules() if isinstance(m, NgptLMPredictionHead)]

    def means(values: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([v.float().mean() for v in values]).cpu()

    hidden = None
    if hidden_states is not None:
        hidden = max(float((torch.linalg.vector_norm(h.float(), dim=-1) - 1).abs().max()) for h in hidden_states)
    return NgptStats(weight_norm_error=float(torch.stack(errors).max()),
                     attn_alpha=means([layer.eigen_lr(layer.attn_alpha) for layer in layers]),
                     mlp_alpha=means([layer.eigen_lr(layer.mlp_alpha) for layer in layers]),
                     sqk=means([a.sqk_scaler.effective(a.sqk) for a in (layer.attention.self for layer in layers)]),
                     su=means([f.su_scaler.effective(f.su) for f in (layer.intermediate for layer in layers)]),
                     sz=float(heads[0].sz_scaler.effective(heads[0].sz).float().mean()) if heads else None,
                     hidden_norm_error=hidden)  # fmt: skip
