"""Residual schemes on Pre-LN (HC, mHC, AttnRes, mHC-lite, Frac-Connections, DenseFormer): equivalences with Pre-LN,
references written from the papers' equations (and official code) over the parameter names of docs/placements.md,
mHC's Sinkhorn, mHC-lite's exact doubly stochastic H_res, bf16 training steps, save/reload, the refusals, weight
decay and the measurements.

The references reuse tests/test_placement_reference.py's sub-layers (attention and FFN from the state dict, float64)
and write the schemes themselves with a loop over streams and sources, where the model batches them.
"""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoModelForPreTraining

from pretrain.modeling import LNBertConfig, LNBertForMaskedLM, LNBertForPreTraining, LNBertModel
from pretrain.optim import build_adamw, weight_decay_groups
from pretrain.residual_streams import recording, sinkhorn
from pretrain.tracking.design_stats import measure
from pretrain.variants import RESIDUAL_SCHEME_FIELDS, variant_name
from tests.conftest import TINY
from tests.test_placement_reference import (
    HIDDEN,
    LAYERS,
    Params,
    attention,
    embeddings,
    ffn,
    make_config,
    make_inputs,
    norm,
    perturb,
    tolerances,
)

# Each scheme's settings; ids name them as the variant labels do.
SCHEMES = {
    "shc1": dict(residual_scheme="hc", hc_streams=1, hc_dynamic=False),
    "shc4": dict(residual_scheme="hc", hc_streams=4, hc_dynamic=False),
    "hc1": dict(residual_scheme="hc", hc_streams=1),
    "hc4": dict(residual_scheme="hc", hc_streams=4),
    "mhc1": dict(residual_scheme="mhc", hc_streams=1),
    "mhc4": dict(residual_scheme="mhc", hc_streams=4),
    "attnres": dict(residual_scheme="attn_res"),
    "attnres-b1": dict(residual_scheme="attn_res", attn_res_block_size=1),
    "attnres-b2": dict(residual_scheme="attn_res", attn_res_block_size=2),
    "attnres-b3": dict(residual_scheme="attn_res", attn_res_block_size=3),  # odd: a block closes mid-layer
    "attnres-b4": dict(residual_scheme="attn_res", attn_res_block_size=4),  # 6 sub-layers: the last block partial
    "mhclite1": dict(residual_scheme="mhc_lite", hc_streams=1),
    "mhclite4": dict(residual_scheme="mhc_lite", hc_streams=4),
    "mhclite3-idres": dict(residual_scheme="mhc_lite", hc_streams=3, mhc_bias_init="identity"),
    "frac1": dict(residual_scheme="frac", frac_parts=1),
    "frac4": dict(residual_scheme="frac", frac_parts=4),
    "sfrac4": dict(residual_scheme="frac", frac_parts=4, hc_dynamic=False),
    "denseformer": dict(residual_scheme="denseformer"),
    "denseformer-2x1": dict(residual_scheme="denseformer", dwa_dilation=2),  # averages over every other output
    "denseformer-1x2": dict(residual_scheme="denseformer", dwa_period=2),  # an average after layer 2 only
}
# One of each kind for the slower tests.
MAIN = ["shc4", "hc4", "mhc4", "attnres", "attnres-b2", "mhclite4", "frac4", "denseformer"]
# The schemes that start as the Pre-LN model bit for bit: nothing duplicated or averaged (1 x + 0 y is x).
BIT_EXACT = ["frac1", "frac4", "sfrac4", "denseformer", "denseformer-2x1", "denseformer-1x2"]
# The equivalences' tolerance in float64: exact but for rounding and eps (1e-12); with rmsnorm, which computes in
# float32 by design, the reference tests' 2e-5.
EXACT = dict(rtol=1e-10, atol=1e-10)


def scheme_config(name: str, norm_type: str = "layernorm", **extra) -> LNBertConfig:
    """The reference tests' config (3 layers, width 32, eps 1e-3, dropout 0) with scheme ``name``."""
    config = make_config("pre", norm_type, **SCHEMES[name])
    return LNBertConfig(**{**config.to_dict(), **extra}) if extra else config


def own_parameters(model: torch.nn.Module) -> set[str]:
    return {k for k in model.state_dict() if "_residual." in k}


def copied_from_pre_ln(config: LNBertConfig, cls=LNBertModel, seed: int = 0):
    """A Pre-LN model with perturbed weights (float64) and the scheme's model with those weights, its own
    parameters at their init."""
    pre_config = LNBertConfig(**{**config.to_dict(), "residual_scheme": "standard"})
    torch.manual_seed(seed)
    pre = cls(pre_config).double().eval()
    perturb(pre, seed)
    scheme = cls(config).double().eval()
    missing, unexpected = scheme.load_state_dict(pre.state_dict(), strict=False)
    assert not unexpected and set(missing) == own_parameters(scheme), (missing, unexpected)
    return pre, scheme


def forward(model, inputs, **kwargs):
    ids, mask, tt = inputs
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, token_type_ids=tt, output_hidden_states=True, **kwargs)


