"""Where the norms go: every placement as one entry of ``PLACEMENTS``, without torch (the command line reads the names
before torch loads); docs/model.md says what an entry holds, docs/placements.md the equations, constants and claims.

``x`` is the residual stream entering a layer; ``Attn`` and ``FFN`` are the two sub-layers, each including its
output projection and dropout; ``N_a`` and ``N_f`` are the sub-layer norms Hugging Face calls
``attention.output.LayerNorm`` and ``output.LayerNorm`` (whatever their ``norm_type``), ``B_a`` and ``B_f`` the
branch norms ``attention.output.branch_norm`` and ``output.branch_norm``; ``L`` layers, ``N = 2L`` sub-layers,
``l = 1..L`` a layer's index. A block function reads the layer's modules and returns the new stream; each draws its
data flow. An entry gives each layer's parts (``LayerParts``: every part off, ``nn.Identity``, unless it turns it on)
and what the rest of the code must know; ``pretrain/modeling.py`` builds from it and never asks for a name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from torch import nn

    from pretrain.denseformer import DepthWeightedAverage, LayerOutputs
    from pretrain.residual_streams import DepthSources, ResidualModule

    # What a block passes on: the stream, ResiDual's (a, d), or a residual scheme's (n streams, AttnRes's sources,
    # DenseFormer's stream and layer outputs).
    Stream = torch.Tensor | tuple[torch.Tensor, torch.Tensor] | DepthSources | LayerOutputs
    Probs = torch.Tensor | None


class LNBertLayer(Protocol):
    """What a block reads of its layer (``pretrain.modeling.LNBertLayer``): the sub-layers and norms by role."""

    norm_a: nn.Module  # attention.output.LayerNorm (nn.Identity where the block has none)
    norm_f: nn.Module  # output.LayerNorm
    rezero_gate: nn.Module
    gpas: nn.Module  # GPAS's scale (nn.Identity without gpas)
    attention_residual: ResidualModule | DepthWeightedAverage  # residual schemes only
    ffn_residual: ResidualModule | DepthWeightedAverage

    def attend(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Probs]: ...
    def feed_forward(self, x: torch.Tensor) -> torch.Tensor: ...
    def skip_a(self, x: torch.Tensor) -> torch.Tensor: ...
    def skip_f(self, x: torch.Tensor) -> torch.Tensor: ...
    def scaled(self, x: torch.Tensor) -> torch.Tensor: ...


def post_block(layer: LNBertLayer, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Probs]:
    """Post-LN, and the placements that only scale its residual (DeepNorm's alpha, Admin's omega: ``r``); with
    ``gpas`` (DeepNorm, Mix-LN's Post-LN layers) GPAS scales the skip, as its official ``deeppost_gpas``.

        x ──┬──────────┐
            Attn       │ G, * r
            └──(+)─────┘
                N_a
        x ──┬──────────┐
            FFN        │ G, * r
            └──(+)─────┘
                N_f

    The Hugging Face trap: BERT's post-LN is ``N(x + F(x))``, not ``x + N(F(x))`` (that is ``output_ln``).
    """
    branch, probs = layer.attend(x, mask)
    x = layer.norm_a(branch + layer.skip_a(layer.gpas(x)))
    x = layer.norm_f(layer.feed_forward(x) + layer.skip_f(layer.gpas(x)))
    return x, probs


def pre_block(layer: LNBertLayer, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Probs]:
    """Pre-LN, and what grows on it: sandwich / Peri-LN (branch norms ``B``), LNS (``s = 1/sqrt(l)``),
    NormFormer (head scales, ``B_a``, a norm inside the FFN, a scaled FFN skip); with ``gpas``, GPAS ``G`` after
    each residual sum, as its official ``pre_gpas``. The sub-layers apply their branch norms, head scales and inner
    norm themselves; absent ones are the identity.

        x ──┬──────────────┐
            N_a * s        │
            Attn           │
            B_a            │
            └──(+)─────────┘
                G
        x ──┬──────────────┐
            N_f * s        │
            FFN            │ (* w, NormFormer's residual scale)
            B_f            │
            └──(+)─────────┘
                G
    """
    branch, probs = layer.attend(layer.scaled(layer.norm_a(x)), mask)  # B_a is part of the sub-layer
    x = layer.gpas(layer.skip_a(x) + branch)
    x = layer.gpas(layer.skip_f(x) + layer.feed_forward(layer.scaled(layer.norm_f(x))))
    return x, probs


def rezero_block(layer: LNBertLayer, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Probs]:
    """ReZero: no norm, one gate ``g`` per layer (``rezero_gate``, 0 at init, shared by both sub-layers), as the
    official ``rztx.py``'s ``resweight``. At init every layer is the identity.

        x ──┬─────────┐        x ──┬─────────┐
            Attn * g  │            FFN * g   │
            └──(+)────┘            └──(+)────┘
    """
    branch, probs = layer.attend(x, mask)
    x = x + layer.rezero_gate(branch)
    x = x + layer.rezero_gate(layer.feed_forward(x))
    return x, probs


def b2t_block(layer: LNBertLayer, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Probs]:
    """Post-LN plus the bottom-to-top connection: the layer's input joins its last residual sum.

    x ──┬──────┬───────────┐
        Attn   │           │
        └─(+)──┘           │
          N_a = y          │
        ┌─┴──────┐         │
        FFN      │         │
        └──(+)───┴─────(+)─┘
                   N_f
    """
    branch, probs = layer.attend(x, mask)
    y = layer.norm_a(branch + x)
    return layer.norm_f(y + layer.feed_forward(y) + x), probs


def resi_dual_block(
    layer: LNBertLayer, streams: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None
) -> tuple[tuple[torch.Tensor, torch.Tensor], Probs]:
    """ResiDual: a Post-LN stream ``a`` and an un-normalised stream ``d`` that sums every sub-layer's output; the
    encoder's output is ``a_L + N_final(d_L)`` (``LNBertEncoder.end``).

        a ──┬─────────┐            d ─────(+)──── d
            Attn = f  │                    │
            └─(+)─────┘── f ───────────────┘
              N_a = a        (likewise FFN with N_f)
    """
    a, d = streams
    f, probs = layer.attend(a, mask)
    a, d = layer.norm_a(a + f), d + f
    f = layer.feed_forward(a)
    a, d = layer.norm_f(a + f), d + f
    return (a, d), probs


def hybrid_block(layer: LNBertLayer, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Probs]:
    """HybridNorm: norms on each head's Q, K and V inside the attention (the sub-layer applies them), none on the
    attention input; the FFN's "Post-Norm" normalises the stream and takes its residual after the norm
    (paper: X' = FFN(Norm(Y)) + Norm(Y); official config ``ffn_residual_after_norm: true``).

        x ──┬─────────────────┐
            Attn(QKV-norm)    │
            └──(+)────────────┘
              N_f
            ┌─┴──────┐
            FFN      │
            └──(+)───┘
    """
    branch, probs = layer.attend(x, mask)
    h = layer.norm_f(x + branch)
    return h + layer.feed_forward(h), probs


def output_ln_block(layer: LNBertLayer, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Probs]:
    """OLMo 2: norms on the branch outputs only, none on the inputs.

    x ──┬──────────┐        x ──┬──────────┐
        Attn       │            FFN        │
        N_a        │            N_f        │
        └──(+)─────┘            └──(+)─────┘
    """
    branch, probs = layer.attend(x, mask)
    x = x + layer.norm_a(branch)
    return x + layer.norm_f(layer.feed_forward(x)), probs


def parallel_block(layer: LNBertLayer, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Probs]:
    """Parallel block (GPT-J, PaLM, ModernBERT ``parallel_prenorm``): one norm feeds both sub-layers.

    x ──┬──────────────────┐
        N_a                │
      ┌─┴──┐               │
    Attn  FFN              │
      └(+)─┴──────(+)──────┘
    """
    h = layer.norm_a(x)
    branch, probs = layer.attend(h, mask)
    return x + branch + layer.feed_forward(h), probs


def residual_scheme_block(layer: LNBertLayer, state: Stream, mask: torch.Tensor | None) -> tuple[Stream, Probs]:
    """Pre-LN's two sub-layers under a residual scheme: each reads its input from the residual state and writes its
    output back through its residual module R (``attention_residual``, ``ffn_residual``; ``residual_schemes.SCHEMES``).

        state ──R.read── h ── N_a ── Attn ──R.write──> state
        state ──R.read── h ── N_f ── FFN ───R.write──> state
    """
    h, pending = layer.attention_residual.read(state)
    branch, probs = layer.attend(layer.norm_a(h), mask)
    state = layer.attention_residual.write(state, pending, branch)
    h, pending = layer.ffn_residual.read(state)
    return layer.ffn_residual.write(state, pending, layer.feed_forward(layer.norm_f(h))), probs


@dataclass(frozen=True)
class Block:
    """One layer's wiring: its forward and the sub-layer norms it reads (the layer builds these and no others)."""

    forward: Callable[..., tuple[Any, Any]]
    attention_norm: bool = True  # N_a, attention.output.LayerNorm
    ffn_norm: bool = True  # N_f, output.LayerNorm
    ends_in_norm: bool = False  # the layer's output is N_f(...): what init-scale reads is that norm's input


BLOCKS: dict[str, Block] = {
    "post": Block(post_block, ends_in_norm=True),
    "pre": Block(pre_block),
    "rezero": Block(rezero_block, attention_norm=False, ffn_norm=False),
    "b2t": Block(b2t_block, ends_in_norm=True),
    "resi_dual": Block(resi_dual_block),
    "hybrid": Block(hybrid_block, attention_norm=False),
    "output_ln": Block(output_ln_block),
    "parallel": Block(parallel_block, ffn_norm=False),
    "residual_scheme": Block(residual_scheme_block),  # pre under a residual scheme (pretrain/residual_schemes.py)
}

# The layer's projections by their Hugging Face names; DeepNorm scales the last four at init.
DEEPNORM_SCALED = ("attention.self.value", "attention.output.dense", "intermediate.dense", "output.dense")
LAYER_LINEARS = ("attention.self.query", "attention.self.key", *DEEPNORM_SCALED)


@dataclass(frozen=True)
class LayerParts:
    """What one layer is built with: its block (``BLOCKS``) and the parts its placement adds, each off by default."""

    block: str
    skip_scale: float = 1.0  # a fixed scalar on both skips (DeepNorm's alpha, Admin's omega): export folds it in
    # The init of a learned per-channel scale on the attention and the FFN skip (attention.output.residual_scale,
    # output.residual_scale); None: no such scale.
    learned_skip_scales: tuple[float | None, float | None] = (None, None)
    norm_scale: float = 1.0  # a scalar on the sub-layer norms' outputs (LNS's 1/sqrt(l))
    gate: bool = False  # ReZero's gate rezero_gate, one scalar shared by both branches, 0 at init
    qkv_norms: tuple[bool, bool] = (False, False)  # norms over each head's (Q and K, V), shared by the heads
    branch_norms: tuple[bool, bool] = (False, False)  # B_a, B_f
    branch_norm_after_dropout: bool = False  # B_a(dropout(F)) as CogView, else dropout(B_a(F)) as fairseq
    head_scale: bool = False  # a learned scale per head on the attention output projection's output (NormFormer)
    ffn_inner_norm: bool = False  # a norm over the FFN's inner width after the activation (NormFormer)
    init_gains: Mapping[str, float] = field(default_factory=dict)  # by projection (LAYER_LINEARS), for _init_weights


def deepnorm_layer(config: Any, index: int) -> LayerParts:
    """DeepNorm: ``x = N_a(alpha x + Attn(x))``, likewise FFN; alpha = (2L)^(1/4) on the skips, and V, the attention
    output and both FFN projections initialised with gain beta = (8L)^(-1/4) (Wang et al. 2022, 2203.00555: Xavier
    with gain beta; torchscale's bert_init: normal(0, 0.02) divided by (8L)^(1/4), i.e. times beta)."""
    layers = config.num_hidden_layers
    return LayerParts(
        "post", skip_scale=(2 * layers) ** 0.25, init_gains=dict.fromkeys(DEEPNORM_SCALED, (8 * layers) ** -0.25)
    )


def admin_omega_default(num_layers: int) -> float:
    """admin-torch's default residual weight ('O(logn)'): sqrt((N+1)/ln(N+1) - 1), N = 2L sub-layers (L = 12: 2.601)."""
    n = 2 * num_layers
    return math.sqrt((n + 1) / math.log(n + 1) - 1)


def admin_layer(config: Any, index: int) -> LayerParts:
    """Admin: ``x = N_a(omega x + Attn(x))``, likewise FFN (Liu et al. 2020, 2004.08249); omega ``admin_omega`` or
    ``admin_omega_default``, a fixed scalar, or with ``admin_learnable_omega`` a learned vector per sub-layer."""
    omega = admin_omega_default(config.num_hidden_layers) if config.admin_omega is None else config.admin_omega
    if config.admin_learnable_omega:
        return LayerParts("post", learned_skip_scales=(omega, omega))
    return LayerParts("post", skip_scale=omega)


def b2t_layer(config: Any, index: int) -> LayerParts:
    """B2T (Takase et al. 2023, 2206.00330): Post-LN plus the layer's input in its last residual sum; with
    ``b2t_rescale_init`` every weight matrix of the layer times L^(-1/2) at init (the official ``rescaling_init``)."""
    gain = config.num_hidden_layers**-0.5
    return LayerParts("b2t", init_gains=dict.fromkeys(LAYER_LINEARS, gain) if config.b2t_rescale_init else {})


def mix_ln_post_layers_default(num_layers: int) -> int:
    """Mix-LN's Post-LN layer count, round(L/4) (the authors' scripts: 3 of 12, 6 of 24)."""
    return round(num_layers / 4)


def mix_ln_layer(config: Any, index: int) -> LayerParts:
    """Mix-LN (Li et al. 2025, 2412.13795): layers 1..k Post-LN, k+1..L Pre-LN; k ``mix_ln_post_layers`` (null:
    ``mix_ln_post_layers_default``)."""
    k = config.mix_ln_post_layers
    return LayerParts("post" if index < (mix_ln_post_layers_default(config.num_hidden_layers) if k is None else k)
                      else "pre")  # fmt: skip


def lns_layer(config: Any, index: int) -> LayerParts:
    """LayerNorm Scaling (Sun et al. 2025, 2502.05795): Pre-LN with the norm outputs times 1/sqrt(l), l = index + 1
    (the official ``1 / sqrt(layer_index + 1)``)."""
    return LayerParts("pre", norm_scale=(index + 1) ** -0.5)


def hybrid_layer(config: Any, index: int) -> LayerParts:
    """HybridNorm (Zhuo et al. 2025, 2503.04598): ``x = N_f(x + Attn_qkv-norm(x)); x = x + FFN(x)``, norms on each
    head's Q, K and V; ``hybrid_first_pre_norm`` (HybridNorm*) makes the first layer Pre-LN, keeping its QKV norms."""
    first_pre = config.hybrid_first_pre_norm and index == 0
    return LayerParts("pre" if first_pre else "hybrid", qkv_norms=(True, True))


def normformer_layer(config: Any, index: int) -> LayerParts:
    """NormFormer (Shleifer et al. 2021, 2110.09456): Pre-LN plus head scales, ``B_a`` and a norm inside the FFN
    (each switched by its ``normformer_*`` option), and optionally a learned scale on the FFN skip."""
    return LayerParts("pre", branch_norms=(config.normformer_attn_norm, False), head_scale=config.normformer_head_scale,
                      ffn_inner_norm=config.normformer_ffn_norm,
                      learned_skip_scales=(None, 1.0 if config.normformer_resid_scale else None))  # fmt: skip


def ngpt_step_stats(model: nn.Module) -> dict[str, float]:
    """nGPT's invariants and learned scalers after an optimizer step, before it re-normalises (``ngpt/...``)."""
    from pretrain.ngpt import ngpt_stats

    return {f"ngpt/{key}": value for key, value in ngpt_stats(model).scalars().items()}


@dataclass(frozen=True)
class Placement:
    """A placement: the parts of each layer, and what the encoder and the rest of the code add around the stack."""

    layers: LayerParts | Callable[[Any, int], LayerParts] | None  # or of (config, index); None: nGPT's own layers
    final_norm: bool  # encoder.final_layer_norm
    two_streams: bool = False  # ResiDual's (a, d); the output is a_L + N_final(d_L)
    exports_to_bert: bool = False  # its fixed skip scale folds into the output projections (pretrain/export.py)
    residual_schemes: bool = False  # a residual scheme may replace its residual sum (each built on Pre-LN only)
    # nGPT: hidden states and weight vectors on the unit sphere (its embeddings, layers and MLM head), the token
    # heads' inputs times sqrt(d), the matrices re-normalised after each optimizer step, no weight decay.
    sphere: bool = False
    options: tuple[str, ...] = ()  # its own options (LNBertOptions): refused under another placement
    fixed_options: Mapping[str, str] = field(default_factory=dict)  # options it does not read, with why: refused
    deepspeed: str = ""  # why it cannot run under DeepSpeed ("": it can)
    # What the training loop logs after a logged optimizer step, before after_optimizer_step (nGPT's invariants).
    step_stats: Callable[[nn.Module], dict[str, float]] | None = None

    def layer_parts(self, config: Any, index: int) -> LayerParts | None:
        return self.layers(config, index) if callable(self.layers) else self.layers


NORMFORMER_OPTIONS = ("normformer_head_scale", "normformer_attn_norm", "normformer_ffn_norm", "normformer_resid_scale")
NGPT_FIXED = {
    "norm_type": "nGPT has no LayerNorm, RMSNorm or DyT",
    "qk_norm": "nGPT normalises each head's queries and keys itself, then scales them by s_qk",
    "embedding_layer_norm": "nGPT's embedding output is Norm(E_tok + E_type + E_pos)",
    "attention_gate": "nGPT's attention is its own, and no source defines a gate on the sphere",
    "value_residual": "nGPT's attention is its own, and no source defines value residuals on the sphere",
}
# GPAS (Chen et al. 2025, 2506.22049; dandingsky/GPAS NORM_TYPE pre_gpas, sandwich_gpas, deeppost_gpas,
# post_pre_gpas, lns_gpas): defined on these placements only.
GPAS_OPTION = ("gpas",)
NGPT_DEEPSPEED = ("its optimizer keeps its own copies of the weights, which nGPT's re-normalisation after each step "
                  "cannot reach")  # fmt: skip

# Ding et al. 2021 (CogView); Peri-LN, Kim et al. 2025 (2502.02732): x = x + B_a(Attn(N_a(x))); likewise FFN.
SANDWICH = Placement(LayerParts("pre", branch_norms=(True, True), branch_norm_after_dropout=True), final_norm=True,
                     options=GPAS_OPTION)
PLACEMENTS: dict[str, Placement] = {
    "post": Placement(LayerParts("post"), final_norm=False, exports_to_bert=True),  # BERT; Hugging Face BertModel
    "pre": Placement(LayerParts("pre"), final_norm=True, residual_schemes=True, options=GPAS_OPTION),  # Xiong et al. 2020
    "sandwich": SANDWICH,
    "peri": SANDWICH,  # another name of sandwich (ALIASES)
    "deepnorm": Placement(deepnorm_layer, final_norm=False, exports_to_bert=True, options=GPAS_OPTION),
    "admin": Placement(admin_layer, final_norm=False, exports_to_bert=True,
                       options=("admin_omega", "admin_learnable_omega")),
    "rezero": Placement(LayerParts("rezero", gate=True), final_norm=False),  # Bachlechner et al. 2020
    "b2t": Placement(b2t_layer, final_norm=False, options=("b2t_rescale_init",)),
    "resi_dual": Placement(LayerParts("resi_dual"), final_norm=True, two_streams=True),  # Xie et al. 2023, 2304.14802
    "mix_ln": Placement(mix_ln_layer, final_norm=True, options=("mix_ln_post_layers", *GPAS_OPTION)),
    "lns": Placement(lns_layer, final_norm=True, options=GPAS_OPTION),
    "hybrid": Placement(hybrid_layer, final_norm=True, options=("hybrid_first_pre_norm",)),
    "normformer": Placement(normformer_layer, final_norm=True, options=NORMFORMER_OPTIONS),
    "output_ln": Placement(LayerParts("output_ln"), final_norm=True),  # OLMo 2, 2501.00656
    "parallel": Placement(LayerParts("parallel"), final_norm=True),  # GPT-J; PaLM; ModernBERT
    # nGPT (Loshchilov et al. 2025, 2410.01131): h = Norm(h + |a_A| (Norm(Attn(h)) - h)), likewise FFN; no norm module.
    "ngpt": Placement(
        None, final_norm=False, sphere=True, fixed_options=NGPT_FIXED, deepspeed=NGPT_DEEPSPEED,
        step_stats=ngpt_step_stats,
    ),
}  # fmt: skip
# Other names of a placement (peri is sandwich): each later name of an entry, with its first name.
_FIRST_NAMES = {id(entry): name for name, entry in reversed(PLACEMENTS.items())}
ALIASES: dict[str, str] = {name: _FIRST_NAMES[id(entry)] for name, entry in PLACEMENTS.items()
                           if _FIRST_NAMES[id(entry)] != name}  # fmt: skip


def canonical_placement(name: str) -> str:
    """The placement's own name (``peri`` is ``sandwich``); distinct placements stay distinct, even with one block."""
    return ALIASES.get(name, name)
