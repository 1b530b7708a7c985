"""Model FLOPs per trained token of a BERT encoder with its pretraining heads: the one count behind the logged
``train/mfu`` and the MFU columns of BENCHMARKS.md."""

from __future__ import annotations

from transformers import PretrainedConfig


def flops_per_token(config: PretrainedConfig, seq_len: int, *, mlm_head_share: float = 1.0) -> float:
    """Training FLOPs (forward + backward) per token of a BERT ``config`` (``LNBertConfig`` or Hugging Face's
    ``BertConfig``: L layers, hidden size H, intermediate size I, vocabulary V) on sequences of ``seq_len`` = T tokens:
    6N + 12·L·H·T (PaLM, Chowdhery et al. 2022, appendix B), plus 3 times a residual scheme's forward FLOPs.

    N counts the weights of the matrix multiplications a token passes through (2 FLOPs per weight forward,
    4 backward), biases, norms and embedding lookups left out (they are not matmuls):

    - encoder: L · (4·H² + 2·H·I) (query, key, value, attention output; the two feed-forward matrices);
    - MLM head: H² + V·H (transform dense and the vocabulary decoder), times ``mlm_head_share``: 1.0 when the
      head runs on every position (dense, as Hugging Face), the masked fraction (about
      ``data.mlm_probability``) when it runs on the masked positions only (``sparse_mlm_head``, our default);
    - pooler and NSP classifier: H² + 2·H, run once per sequence, so divided by T.

    12·L·H·T is attention itself: the scores Q·Kᵀ and the weighted sum of values, 2·2·H·T forward per token
    per layer, times 3 for forward + backward. A residual scheme's mixing (``residual_scheme_flops``) is counted
    the same way: its forward, times 3.
    """
    layers, hidden, intermediate = config.num_hidden_layers, config.hidden_size, config.intermediate_size
    encoder = layers * (4 * hidden * hidden + 2 * hidden * intermediate)
    mlm_head = hidden * hidden + config.vocab_size * hidden
    pooler_nsp = (hidden * hidden + 2 * hidden) / seq_len
    attention = 12 * layers * hidden * seq_len
    return 6 * (encoder + mlm_head_share * mlm_head + pooler_nsp) + attention + 3 * residual_scheme_flops(config)


def residual_scheme_flops(config: PretrainedConfig) -> float:
    """Forward FLOPs per token of a residual scheme's own work (``pretrain/residual_streams.py``) over the 2·L
    sub-layers, d = H, n = ``hc_streams``; 0 for the standard residual sum (and Hugging Face's ``BertConfig``).
    Products and sums count 2 FLOPs per multiply-add; norms, exp, sigmoid and tanh are left out, as above:

    - HC and mHC, per sub-layer: reading the input and H_res x, an (n+1) x n matrix times the n x d streams,
      2·(n+1)·n·d; writing the output into n streams, 2·n·d;
    - dynamic HC adds its weights from the normalised streams: 2·n·d·(n+1) for A's, 2·n·d for B's;
    - mHC adds its mappings from the flattened streams, 2·n·d·(2n + n²), and Sinkhorn-Knopp's normalisations,
      4·n² per iteration (column and row sums and divisions);
    - AttnRes, per sub-layer reading K sources: K logits of d and their weighted sum, 4·K·d; once more for the
      encoder's output. K: the embedding output and every earlier sub-layer's output (Full); the embedding output,
      the completed blocks and the current block's partial sum (Block).
    """
    scheme = getattr(config, "residual_scheme", "standard")
    sublayers, d = 2 * config.num_hidden_layers, config.hidden_size
    if scheme in ("hc", "mhc"):
        n = config.hc_streams
        per_sublayer = 2 * (n + 1) * n * d + 2 * n * d
        if scheme == "hc" and config.hc_dynamic:
            per_sublayer += 2 * n * d * (n + 1) + 2 * n * d
        if scheme == "mhc":
            per_sublayer += 2 * n * d * (2 * n + n * n) + 4 * n * n * config.mhc_sinkhorn_iters
        return float(sublayers * per_sublayer)
    if scheme == "attn_res":
        block = config.attn_res_block_size or 1  # Full AttnRes: every output its own source

        def sources(k: int) -> int:
            """What sub-layer k (or, for k = 2L, the output) attends over: b_0, k // block completed blocks, and
            the partial sum of the current block when it has begun."""
            return 1 + k // block + (k % block != 0)

        return float(sum(4 * sources(k) * d for k in range(sublayers + 1)))
    return 0.0
