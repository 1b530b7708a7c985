"""The options of a model variant, declared once, without torch (standard library only).

``LNBertOptions`` declares each option ``LNBertConfig`` adds to ``BertConfig``: its type, default, what it changes
(``effect``) and its doc. ``LNBertConfig`` (pretrain/modeling.py) and the command line's ``model`` section
(``pretrain.config.ModelConfig``) both inherit these fields; what ``from_pretrained`` compares with the trained
config derives from ``effect``. Every command checks its options before it imports torch and transformers (about 9 s
of CPU), so a typo answers at once, against what lives here and in the design tables it reads (the placements,
``pretrain/placements.py``; the residual schemes, ``pretrain/residual_schemes.py``): the names, and
``check_options``, the one check of a model's options.
"""

# No `from __future__ import annotations`: pretrain.config.ModelConfig inherits these fields, and jsonargparse resolves
# postponed annotations by running the TYPE_CHECKING imports of config.py (torch) before the options are read.

import dataclasses
import difflib
import functools
import math
import typing
from dataclasses import dataclass, fields
from types import MappingProxyType, SimpleNamespace
from typing import Any, Literal, get_args

from pretrain.common.roles import role
from pretrain.placements import PLACEMENTS
from pretrain.residual_schemes import SCHEMES

NormPlacement = Literal[tuple(PLACEMENTS)]  # type: ignore[valid-type]
NORM_PLACEMENTS: tuple[str, ...] = get_args(NormPlacement)
NormType = Literal["layernorm", "rmsnorm", "dyt", "derf", "seednorm"]  # each built by pretrain/norms.py's NORMS
NORM_TYPES: tuple[str, ...] = get_args(NormType)
InitScheme = Literal["bert", "xavier"]
INIT_SCHEMES: tuple[str, ...] = get_args(InitScheme)
ResidualScheme = Literal[tuple(SCHEMES)]  # type: ignore[valid-type]
RESIDUAL_SCHEMES: tuple[str, ...] = get_args(ResidualScheme)
# mHC's static biases at init (not in its paper): zero (H_res uniform 1/n) or b_res diagonal (H_res near I).
MhcBiasInit = Literal["zero", "identity"]
AttentionGate = Literal["none", "elementwise", "headwise"]
ValueResidual = Literal["none", "identity", "learnable"]

Effect = Literal["computation", "init", "kernel"]


def option(default: Any, effect: Effect = "computation") -> Any:
    """A model option (a ``recipe`` field, pretrain/common/roles.py) and what it changes: ``computation``, what given
    weights compute (``from_pretrained`` refuses another value than the trained one); ``init``, only the initial
    weights; ``kernel``, how the same numbers are computed."""
    f = role("recipe", default=default)
    f.metadata = MappingProxyType({**f.metadata, "effect": effect})
    return f


