"""BERT with a configurable normalization placement and norm type (Xiong et al. 2020, "On Layer Normalization in
the Transformer Architecture", and the placements proposed since).

One model file, read top to bottom: config, embeddings, attention, the layer, encoder, heads, pretrained-model base,
the task models (pretraining, MLM, and Hugging Face BERT's fine-tuning heads over ``LNBertTaskModel``). What a
placement builds is its entry's (``pretrain/placements.py``: each layer's block and parts), what a residual scheme
builds its entry's (``pretrain/residual_schemes.py``), the norm type ``pretrain/norms.py``'s; nothing here asks for
a name. nGPT's layers and MLM head are ``pretrain/ngpt.py``'s, at the same Hugging Face names. With
``norm_placement="post"`` and ``norm_type="layernorm"`` every parameter name and output equals Hugging Face
``BertModel`` / ``BertForPreTraining`` (``tests/test_modeling.py``), so a Hugging Face BERT state dict loads with
``strict=True``; ``pre`` equals Hugging Face's ``RobertaPreLayerNorm``. A residual scheme keeps Pre-LN's names.

Each sub-layer owns the norm Hugging Face calls ``attention.output.LayerNorm`` / ``output.LayerNorm`` (whatever its
type); the block only decides where it is applied. Extra norms and scales (``branch_norm``, ``query_norm``,
``ffn_norm``, ``rezero_gate``, ``residual_scale``, ``head_scale``) exist only in the placements that use them, so
Pre-LN has one norm more than Post-LN (``encoder.final_layer_norm``). A residual scheme's modules are
``encoder.layer.{i}.attention_residual`` / ``ffn_residual`` (and AttnRes's ``encoder.output_residual``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForNextSentencePrediction,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    BertConfig,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.loss.loss_utils import ForQuestionAnsweringLoss, ForSequenceClassificationLoss
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    NextSentencePredictorOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.bert.modeling_bert import BertForPreTrainingOutput
from transformers.utils import logging
from transformers.utils.generic import can_return_tuple

from pretrain.attention import eager_attention_forward, project_qkv
from pretrain.ngpt import (
    NGPT_MODULES,
    NgptLayer,
    NgptLMPredictionHead,
    UnitNorm,
    base_scale,
    init_on_sphere,
    normalize_matrices,
    on_sphere,
)
from pretrain.norms import GPAS, NORM_MODULES, Scale, make_norm
from pretrain.placements import BLOCKS, PLACEMENTS, LayerParts, Placement, canonical_placement
from pretrain.residual_schemes import SCHEMES, Scheme
from pretrain.variants import (
    COMPUTATION_OPTIONS,
    INIT_SCHEMES,
    NORM_PLACEMENTS,
    NORM_TYPES,
    LNBertOptions,
    check_options,
)

if TYPE_CHECKING:
    from pretrain.placements import Stream

logger = logging.get_logger(__name__)

# What from_pretrained compares with the trained config: the options that change what given weights compute
# (pretrain/variants.py), and BERT's own fields that do (the shapes are checked by the weights themselves).
_COMPUTATION_FIELDS = (*COMPUTATION_OPTIONS, "num_hidden_layers", "hidden_act", "layer_norm_eps")


# Not @strict as BertConfig: huggingface_hub would check each Literal option as it is set, before check_options names
# the nearest valid value; BertConfig's own fields keep its checks.
class LNBertConfig(BertConfig, LNBertOptions):
    """BERT configuration plus the choices the paper leaves open (``LNBertOptions``, pretrain/variants.py: each
    option's type, default and meaning, read by the command line's ``model`` section too; the placements'
    constants: docs/placements.md)."""

    model_type = "lnbert"

    def __post_init__(self, **kwargs: Any) -> None:
        check_options(self)
        super().__post_init__(**kwargs)

    @property
    def placement(self) -> Placement:
        return PLACEMENTS[self.norm_placement]

    @property
    def scheme(self) -> Scheme:
        return SCHEMES[self.residual_scheme]

    def layer_parts(self, index: int) -> LayerParts | None:
        """The parts of layer ``index`` (0-based) by its placement's entry; under a residual scheme its block is
        ``residual_scheme``. None: nGPT's layers."""
        parts = self.placement.layer_parts(self, index)
        return replace(parts, block="residual_scheme") if parts and self.scheme.module else parts

    def make_norm(self, size: int | None = None) -> nn.Module:
        """A norm of this config's type over ``size`` (default: the hidden size)."""
        return make_norm(self, size or self.hidden_size)


def _norm_or_identity(config: LNBertConfig, wanted: bool, size: int | None = None) -> nn.Module:
    return config.make_norm(size) if wanted else nn.Identity()


def _scale_or_identity(size: int, init: float | None) -> nn.Module:
    return nn.Identity() if init is None else Scale(size, init)