# --------------------------------------------------------------------------------------------------
# Exact equivalences with Pre-LN
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("name", list(SCHEMES))
def test_scheme_at_its_equivalent_init_is_the_pre_ln_model(name, norm_type):
    """HC at Eq. 14's init (SHC, DHC: tanh(0) = 0), mHC with its gates at 0 and b = 0, AttnRes with zero
    pseudo-queries, mHC-lite, Frac-Connections and DenseFormer at their inits: the Pre-LN model with the same weights,
    through the final norm. The n streams of HC, mHC and mHC-lite stay Pre-LN's stream (their sum, ``hidden_states``,
    n times it; a doubly stochastic H_res keeps identical streams identical); AttnRes's sources sum to it."""
    # BERT's eps: the norms remove the streams' factor n (AttnRes's 1/K) up to eps, which the reference tests'
    # eps of 1e-3 would show.
    config = scheme_config(name, norm_type, layer_norm_eps=1e-12)
    pre, scheme = copied_from_pre_ln(config, LNBertForPreTraining)
    if config.residual_scheme == "mhc":
        with torch.no_grad():
            for key, param in scheme.named_parameters():
                if key.rsplit(".", 1)[-1] in ("alpha_pre", "alpha_post", "alpha_res"):
                    param.zero_()
    inputs = make_inputs()
    want, got = forward(pre, inputs), forward(scheme, inputs)
    tol = EXACT if norm_type == "layernorm" else tolerances(config)
    torch.testing.assert_close(got.prediction_logits, want.prediction_logits, **tol)
    torch.testing.assert_close(got.seq_relationship_logits, want.seq_relationship_logits, **tol)
    copies = config.hc_streams if config.residual_scheme in ("hc", "mhc", "mhc_lite") else 1
    for j in range(1, LAYERS):
        torch.testing.assert_close(got.hidden_states[j], copies * want.hidden_states[j], **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", BIT_EXACT)
def test_frac_and_denseformer_start_as_the_pre_ln_model_bit_for_bit(name, dtype):
    """Frac-Connections at Gamma = A = I, beta = 1, W = 0 (SFC and DFC, m = 1 and 4) and DenseFormer at dwa_weight =
    (0, .., 0, 1) (1x1, 2x1, 1x2) compute Pre-LN's sums exactly: the same logits and hidden states, bit for bit."""
    pre, scheme = copied_from_pre_ln(scheme_config(name), LNBertForPreTraining)
    inputs = make_inputs()
    want, got = forward(pre.to(dtype), inputs), forward(scheme.to(dtype), inputs)
    assert torch.equal(got.prediction_logits, want.prediction_logits)
    assert torch.equal(got.seq_relationship_logits, want.seq_relationship_logits)
    assert all(torch.equal(a, b) for a, b in zip(got.hidden_states, want.hidden_states, strict=True))


@pytest.mark.parametrize("dynamic", [True, False])
def test_frac_with_one_fraction_is_hc_with_one_stream(dynamic):
    """The paper's Fig. 1: at n = m = 1 Frac- and Hyper-Connections are the same; HC's parameters load unchanged."""
    hc = LNBertModel(scheme_config("hc1", hc_dynamic=dynamic)).double().eval()
    perturb(hc, seed=3)
    frac = LNBertModel(scheme_config("frac1", hc_dynamic=dynamic)).double().eval()
    frac.load_state_dict(hc.state_dict())
    inputs = make_inputs()
    a, b = forward(hc, inputs), forward(frac, inputs)
    for want, got in zip(a.hidden_states, b.hidden_states, strict=True):
        torch.testing.assert_close(got, want, **EXACT)


def test_hc_init_is_eq_14_counted_over_sub_layers():
    """A_m = e_(k mod n) with k over sub-layers (layer i's attention 2i, FFN 2i + 1), A_r = I, B = 1, W = 0."""
    model = LNBertModel(scheme_config("hc4"))
    modules = [m for layer in model.encoder.layer for m in (layer.attention_residual, layer.ffn_residual)]
    for k, module in enumerate(modules):
        want = torch.cat([torch.eye(4)[:, k % 4 : k % 4 + 1], torch.eye(4)], dim=1)
        assert torch.equal(module.static_alpha, want), k
        assert torch.equal(module.static_beta, torch.ones(4))
        assert not module.dynamic_alpha_fn.any() and not module.dynamic_beta_fn.any()
        assert module.dynamic_alpha_scale.item() == module.dynamic_beta_scale.item() == pytest.approx(0.01)


@pytest.mark.parametrize("name", MAIN)
def test_padding_positions_do_not_leak(name):
    """The streams and the sources mix per token: tokens under the padding mask change nothing elsewhere."""
    model = LNBertModel(scheme_config(name)).double().eval()
    perturb(model, seed=7)
    ids, mask, tt = make_inputs()
    noisy = ids.clone()
    noisy[mask == 0] = 5
    real = mask.bool()
    a, b = forward(model, (ids, mask, tt)), forward(model, (noisy, mask, tt))
    torch.testing.assert_close(a.last_hidden_state[real], b.last_hidden_state[real], rtol=0, atol=1e-12)


def test_block_size_one_is_full_attn_res_for_random_queries():
    full = scheme_config("attnres")
    model_full = LNBertModel(full).double().eval()
    perturb(model_full, seed=3)  # random pseudo-queries and weights
    assert all(v.abs().min() > 0 for k, v in model_full.state_dict().items() if k.endswith("pseudo_query"))
    model_block = LNBertModel(scheme_config("attnres-b1")).double().eval()
    model_block.load_state_dict(model_full.state_dict())
    inputs = make_inputs()
    a, b = forward(model_full, inputs), forward(model_block, inputs)
    torch.testing.assert_close(a.last_hidden_state, b.last_hidden_state, rtol=0, atol=0)
    # and both are the paper's Full AttnRes (Eqs. 1-4), written here with every output its own source
    torch.testing.assert_close(a.last_hidden_state, full_attn_res_reference(model_full, full, inputs), **EXACT)


# --------------------------------------------------------------------------------------------------
# References from the papers, perturbed weights
# --------------------------------------------------------------------------------------------------


def sublayers(P: Params, cfg: LNBertConfig, key_mask: torch.Tensor):
    """(residual module prefix, F) for each sub-layer in order; F includes its own pre-norm."""
    for i in range(cfg.num_hidden_layers):
        lp = f"encoder.layer.{i}."
        yield (
            f"{lp}attention_residual.",
            lambda h, lp=lp: attention(P, lp, norm(P, f"{lp}attention.output.LayerNorm", h, cfg), cfg, key_mask),
        )
        yield f"{lp}ffn_residual.", lambda h, lp=lp: ffn(P, lp, norm(P, f"{lp}output.LayerNorm", h, cfg), cfg)


def rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def hc_reference(model, cfg, inputs):
    """HC, Algorithm 2 (static_alpha = [A_m | A_r], static_beta = B; DHC's tanh terms), streams summed at the end.
    Returns the collapsed stream after each layer and the encoder's output."""
    ids, mask, tt = inputs
    P = Params(model)
    n = cfg.hc_streams
    x = embeddings(P, cfg, ids, tt)
    H = [x] * n  # H^0: n copies
    states = []
    for k, (pre, F) in enumerate(sublayers(P, cfg, mask.bool())):
        alpha = P.get(pre + "static_alpha").expand(*x.shape[:2], n, n + 1)  # (B, T, n, n + 1)
        beta = P.get(pre + "static_beta").expand(*x.shape[:2], n)
        if cfg.hc_dynamic:
            Hbar = [norm(P, pre + "norm", h, cfg) for h in H]
            alpha = alpha + P.get(pre + "dynamic_alpha_scale") * torch.stack(
                [torch.tanh(hb @ P.get(pre + "dynamic_alpha_fn")) for hb in Hbar], dim=-2
            )
            beta = beta + P.get(pre + "dynamic_beta_scale") * torch.stack(
                [torch.tanh(hb @ P.get(pre + "dynamic_beta_fn")) for hb in Hbar], dim=-1
            )
        h0 = sum(alpha[..., j, 0, None] * H[j] for j in range(n))  # A_m^T H
        out = F(h0)
        H = [beta[..., c, None] * out + sum(alpha[..., j, 1 + c, None] * H[j] for j in range(n)) for c in range(n)]
        if k % 2 == 1:
            states.append(sum(H))
    return states, norm(P, "encoder.final_layer_norm", sum(H), cfg)


def mhc_reference(model, cfg, inputs):
    """mHC, Eqs. 3 and 7-9: RMSNorm over vec(x), sigmoid, 2 sigmoid, Sinkhorn-Knopp (column, then row, 20 times)."""
    ids, mask, tt = inputs
    P = Params(model)
    n = cfg.hc_streams
    x = embeddings(P, cfg, ids, tt)
    H = [x] * n
    states = []
    for k, (pre, F) in enumerate(sublayers(P, cfg, mask.bool())):
        v = torch.cat(H, dim=-1)  # vec: stream s at s C .. (s + 1) C
        v = v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + 1e-20)
        h_pre = torch.sigmoid(P.get(pre + "alpha_pre") * (v @ P.get(pre + "phi_pre")) + P.get(pre + "b_pre"))
        h_post = 2 * torch.sigmoid(P.get(pre + "alpha_post") * (v @ P.get(pre + "phi_post")) + P.get(pre + "b_post"))
        logits = P.get(pre + "alpha_res") * (v @ P.get(pre + "phi_res")).reshape(*v.shape[:-1], n, n)
        M = torch.exp(logits + P.get(pre + "b_res"))
        for _ in range(cfg.mhc_sinkhorn_iters):
            M = M / M.sum(-2, keepdim=True)
            M = M / M.sum(-1, keepdim=True)
        out = F(sum(h_pre[..., j, None] * H[j] for j in range(n)))
        H = [sum(M[..., i, j, None] * H[j] for j in range(n)) + h_post[..., i, None] * out for i in range(n)]
        if k % 2 == 1:
            states.append(sum(H))
    return states, norm(P, "encoder.final_layer_norm", sum(H), cfg)