@dataclass(kw_only=True)
class LNBertOptions:
    """The options ``LNBertConfig`` adds to ``BertConfig``, each with the same default for every placement."""

    norm_placement: NormPlacement = option("post")
    """Where the norms go: post is original BERT, pre Xiong et al. 2020's, sandwich = peri (docs/placements.md)."""
    norm_type: NormType = option("layernorm")
    """The norm used everywhere (embeddings, layers, final norm, MLM head): layernorm, rmsnorm, dyt, derf or seednorm."""
    qk_norm: bool = option(False)
    """A norm of norm_type on each head's queries and keys before the dot product (QK-norm)."""
    dyt_alpha_init: float = option(0.5, "init")
    """DyT's alpha at initialisation (norm_type=dyt)."""
    mix_ln_post_layers: int | None = option(None)
    """mix_ln: how many of the lowest layers are Post-LN; null: round(L/4) (3 of 12, 6 of 24)."""
    admin_omega: float | None = option(None)
    """admin: the residual weight omega; null: admin-torch's O(log N) rule sqrt((N+1)/ln(N+1) - 1), N = 2L."""
    admin_learnable_omega: bool = option(False)
    """admin: omega as a learnable vector per sub-layer (initialised to admin_omega) instead of a fixed scalar."""
    b2t_rescale_init: bool = option(True, "init")
    """b2t: scale every weight matrix of the layers by L^(-1/2) at init, as B2T's official code does."""
    hybrid_first_pre_norm: bool = option(False)
    """hybrid: HybridNorm*, the first layer Pre-Norm in attention and FFN."""
    normformer_head_scale: bool = option(True)
    """normformer: a learned scale per attention head."""
    normformer_attn_norm: bool = option(True)
    """normformer: a norm on the attention output before the residual add."""
    normformer_ffn_norm: bool = option(True)
    """normformer: a norm over the FFN's inner width after the activation."""
    normformer_resid_scale: bool = option(False)
    """normformer: a learned scale on the FFN skip connection (the paper's option for small models)."""
    init_scheme: InitScheme = option("bert", "init")
    """Weight init: bert = normal(0, 0.02); xavier = Xavier-normal (the paper's analysis setting)."""
    embedding_layer_norm: bool = option(True)
    """Keep BERT's LayerNorm on the summed embeddings (same for every placement)."""
    sparse_mlm_head: bool = option(True, "kernel")
    """Run the MLM head only at masked positions (same loss and gradients, less compute)."""
    fused_qkv: bool = option(False, "kernel")
    """Q, K, V from one GEMM (same parameters; a few % faster under bf16); off: Post-LN is op-for-op HF BERT."""
    residual_scheme: ResidualScheme = option("standard")
    """How sub-layer outputs reach later ones (norm_placement=pre only): hc, mhc, attn_res, mhc_lite, frac,
    denseformer (docs/placements.md)."""
    hc_streams: int = option(4)
    """hc, mhc, mhc_lite: the number of residual streams n (the papers' 4)."""
    hc_dynamic: bool = option(True)
    """hc, frac: dynamic HC or FC (per-token weights, the papers' default); false: static HC or FC."""
    mhc_sinkhorn_iters: int = option(20)
    """mhc: Sinkhorn-Knopp iterations of H_res (the paper's 20)."""
    mhc_bias_init: MhcBiasInit = option("zero", "init")
    """mhc, mhc_lite: the static biases at init: zero (H_res uniform 1/n: the Pre-LN model) or identity (H_res near
    I)."""
    attn_res_block_size: int | None = option(None)
    """attn_res: Block AttnRes's block size in sub-layers (attention and FFN count one each); null: Full AttnRes."""
    frac_parts: int = option(4)
    """frac: the fractions m the hidden state is split into, each d/m wide (the paper's DFC x4: 4)."""
    dwa_dilation: int = option(1)
    """denseformer: the dilation k: the average after layer i reads the outputs j = i + 1 mod k (the paper's 1)."""
    dwa_period: int = option(1)
    """denseformer: the period p: an average after every p-th layer only (the paper's 1)."""
    # The 2025-26 designs inside the layer (docs/placements.md): Derf's init, GPAS, gated attention, value residual.
    derf_alpha_init: float = option(0.5, "init")
    """Derf's alpha at initialisation (norm_type=derf; its official code's 0.5)."""
    gpas: bool = option(False)
    """GPAS: each layer's stream scaled by 1 - SiLU(g) in the forward pass, its gradient unscaled (on the placements
    whose entries name it: those its official code defines it on)."""
    attention_gate: AttentionGate = option("none")
    """Gated attention: sigmoid(x W + b) times each head's output before the output projection; elementwise or
    headwise (one gate per head)."""
    value_residual: ValueResidual = option("none")
    """ResFormer: every later layer's values mixed with the first layer's, 0.5/0.5 (identity) or learned (learnable)."""


DEFAULTS = LNBertOptions()
COMPUTATION_OPTIONS: tuple[str, ...] = tuple(
    f.name for f in fields(LNBertOptions) if f.metadata["effect"] == "computation"
)
"""The options that change what given weights compute."""
RESIDUAL_SCHEME_FIELDS: tuple[str, ...] = (
    "residual_scheme",
    *dict.fromkeys(o for s in SCHEMES.values() for o in s.options),
)
"""The options a residual scheme's label names (``residual_scheme_label``), in the order the entries name them."""
DESIGN_LABELS: dict[str, dict[Any, str]] = {
    "gpas": {True: "gpas"}, "attention_gate": {"elementwise": "gated", "headwise": "gated-head"},
    "value_residual": {"identity": "vres", "learnable": "vres-learn"},
}  # fmt: skip
"""The options inside the layer that a variant's label names, and the label part of each value but the default."""
VARIANT_FIELDS: tuple[str, ...] = ("norm_placement", "norm_type", "qk_norm", *RESIDUAL_SCHEME_FIELDS, *DESIGN_LABELS)
"""The options a variant's label names (``variant_name``)."""


@functools.cache
def option_choices() -> dict[str, tuple[Any, ...]]:
    """The values of each option typed by a ``Literal``, by name."""
    hints = typing.get_type_hints(LNBertOptions)
    return {
        f.name: get_args(hints[f.name]) for f in fields(LNBertOptions) if typing.get_origin(hints[f.name]) is Literal
    }