class LNBertEmbeddings(nn.Module):
    """Word + position + token-type embeddings, then (optionally) the embedding norm and dropout. nGPT's: Norm(sum),
    each table's rows on the sphere, no dropout, no ``padding_idx`` (BERT zeroes the [PAD] row; Norm(0) is NaN)."""

    def __init__(self, config: LNBertConfig) -> None:
        super().__init__()
        ngpt = config.placement.sphere
        d, padding_idx = config.hidden_size, None if ngpt else config.pad_token_id
        self.word_embeddings = nn.Embedding(config.vocab_size, d, padding_idx=padding_idx)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, d)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, d)
        if ngpt:
            for table in (self.word_embeddings, self.position_embeddings, self.token_type_embeddings):
                on_sphere(table, dim=1)
            self.LayerNorm, self.dropout = UnitNorm(), nn.Identity()
        else:
            self.LayerNorm = _norm_or_identity(config, config.embedding_layer_norm)
            self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.register_buffer("position_ids", torch.arange(config.max_position_embeddings)[None], persistent=False)

    def forward(self, input_ids: torch.Tensor | None, token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """``inputs_embeds`` (B, T, H), given instead of ``input_ids``, replaces the word embeddings' rows."""
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        if position_ids is None:
            position_ids = self.position_ids[:, : inputs_embeds.shape[1]]
        if token_type_ids is None:
            token_type_ids = torch.zeros(inputs_embeds.shape[:2], dtype=torch.long, device=inputs_embeds.device)
        # Same summation order as Hugging Face BERT, so fp32 outputs match bit for bit.
        embeddings = inputs_embeds + self.token_type_embeddings(token_type_ids)
        embeddings = embeddings + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(embeddings))


class LNBertSelfAttention(nn.Module):
    """Q, K, V projections and scaled dot-product attention, with norms over each head's Q and K (``qk_norm``;
    HybridNorm also V), shared by the heads. NormFormer's head scale is in ``LNBertSelfOutput``, as fairseq's.
    Gated attention (``attention_gate``): ``gate``, a projection of the attention's input whose sigmoid multiplies
    each head's output (Qiu et al. 2025, G1). Value residual (``value_residual``, ResFormer): the first layer's values
    V_1 mixed into every later layer's before attention, lambda_1 V_1 + lambda_2 V_n (``value_lambda``, learned, or
    0.5 and 0.5)."""

    def __init__(self, config: LNBertConfig, parts: LayerParts, index: int) -> None:
        super().__init__()
        self.config = config
        self.head_size = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_size**-0.5
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        qk_norm, v_norm = config.qk_norm or parts.qkv_norms[0], parts.qkv_norms[1]
        self.query_norm = _norm_or_identity(config, qk_norm, self.head_size)
        self.key_norm = _norm_or_identity(config, qk_norm, self.head_size)
        self.value_norm = _norm_or_identity(config, v_norm, self.head_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)
        self.is_causal = False  # read by transformers' SDPA / flash attention interfaces
        gates = {"none": 0, "elementwise": config.hidden_size, "headwise": config.num_attention_heads}
        width = gates[config.attention_gate]
        self.gate = nn.Linear(config.hidden_size, width) if width else None
        self.first = index == 0
        learned = config.value_residual == "learnable" and not self.first
        self.value_lambda = Scale(2, 0.5) if learned else None  # (lambda_1, lambda_2)

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None,
        values: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        """``values``: value residual's list of the first layer's values (None without it), which the first layer
        fills and the others read (a recomputation under checkpointing finds it filled)."""
        q, k, v = project_qkv(hidden_states, (self.query, self.key, self.value), self.head_size, self.config.fused_qkv)
        q, k, v = self.query_norm(q), self.key_norm(k), self.value_norm(v)  # (B, nh, T, hs)
        if values is not None and self.first and not values:
            values.append(v)
        elif values is not None and not self.first:
            mix = self.value_lambda.weight if self.value_lambda is not None else (0.5, 0.5)
            v = (mix[0] * values[0] + mix[1] * v).to(v.dtype)
        # Read from transformers' table at each call, as BERT: set_attn_implementation() switches it (transformers
        # looks for this call in the model's source before it allows the switch).
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        dropout = self.dropout.p if self.training else 0.0
        out, probs = attend(self, q, k, v, attention_mask, dropout=dropout, scaling=self.scaling)  # out: (B, T, nh, hs)
        if self.gate is not None:
            out = out * torch.sigmoid(self.gate(hidden_states)).unflatten(-1, (out.shape[2], -1))
        return out.flatten(2), probs


class LNBertSelfOutput(nn.Module):
    """Attention output projection, the branch norm ``B_a`` (sandwich / Peri-LN, NormFormer), dropout; plus the
    sub-layer's norm ``LayerNorm`` (N_a) and skip scale ``residual_scale``, which the layer's block applies.

    NormFormer's ``head_scale`` multiplies the projection's output per head, before ``B_a``, as fairseq's code
    (``c_attn``; the paper's text puts it before the projection). Sandwich / Peri-LN's branch norm acts after dropout,
    ``B(dropout(F))`` (CogView's ``third_layernorm``), NormFormer's before, ``dropout(B(F))`` (fairseq's ``attn_ln``).
    """

    def __init__(self, config: LNBertConfig, parts: LayerParts) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = _norm_or_identity(config, BLOCKS[parts.block].attention_norm)
        self.branch_norm = _norm_or_identity(config, parts.branch_norms[0])
        self.head_scale = Scale(config.num_attention_heads, 1.0) if parts.head_scale else None
        self.residual_scale = _scale_or_identity(config.hidden_size, parts.learned_skip_scales[0])
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.norm_after_dropout = parts.branch_norm_after_dropout

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        out = self.dense(hidden_states)
        if self.head_scale is not None:
            heads = self.head_scale.weight.shape[0]
            out = (out.unflatten(-1, (heads, -1)) * self.head_scale.weight[:, None]).flatten(-2)  # (B, T, nh, hs)
        if self.norm_after_dropout:
            return self.branch_norm(self.dropout(out))
        return self.dropout(self.branch_norm(out))


class LNBertAttention(nn.Module):
    def __init__(self, config: LNBertConfig, parts: LayerParts, index: int) -> None:
        super().__init__()
        self.self = LNBertSelfAttention(config, parts, index)
        self.output = LNBertSelfOutput(config, parts)