def aggregate(w: torch.Tensor, sources: list[torch.Tensor], eps: float) -> torch.Tensor:
    """AttnRes Eqs. 2-4: softmax over the sources of w^T RMSNorm(v_i), per token; the weighted sum of the v_i."""
    logits = torch.stack([rms(v, eps) @ w for v in sources])
    weights = torch.softmax(logits, dim=0)
    return sum(weights[i, ..., None] * v for i, v in enumerate(sources))


def full_attn_res_reference(model, cfg, inputs):
    """Full AttnRes (Eqs. 1-4): v_0 the embedding output, v_l = f_l(h_l); the output aggregates v_0 .. v_N."""
    ids, mask, tt = inputs
    P = Params(model)
    values = [embeddings(P, cfg, ids, tt)]
    for pre, F in sublayers(P, cfg, mask.bool()):
        values.append(F(aggregate(P.get(pre + "pseudo_query"), values, cfg.layer_norm_eps)))
    out = aggregate(P.get("encoder.output_residual.pseudo_query"), values, cfg.layer_norm_eps)
    return norm(P, "encoder.final_layer_norm", out, cfg)


def block_attn_res_reference(model, cfg, inputs):
    """Block AttnRes (Eqs. 5-6): blocks of S sub-layers summed; a sub-layer attends over b_0 (the embedding
    output), the completed blocks and, after its block's first sub-layer, the block's partial sum."""
    ids, mask, tt = inputs
    P = Params(model)
    S = cfg.attn_res_block_size or 1
    blocks, partial, states = [embeddings(P, cfg, ids, tt)], None, []
    for k, (pre, F) in enumerate(sublayers(P, cfg, mask.bool())):
        sources = blocks + ([] if partial is None else [partial])
        out = F(aggregate(P.get(pre + "pseudo_query"), sources, cfg.layer_norm_eps))
        partial = out if partial is None else partial + out
        if (k + 1) % S == 0:
            blocks, partial = [*blocks, partial], None
        if k % 2 == 1:
            states.append(sum(blocks) + (0 if partial is None else partial))
    sources = blocks + ([] if partial is None else [partial])
    out = aggregate(P.get("encoder.output_residual.pseudo_query"), sources, cfg.layer_norm_eps)
    return states, norm(P, "encoder.final_layer_norm", out, cfg)


def mhc_lite_reference(model, cfg, inputs):
    """mHC-lite as its official code (FFTYYY/mhc-lite, hyper_conn/mhc_lite.py): mHC's H_pre and H_post (without the
    code's RMSNorm gain, which the port folds into phi); c = softmax(alpha_res (x' phi_res) + b_res) over the n!
    permutation matrices eye[perm] in itertools' order, A = sum_r c_r P_r, applied as the code's einsum does: new
    stream t = sum_s A[s, t] x_s."""
    ids, mask, tt = inputs
    P = Params(model)
    n = cfg.hc_streams
    perms = torch.eye(n, dtype=torch.float64)[torch.tensor(list(itertools.permutations(range(n))))]
    x = embeddings(P, cfg, ids, tt)
    H = [x] * n
    states = []
    for k, (pre, F) in enumerate(sublayers(P, cfg, mask.bool())):
        v = torch.cat(H, dim=-1)
        v = v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + 1e-20)
        h_pre = torch.sigmoid(P.get(pre + "alpha_pre") * (v @ P.get(pre + "phi_pre")) + P.get(pre + "b_pre"))
        h_post = 2 * torch.sigmoid(P.get(pre + "alpha_post") * (v @ P.get(pre + "phi_post")) + P.get(pre + "b_post"))
        c = torch.softmax(P.get(pre + "alpha_res") * (v @ P.get(pre + "phi_res")) + P.get(pre + "b_res"), dim=-1)
        A = torch.einsum("...r,rij->...ij", c, perms)
        out = F(sum(h_pre[..., j, None] * H[j] for j in range(n)))
        H = [sum(A[..., s, t, None] * H[s] for s in range(n)) + h_post[..., t, None] * out for t in range(n)]
        if k % 2 == 1:
            states.append(sum(H))
    return states, norm(P, "encoder.final_layer_norm", sum(H), cfg)


