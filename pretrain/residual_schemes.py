"""What replaces Pre-LN's residual sum: every residual scheme as one entry of one table, ``SCHEMES``, without torch
(the command line reads names and labels before torch loads; an entry's builders import its module when a model is
built). The modules of HC, mHC and AttnRes are ``pretrain/residual_streams.py``'s, those of mHC-lite and
Frac-Connections ``pretrain/hc_variants.py``'s, DenseFormer's ``pretrain/denseformer.py``'s; the layer's block is
``placements.residual_scheme_block``; docs/placements.md gives the equations.

A scheme gives each sub-layer k (layer i's attention: k = 2i, its FFN: 2i + 1) a residual module R that reads the
sub-layer's input from the residual state and writes its output back; the encoder starts the state from the
embedding output, reports and ends it as one stream (the entry's ``collapse``), or through an output module of its
own (AttnRes's ``encoder.output_residual``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

MHC_LITE_MAX_STREAMS = 5  # mHC-lite's H_res weighs n! permutations: 120 at n = 5, 720 at 6


def _streams() -> Any:
    """``pretrain.residual_streams``, the modules of HC, mHC and AttnRes: imported once a model is built."""
    from pretrain import residual_streams

    return residual_streams


def _hc_variants() -> Any:
    """``pretrain.hc_variants``, the modules of mHC-lite and Frac-Connections."""
    from pretrain import hc_variants

    return hc_variants


def _denseformer() -> Any:
    """``pretrain.denseformer``, DenseFormer's modules."""
    from pretrain import denseformer

    return denseformer


def _stream_copies(encoder: nn.Module, embeddings: torch.Tensor) -> torch.Tensor:
    """n copies of the embedding output, (B, T, n, d) (HC's Algorithm 1)."""
    return embeddings.unsqueeze(-2).expand(*embeddings.shape[:-1], encoder.config.hc_streams, embeddings.shape[-1])


def _depth_sources(encoder: nn.Module, embeddings: torch.Tensor) -> Any:
    """AttnRes's sources of the embedding output (``DepthSources``), with every reader's pseudo-query in reading
    order: each layer's attention and FFN, then the output; ``attn_res_block_size`` null: Full AttnRes."""
    readers = [r for layer in encoder.layer for r in (layer.attention_residual, layer.ffn_residual)]
    queries = [r.pseudo_query for r in (*readers, encoder.output_residual)]
    config = encoder.config
    return _streams().DepthSources.start(embeddings, config.attn_res_block_size or 1, config.layer_norm_eps, queries)


def _streams_flops(config: Any, extra: int) -> float:
    """HC and mHC, per sub-layer: the input and H_res x, (n+1) x n times n x d, 2·(n+1)·n·d; the output into n
    streams, 2·n·d; plus ``extra``, the scheme's own mappings."""
    n, d = config.hc_streams, config.hidden_size
    return float(2 * config.num_hidden_layers * (2 * (n + 1) * n * d + 2 * n * d + extra))


def _hc_flops(config: Any) -> float:
    """Dynamic HC's weights add 2·n·d·(n+1) + 2·n·d per sub-layer."""
    n, d = config.hc_streams, config.hidden_size
    return _streams_flops(config, 2 * n * d * (n + 1) + 2 * n * d if config.hc_dynamic else 0)


def _mhc_flops(config: Any) -> float:
    """mHC's mappings from the flattened streams add 2·n·d·(2n + n²), Sinkhorn-Knopp 4·n² per iteration."""
    n, d = config.hc_streams, config.hidden_size
    return _streams_flops(config, 2 * n * d * (2 * n + n * n) + 4 * n * n * config.mhc_sinkhorn_iters)