class LNBertIntermediate(nn.Module):
    """FFN input projection and activation; NormFormer adds a norm over the inner width after the activation."""

    def __init__(self, config: LNBertConfig, parts: LayerParts) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]
        self.ffn_norm = _norm_or_identity(config, parts.ffn_inner_norm, config.intermediate_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.ffn_norm(self.intermediate_act_fn(self.dense(hidden_states)))


class LNBertOutput(nn.Module):
    """FFN output projection, dropout, the branch norm ``B_f`` (after dropout, as CogView's ``fourth_layernorm``);
    plus the sub-layer's norm ``LayerNorm`` (N_f) and skip scale ``residual_scale``, which the block applies."""

    def __init__(self, config: LNBertConfig, parts: LayerParts) -> None:
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = _norm_or_identity(config, BLOCKS[parts.block].ffn_norm)
        self.branch_norm = _norm_or_identity(config, parts.branch_norms[1])
        self.residual_scale = _scale_or_identity(config.hidden_size, parts.learned_skip_scales[1])
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.branch_norm(self.dropout(self.dense(hidden_states)))


class LNBertLayer(GradientCheckpointingLayer):
    """One Transformer layer: Hugging Face BERT's modules, wired by the block its placement picks for this layer
    (``placements.BLOCKS``; each block draws its data flow). The accessors below are what the blocks read. As
    ``BertLayer``, a ``GradientCheckpointingLayer``: ``activation_checkpointing_enable()`` recomputes it in the
    backward pass instead of keeping its activations."""

    def __init__(self, config: LNBertConfig, index: int = 0) -> None:
        super().__init__()
        parts = config.layer_parts(index)
        self.block = BLOCKS[parts.block]
        self.residual_scale, self.norm_scale = parts.skip_scale, parts.norm_scale
        self.attention = LNBertAttention(config, parts, index)
        self.intermediate = LNBertIntermediate(config, parts)
        self.output = LNBertOutput(config, parts)
        if parts.gate:
            self.rezero_gate = Scale(1, 0.0)
        self.gpas = GPAS() if config.gpas else nn.Identity()
        self.values: list[torch.Tensor] | None = None  # value residual's, during the layer's forward (attend)
        if config.scheme.module:
            # Sub-layer k counts attention and FFN: 2 * index and 2 * index + 1 (HC's one-hot A_m init reads it).
            self.attention_residual = config.scheme.module(config, 2 * index)
            self.ffn_residual = config.scheme.module(config, 2 * index + 1)
        for name, gain in parts.init_gains.items():  # read by _init_weights
            self.get_submodule(name).init_gain = gain

    # What the blocks read.
    @property
    def norm_a(self) -> nn.Module:
        return self.attention.output.LayerNorm

    @property
    def norm_f(self) -> nn.Module:
        return self.output.LayerNorm

    def attend(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The attention sub-layer: self-attention, output projection, branch norm (where there is one), dropout."""
        out, probs = self.attention.self(x, attention_mask, self.values)
        return self.attention.output(out), probs

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The FFN sub-layer: both projections, activation, branch norm (where there is one), dropout."""
        return self.output(self.intermediate(x))

    def skip_a(self, x: torch.Tensor) -> torch.Tensor:
        return self.attention.output.residual_scale(self._scaled_residual(x))

    def skip_f(self, x: torch.Tensor) -> torch.Tensor:
        return self.output.residual_scale(self._scaled_residual(x))

    def _scaled_residual(self, x: torch.Tensor) -> torch.Tensor:
        # Skip the multiply for a scale of 1 so Post-LN stays op-for-op Hugging Face BERT.
        return x if self.residual_scale == 1.0 else x * self.residual_scale

    def scaled(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.norm_scale == 1.0 else x * self.norm_scale

    def forward(self, x: Stream, attention_mask: torch.Tensor | None,
                values: list[torch.Tensor] | None = None) -> tuple[Stream, torch.Tensor | None]:  # fmt: skip
        """``values``: value residual's first-layer values (``LNBertSelfAttention``), None without it."""
        self.values = values  # the blocks call attend(x, mask): the layer hands its attention the values
        try:
            return self.block.forward(self, x, attention_mask)
        finally:
            self.values = None


class LNBertEncoder(nn.Module):
    """The layer stack (nGPT's: ``NgptLayer``s), and what the placement or residual scheme adds around it: the state
    the first layer reads (``start``), the hidden state reported per layer (``reported``), the output (``end``)."""

    def __init__(self, config: LNBertConfig) -> None:
        super().__init__()
        self.config = config
        layers = [NgptLayer(config) if config.placement.sphere else LNBertLayer(config, i)
                  for i in range(config.num_hidden_layers)]  # fmt: skip
        self.layer = nn.ModuleList(layers)
        # Pre-LN's residual stream grows with depth (paper, Lemma 2): normalised once here for every consumer.
        self.final_layer_norm = _norm_or_identity(config, config.placement.final_norm)
        self.two_streams, self.scheme = config.placement.two_streams, config.scheme
        if self.scheme.output:  # AttnRes's output layer: the sources with a query of its own, then the final norm
            self.output_residual = self.scheme.output(config)
        self.value_residual = config.value_residual != "none"
        # What passes between layers is one tensor, except ResiDual's pair (a, d), AttnRes's ``DepthSources`` and value
        # residual's first-layer values.
        self.stream_is_tensor = not self.two_streams and self.scheme.stream_is_tensor and not self.value_residual

    def start(self, x: torch.Tensor) -> Stream:
        """What the first layer reads: the embedding output; ResiDual's a_0 = d_0 = it; a residual scheme's state."""
        if self.scheme.start:
            return self.scheme.start(self, x)
        return (x, x) if self.two_streams else x

    def reported(self, stream: Stream) -> torch.Tensor:
        """A layer's entry of ``hidden_states``: the stream; ResiDual's Post-LN stream ``a``; a residual scheme's
        collapsed state (its entry's ``collapse``: HC's sum of the streams, DenseFormer's averaged stream, ...)."""
        if self.scheme.module:
            return self.scheme.collapse(stream)
        return stream[0] if self.two_streams else stream

    def end(self, stream: Stream) -> torch.Tensor:
        """The encoder's output, through the final norm where the placement has one."""
        if self.scheme.output:
            return self.final_layer_norm(self.output_residual.read(stream)[0])
        if self.scheme.module:  # HC's Algorithm 1: sum the streams, then the final norm
            return self.final_layer_norm(self.scheme.collapse(stream))
        if self.two_streams:  # ResiDual: the Post-LN stream plus the normalised sum of every sub-layer's output
            return stream[0] + self.final_layer_norm(stream[1])
        return self.final_layer_norm(stream)

    def forward(
        self, x: torch.Tensor, attention_mask: torch.Tensor | None,
        output_hidden_states: bool = False, output_attentions: bool = False,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None, tuple[torch.Tensor, ...] | None]:  # fmt: skip
        hidden_states, attentions = [x], []
        stream = self.start(x)
        values = ([],) if self.value_residual else ()  # the first layer's values, for the later ones (ResFormer)
        for layer in self.layer:
            stream, probs = layer(stream, attention_mask, *values)  # positional, as GradientCheckpointingLayer wants
            if output_hidden_states:
                hidden_states.append(self.reported(stream))
            if output_attentions and probs is not None:  # sdpa computes no probabilities: () as in Hugging Face
                attentions.append(probs)
        if output_attentions and not attentions:
            logger.warning_once(f"{self.config._attn_implementation} attention returns no attention probabilities "
                                "(output_attentions gives an empty tuple); load the model with attn_implementation="
                                "'eager', or call its set_attn_implementation('eager'), to get them")  # fmt: skip
        x = self.end(stream)
        hidden_states[-1] = x  # as in Hugging Face, hidden_states[-1] is last_hidden_state (after the final norm)
        hidden = tuple(hidden_states) if output_hidden_states else None
        return x, hidden, tuple(attentions) if output_attentions else None


def head_input_scale(config: LNBertConfig) -> float:
    """What BERT's heads over hidden states (the pooler, the token classifier, question answering) multiply them by:
    nGPT's have norm 1 (entries about 1/sqrt(d)), times sqrt(d) they reach BERT's scale, so the heads stay BERT's,
    with its init; 1 for every other placement."""
    return math.sqrt(config.hidden_size) if config.placement.sphere else 1.0


class LNBertPooler(nn.Module):
    """tanh(W h + b) of the [CLS] token, as Hugging Face BERT (``h`` times ``head_input_scale``)."""

    def __init__(self, config: LNBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()
        self.input_scale = head_input_scale(config)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        first = hidden_states[:, 0]  # the [CLS] token
        return self.activation(self.dense(first if self.input_scale == 1.0 else first * self.input_scale))


class LNBertPredictionHeadTransform(nn.Module):
    def __init__(self, config: LNBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = ACT2FN[config.hidden_act]
        self.LayerNorm = config.make_norm()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden_states)))


class LNBertLMPredictionHead(nn.Module):
    def __init__(self, config: LNBertConfig) -> None:
        super().__init__()
        self.transform = LNBertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=True)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))  # tied to decoder.bias

    def set_decoder(self, decoder: nn.Linear) -> None:
        self.decoder = decoder
        self.bias = decoder.bias

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden_states))


