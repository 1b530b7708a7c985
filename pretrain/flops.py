"""Model FLOPs per trained token of a BERT encoder with its pretraining heads: the one count behind the logged
``train/mfu`` and the MFU columns of BENCHMARKS.md."""

from __future__ import annotations

from transformers import PretrainedConfig

from pretrain.residual_schemes import SCHEMES


def flops_per_token(config: PretrainedConfig, seq_len: int, *, mlm_head_share: float = 1.0) -> float:
    """Training FLOPs (forward + backward) per token of a BERT ``config`` (``LNBertConfig`` or Hugging Face's
    ``BertConfig``: L layers, hidden size H, intermediate size I, vocabulary V) on sequences of ``seq_len`` = T tokens:
    6N + 12·L·H·T (PaLM, Chowdhery et al. 2022, appendix B), plus 3 times a residual scheme's forward FLOPs.

    N counts the weights of the matrix multiplications a token passes through (biases, norms and embedding lookups
    are not matmuls):

    - encoder: L · (4·H² + 2·H·I) (query, key, value, attention output; the two feed-forward matrices);
    - MLM head: H² + V·H (transform dense and decoder), times ``mlm_head_share``: 1.0 when the head runs on every
      position, the masked fraction (about ``data.mlm_probability``) under ``sparse_mlm_head`` (our default);
    - pooler and NSP classifier: H² + 2·H, run once per sequence, so divided by T.

    12·L·H·T is attention itself: Q·Kᵀ and the weighted sum of values, 2·2·H·T forward per token per layer,
    times 3 for forward + backward.
    """
    layers, hidden, intermediate = config.num_hidden_layers, config.hidden_size, config.intermediate_size
    encoder = layers * (4 * hidden * hidden + 2 * hidden * intermediate)
    mlm_head = hidden * hidden + config.vocab_size * hidden
    pooler_nsp = (hidden * hidden + 2 * hidden) / seq_len
    attention = 12 * layers * hidden * seq_len
    return 6 * (encoder + mlm_head_share * mlm_head + pooler_nsp) + attention + 3 * residual_scheme_flops(config)


def residual_scheme_flops(config: PretrainedConfig) -> float:
    """Forward FLOPs per token of a residual scheme's own work over the 2·L sub-layers, by its entry
    (``pretrain/residual_schemes.py``: each entry's ``flops`` says what it counts); 0 for the standard residual sum
    (and Hugging Face's ``BertConfig``)."""
    return SCHEMES[getattr(config, "residual_scheme", "standard")].flops(config)