def _attn_res_flops(config: Any) -> float:
    """AttnRes, per sub-layer reading K sources (and once more for the output): K logits of d and their weighted
    sum, 4·K·d; K counts the embedding output, then every earlier output (Full) or the completed blocks and the
    current block's partial sum (Block)."""
    block, d = config.attn_res_block_size or 1, config.hidden_size  # Full AttnRes: every output its own source
    # Sub-layer k (or the output, k = 2L) attends over b_0, k // block completed blocks and a begun partial sum.
    return float(sum(4 * (1 + k // block + (k % block != 0)) * d for k in range(2 * config.num_hidden_layers + 1)))


def _mhc_lite_flops(config: Any) -> float:
    """mHC-lite's mappings from the flattened streams add 2·n·d·(2n + n!), H_res from the n! permutations 2·n!·n²."""
    n, d = config.hc_streams, config.hidden_size
    return _streams_flops(config, 2 * n * d * (2 * n + math.factorial(n)) + 2 * math.factorial(n) * n * n)


def _frac_flops(config: Any) -> float:
    """Frac-Connections, per sub-layer: [Gamma^T; A^T] (2m x m) times the m fractions of d/m, 2·2m·d; the output into
    them, 2·d; dynamic FC's weights from each fraction, 2·d·2m + 2·d."""
    m, d = config.frac_parts, config.hidden_size
    dynamic = 4 * d * m + 2 * d if config.hc_dynamic else 0
    return float(2 * config.num_hidden_layers * (4 * m * d + 2 * d + dynamic))


def _denseformer_flops(config: Any) -> float:
    """DenseFormer: after layer i (where it averages) the weighted sum of its (i + 1 + k) // k stored outputs, 2·d each."""
    k, p, d = config.dwa_dilation, config.dwa_period, config.hidden_size
    return float(sum(2 * d * ((i + 1 + k) // k) for i in range(config.num_hidden_layers) if (i + 1) % p == 0))


def _frac_problem(config: Any, prefix: str) -> str:
    if config.hidden_size % config.frac_parts:
        return (
            f"{prefix}frac_parts={config.frac_parts} must divide {prefix}hidden_size={config.hidden_size} (the "
            "hidden state is split into frac_parts fractions of equal width); choose one of its divisors"
        )
    return ""


def _mhc_lite_problem(config: Any, prefix: str) -> str:
    if config.hc_streams > MHC_LITE_MAX_STREAMS:
        return (
            f"{prefix}hc_streams={config.hc_streams} is too many for residual_scheme=mhc_lite: H_res mixes all n! "
            f"permutations (720 at n = 6) and phi_res grows as n·d·n!; use n <= {MHC_LITE_MAX_STREAMS} (the "
            "paper's: 4)"
        )
    return ""


@dataclass(frozen=True)
class Scheme:
    """A residual scheme: its label, and how a model builds, starts and ends its residual state."""

    label: Callable[[Any], str]
    """Its part of a variant's label, from the model's options ("" for the plain sum)."""
    options: tuple[str, ...] = ()
    """The model options its label names (read back by ``pretrain.config.residual_scheme_fields``)."""
    module: Callable[[Any, int], nn.Module] | None = None
    """The residual module of sub-layer k under a config; None: the plain residual sum (no module)."""
    start: Callable[[nn.Module, torch.Tensor], Any] | None = None
    """The state the first layer reads, from the encoder (its config and modules) and the embedding output."""
    output: Callable[[Any], nn.Module] | None = None
    """A module that reads the encoder's output from the state (``encoder.output_residual``); None: the collapse."""
    collapse: Callable[[Any], torch.Tensor] = lambda state: _streams().collapse(state)
    """The one stream a state stands for (``hidden_states``, and the output before the final norm): HC's and mHC's
    sum of the streams, AttnRes's plain sum of its sources."""
    stream_is_tensor: bool = True
    """What passes between layers is one tensor (AttnRes passes its sources: no reentrant checkpointing)."""
    flops: Callable[[Any], float] = lambda config: 0.0
    """Forward FLOPs per token of its own work over the 2L sub-layers (``pretrain.flops``), 2 per multiply-add;
    norms, exp, sigmoid and tanh left out."""
    problem: Callable[[Any, str], str] = lambda config, prefix: ""
    """Why a model config (its sizes included) cannot take the scheme's options ("" when it can), naming each field
    with ``prefix``: ``pretrain.variants.check_options`` raises it."""


SCHEMES: dict[str, Scheme] = {
    "standard": Scheme(lambda o: ""),
    # Hyper-Connections (Zhu et al., ICLR 2025, 2409.19606): dynamic (hc4) or static (shc4), n streams.
    "hc": Scheme(
        label=lambda o: f"{'hc' if o.hc_dynamic else 'shc'}{o.hc_streams}", options=("hc_streams", "hc_dynamic"),
        module=lambda c, k: _streams().HyperConnection(c.hidden_size, c.hc_streams, k,
                                                       c.make_norm() if c.hc_dynamic else None),
        start=_stream_copies, flops=_hc_flops,
    ),
    # mHC (Xie et al., DeepSeek-AI, 2512.24880): H_res doubly stochastic by Sinkhorn-Knopp.
    "mhc": Scheme(
        label=lambda o: f"mhc{o.hc_streams}" + ("-idres" if o.mhc_bias_init == "identity" else ""),
        options=("hc_streams", "mhc_bias_init"),
        module=lambda c, k: _streams().ManifoldHyperConnection(c.hidden_size, c.hc_streams, c.mhc_sinkhorn_iters,
                                                               c.mhc_bias_init),
        start=_stream_copies, flops=_mhc_flops,
    ),
    # Attention Residuals (Kimi Team, 2603.15031): a softmax over depth, Full or Block.
    "attn_res": Scheme(
        label=lambda o: "attnres" if o.attn_res_block_size is None else f"attnres-b{o.attn_res_block_size}",
        options=("attn_res_block_size",), module=lambda c, k: _streams().AttentionResidual(c.hidden_size),
        start=_depth_sources, output=lambda c: _streams().AttentionResidual(c.hidden_size), stream_is_tensor=False,
        flops=_attn_res_flops,
    ),
    # mHC-lite (Yang, Gao, 2601.05732; FFTYYY/mhc-lite): mHC with H_res a convex combination of the n! permutations.
    "mhc_lite": Scheme(
        label=lambda o: f"mhclite{o.hc_streams}" + ("-idres" if o.mhc_bias_init == "identity" else ""),
        options=("hc_streams", "mhc_bias_init"),
        module=lambda c, k: _hc_variants().MhcLite(c.hidden_size, c.hc_streams, c.mhc_bias_init),
        start=_stream_copies, flops=_mhc_lite_flops, problem=_mhc_lite_problem,
    ),
    # Frac-Connections (Zhu, Huang et al., 2503.14125; its Algorithm 2): HC over m fractions of the hidden state.
    "frac": Scheme(
        label=lambda o: f"{'frac' if o.hc_dynamic else 'sfrac'}{o.frac_parts}", options=("frac_parts", "hc_dynamic"),
        module=lambda c, k: _hc_variants().FracConnection(
            c.hidden_size, c.frac_parts, c.make_norm(c.hidden_size // c.frac_parts) if c.hc_dynamic else None),
        collapse=lambda state: state, flops=_frac_flops, problem=_frac_problem,
    ),
    # DenseFormer (Pagliardini et al., 2402.02622; epfml/DenseFormer): after each layer a weighted average over depth.
    "denseformer": Scheme(
        label=lambda o: "denseformer" + ("" if o.dwa_dilation == o.dwa_period == 1 else
                                         f"-{o.dwa_dilation}x{o.dwa_period}"),
        options=("dwa_dilation", "dwa_period"),
        module=lambda c, k: _denseformer().DepthWeightedAverage(k, c.dwa_dilation, c.dwa_period),
        start=lambda encoder, x: _denseformer().LayerOutputs.start(x), collapse=lambda state: state.current,
        stream_is_tensor=False, flops=_denseformer_flops,
    ),
}  # fmt: skip