def _mlm_head(config: LNBertConfig) -> LNBertLMPredictionHead | NgptLMPredictionHead:
    return NgptLMPredictionHead(config) if config.placement.sphere else LNBertLMPredictionHead(config)


class LNBertOnlyMLMHead(nn.Module):
    def __init__(self, config: LNBertConfig) -> None:
        super().__init__()
        self.predictions = _mlm_head(config)


class LNBertPreTrainingHeads(nn.Module):
    def __init__(self, config: LNBertConfig) -> None:
        super().__init__()
        self.predictions = _mlm_head(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


def mlm_logits_and_loss(
    head: LNBertLMPredictionHead | NgptLMPredictionHead, sequence_output: torch.Tensor, labels: torch.Tensor | None,
    sparse: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """MLM logits and mean cross-entropy over positions whose label is not -100. Sparse: gather the labelled
    positions first, so the head runs on ~15% of the tokens, with the dense computation's loss and gradients; the
    logits are then ``(num_masked, vocab_size)``, row-major over ``labels != -100``."""
    if labels is None:
        return head(sequence_output), None
    if sparse:
        selected = labels != -100  # (B, T)
        sequence_output, labels = sequence_output[selected], labels[selected]  # (num_masked, H), (num_masked,)
    logits = head(sequence_output)  # (B, T, V) or (num_masked, V)
    return logits, cross_entropy(logits, labels)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor | None:
    """The mean cross-entropy over the classes of the last dimension, in float32, positions labelled -100 left out;
    None without labels. The MLM, NSP, token-classification and multiple-choice losses."""
    if labels is None:
        return None
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))