def frac_reference(model, cfg, inputs):
    """Frac-Connections (arXiv 2503.14125, Eqs. 6-14): the stream split into m contiguous fractions H_j of
    d/m, fraction j owning row j of [Gamma | A] and beta_j, DFC adding s tanh(norm(H_j) W); the input's fraction i
    is sum_j Gamma[j, i] H_j, the new fraction c is beta_c F(h)_c + sum_j A[j, c] H_j."""
    ids, mask, tt = inputs
    P = Params(model)
    m, w = cfg.frac_parts, cfg.hidden_size // cfg.frac_parts
    x = embeddings(P, cfg, ids, tt)
    states = []
    for k, (pre, F) in enumerate(sublayers(P, cfg, mask.bool())):
        H = [x[..., j * w : (j + 1) * w] for j in range(m)]
        rows, beta = [], []
        for j in range(m):
            row, b = P.get(pre + "static_alpha")[j], P.get(pre + "static_beta")[j]
            if cfg.hc_dynamic:
                normed = norm(P, pre + "norm", H[j], cfg)
                row = row + P.get(pre + "dynamic_alpha_scale") * torch.tanh(normed @ P.get(pre + "dynamic_alpha_fn"))
                b = b + P.get(pre + "dynamic_beta_scale") * torch.tanh(normed @ P.get(pre + "dynamic_beta_fn"))
            rows.append(row)
            beta.append(b)
        out = F(torch.cat([sum(rows[j][..., i, None] * H[j] for j in range(m)) for i in range(m)], dim=-1))
        x = torch.cat([beta[c][..., None] * out[..., c * w : (c + 1) * w]
                       + sum(rows[j][..., m + c, None] * H[j] for j in range(m)) for c in range(m)], dim=-1)  # fmt: skip
        if k % 2 == 1:
            states.append(x)
    return states, norm(P, "encoder.final_layer_norm", x, cfg)


def denseformer_reference(model, cfg, inputs):
    """DenseFormer as its official package (epfml/DenseFormer, denseformer/denseformer.py, ``DWAModules``): k
    accumulators, the embedding output first in accumulator 0; block i's output joins accumulator (i + 1) % k, and
    where (i + 1) % p == 0 the stream becomes ``tensordot(alphas[i].weight, accumulator)`` over what it holds."""
    ids, mask, tt = inputs
    P = Params(model)
    k, p = cfg.dwa_dilation, cfg.dwa_period
    x = embeddings(P, cfg, ids, tt)
    accumulators = [[x]] + [[] for _ in range(k - 1)]
    layers = list(sublayers(P, cfg, mask.bool()))
    states = []
    for i in range(cfg.num_hidden_layers):
        (_, attn), (pre, ffn_) = layers[2 * i], layers[2 * i + 1]
        x = x + attn(x)
        x = x + ffn_(x)
        accumulators[(i + 1) % k].append(x)
        if (i + 1) % p == 0:
            x = torch.tensordot(P.get(pre + "dwa_weight"), torch.stack(accumulators[(i + 1) % k]), dims=1)
        states.append(x)
    return states, norm(P, "encoder.final_layer_norm", x, cfg)


REFERENCES = {"hc": hc_reference, "mhc": mhc_reference, "attn_res": block_attn_res_reference,
              "mhc_lite": mhc_lite_reference, "frac": frac_reference, "denseformer": denseformer_reference}  # fmt: skip


@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm", "dyt"])
@pytest.mark.parametrize("name", list(SCHEMES))
def test_scheme_matches_its_reference_with_perturbed_weights(name, norm_type):
    config = scheme_config(name, norm_type)
    torch.manual_seed(0)
    model = LNBertModel(config).double().eval()
    perturb(model, seed=1)
    inputs = make_inputs()
    got = forward(model, inputs)
    states, last = REFERENCES[config.residual_scheme](model, config, inputs)
    tol = tolerances(config)
    torch.testing.assert_close(got.last_hidden_state, last, **tol)
    for j, want in enumerate(states[:-1], start=1):
        torch.testing.assert_close(got.hidden_states[j], want, **tol, msg=lambda m, j=j: f"hidden_states[{j}]: {m}")


@pytest.mark.parametrize("iters", [1, 20])
def test_mhc_identity_bias_init_starts_near_the_identity(iters):
    config = scheme_config("mhc4", mhc_bias_init="identity", mhc_sinkhorn_iters=iters)
    model = LNBertModel(config)
    module = model.encoder.layer[0].attention_residual
    with torch.no_grad():
        module.alpha_res.zero_()
        _, _, h_res = module.mappings(torch.randn(2, 3, 4, HIDDEN))
    want = torch.full((4, 4), 0.01 / 3) + (0.99 - 0.01 / 3) * torch.eye(4)  # diagonal 0.99, rows and columns sum 1
    torch.testing.assert_close(h_res, want.expand_as(h_res), rtol=0, atol=1e-6)
    zero = LNBertModel(scheme_config("mhc4")).encoder.layer[0].attention_residual
    assert torch.equal(zero.b_res, torch.zeros(4, 4)) and torch.equal(zero.b_pre, torch.zeros(4))


# --------------------------------------------------------------------------------------------------
# Sinkhorn: doubly stochastic
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4, 8])
def test_sinkhorn_is_doubly_stochastic_for_random_logits(n):
    """Non-negative; rows (normalised last) sum to 1 to float32 rounding; columns within 1e-2 after the paper's 20
    rounds for logits N(0, 1) (the worst of 256 matrices; near init, logits near 0, much closer), and to float32
    rounding once converged."""
    logits = torch.randn(256, n, n, generator=torch.Generator().manual_seed(n))
    m = sinkhorn(logits, 20)
    assert m.dtype == torch.float32 and (m >= 0).all()
    torch.testing.assert_close(m.sum(-1), torch.ones(256, n), rtol=0, atol=1e-6)
    torch.testing.assert_close(m.sum(-2), torch.ones(256, n), rtol=0, atol=1e-2)
    converged = sinkhorn(logits, 200)
    torch.testing.assert_close(converged.sum(-2), torch.ones(256, n), rtol=0, atol=1e-5)
    torch.testing.assert_close(sinkhorn(0.1 * logits, 20).sum(-2), torch.ones(256, n), rtol=0, atol=1e-5)
    # Extreme logits: exp stays finite (the largest logit is subtracted) and no sum is 0 (exp's floor)
    extreme = sinkhorn(logits * 100, 20)
    assert torch.isfinite(extreme).all() and (extreme >= 0).all()
    torch.testing.assert_close(extreme.sum(-1), torch.ones(256, n), rtol=0, atol=1e-6)


