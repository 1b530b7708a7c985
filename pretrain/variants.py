"""What a model variant is made of, as names and defaults, without torch (standard library only).

Every command checks its options before it imports torch and transformers (about 9 s of CPU), so that a typo
answers at once, against what lives here: the names of the placements, norm types, init schemes and residual
schemes, the defaults of ``LNBertConfig``'s own options (each documented in docs/model.md), and ``check_options``,
the one check of a model's options.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any, Literal, get_args

NormPlacement = Literal[
    "post", "pre", "sandwich", "peri", "deepnorm", "admin", "rezero", "b2t", "resi_dual",
    "mix_ln", "lns", "hybrid", "normformer", "output_ln", "parallel", "ngpt",
]  # fmt: skip
NORM_PLACEMENTS: tuple[str, ...] = get_args(NormPlacement)

NormType = Literal["layernorm", "rmsnorm", "dyt"]
NORM_TYPES: tuple[str, ...] = get_args(NormType)

InitScheme = Literal["bert", "xavier"]
INIT_SCHEMES: tuple[str, ...] = get_args(InitScheme)

# On top of Pre-LN (docs/placements.md): the plain residual sum, Hyper-Connections, mHC, Attention Residuals.
ResidualScheme = Literal["standard", "hc", "mhc", "attn_res"]
RESIDUAL_SCHEMES: tuple[str, ...] = get_args(ResidualScheme)

# mHC's static biases at init (not in its paper): zero (H_res uniform 1/n) or b_res diagonal (H_res near I).
MhcBiasInit = Literal["zero", "identity"]
MHC_BIAS_INITS: tuple[str, ...] = get_args(MhcBiasInit)


@dataclass(frozen=True)
class LNBertOptions:
    """The options ``LNBertConfig`` adds to ``BertConfig``, with their defaults (the same for every placement)."""

    norm_placement: NormPlacement = "post"
    norm_type: NormType = "layernorm"
    qk_norm: bool = False
    dyt_alpha_init: float = 0.5
    mix_ln_post_layers: int | None = None
    admin_omega: float | None = None
    admin_learnable_omega: bool = False
    b2t_rescale_init: bool = True
    hybrid_first_pre_norm: bool = False
    normformer_head_scale: bool = True
    normformer_attn_norm: bool = True
    normformer_ffn_norm: bool = True
    normformer_resid_scale: bool = False
    embedding_layer_norm: bool = True
    init_scheme: InitScheme = "bert"
    sparse_mlm_head: bool = True
    tie_word_embeddings: bool = True
    fused_qkv: bool = False
    residual_scheme: ResidualScheme = "standard"
    hc_streams: int = 4
    hc_dynamic: bool = True
    mhc_sinkhorn_iters: int = 20
    mhc_bias_init: MhcBiasInit = "zero"
    attn_res_block_size: int | None = None


DEFAULTS = LNBertOptions()


def check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    """Refuse ``value`` unless it is one of ``choices``, naming the key, the closest choice and all of them."""
    if value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{key}={value!r} is not a valid choice{hint}; valid choices: {', '.join(choices)}")


def check_options(config: Any, prefix: str = "") -> None:
    """Refuse options no model builds, naming the field (``prefix`` + its name) and the fix: ``config`` is an
    ``LNBertConfig``, or the command line's ``model`` section (``prefix`` "model."), checked before torch loads."""
    for key, choices in (("norm_placement", NORM_PLACEMENTS), ("norm_type", NORM_TYPES), ("init_scheme", INIT_SCHEMES)):
        check_choice(f"{prefix}{key}", getattr(config, key), choices)
    width, heads = f"{prefix}hidden_size={config.hidden_size}", f"{prefix}num_attention_heads"
    if config.hidden_size % config.num_attention_heads != 0:
        raise ValueError(f"{width} is not divisible by {heads}={config.num_attention_heads}: {heads} must divide "
                         f"{width}; choose one of its divisors")  # fmt: skip
    if (k := config.mix_ln_post_layers) is not None and not 0 <= k <= config.num_hidden_layers:
        raise ValueError(f"{prefix}mix_ln_post_layers={k} must be between 0 and {prefix}num_hidden_layers="
                         f"{config.num_hidden_layers} (or null for round(L/4))")  # fmt: skip
    if config.admin_omega is not None and not (math.isfinite(config.admin_omega) and config.admin_omega > 0):
        raise ValueError(f"{prefix}admin_omega={config.admin_omega} must be positive (or null for the O(log N) rule)")
    if not (math.isfinite(config.dyt_alpha_init) and config.dyt_alpha_init > 0):
        raise ValueError(f"{prefix}dyt_alpha_init={config.dyt_alpha_init} must be > 0 (DyT's default: 0.5)")
    check_residual_scheme(config.norm_placement, config.residual_scheme, config.hc_streams, config.mhc_sinkhorn_iters,
                          config.mhc_bias_init, config.attn_res_block_size, prefix)  # fmt: skip
    check_ngpt(config.norm_placement, config.norm_type, config.qk_norm, config.embedding_layer_norm, prefix)