class LNBertPreTrainedModel(PreTrainedModel):
    config_class = LNBertConfig
    config: LNBertConfig
    base_model_prefix = "bert"
    supports_gradient_checkpointing = True  # every layer is a GradientCheckpointingLayer
    _supports_sdpa = True
    # Flex attention gives sdpa's outputs (tests/test_modeling.py; on CPU without gradients only). No flash-attention
    # claim: it needs the flash_attn package and a GPU, and no test here could exercise it.
    _supports_flex_attn = True
    _supports_attention_backend = True
    _no_split_modules = ["LNBertEmbeddings", "LNBertLayer", "NgptLayer"]

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        """What every training loop calls after each optimizer step, on the unwrapped model
        (``accelerator.unwrap_model(model).after_optimizer_step()``): nGPT re-normalises its matrices
        (``pretrain.ngpt.normalize_matrices``); a no-op for every other placement."""
        if self.config.placement.sphere:
            normalize_matrices(self)

    def activation_checkpointing_enable(
        self, activation_checkpointing_kwargs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        """transformers' activation checkpointing of every layer (also ``gradient_checkpointing_enable()`` and the
        Trainer's ``gradient_checkpointing``), non-reentrant unless the kwargs say otherwise: the same gradients for
        less memory. Reentrant checkpointing (``use_reentrant=True``, and torch's default when the kwargs are given
        without it) gives gradients only through tensor arguments: ResiDual's pair of streams and AttnRes's sources
        would silently lose theirs, so it is refused for them."""
        given = activation_checkpointing_kwargs
        reentrant = given is not None and given.get("use_reentrant", True)
        if reentrant and not self.base_model.encoder.stream_is_tensor:
            config = self.config
            raise ValueError(
                f"reentrant activation checkpointing (activation_checkpointing_kwargs={given}) would drop the "
                f"gradients of what passes between the layers of norm_placement={config.norm_placement!r}, "
                f"residual_scheme={config.residual_scheme!r}, value_residual={config.value_residual!r} (not one "
                "tensor); pass use_reentrant=False (the default without kwargs)"
            )
        super().activation_checkpointing_enable(activation_checkpointing_kwargs, **kwargs)

    def get_output_embeddings(self) -> nn.Linear | None:
        """The MLM decoder of the models with an MLM head (``cls.predictions``); None for the others."""
        predictions = getattr(getattr(self, "cls", None), "predictions", None)
        return predictions.decoder if predictions is not None else None

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.cls.predictions.set_decoder(new_embeddings)

    @property
    def weight_decay_exempt(self) -> bool:
        """No parameter gets weight decay (``pretrain.optim``) under nGPT, trained with weight decay 0 as its paper."""
        return self.config.placement.sphere

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        config = self.config
        sphere_dim = getattr(module, "unit_norm_dim", None)
        if sphere_dim is not None:  # nGPT's matrices: unit norm along the embedding dimension from the start
            init_on_sphere(module.weight, sphere_dim, base_scale(config.hidden_size))
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            # DeepNorm's V, attention output and FFN: gain beta (DeepNet, Wang et al. 2022: Xavier-normal with gain
            # beta; torchscale's bert_init: normal(0, 0.02) divided by (8N)^(1/4), i.e. times beta). B2T's official
            # rescaling_init: every weight matrix of its layers times L^(-1/2).
            gain = getattr(module, "init_gain", 1.0)
            if config.init_scheme == "xavier":
                init.xavier_normal_(module.weight, gain=gain)
            else:
                init.normal_(module.weight, mean=0.0, std=config.initializer_range * gain)
            padding_idx = getattr(module, "padding_idx", None)
            if padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[padding_idx])
        elif isinstance(module, NORM_MODULES):
            init.ones_(module.weight)
        elif isinstance(module, Scale):
            init.constant_(module.weight, module.init)
        elif hasattr(module, "recorder"):  # a residual scheme's module (each has a recorder): its own init
            module.init_parameters(config.initializer_range)
        elif isinstance(module, LNBertEmbeddings):
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1])[None])
        elif isinstance(module, NGPT_MODULES):  # nGPT's learned scalers, stored with the scale trick (pretrain/ngpt.py)
            module.init_parameters()
        if isinstance(getattr(module, "bias", None), torch.Tensor):  # every bias (the MLM head's too) starts at zero
            init.zeros_(module.bias)
        for name, value in getattr(module, "inits", {}).items():  # DyT's, Derf's and SeeDNorm's scalars, GPAS's gate
            init.constant_(getattr(module, name), value)

    def _check_loaded_keys(self, loading_info: dict[str, Any]) -> None:
        """A snapshot of another placement must not load with silently missing or unused encoder weights (head
        mismatches, an MLM snapshot opened as a classifier, are normal and allowed)."""
        own = "" if self.base_model is self else self.base_model_prefix + "."
        body = (own + "embeddings.", own + "encoder.")
        kinds = ("missing_keys", "unexpected_keys")
        missing, unexpected = (sorted(k for k in loading_info.get(kind, ()) if k.startswith(body)) for kind in kinds)
        if missing or unexpected:
            raise CheckpointMismatch(
                f"Checkpoint does not match norm_placement={self.config.norm_placement!r}, "
                f"norm_type={self.config.norm_type!r}, residual_scheme={self.config.residual_scheme!r}: missing "
                f"encoder weights {missing[:6]}, unexpected encoder weights {unexpected[:6]}. Load it with the "
                "norm_placement, norm_type and residual_scheme it was trained with (leave them out of "
                "from_pretrained to use the checkpoint's own config); where that is the folder's own config.json, "
                "its files do not belong together (one replaced or copied from another run): restore it from a copy."
            )

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | Path, *args: Any, **kwargs: Any
    ) -> LNBertPreTrainedModel:
        """``PreTrainedModel.from_pretrained`` that fails loudly on encoder weight mismatches and on a
        placement (or another setting that changes the computation) other than the one trained with."""
        wants_info = kwargs.pop("output_loading_info", False)
        path = Path(str(pretrained_model_name_or_path))
        saved = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
        checked = saved.get("model_type") in (LNBertConfig.model_type, "bert")  # Hugging Face BERT: Post-LN
        if checked:  # before the weights load: this message, not a shape mismatch's (hc_streams, ...)
            _check_same_computation(saved, cls._config_to_load(path, kwargs))
        model, info = super().from_pretrained(pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs)
        if checked:
            _check_same_computation(saved, model.config)
        model._check_loaded_keys(info)
        return (model, info) if wants_info else model

    @classmethod
    def _config_to_load(cls, path: Path, kwargs: dict[str, Any]) -> PretrainedConfig:
        """The config ``from_pretrained`` will build the model with: the one passed, or the folder's with the
        keyword arguments that name config fields (the Auto classes pass ``config``)."""
        config = kwargs.get("config")
        if isinstance(config, PretrainedConfig):
            return config
        others = {k: v for k, v in kwargs.items() if k != "config"}
        return cls.config_class.from_pretrained(config or path, return_unused_kwargs=True, **others)[0]