@dataclass(frozen=True)
class OptionKind:
    """The values an option not typed by a ``Literal`` takes."""

    types: tuple[type, ...]  # bool is apart: True is no integer here, and 1 no boolean
    nullable: bool
    what: str

    def takes(self, value: Any) -> bool:
        if value is None or isinstance(value, bool):
            return self.nullable if value is None else self.types == (bool,)
        return self.types != (bool,) and isinstance(value, self.types)


@functools.cache
def option_kinds() -> dict[str, OptionKind]:
    """Each option not typed by a ``Literal`` (``option_choices``), by name: a config built in Python or read from a
    config.json is checked as the command line's parser checks its own (a float option takes an integer too)."""
    kinds = {bool: ((bool,), "true or false"), int: ((int,), "an integer"), float: ((int, float), "a number")}
    found = {}
    for name, hint in typing.get_type_hints(LNBertOptions).items():
        if typing.get_origin(hint) is not Literal:
            nullable = type(None) in get_args(hint)
            types, what = kinds[next(t for t in get_args(hint) or (hint,) if t is not type(None))]
            found[name] = OptionKind(types, nullable, what + " or null" * nullable)
    return found


def check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    """Refuse ``value`` unless it is one of ``choices``, naming the key, the closest choice and all of them."""
    if value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{key}={value!r} is not a valid choice{hint}; valid choices: {', '.join(choices)}")


def check_options(config: Any, prefix: str = "") -> None:
    """Refuse options no model builds, naming the field (``prefix`` + its name) and the fix: ``config`` is an
    ``LNBertConfig``, or the command line's ``model`` section (``prefix`` "model."), checked before torch loads."""
    for key, choices in option_choices().items():
        check_choice(f"{prefix}{key}", getattr(config, key), choices)
    for key, kind in option_kinds().items():
        if not kind.takes(value := getattr(config, key)):
            raise ValueError(f"{prefix}{key}={value!r} must be {kind.what}")
    width, heads = f"{prefix}hidden_size={config.hidden_size}", f"{prefix}num_attention_heads"
    if config.hidden_size % config.num_attention_heads != 0:
        raise ValueError(f"{width} is not divisible by {heads}={config.num_attention_heads}: {heads} must divide "
                         f"{width}; choose one of its divisors")  # fmt: skip
    if (k := config.mix_ln_post_layers) is not None and not 0 <= k <= config.num_hidden_layers:
        raise ValueError(f"{prefix}mix_ln_post_layers={k} must be between 0 and {prefix}num_hidden_layers="
                         f"{config.num_hidden_layers} (or null for round(L/4))")  # fmt: skip
    if config.admin_omega is not None and not (math.isfinite(config.admin_omega) and config.admin_omega > 0):
        raise ValueError(f"{prefix}admin_omega={config.admin_omega} must be positive (or null for the O(log N) rule)")
    for key in ("dyt_alpha_init", "derf_alpha_init"):
        if not (math.isfinite(value := getattr(config, key)) and value > 0):
            raise ValueError(f"{prefix}{key}={value} must be > 0 (the default, its official code's: 0.5)")
    for key, default in (("hc_streams", 4), ("mhc_sinkhorn_iters", 20), ("frac_parts", 4), ("dwa_dilation", 1),
                         ("dwa_period", 1)):
        if (value := getattr(config, key)) < 1:
            raise ValueError(f"{prefix}{key}={value!r} must be an integer >= 1 (the papers' default: {default})")
    # An odd size is allowed: Block AttnRes is defined for any block size in sub-layers (1 is Full AttnRes); an odd
    # size only closes some blocks inside a layer, where the paper's close after whole layers.
    if (size := config.attn_res_block_size) is not None and size < 1:
        raise ValueError(
            f"{prefix}attn_res_block_size={size!r} must be an integer >= 1 (sub-layers per block; 1 or null: Full "
            "AttnRes; even values close blocks between layers)"
        )
    if problem := SCHEMES[config.residual_scheme].problem(config, prefix):
        raise ValueError(problem)
    check_design(config, prefix)