def test_mhc_h_res_is_doubly_stochastic_in_float32_under_bf16_autocast():
    model = LNBertModel(scheme_config("mhc4"))
    perturb(model, seed=2)  # gates ~0.3, biases random: H_res far from uniform
    module = model.encoder.layer[1].ffn_residual
    state = torch.randn(3, 5, 4, HIDDEN, generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h_pre, h_post, h_res = module.mappings(state)
    assert h_res.dtype == h_pre.dtype == torch.float32
    assert (h_res >= 0).all() and (h_pre > 0).all() and (h_pre < 1).all() and (h_post < 2).all()
    torch.testing.assert_close(h_res.sum(-1), torch.ones(3, 5, 4), rtol=0, atol=1e-6)
    torch.testing.assert_close(h_res.sum(-2), torch.ones(3, 5, 4), rtol=0, atol=1e-3)
    assert h_res.std() > 0.01  # not the uniform matrix


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_mhc_lite_h_res_is_doubly_stochastic_to_rounding(dtype, autocast):
    """Every parameter perturbed, and then the logits spread over hundreds (gate 30: c near one-hot): each H_res is
    non-negative and its rows and columns sum to 1 to the dtype's rounding (a few eps), in at least float32 under
    bf16 autocast. A convex combination of permutations needs no iteration, where mHC's 20 Sinkhorn rounds leave the
    columns within 1e-2 (``test_sinkhorn_is_doubly_stochastic_for_random_logits``)."""
    model = LNBertModel(scheme_config("mhclite4")).to(dtype)
    perturb(model, seed=2)
    modules = [m for layer in model.encoder.layer for m in (layer.attention_residual, layer.ffn_residual)]
    state = torch.randn(3, 5, 4, HIDDEN, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)
    ones, tol = torch.ones(3, 5, 4, dtype=dtype), dict(rtol=0, atol=8 * torch.finfo(dtype).eps)
    for gate in (None, 30.0):
        for module in modules:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                if gate is not None:
                    module.alpha_res.fill_(gate)
                _, _, h_res = module.mappings(state)
            assert h_res.dtype == dtype and (h_res >= 0).all()
            torch.testing.assert_close(h_res.sum(-1), ones, **tol)
            torch.testing.assert_close(h_res.sum(-2), ones, **tol)
            assert h_res.std() > 0.01  # not the uniform matrix
    assert h_res.amax(dim=(-2, -1)).median() > 0.9  # gate 30: most tokens near a permutation


@pytest.mark.parametrize("n", [1, 4])
def test_mhc_lite_bias_inits(n):
    """zero: c uniform, H_res = J/n, H_pre = 1/2, H_post = 1 for any input (phi starts at 0, as the official code);
    identity: the official b_res (0 at the identity, -8 elsewhere), at n = 4 H_res's diagonal 1/(1 + 23 e^-8) + 5
    e^-8/(1 + 23 e^-8) = 0.994008, off it 0.001997; n = 1: H_res = 1."""
    state = torch.randn(2, 3, n, HIDDEN, dtype=torch.float64)
    zero = LNBertModel(scheme_config("mhclite4", hc_streams=n)).double().encoder.layer[0].attention_residual
    h_pre, h_post, h_res = zero.mappings(state)
    assert torch.equal(h_pre, torch.full_like(h_pre, 0.5)) and torch.equal(h_post, torch.ones_like(h_post))
    torch.testing.assert_close(h_res, torch.full_like(h_res, 1 / n), rtol=0, atol=1e-15)
    identity = LNBertModel(scheme_config("mhclite4", hc_streams=n, mhc_bias_init="identity")).double()
    _, _, h_res = identity.encoder.layer[0].attention_residual.mappings(state)
    if n == 1:
        assert torch.equal(h_res, torch.ones_like(h_res))
        return
    other = math.exp(-8) / (1 + 23 * math.exp(-8))
    want = torch.full((4, 4), 6 * other, dtype=torch.float64).fill_diagonal_(1 / (1 + 23 * math.exp(-8)) + 5 * other)
    torch.testing.assert_close(h_res, want.expand_as(h_res), rtol=0, atol=1e-15)
    assert round(want[0, 0].item(), 6) == 0.994008 and round(want[0, 1].item(), 6) == 0.001997


# --------------------------------------------------------------------------------------------------
# Training, save / reload, refusals
# --------------------------------------------------------------------------------------------------


def tiny_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, 99, (3, 11), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 7:] = 0
    input_ids[attention_mask == 0] = 0
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=torch.zeros_like(input_ids))


@pytest.mark.parametrize("depth", [2, 24])
@pytest.mark.parametrize("name", MAIN)
def test_a_bf16_autocast_training_step_is_finite(name, depth):
    torch.manual_seed(0)
    model = LNBertForPreTraining(
        LNBertConfig(**{**TINY, "num_hidden_layers": depth}, **SCHEMES[name], norm_placement="pre")
    )
    optimizer = build_adamw(model, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, implementation="for_loop")
    batch = tiny_batch()
    labels = batch["input_ids"].clone()
    labels[batch["attention_mask"] == 0] = -100
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(**batch, labels=labels, next_sentence_label=torch.tensor([0, 1, 0]), output_hidden_states=True)
    assert torch.isfinite(out.loss)
    # The residual state stays float32 under autocast (the sub-layers run in bf16).
    assert all(h.dtype == torch.float32 for h in out.hidden_states)
    out.loss.backward()
    for key, param in model.named_parameters():
        assert param.grad is not None, f"{key} gets no gradient"
        assert torch.isfinite(param.grad).all(), f"{key} has non-finite gradients"
    optimizer.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("name", MAIN)
def test_save_and_reload_through_the_auto_classes_is_bit_identical(name, tmp_path):
    torch.manual_seed(0)
    model = LNBertForPreTraining(LNBertConfig(**TINY, **SCHEMES[name], norm_placement="pre")).eval()
    perturb(model, seed=4)  # every parameter away from its init, so that a re-initialised one shows
    model.save_pretrained(tmp_path)
    loaded = AutoModelForPreTraining.from_pretrained(tmp_path).eval()
    assert type(loaded) is LNBertForPreTraining and loaded.config.residual_scheme == SCHEMES[name]["residual_scheme"]
    saved, got = model.state_dict(), loaded.state_dict()
    assert saved.keys() == got.keys()
    assert all(torch.equal(saved[k], got[k]) for k in saved), [k for k in saved if not torch.equal(saved[k], got[k])]
    batch = tiny_batch()
    with torch.no_grad():
        a, b = model(**batch), loaded(**batch)
    assert torch.equal(a.prediction_logits, b.prediction_logits)
    assert torch.equal(a.seq_relationship_logits, b.seq_relationship_logits)
    mlm = AutoModelForMaskedLM.from_pretrained(tmp_path)  # the snapshot opens as the other task models too
    assert isinstance(mlm, LNBertForMaskedLM)
    assert all(torch.equal(v, saved[f"bert.{k}"]) for k, v in mlm.bert.state_dict().items())