class CheckpointMismatch(ValueError):
    """Weights, or the settings they were trained with, that do not match the model they are loaded into: no retry
    changes that while the files and the settings stay as they are."""


def _check_same_computation(saved: dict[str, Any], config: PretrainedConfig) -> None:
    """Weights trained under one placement must not be run under another: Post-LN and DeepNorm have the same
    parameter names but compute different functions. Compares the saved config with the one in use."""
    differ = []
    for key in _COMPUTATION_FIELDS:
        default = getattr(LNBertConfig(), key)
        trained, used = saved.get(key, default), getattr(config, key, default)
        if key == "norm_placement" and canonical_placement(str(trained)) == canonical_placement(used):
            continue  # another name of the same placement (peri is sandwich)
        if trained != used:
            differ.append(f"{key}={used!r} (trained with {trained!r})")
    if differ:
        raise CheckpointMismatch(
            f"Checkpoint does not match {', '.join(differ)}. These settings change what "
            "the weights compute; leave them out of from_pretrained to use the checkpoint's own config."
        )


class LNBertModel(LNBertPreTrainedModel):
    """The encoder: embeddings, the layer stack, the final LN where the placement has one, the pooler."""

    def __init__(self, config: LNBertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__(config)
        for key in ("is_decoder", "add_cross_attention"):  # BertModel's decoder mode, which lnbert does not build
            if getattr(config, key):
                raise ValueError(f"{key}=True: lnbert is an encoder (bidirectional self-attention, no cross-attention "
                                 f"layers); leave {key} False")  # fmt: skip
        self.embeddings = LNBertEmbeddings(config)
        self.encoder = LNBertEncoder(config)
        self.pooler = LNBertPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    @can_return_tuple
    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, output_hidden_states: bool | None = None,
                output_attentions: bool | None = None, *, pool: bool = True,
                **kwargs: Any) -> BaseModelOutputWithPooling:  # fmt: skip
        """Hugging Face ``BertModel``'s inputs, one of ``input_ids`` and ``inputs_embeds`` (B, T, H). ``hidden_states``
        (when asked for) holds ``num_hidden_layers + 1`` tensors: the embedding output, then the residual stream after
        each layer, except that the last entry is ``last_hidden_state``, after the final LN where there is one (as in
        Hugging Face, what the pooler and the heads see). ``pool=False`` skips the pooler (``pooler_output`` is None)
        for a caller that does not use it. Other keyword arguments (a Trainer's ``num_items_in_batch``) are ignored,
        as ``BertModel`` does, except the cross-attention inputs, which an encoder cannot use."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        crossing = [k for k in ("encoder_hidden_states", "encoder_attention_mask") if kwargs.get(k) is not None]
        if crossing:
            raise ValueError(f"{', '.join(crossing)} given: lnbert is an encoder without cross-attention layers; pass "
                             "the sequence itself as input_ids (or inputs_embeds)")  # fmt: skip
        if input_ids is not None:
            self.warn_if_padding_and_no_attention_mask(input_ids, attention_mask)
        embeddings = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        # Bool/additive mask in the form the chosen attention implementation wants (None: no padding).
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=embeddings, attention_mask=attention_mask)
        want_hidden = bool(output_hidden_states or self.config.output_hidden_states)
        want_attentions = bool(output_attentions or self.config.output_attentions)
        sequence_output, hidden_states, attentions = self.encoder(embeddings, mask, want_hidden, want_attentions)
        pooled = self.pooler(sequence_output) if self.pooler is not None and pool else None
        return BaseModelOutputWithPooling(last_hidden_state=sequence_output, pooler_output=pooled,
                                          hidden_states=hidden_states, attentions=attentions)  # fmt: skip


@dataclass
class LNBertForPreTrainingOutput(BertForPreTrainingOutput):
    """Hugging Face's ``BertForPreTrainingOutput``, plus the two losses separately (for logging)."""

    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None