def check_residual_scheme(norm_placement: str, residual_scheme: str, hc_streams: int, mhc_sinkhorn_iters: int,
                          mhc_bias_init: str, attn_res_block_size: int | None, prefix: str = "") -> None:  # fmt: skip
    """Refuse a residual scheme the model cannot build, naming the field (``prefix`` + its name) and the fix.

    An odd ``attn_res_block_size`` is allowed: Block AttnRes is defined for any block size in sub-layers (1 is Full
    AttnRes); an odd size only closes some blocks inside a layer, where the paper's close after whole layers.
    """
    check_choice(f"{prefix}residual_scheme", residual_scheme, RESIDUAL_SCHEMES)
    if residual_scheme != "standard" and norm_placement != "pre":
        raise ValueError(f"{prefix}residual_scheme={residual_scheme!r} needs {prefix}norm_placement='pre' (got "
                         f"{norm_placement!r}): HC, mHC and AttnRes are defined on a Pre-LN block only; set "
                         f"{prefix}norm_placement=pre or {prefix}residual_scheme=standard")  # fmt: skip
    for key, value, default in (("hc_streams", hc_streams, 4), ("mhc_sinkhorn_iters", mhc_sinkhorn_iters, 20)):
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"{prefix}{key}={value!r} must be an integer >= 1 (the papers' default: {default})")
    check_choice(f"{prefix}mhc_bias_init", mhc_bias_init, MHC_BIAS_INITS)
    size = attn_res_block_size
    if size is not None and not (isinstance(size, int) and size >= 1):
        raise ValueError(
            f"{prefix}attn_res_block_size={size!r} must be an integer >= 1 (sub-layers per block; 1 or null: Full "
            "AttnRes; even values close blocks between layers)"
        )


def check_ngpt(
    norm_placement: str, norm_type: str, qk_norm: bool, embedding_layer_norm: bool, prefix: str = ""
) -> None:
    """Refuse, under ``norm_placement="ngpt"``, the options that choose a norm module: nGPT has none (its hidden
    states and weight vectors are normalised to unit length, x / ||x||), so each would change nothing but the
    variant's label. ``residual_scheme`` is refused by ``check_residual_scheme`` (Pre-LN only)."""
    if norm_placement != "ngpt":
        return
    given = {
        "norm_type": (norm_type, "nGPT has no LayerNorm, RMSNorm or DyT"),
        "qk_norm": (qk_norm, "nGPT normalises each head's queries and keys itself, then scales them by s_qk"),
        "embedding_layer_norm": (embedding_layer_norm, "nGPT's embedding output is Norm(E_tok + E_type + E_pos)"),
    }
    for key, (value, why) in given.items():
        if value != getattr(DEFAULTS, key):
            raise ValueError(
                f"{prefix}{key}={value!r} does not apply to {prefix}norm_placement='ngpt': {why}; leave "
                f"{prefix}{key} at its default ({getattr(DEFAULTS, key)!r}, which ngpt does not read)"
            )


def residual_scheme_label(residual_scheme: str = DEFAULTS.residual_scheme, hc_streams: int = DEFAULTS.hc_streams,
                          hc_dynamic: bool = DEFAULTS.hc_dynamic, mhc_bias_init: str = DEFAULTS.mhc_bias_init,
                          attn_res_block_size: int | None = DEFAULTS.attn_res_block_size) -> str:  # fmt: skip
    """The residual scheme's part of a variant's label, empty for ``standard``: ``hc4`` (dynamic HC, 4 streams),
    ``shc4`` (static HC), ``mhc4`` (``mhc4-idres`` with the identity bias init), ``attnres`` (Full AttnRes),
    ``attnres-b4`` (Block AttnRes, blocks of 4 sub-layers; ``attnres-b1`` computes what ``attnres`` does)."""
    if residual_scheme == "hc":
        return f"{'hc' if hc_dynamic else 'shc'}{hc_streams}"
    if residual_scheme == "mhc":
        return f"mhc{hc_streams}" + ("-idres" if mhc_bias_init == "identity" else "")
    if residual_scheme == "attn_res":
        return "attnres" if attn_res_block_size is None else f"attnres-b{attn_res_block_size}"
    return ""


def variant_name(norm_placement: str, norm_type: str = DEFAULTS.norm_type, qk_norm: bool = DEFAULTS.qk_norm, *,
                 residual_scheme: str = DEFAULTS.residual_scheme, hc_streams: int = DEFAULTS.hc_streams,
                 hc_dynamic: bool = DEFAULTS.hc_dynamic, mhc_bias_init: str = DEFAULTS.mhc_bias_init,
                 attn_res_block_size: int | None = DEFAULTS.attn_res_block_size) -> str:  # fmt: skip
    """The label of a model variant in run names, W&B groups and tags, and reports: the placement, its residual
    scheme (``residual_scheme_label``), then the norm type and QK-norm when they are not the defaults (``pre``,
    ``pre-rmsnorm``, ``post-dyt-qknorm``, ``pre-hc4``, ``pre-attnres-b4-rmsnorm``)."""
    scheme = residual_scheme_label(residual_scheme, hc_streams, hc_dynamic, mhc_bias_init, attn_res_block_size)
    parts = [norm_placement] + ([scheme] if scheme else []) + ([norm_type] if norm_type != "layernorm" else [])
    return "-".join(parts + (["qknorm"] if qk_norm else []))