@pytest.mark.parametrize(
    ("saved", "loaded", "message"),
    [
        (SCHEMES["hc4"], {"residual_scheme": "mhc"}, "residual_scheme='mhc' (trained with 'hc')"),
        (SCHEMES["hc4"], {"hc_dynamic": False}, "hc_dynamic=False (trained with True)"),
        (SCHEMES["mhc4"], {"hc_streams": 2}, "hc_streams=2 (trained with 4)"),
        (SCHEMES["mhc4"], {"mhc_sinkhorn_iters": 5}, "mhc_sinkhorn_iters=5 (trained with 20)"),
        (SCHEMES["attnres"], {"attn_res_block_size": 2}, "attn_res_block_size=2 (trained with None)"),
        ({}, {"residual_scheme": "attn_res"}, "residual_scheme='attn_res' (trained with 'standard')"),
        (
            SCHEMES["attnres-b2"],
            {"residual_scheme": "standard"},
            "residual_scheme='standard' (trained with 'attn_res')",
        ),
        (SCHEMES["mhclite4"], {"residual_scheme": "mhc"}, "residual_scheme='mhc' (trained with 'mhc_lite')"),
        (SCHEMES["frac4"], {"frac_parts": 2}, "frac_parts=2 (trained with 4)"),
        (SCHEMES["denseformer"], {"dwa_period": 2}, "dwa_period=2 (trained with 1)"),
        (SCHEMES["denseformer"], {"dwa_dilation": 2}, "dwa_dilation=2 (trained with 1)"),
    ],
)
def test_loading_into_another_scheme_is_refused(tmp_path, saved, loaded, message):
    LNBertForPreTraining(LNBertConfig(**TINY, **saved, norm_placement="pre")).save_pretrained(tmp_path)
    for cls in (LNBertForPreTraining, AutoModelForPreTraining):
        with pytest.raises(ValueError, match=re.escape(message)):
            cls.from_pretrained(tmp_path, **loaded)


@pytest.mark.parametrize("name", MAIN)
def test_a_pre_ln_state_dict_loads_with_only_the_schemes_parameters_missing(name):
    pre = LNBertForPreTraining(LNBertConfig(**TINY, norm_placement="pre"))
    scheme = LNBertForPreTraining(LNBertConfig(**TINY, **SCHEMES[name], norm_placement="pre"))
    missing, unexpected = scheme.load_state_dict(pre.state_dict(), strict=False)
    assert not unexpected
    assert set(missing) == own_parameters(scheme) and missing
    # The sub-layers keep Pre-LN's names: every Pre-LN parameter is one of the scheme model's.
    assert set(pre.state_dict()) == set(scheme.state_dict()) - own_parameters(scheme)


def test_standard_is_todays_pre_ln():
    pre = LNBertForPreTraining(LNBertConfig(**TINY, norm_placement="pre"))
    assert not own_parameters(pre) and not hasattr(pre.bert.encoder, "output_residual")
    assert all(layer.block.forward.__name__ == "pre_block" for layer in pre.bert.encoder.layer)


# --------------------------------------------------------------------------------------------------
# Config checks and labels
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"residual_scheme": "hc", "norm_placement": "post"},
            "residual_scheme='hc' needs norm_placement='pre' (got 'post')",
        ),
        (
            {"residual_scheme": "attn_res", "norm_placement": "sandwich"},
            "set norm_placement=pre or residual_scheme=standard",
        ),
        ({"residual_scheme": "hyper"}, "residual_scheme='hyper' is not a valid choice"),
        ({"residual_scheme": "hc", "hc_streams": 0}, "hc_streams=0 must be an integer >= 1"),
        ({"residual_scheme": "mhc", "mhc_sinkhorn_iters": 0}, "mhc_sinkhorn_iters=0 must be an integer >= 1"),
        ({"residual_scheme": "mhc", "mhc_bias_init": "eye"}, "mhc_bias_init='eye' is not a valid choice"),
        ({"residual_scheme": "attn_res", "attn_res_block_size": 0}, "attn_res_block_size=0 must be an integer >= 1"),
        (
            {"residual_scheme": "denseformer", "norm_placement": "post"},
            "residual_scheme='denseformer' needs norm_placement='pre' (got 'post')",
        ),
        ({"residual_scheme": "frac", "frac_parts": 0}, "frac_parts=0 must be an integer >= 1"),
        ({"residual_scheme": "frac", "frac_parts": 5}, "frac_parts=5 must divide hidden_size=32"),
        ({"residual_scheme": "mhc_lite", "hc_streams": 6}, "hc_streams=6 is too many for residual_scheme=mhc_lite"),
        ({"residual_scheme": "denseformer", "dwa_dilation": 0}, "dwa_dilation=0 must be an integer >= 1"),
        ({"residual_scheme": "denseformer", "dwa_period": -1}, "dwa_period=-1 must be an integer >= 1"),
    ],
)
def test_bad_scheme_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        LNBertConfig(**{"norm_placement": "pre", **TINY, **settings})


def test_odd_block_sizes_and_any_norm_type_are_allowed():
    LNBertConfig(**TINY, norm_placement="pre", residual_scheme="attn_res", attn_res_block_size=3)
    LNBertConfig(**TINY, norm_placement="pre", residual_scheme="hc", norm_type="dyt")
    # A scheme's own checks apply to it only: 5 fractions or 6 streams are fine under another scheme.
    LNBertConfig(**TINY, norm_placement="pre", residual_scheme="mhc", frac_parts=5, hc_streams=6)


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("hc4", "pre-hc4"),
        ("shc4", "pre-shc4"),
        ("hc1", "pre-hc1"),
        ("mhc4", "pre-mhc4"),
        ("attnres", "pre-attnres"),
        ("attnres-b4", "pre-attnres-b4"),
        ("mhclite4", "pre-mhclite4"),
        ("mhclite3-idres", "pre-mhclite3-idres"),
        ("frac4", "pre-frac4"),
        ("sfrac4", "pre-sfrac4"),
        ("denseformer", "pre-denseformer"),
        ("denseformer-2x1", "pre-denseformer-2x1"),
    ],
)
def test_variant_labels_name_the_scheme(name, label):
    config = LNBertConfig(**TINY, norm_placement="pre", **SCHEMES[name])
    fields = {k: getattr(config, k) for k in RESIDUAL_SCHEME_FIELDS}
    assert variant_name("pre", **fields) == label
    assert variant_name("pre", "rmsnorm", True, **fields) == f"{label}-rmsnorm-qknorm"


