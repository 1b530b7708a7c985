"""Where the norms go: every placement as a named block, chosen from one table.

``x`` is the residual stream entering a layer; ``Attn`` and ``FFN`` are the two sub-layers, each including its
output projection and dropout; ``N_a`` and ``N_f`` are the sub-layer norms Hugging Face calls
``attention.output.LayerNorm`` and ``output.LayerNorm`` (whatever their ``norm_type``), ``B_a`` and ``B_f`` the
branch norms ``attention.output.branch_norm`` and ``output.branch_norm``; ``L`` layers, ``N = 2L`` sub-layers,
``l = 1..L`` a layer's index. A block function reads the layer's modules and returns the new stream; the layer
builds exactly the modules its block reads (the others are ``nn.Identity``, without parameters).

    name        per layer                                              final norm   source
    post        x = N_a(x + Attn(x)); x = N_f(x + FFN(x))              no           BERT; Hugging Face BertModel
    pre         x = x + Attn(N_a(x)); x = x + FFN(N_f(x))              yes          Xiong et al. 2020
    sandwich    x = x + B_a(Attn(N_a(x))); x = x + B_f(FFN(N_f(x)))    yes          Ding et al. 2021; Peri-LN
    peri        another name of sandwich                               yes          Kim et al. 2025, 2502.02732
    deepnorm    x = N_a(alpha x + Attn(x)); likewise FFN               no           Wang et al. 2022, 2203.00555
    admin       x = N_a(omega x + Attn(x)); likewise FFN               no           Liu et al. 2020, 2004.08249
    rezero      x = x + g_l Attn(x); x = x + g_l FFN(x); g_l = 0       no           Bachlechner et al. 2020
    b2t         y = N_a(x + Attn(x)); x = N_f(y + FFN(y) + x)          no           Takase et al. 2023, 2206.00330
    resi_dual   f = F(a); d = d + f; a = N(a + f); out a_L + N_F(d_L)  yes (on d)   Xie et al. 2023, 2304.14802
    mix_ln      layers 1..k post, k+1..L pre                           yes          Li et al. 2025, 2412.13795
    lns         pre with N(x) / sqrt(l)                                yes          Sun et al. 2025, 2502.05795
    hybrid      x = N_f(x + Attn_qkv-norm(x)); x = x + FFN(x)          yes          Zhuo et al. 2025, 2503.04598
    normformer  pre + head scales, B_a, a norm inside the FFN          yes          Shleifer et al. 2021, 2110.09456
    output_ln   x = x + N_a(Attn(x)); x = x + N_f(FFN(x))              yes          OLMo 2, 2501.00656
    parallel    h = N_a(x); x = x + Attn(h) + FFN(h)                   yes          GPT-J; PaLM; ModernBERT
    ngpt        h = Norm(h + |a_A| (Norm(Attn(h)) - h)); likewise FFN  no           Loshchilov et al. 2025, 2410.01131

Each block's docstring draws its data flow; docs/placements.md gives the equations, constants, parameter counts
and the papers' claims. ``ngpt`` is a family rather than a place for norms (``pretrain/ngpt.py``, ``ngpt_block``).
A residual scheme (HC, mHC, AttnRes: ``pretrain/residual_streams.py``) replaces Pre-LN's residual sum and keeps its
sub-layers (``residual_scheme_block``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from pretrain.ngpt import ngpt_block
from pretrain.residual_streams import DepthSources, ResidualModule
from pretrain.variants import NORM_PLACEMENTS, NormPlacement

# What a block passes on: the stream, ResiDual's (a, d), or a residual scheme's (n streams, AttnRes's sources).
Stream = torch.Tensor | tuple[torch.Tensor, torch.Tensor] | DepthSources
Probs = torch.Tensor | None


class LNBertLayer(Protocol):
    """What a block reads of its layer (``pretrain.modeling.LNBertLayer``): the sub-layers and norms by role."""

    norm_a: nn.Module  # attention.output.LayerNorm (nn.Identity where the block has none)
    norm_f: nn.Module  # output.LayerNorm
    rezero_gate: nn.Module
    attention_residual: ResidualModule  # residual schemes only
    ffn_residual: ResidualModule

    def attend(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Probs]: ...
    def feed_forward(self, x: torch.Tensor) -> torch.Tensor: ...
    def skip_a(self, x: torch.Tensor) -> torch.Tensor: ...
    def skip_f(self, x: torch.Tensor) -> torch.Tensor: ...
    def scaled(self, x: torch.Tensor) -> torch.Tensor: ...


BlockForward = Callable[[LNBertLayer, Stream, torch.Tensor | None], tuple[Stream, Probs]]


def post_block(layer: LNBertLayer, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Probs]:
    """Post-LN, and the placements that only scale its residual (DeepNorm's alpha, Admin's omega: ``r``).

        x ──┬──────────┐
            Attn       │ * r
            └──(+)─────┘
                N_a
        x ──┬──────────┐
            FFN        │ * r
            └──(+)─────┘
                N_f

    The Hugging Face trap: BERT's post-LN is ``N(x + F(x))``, not ``x + N(F(x))`` (that is ``output_ln``).
    """
    branch, probs = layer.attend(x, mask)
    x = layer.norm_a(branch + layer.skip_a(x))
    x = layer.norm_f(layer.feed_forward(x) + layer.skip_f(x))
    return x, probs


def pre_block(layer: LNBertLayer, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Probs]:
    """Pre-LN, and what grows on it: sandwich / Peri-LN (branch norms ``B``), LNS (``s = 1/sqrt(l)``),
    NormFormer (head scales, ``B_a``, a norm inside the FFN, a scaled FFN skip). The sub-layers apply their
    branch norms, head scales and inner norm themselves; absent ones are the identity.

        x ──┬──────────────┐
            N_a * s        │
            Attn           │
            B_a            │
            └──(+)─────────┘
        x ──┬──────────────┐
            N_f * s        │
            FFN            │ (* w, NormFormer's residual scale)
            B_f            │
            └──(+)─────────┘
    """
    branch, probs = layer.attend(layer.scaled(layer.norm_a(x)), mask)  # B_a is part of the sub-layer
    x = layer.skip_a(x) + branch
    x = layer.skip_f(x) + layer.feed_forward(layer.scaled(layer.norm_f(x)))
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
    output back through its residual module R (``attention_residual``, ``ffn_residual``; HC, mHC or AttnRes).

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
    """One layer's wiring: its forward and the norms it reads (the layer builds these and no others)."""

    forward: BlockForward
    attention_norm: bool = True  # N_a, attention.output.LayerNorm
    ffn_norm: bool = True  # N_f, output.LayerNorm
    branch_norms: bool = False  # B_a and B_f
    ends_in_norm: bool = False  # the layer's output is N_f(...): what init-scale reads is that norm's input


BLOCKS: dict[str, Block] = {
    "post": Block(post_block, ends_in_norm=True),
    "pre": Block(pre_block),
    "sandwich": Block(pre_block, branch_norms=True),
    "rezero": Block(rezero_block, attention_norm=False, ffn_norm=False),
    "b2t": Block(b2t_block, ends_in_norm=True),
    "resi_dual": Block(resi_dual_block),
    "hybrid": Block(hybrid_block, attention_norm=False),
    "output_ln": Block(output_ln_block),
    "parallel": Block(parallel_block, ffn_norm=False),
    "residual_scheme": Block(residual_scheme_block),  # pre with LNBertConfig.residual_scheme != "standard"
    "ngpt": Block(ngpt_block, attention_norm=False, ffn_norm=False),  # pretrain/ngpt.py's layers, no norm module
}


@dataclass(frozen=True)
class Placement:
    """A placement: the block of each layer, and what the encoder adds around the stack."""

    block: str  # the block of every layer, unless the placement mixes two (mix_ln, hybrid with its first layer)
    final_norm: bool
    two_streams: bool = False  # ResiDual
    # Scalar residual scales fold into the output projections (export_to_bert), so the model is plain BERT.
    exports_to_bert: bool = False


PLACEMENTS: dict[str, Placement] = {
    "post": Placement("post", final_norm=False, exports_to_bert=True),
    "pre": Placement("pre", final_norm=True),
    "sandwich": Placement("sandwich", final_norm=True),
    "deepnorm": Placement("post", final_norm=False, exports_to_bert=True),
    "admin": Placement("post", final_norm=False, exports_to_bert=True),
    "rezero": Placement("rezero", final_norm=False),
    "b2t": Placement("b2t", final_norm=False),
    "resi_dual": Placement("resi_dual", final_norm=True, two_streams=True),
    "mix_ln": Placement("pre", final_norm=True),
    "lns": Placement("pre", final_norm=True),
    "hybrid": Placement("hybrid", final_norm=True),
    "normformer": Placement("pre", final_norm=True),
    "output_ln": Placement("output_ln", final_norm=True),
    "parallel": Placement("parallel", final_norm=True),
    "ngpt": Placement("ngpt", final_norm=False),
}
# Other names of a placement: Peri-LN's block is the Sandwich block.
ALIASES: dict[str, str] = {"peri": "sandwich"}
PLACEMENTS.update({alias: PLACEMENTS[name] for alias, name in ALIASES.items()})
assert set(PLACEMENTS) == set(NORM_PLACEMENTS), "every placement needs a row in the table"


def canonical_placement(name: str) -> str:
    """The placement's own name (``peri`` is ``sandwich``); distinct placements stay distinct, even with one block."""
    return ALIASES.get(name, name)


def admin_omega_default(num_layers: int) -> float:
    """admin-torch's default residual weight ('O(logn)'): sqrt((N+1)/ln(N+1) - 1), N = 2L sub-layers (L = 12: 2.601)."""
    n = 2 * num_layers
    return math.sqrt((n + 1) / math.log(n + 1) - 1)


def mix_ln_post_layers_default(num_layers: int) -> int:
    """Mix-LN's Post-LN layer count, round(L/4) (the authors' scripts: 3 of 12, 6 of 24)."""
    return round(num_layers / 4)


__all__ = [
    "ALIASES", "BLOCKS", "NORM_PLACEMENTS", "PLACEMENTS", "Block", "NormPlacement", "Placement", "admin_omega_default",
    "canonical_placement", "mix_ln_post_layers_default",
]  # fmt: skip