def _tied_mlm_keys(config: LNBertConfig) -> dict[str, str]:
    """The decoder's tied parameters (target: source), when ``tie_word_embeddings``; nGPT's decoder has no bias."""
    keys = {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight"}
    if not config.placement.sphere:
        keys["cls.predictions.decoder.bias"] = "cls.predictions.bias"
    return keys


class LNBertForPreTraining(LNBertPreTrainedModel):
    """Encoder + MLM head + NSP head, BERT's pretraining objective (loss = MLM + NSP)."""

    def __init__(self, config: LNBertConfig) -> None:
        super().__init__(config)
        self._tied_weights_keys = _tied_mlm_keys(config)  # read by post_init
        self.bert = LNBertModel(config)
        self.cls = LNBertPreTrainingHeads(config)
        self.post_init()

    @can_return_tuple
    def forward(
        self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None, labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None, **kwargs: Any,
    ) -> LNBertForPreTrainingOutput:  # fmt: skip
        """``labels``: MLM targets, -100 where not predicted. ``next_sentence_label``: 0 if segment B follows A, 1 if
        random. The loss is MLM + NSP, or MLM alone with ``labels`` only (the MLM-only objective): then the pooler and
        the NSP head do not run (``seq_relationship_logits`` is None) and their parameters get no gradient, which
        DDP (find_unused_parameters=False) reports as an error at the next step."""
        nsp = labels is None or next_sentence_label is not None
        inputs = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        out = self.bert(*inputs, return_dict=True, pool=nsp, **kwargs)  # return_dict: the encoder's, not this model's
        head, sparse = self.cls.predictions, self.config.sparse_mlm_head
        logits, mlm_loss = mlm_logits_and_loss(head, out.last_hidden_state, labels, sparse)
        nsp_logits = self.cls.seq_relationship(out.pooler_output) if nsp else None
        nsp_loss = cross_entropy(nsp_logits, next_sentence_label)
        loss = mlm_loss + nsp_loss if mlm_loss is not None and nsp_loss is not None else mlm_loss
        return LNBertForPreTrainingOutput(loss=loss, prediction_logits=logits, seq_relationship_logits=nsp_logits,
                                          hidden_states=out.hidden_states, attentions=out.attentions, mlm_loss=mlm_loss,
                                          nsp_loss=nsp_loss)  # fmt: skip


class LNBertForMaskedLM(LNBertPreTrainedModel):
    """Encoder (no pooler) + MLM head, as Hugging Face ``BertForMaskedLM``."""

    def __init__(self, config: LNBertConfig) -> None:
        super().__init__(config)
        self._tied_weights_keys = _tied_mlm_keys(config)  # read by post_init
        self.bert = LNBertModel(config, add_pooling_layer=False)
        self.cls = LNBertOnlyMLMHead(config)
        self.post_init()

    @can_return_tuple
    def forward(
        self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None, labels: torch.Tensor | None = None, **kwargs: Any,
    ) -> MaskedLMOutput:  # fmt: skip
        inputs = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        out = self.bert(*inputs, return_dict=True, **kwargs)  # return_dict: the encoder's, not this model's
        head, sparse = self.cls.predictions, self.config.sparse_mlm_head
        logits, loss = mlm_logits_and_loss(head, out.last_hidden_state, labels, sparse)
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions)


def _classifier_dropout(config: LNBertConfig) -> nn.Dropout:
    """BERT's dropout before a classifier: ``classifier_dropout``, else ``hidden_dropout_prob``."""
    p = config.classifier_dropout
    return nn.Dropout(p if p is not None else config.hidden_dropout_prob)