def test_todays_variant_labels_are_unchanged():
    assert [variant_name("pre"), variant_name("post", "dyt", True), variant_name("sandwich", "rmsnorm")] == [
        "pre",
        "post-dyt-qknorm",
        "sandwich-rmsnorm",
    ]
    assert variant_name("pre", residual_scheme="mhc", mhc_bias_init="identity") == "pre-mhc4-idres"


# --------------------------------------------------------------------------------------------------
# Weight decay
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "decayed", "exempt"),
    [
        ("hc4", {"dynamic_alpha_fn", "dynamic_beta_fn"},
         {"static_alpha", "static_beta", "dynamic_alpha_scale", "dynamic_beta_scale", "norm.weight", "norm.bias"}),
        ("shc4", set(), {"static_alpha", "static_beta"}),
        ("mhc4", {"phi_pre", "phi_post", "phi_res"},
         {"b_pre", "b_post", "b_res", "alpha_pre", "alpha_post", "alpha_res"}),
        ("attnres", set(), {"pseudo_query"}),
        ("mhclite4", {"phi_pre", "phi_post", "phi_res"},
         {"b_pre", "b_post", "b_res", "alpha_pre", "alpha_post", "alpha_res"}),
        ("frac4", {"dynamic_alpha_fn", "dynamic_beta_fn"},
         {"static_alpha", "static_beta", "dynamic_alpha_scale", "dynamic_beta_scale", "norm.weight", "norm.bias"}),
        ("denseformer", {"dwa_weight"}, set()),  # as the official code, which decays every nn.Linear weight
    ],
)  # fmt: skip
def test_weight_decay_follows_the_papers(name, decayed, exempt):
    """HC §4: the static matrices without weight decay, the dynamic projections with it; mHC and AttnRes as
    docs/placements.md says. Selected by the modules' own markers, not by names."""
    model = LNBertForPreTraining(LNBertConfig(**TINY, norm_placement="pre", **SCHEMES[name]))
    names = {id(p): n for n, p in model.named_parameters()}
    decay, no_decay = weight_decay_groups(model, 0.01)

    def leaves(group):
        return {names[id(p)].split("_residual.", 1)[1] for p in group["params"] if "_residual." in names[id(p)]}

    assert leaves(decay) == decayed and leaves(no_decay) == exempt
    assert "bert.encoder.layer.0.attention.self.query.weight" in {names[id(p)] for p in decay["params"]}


# --------------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------------


def test_stats_of_static_hc_are_its_matrices_and_their_composite_gain():
    config = scheme_config("shc4")
    model = LNBertModel(config).double()
    perturb(model, seed=5)
    ids, mask, tt = make_inputs()
    model.train()
    stats = measure(model, ids, mask, tt).residual
    assert model.training  # restored
    modules = [m for layer in model.encoder.layer for m in (layer.attention_residual, layer.ffn_residual)]
    product = torch.eye(4, dtype=torch.float64)
    for k, module in enumerate(modules):
        alpha = module.static_alpha.detach()
        torch.testing.assert_close(stats.pre[k], alpha[:, 0].float())
        torch.testing.assert_close(stats.post[k], module.static_beta.detach().float())
        torch.testing.assert_close(stats.res[k], alpha[:, 1:].T.float())
        product = alpha[:, 1:].T @ product  # x_(k+1) = A_r^T x_k + ...
        gains = torch.stack([product.abs().sum(1).max(), product.abs().sum(0).max()]).float()
        torch.testing.assert_close(stats.composite_gain[k], gains)
        sums = torch.cat([alpha[:, 1:].sum(0), alpha[:, 1:].sum(1)])  # H_res = A_r^T: its rows, then its columns
        torch.testing.assert_close(stats.stochastic_error[k], (sums - 1).abs().max().float())
    assert set(stats.scalars()) == {
        *(f"output_norm/{k:02d}" for k in range(6)),
        *(f"stochastic_error/{k:02d}" for k in range(6)),
        "composite_gain/row",
        "composite_gain/col",
    }


def test_mhc_composite_gain_stays_near_one():
    model = LNBertModel(scheme_config("mhc4")).double()
    perturb(model, seed=6)
    stats = measure(model, *make_inputs()).residual
    assert stats.res.shape == (6, 4, 4) and stats.pre.shape == stats.post.shape == (6, 4)
    torch.testing.assert_close(stats.composite_gain[:, 0], torch.ones(6), rtol=0, atol=1e-5)  # rows: exact
    torch.testing.assert_close(stats.composite_gain[:, 1], torch.ones(6), rtol=0, atol=1e-2)


def test_mhc_lite_composite_gain_is_one_to_rounding():
    """mHC-lite's claim: H_res exactly doubly stochastic at every sub-layer, so the product over depth keeps row and
    column sums 1 (what mHC reaches only as far as Sinkhorn converged), to the recorder's float32 rounding."""
    model = LNBertModel(scheme_config("mhclite4")).double()
    perturb(model, seed=6)
    stats = measure(model, *make_inputs()).residual
    assert stats.res.shape == (6, 4, 4) and stats.pre.shape == stats.post.shape == (6, 4)
    torch.testing.assert_close(stats.composite_gain, torch.ones(6, 2), rtol=0, atol=1e-5)
    torch.testing.assert_close(stats.res.sum(-2), torch.ones(6, 4), rtol=0, atol=1e-5)  # columns of the token mean
    assert float(stats.stochastic_error.max()) < 1e-5 and stats.permutation_entropy.shape == (6,)


def test_mhc_lite_logs_the_entropy_of_its_permutation_weights():
    """With phi_res 0 the weights over the 24 permutations are softmax(b_res) at every token: their entropy, per
    sub-layer, from a perturbed b_res; ln 24 where b_res is uniform."""
    model = LNBertModel(scheme_config("mhclite4")).double()
    modules = [m for layer in model.encoder.layer for m in (layer.attention_residual, layer.ffn_residual)]
    torch.manual_seed(3)
    with torch.no_grad():
        for module in modules:
            module.phi_res.zero_()
            module.b_res.normal_()
        modules[0].b_res.zero_()
    stats = measure(model, *make_inputs()).residual
    expected = [torch.special.entr(torch.softmax(m.b_res.detach(), -1)).sum().item() for m in modules]
    torch.testing.assert_close(stats.permutation_entropy, torch.tensor(expected, dtype=torch.float32))
    assert stats.permutation_entropy[0].item() == pytest.approx(math.log(24), rel=1e-6)
    assert {f"permutation_entropy/{k:02d}" for k in range(6)} <= set(stats.scalars())


