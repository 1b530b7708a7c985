"""What a model variant is made of, as names and defaults, without torch.

Every command reads and checks its options before it imports torch and transformers (about 9 s of CPU), so that a
typo answers at once. What the options are checked against lives here: the names of the placements, norm types
and init schemes, and the defaults of ``LNBertConfig``'s own options (documented there). ``pretrain.placements``,
``pretrain.norms``, ``pretrain.modeling`` and ``pretrain.config`` take them from here; nothing here imports more
than the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

NormPlacement = Literal[
    "post", "pre", "sandwich", "peri", "deepnorm", "admin", "rezero", "b2t", "resi_dual",
    "mix_ln", "lns", "hybrid", "normformer", "output_ln", "parallel",
]  # fmt: skip
NORM_PLACEMENTS: tuple[str, ...] = get_args(NormPlacement)

NormType = Literal["layernorm", "rmsnorm", "dyt"]
NORM_TYPES: tuple[str, ...] = get_args(NormType)

InitScheme = Literal["bert", "xavier"]
INIT_SCHEMES: tuple[str, ...] = get_args(InitScheme)


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


DEFAULTS = LNBertOptions()


def variant_name(norm_placement: str, norm_type: str = "layernorm", qk_norm: bool = False) -> str:
    """The label of a model variant in run names, W&B groups and tags, and reports: the placement, plus the norm
    type and QK-norm when they are not the defaults (``pre``, ``pre-rmsnorm``, ``post-dyt-qknorm``)."""
    parts = [norm_placement] + ([norm_type] if norm_type != "layernorm" else []) + (["qknorm"] if qk_norm else [])
    return "-".join(parts)