def check_design(options: Any, prefix: str = "") -> None:
    """Refuse what the placement's entry rules out: a residual scheme on a placement that takes none (their papers
    define them on a Pre-LN block), another placement's option (``options``), an option the placement
    does not read (``fixed_options``)."""
    placement, scheme = options.norm_placement, options.residual_scheme
    entry = PLACEMENTS[placement]
    if scheme != DEFAULTS.residual_scheme and not entry.residual_schemes:
        takers = [name for name, p in PLACEMENTS.items() if p.residual_schemes]
        raise ValueError(f"{prefix}residual_scheme={scheme!r} needs {prefix}norm_placement="
                         f"{' or '.join(map(repr, takers))} (got {placement!r}): the residual schemes are built on a "
                         f"Pre-LN block only; set {prefix}norm_placement={takers[0]} or "
                         f"{prefix}residual_scheme={DEFAULTS.residual_scheme}")  # fmt: skip
    if scheme != DEFAULTS.residual_scheme and options.gpas:
        raise ValueError(f"{prefix}gpas=True with {prefix}residual_scheme={scheme!r}: GPAS scales Pre-LN's one residual "
                         f"stream, which a residual scheme rebuilds; set {prefix}gpas=false or {prefix}residual_scheme="
                         f"{DEFAULTS.residual_scheme}")  # fmt: skip
    for key in (key for other in PLACEMENTS.values() for key in other.options if key not in entry.options):
        if (value := getattr(options, key)) != (default := getattr(DEFAULTS, key)):
            owners = " or ".join(name for name, other in PLACEMENTS.items() if key in other.options)
            raise ValueError(f"{prefix}{key}={value!r} is an option of {prefix}norm_placement={owners}, not of "
                             f"{placement!r} (its paper and code define it on those only): set {prefix}norm_placement="
                             f"{owners}, or leave {prefix}{key} at its default ({default!r})")  # fmt: skip
    for key, why in entry.fixed_options.items():
        if (value := getattr(options, key)) != (default := getattr(DEFAULTS, key)):
            raise ValueError(
                f"{prefix}{key}={value!r} does not apply to {prefix}norm_placement={placement!r}: {why}; leave "
                f"{prefix}{key} at its default ({default!r}, which {placement} does not read)"
            )


def design_problem(placement: str, norm_type: str, scheme_fields: dict[str, Any], **options: Any) -> str:
    """Why a model of ``placement``, ``norm_type``, a residual scheme's fields and other ``options`` cannot be built
    ("" when it can)."""
    try:
        check_design(dataclasses.replace(DEFAULTS, norm_placement=placement, norm_type=norm_type, **scheme_fields,
                                         **options))  # fmt: skip
    except ValueError as err:
        return str(err)
    return ""


def residual_scheme_label(**options: Any) -> str:
    """The residual scheme's part of a variant's label (``RESIDUAL_SCHEME_FIELDS``, the others at their defaults),
    empty for ``standard``: ``hc4`` (dynamic HC, 4 streams), ``shc4`` (static HC), ``mhc4`` (``mhc4-idres`` with the
    identity bias init), ``attnres`` (Full AttnRes), ``attnres-b4`` (Block AttnRes, blocks of 4 sub-layers;
    ``attnres-b1`` computes what ``attnres`` does), ``mhclite4``, ``frac4`` (dynamic FC, 4 fractions), ``sfrac4``
    (static FC), ``denseformer`` (1x1), ``denseformer-2x3`` (dilation 2, period 3)."""
    given = SimpleNamespace(**{key: options.get(key, getattr(DEFAULTS, key)) for key in RESIDUAL_SCHEME_FIELDS})
    return SCHEMES[given.residual_scheme].label(given)


def variant_name(norm_placement: str, norm_type: str = DEFAULTS.norm_type, qk_norm: bool = DEFAULTS.qk_norm,
                 **options: Any) -> str:  # fmt: skip
    """The label of a model variant in run names, W&B groups and tags, and reports: the placement, its residual
    scheme (``residual_scheme_label`` of the ``RESIDUAL_SCHEME_FIELDS`` given), the ``DESIGN_LABELS`` of the options
    given, then the norm type and QK-norm when they are not the defaults (``pre``, ``pre-rmsnorm``,
    ``post-dyt-qknorm``, ``pre-hc4``, ``pre-attnres-b4-rmsnorm``, ``pre-gpas``, ``pre-gated-vres-derf``)."""
    scheme = residual_scheme_label(**{k: v for k, v in options.items() if k in RESIDUAL_SCHEME_FIELDS})
    designs = [labels[value] for key, labels in DESIGN_LABELS.items() if (value := options.get(key)) in labels]
    parts = [norm_placement] + ([scheme] if scheme else []) + designs + ([norm_type] if norm_type != "layernorm" else [])
    return "-".join(parts + (["qknorm"] if qk_norm else []))


def variant_of(options: Any) -> str:
    """``variant_name`` of an object or mapping with the ``VARIANT_FIELDS`` (a config, a config.json's dict)."""
    get = options.get if isinstance(options, dict) else lambda key, default: getattr(options, key, default)
    return variant_name(**{key: get(key, getattr(DEFAULTS, key)) for key in VARIANT_FIELDS})