class LNBertTaskModel(LNBertPreTrainedModel):
    """The encoder under one small head: what Hugging Face's ``BertFor...`` task models share. ``encode`` runs the
    encoder and gives what the head reads, with the encoder's outputs: the pooled [CLS] output (``pooled``, with the
    pooler), or every token's hidden state times ``head_input_scale`` (without the pooler, as BERT's token-level
    models). A subclass adds its head under BERT's names, then calls ``post_init``; one that takes ``labels`` gives
    ``head`` (what the encoder gave, the labels -> logits, loss) and its ``output_class``, and shares ``forward``."""

    pooled = True
    output_class: type = SequenceClassifierOutput

    def __init__(self, config: LNBertConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = LNBertModel(config, add_pooling_layer=self.pooled)
        self.token_scale = head_input_scale(config)

    def encode(self, *inputs: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, BaseModelOutputWithPooling]:
        out = self.bert(*inputs, return_dict=True, **kwargs)  # return_dict: the encoder's, not this model's
        if self.pooled:
            return out.pooler_output, out
        hidden = out.last_hidden_state
        return (hidden if self.token_scale == 1.0 else hidden * self.token_scale), out

    def head(self, encoded: torch.Tensor, labels: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        raise NotImplementedError

    @can_return_tuple
    def forward(
        self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None, labels: torch.Tensor | None = None, **kwargs: Any,
    ) -> SequenceClassifierOutput | TokenClassifierOutput | NextSentencePredictorOutput:  # fmt: skip
        encoded, out = self.encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, **kwargs)
        logits, loss = self.head(encoded, labels)
        return self.output_class(loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions)


class LNBertForSequenceClassification(LNBertTaskModel):
    """Pooled output + dropout + linear classifier, as Hugging Face ``BertForSequenceClassification``: the loss by
    ``config.problem_type``, regression (MSE), single-label (cross-entropy over integer labels) or multi-label
    (BCE over float labels), which the first labelled batch sets where it is None (``num_labels == 1``: regression)."""

    def __init__(self, config: LNBertConfig) -> None:
        super().__init__(config)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def head(self, pooled: torch.Tensor, labels: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = self.classifier(self.dropout(pooled))
        return logits, ForSequenceClassificationLoss(labels, logits.float(), self.config) if labels is not None else None


class LNBertForMultipleChoice(LNBertTaskModel):
    """Each choice's pooled output + dropout + one score, as Hugging Face ``BertForMultipleChoice``: inputs
    (B, C, T) (``inputs_embeds`` (B, C, T, H)), logits (B, C), ``labels`` the right choice's index."""

    def __init__(self, config: LNBertConfig) -> None:
        super().__init__(config)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    @can_return_tuple
    def forward(
        self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None, labels: torch.Tensor | None = None, **kwargs: Any,
    ) -> MultipleChoiceModelOutput:  # fmt: skip
        choices = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        flat = [x if x is None else x.flatten(0, -2) for x in (input_ids, attention_mask, token_type_ids, position_ids)]
        embeds = inputs_embeds if inputs_embeds is None else inputs_embeds.flatten(0, -3)  # (B C, T, H)
        pooled, out = self.encode(*flat, embeds, **kwargs)
        logits = self.classifier(self.dropout(pooled)).view(-1, choices)  # (B, C)
        return MultipleChoiceModelOutput(loss=cross_entropy(logits, labels), logits=logits,
                                         hidden_states=out.hidden_states, attentions=out.attentions)  # fmt: skip


class LNBertForTokenClassification(LNBertTaskModel):
    """Every token's hidden state + dropout + linear classifier, as Hugging Face ``BertForTokenClassification``
    (labels -100 where there is none to predict)."""

    pooled, output_class = False, TokenClassifierOutput

    def __init__(self, config: LNBertConfig) -> None:
        super().__init__(config)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def head(self, hidden: torch.Tensor, labels: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = self.classifier(self.dropout(hidden))  # (B, T, num_labels)
        return logits, cross_entropy(logits, labels)


class LNBertForQuestionAnswering(LNBertTaskModel):
    """Every token's hidden state + a linear layer to (start, end) logits, as Hugging Face
    ``BertForQuestionAnswering`` (``qa_outputs``, ``num_labels`` 2); the loss, the mean of the start and end
    cross-entropies, ignores positions outside the sequence."""

    pooled = False

    def __init__(self, config: LNBertConfig) -> None:
        super().__init__(config)
        self.qa_outputs = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None, start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None, **kwargs: Any,
    ) -> QuestionAnsweringModelOutput:  # fmt: skip
        hidden, out = self.encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, **kwargs)
        start, end = (x.squeeze(-1).contiguous() for x in self.qa_outputs(hidden).split(1, dim=-1))  # (B, T) each
        loss = ForQuestionAnsweringLoss(start.float(), end.float(), start_positions, end_positions)
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start, end_logits=end,
                                            hidden_states=out.hidden_states, attentions=out.attentions)  # fmt: skip


class LNBertOnlyNSPHead(nn.Module):
    """BERT's NSP classifier alone, at its name ``cls.seq_relationship``."""

    def __init__(self, config: LNBertConfig) -> None:
        super().__init__()
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


class LNBertForNextSentencePrediction(LNBertTaskModel):
    """Pooled output + BERT's NSP classifier (``cls.seq_relationship``), as Hugging Face
    ``BertForNextSentencePrediction``; ``labels`` 0 if segment B follows A, 1 if random."""

    output_class = NextSentencePredictorOutput

    def __init__(self, config: LNBertConfig) -> None:
        super().__init__(config)
        self.cls = LNBertOnlyNSPHead(config)
        self.post_init()

    def head(self, pooled: torch.Tensor, labels: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = self.cls.seq_relationship(pooled)
        return logits, cross_entropy(logits, labels)


def count_layer_norms(model: nn.Module) -> int:
    """How many norm modules (of any ``norm_type``) the model has."""
    return sum(isinstance(m, NORM_MODULES) for m in model.modules())


# Registration with the Auto classes: importing `pretrain.modeling` makes "lnbert" snapshots open anywhere.
AutoConfig.register(LNBertConfig.model_type, LNBertConfig, exist_ok=True)
AutoModel.register(LNBertConfig, LNBertModel, exist_ok=True)
AutoModelForPreTraining.register(LNBertConfig, LNBertForPreTraining, exist_ok=True)
AutoModelForMaskedLM.register(LNBertConfig, LNBertForMaskedLM, exist_ok=True)
AutoModelForSequenceClassification.register(LNBertConfig, LNBertForSequenceClassification, exist_ok=True)
AutoModelForMultipleChoice.register(LNBertConfig, LNBertForMultipleChoice, exist_ok=True)
AutoModelForTokenClassification.register(LNBertConfig, LNBertForTokenClassification, exist_ok=True)
AutoModelForQuestionAnswering.register(LNBertConfig, LNBertForQuestionAnswering, exist_ok=True)
AutoModelForNextSentencePrediction.register(LNBertConfig, LNBertForNextSentencePrediction, exist_ok=True)

__all__ = [
    "INIT_SCHEMES", "NORM_PLACEMENTS", "NORM_TYPES", "LNBertConfig", "LNBertForMaskedLM", "LNBertForMultipleChoice",
    "LNBertForNextSentencePrediction", "LNBertForPreTraining", "LNBertForPreTrainingOutput",
    "LNBertForQuestionAnswering", "LNBertForSequenceClassification", "LNBertForTokenClassification", "LNBertModel",
    "LNBertPreTrainedModel", "LNBertTaskModel", "count_layer_norms", "cross_entropy", "mlm_logits_and_loss",
]  # fmt: skip