def test_stats_of_static_frac_are_its_matrices():
    """HC's measurements for Frac-Connections: H_pre = Gamma^T (m x m, row-major), H_post = beta, H_res = A^T."""
    model = LNBertModel(scheme_config("sfrac4")).double()
    perturb(model, seed=5)
    stats = measure(model, *make_inputs()).residual
    modules = [m for layer in model.encoder.layer for m in (layer.attention_residual, layer.ffn_residual)]
    assert stats.pre.shape == (6, 16) and stats.post.shape == (6, 4) and stats.res.shape == (6, 4, 4)
    for k, module in enumerate(modules):
        alpha = module.static_alpha.detach()
        torch.testing.assert_close(stats.pre[k], alpha[:, :4].T.flatten().float())
        torch.testing.assert_close(stats.post[k], module.static_beta.detach().float())
        torch.testing.assert_close(stats.res[k], alpha[:, 4:].T.float())


@pytest.mark.parametrize("name", ["denseformer", "denseformer-2x1", "denseformer-1x2"])
def test_denseformer_logs_its_depth_weights(name):
    """DenseFormer's claim is about its learned DWA weights: ``depth_weights`` holds one row per average, its weight
    on each output X_0 .. X_(i+1) (0 off the dilation's outputs and past the row's own), as wide as the last row."""
    config = scheme_config(name)
    model = LNBertModel(config).double()
    perturb(model, seed=8)
    stats = measure(model, *make_inputs()).residual
    k, layers = config.dwa_dilation, config.num_hidden_layers
    rows, width = [], 0
    for i, layer in enumerate(model.encoder.layer):
        if hasattr(layer.ffn_residual, "dwa_weight"):
            row = torch.zeros(layers + 1)
            row[(i + 1) % k : i + 2 : k] = layer.ffn_residual.dwa_weight.detach().float()
            rows.append(row)
            width = i + 2  # X_0 .. X_(i+1)
    torch.testing.assert_close(stats.depth_weights, torch.stack(rows)[:, :width])
    assert len(rows) == layers // config.dwa_period and stats.output_norm.shape == (6,)
    assert stats.composite_gain is None and set(stats.scalars()) == {f"output_norm/{j:02d}" for j in range(6)}


def test_stats_output_norms_and_attn_res_depth_weights():
    config = scheme_config("attnres")
    model = LNBertModel(config).double().eval()
    ids, mask, tt = make_inputs()
    outputs = []
    hooks = [
        module.register_forward_hook(lambda m, i, o: outputs.append(o))
        for layer in model.encoder.layer
        for module in (layer.attention.output, layer.output)
    ]
    with recording(model, mask) as recorder:
        forward(model, (ids, mask, tt))
    for hook in hooks:
        hook.remove()
    stats = recorder.stats()
    real = mask.bool()
    want = torch.stack([o[real].norm(dim=-1).mean() for o in outputs]).float()
    torch.testing.assert_close(stats.output_norm, want)
    # Zero pseudo-queries: sub-layer k averages its k + 1 sources, the output all 7.
    assert stats.depth_weights.shape == (7, 7)
    for k, row in enumerate(stats.depth_weights):
        torch.testing.assert_close(row, torch.tensor([1 / (k + 1)] * (k + 1) + [0.0] * (6 - k)))
    assert stats.composite_gain is None and all(m.recorder is None for m in model.modules() if hasattr(m, "recorder"))


def test_block_attn_res_depth_weights_are_over_blocks():
    model = LNBertModel(scheme_config("attnres-b4")).double()
    stats = measure(model, *make_inputs()).residual
    # blocks of 4 over 6 sub-layers: sources b_0 (+ partial) for k = 0..3, then b_0, b_1 (+ partial); the output
    # reads b_0, b_1 and the last, partial block
    counts = [1, 2, 2, 2, 2, 3, 3]
    assert [int((row > 0).sum()) for row in stats.depth_weights] == counts


def test_recording_needs_a_scheme_and_a_log_step_records_none_without_one():
    model = LNBertModel(make_config("pre"))
    with pytest.raises(ValueError, match="no residual scheme to record"), recording(model):
        pass
    found = measure(model, *make_inputs())
    assert found.residual is None and "hidden/variance/00" in found.design


# --------------------------------------------------------------------------------------------------
# Parameter counts (docs/placements.md)
# --------------------------------------------------------------------------------------------------


def bert_base_count(**settings) -> int:
    config = LNBertConfig(
        vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        norm_placement="pre", **settings,
    )  # fmt: skip
    with torch.device("meta"):
        return sum(p.numel() for p in LNBertModel(config).parameters())


@pytest.mark.parametrize(
    ("settings", "added"),
    [
        (dict(residual_scheme="hc", hc_dynamic=False), 576),  # 24 modules x n(n + 2)
        (dict(residual_scheme="hc"), 148_080),  # + LayerNorm (2d) + d(n + 2) + 2 per module
        (dict(residual_scheme="hc", norm_type="rmsnorm"), 129_648),
        (dict(residual_scheme="mhc"), 1_770_120),  # 24 x (nC (2n + n^2) + 2n + n^2 + 3)
        (dict(residual_scheme="attn_res"), 19_200),  # 25 pseudo-queries
        (dict(residual_scheme="attn_res", attn_res_block_size=4), 19_200),
        (dict(residual_scheme="mhc_lite"), 2_360_136),  # 24 x (nC (2n + n!) + 2n + n! + 3)
        (dict(residual_scheme="frac", hc_dynamic=False), 864),  # 24 x (2m^2 + m)
        (dict(residual_scheme="frac"), 51_600),  # + LayerNorm (2 d/m) + (d/m)(2m + 1) + 2 per module
        (dict(residual_scheme="frac", norm_type="rmsnorm"), 46_992),  # the paper's Eq. 19 (its norm an RMSNorm)
        (dict(residual_scheme="denseformer"), 90),  # sum over layers i of i + 2: L(L + 3) / 2
        (dict(residual_scheme="denseformer", dwa_dilation=2, dwa_period=3), 18),  # layers 3, 6, 9, 12: 2 + 4 + 5 + 7
    ],
)
def test_parameter_counts_at_bert_base(settings, added):
    base = bert_base_count(norm_type=settings.get("norm_type", "layernorm"))
    assert bert_base_count(**settings) - base == added
    assert math.isclose(bert_base_count(), 109_483_776)  # BertModel's 109,482,240 + the final LN
