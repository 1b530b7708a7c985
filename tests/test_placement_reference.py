"""Independent reference tests for the placements and norm types, written from the papers (docs/placements.md).

Every forward here is written from the papers' / the spec's equations with ``torch`` tensor ops only, over the
Hugging Face parameter names of the spec, reading the tensors from ``model.state_dict()``. No sub-module of the
model is ever called (only the full ``model(...)`` under test). Weights are perturbed away from their init (norm
gains and biases, gates, scales, DyT's and Derf's scalars, SeeDNorm's alpha and beta) so that a norm or gate applied
in the wrong place cannot hide behind an identity init. Everything runs in float64 in eval mode with dropout 0.

Two switches choose between readings the spec leaves open (docs/placements.md says which one the model follows):
  REF_HYBRID_FFN_FORM=paper (default): HybridNorm FFN  h = N_f(y); x' = h + F_ffn(h)   (ffn_residual_after_norm)
  REF_HYBRID_FFN_FORM=post           : HybridNorm FFN  x' = N_f(y + F_ffn(y))          (classic Post-Norm)
  REF_NORMFORMER_HEAD_SCALE=after_proj (default): fairseq's c_attn, on the output projection's output in nh chunks
  REF_NORMFORMER_HEAD_SCALE=context             : head scale on each head's context, before attention.output.dense
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from pretrain.modeling import LNBertConfig, LNBertForPreTraining, LNBertModel

HYBRID_FFN_FORM = os.environ.get("REF_HYBRID_FFN_FORM", "paper")
NORMFORMER_HEAD_SCALE = os.environ.get("REF_NORMFORMER_HEAD_SCALE", "after_proj")
assert HYBRID_FFN_FORM in ("paper", "post"), HYBRID_FFN_FORM
assert NORMFORMER_HEAD_SCALE in ("context", "after_proj"), NORMFORMER_HEAD_SCALE

PLACEMENTS = (
    "post",
    "pre",
    "sandwich",
    "peri",
    "deepnorm",
    "admin",
    "rezero",
    "b2t",
    "resi_dual",
    "mix_ln",
    "lns",
    "hybrid",
    "normformer",
    "output_ln",
    "parallel",
)
NORM_TYPES = ("layernorm", "rmsnorm", "dyt", "derf", "seednorm")
# Placements whose encoder ends with encoder.final_layer_norm (resi_dual applies it to its Pre-LN stream d).
FINAL_NORM = {"pre", "sandwich", "peri", "resi_dual", "mix_ln", "lns", "hybrid", "normformer", "output_ln", "parallel"}

VOCAB, HIDDEN, HEADS, INTER, MAXPOS, LAYERS = 99, 32, 4, 37, 64, 3
HEAD_SIZE = HIDDEN // HEADS
EPS = 1e-3  # large on purpose: a norm using another eps than layer_norm_eps shows at float64 tolerance

# Names the spec gives, and names the implementation might use instead. The forward tests accept an alias (so
# that they still check the computation); test_spec_parameter_names fails on any alias actually used.
ALIASES = {
    "attention.output.residual_scale.weight": (
        "attention.output.residual_scale.weight",
        "attention.output.omega.weight",
    ),
    "output.residual_scale.weight": ("output.residual_scale.weight", "output.omega.weight"),
    "rezero_gate.weight": ("rezero.weight", "resweight", "rezero_weight"),
    "attention.output.head_scale.weight": ("attention.output.head_scale.weight",),
}


# ------------------------------------------------------------------------------------------------------------
# Model construction
# ------------------------------------------------------------------------------------------------------------


def make_config(placement: str, norm_type: str = "layernorm", qk_norm: bool = False, **extra) -> LNBertConfig:
    return LNBertConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=INTER,
        max_position_embeddings=MAXPOS,
        type_vocab_size=2,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        layer_norm_eps=EPS,
        norm_placement=placement,
        norm_type=norm_type,
        qk_norm=qk_norm,
        **extra,
    )


@torch.no_grad()
def perturb(model: torch.nn.Module, seed: int = 0) -> None:
    """Matrices: fresh N(0, 1/fan_in). Vectors and scalars (norm gains/biases, DyT alpha, gates, scales,
    learnable omegas, linear biases): init + 0.3 N(0, 1), so gains leave 1, biases and gates leave 0, scales leave
    1 and alpha leaves its init."""
    gen = torch.Generator().manual_seed(seed)
    for _, p in model.named_parameters():
        if p.dim() >= 2:
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) / math.sqrt(p.shape[-1]))
        else:
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype))


def build(config: LNBertConfig, seed: int = 0, cls=LNBertModel, do_perturb: bool = True):
    torch.manual_seed(seed)
    model = cls(config).to(torch.float64).eval()
    if do_perturb:
        perturb(model, seed)
    return model


def make_inputs(seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    batch, seq = 2, 11
    input_ids = torch.randint(0, VOCAB, (batch, seq), generator=gen)
    token_type_ids = torch.randint(0, 2, (batch, seq), generator=gen)
    attention_mask = torch.ones(batch, seq, dtype=torch.long)
    attention_mask[1, 7:] = 0  # padding in the second sequence
    return input_ids, attention_mask, token_type_ids


# ------------------------------------------------------------------------------------------------------------
# Parameter access (state_dict only)
# ------------------------------------------------------------------------------------------------------------


class Params:
    def __init__(self, model: torch.nn.Module):
        self.sd = {k: v.detach() for k, v in model.state_dict().items()}
        self.prefix = "bert." if any(k.startswith("bert.encoder.") for k in self.sd) else ""
        self.aliases_used: list[tuple[str, str]] = []

    def _full(self, name: str) -> str:
        return name if name.startswith("cls.") else self.prefix + name

    def has(self, name: str) -> bool:
        return self._full(name) in self.sd

    def get(self, name: str) -> torch.Tensor:
        full = self._full(name)
        if full in self.sd:
            return self.sd[full]
        # alias lookup on the suffix after "encoder.layer.{i}."
        head, sep, tail = name.partition("encoder.layer.")
        if sep:
            idx, _, local = tail.partition(".")
            for alias in ALIASES.get(local, ()):
                cand = self._full(f"{head}encoder.layer.{idx}.{alias}")
                if cand in self.sd:
                    self.aliases_used.append((name, cand))
                    return self.sd[cand]
        raise KeyError(
            f"{full} not in the model's state_dict (spec name); keys under that layer: "
            f"{sorted(k for k in self.sd if k.startswith(full.rsplit('.', 2)[0]))[:20]}"
        )


# ------------------------------------------------------------------------------------------------------------
# Reference maths
# ------------------------------------------------------------------------------------------------------------


def norm(P: Params, name: str, x: torch.Tensor, cfg: LNBertConfig) -> torch.Tensor:
    """The spec's norm of ``cfg.norm_type`` at module ``name`` over the last dim of ``x``."""
    w = P.get(f"{name}.weight")
    assert w.shape == (x.shape[-1],), (name, tuple(w.shape), x.shape[-1])
    if cfg.norm_type == "layernorm":
        b = P.get(f"{name}.bias")
        mean = x.mean(-1, keepdim=True)
        var = (x - mean).pow(2).mean(-1, keepdim=True)  # biased, as LayerNorm
        return (x - mean) / torch.sqrt(var + cfg.layer_norm_eps) * w + b
    if cfg.norm_type == "rmsnorm":
        assert not P.has(f"{name}.bias"), f"RMSNorm {name} must have no bias"
        x32 = x.to(torch.float32)  # the spec: computed in float32
        y = x32 / torch.sqrt(x32.pow(2).mean(-1, keepdim=True) + cfg.layer_norm_eps)
        return w * y.to(x.dtype)
    if cfg.norm_type == "dyt":
        alpha = P.get(f"{name}.alpha")
        assert alpha.numel() == 1, (name, tuple(alpha.shape))
        return w * torch.tanh(alpha.reshape(()) * x) + P.get(f"{name}.bias")
    if cfg.norm_type == "derf":  # Derf (arXiv 2512.10938): weight * erf(alpha x + shift) + bias, scalar alpha, shift
        alpha, shift = P.get(f"{name}.alpha"), P.get(f"{name}.shift")
        assert alpha.numel() == 1 and shift.numel() == 1, (name, tuple(alpha.shape), tuple(shift.shape))
        return w * torch.erf(alpha.reshape(()) * x + shift.reshape(())) + P.get(f"{name}.bias")
    if cfg.norm_type == "seednorm":  # SeeDNorm (arXiv 2510.22777): (weight + tanh(x . beta) alpha) * x / RMS(x)
        assert not P.has(f"{name}.bias"), f"SeeDNorm {name} must have no bias"
        alpha, beta = P.get(f"{name}.alpha"), P.get(f"{name}.beta")
        assert alpha.shape == beta.shape == w.shape, (name, tuple(alpha.shape), tuple(beta.shape))
        rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + cfg.layer_norm_eps)
        return (w + torch.tanh((x * beta).sum(-1, keepdim=True)) * alpha) * x / rms
    raise AssertionError(cfg.norm_type)


def linear(P: Params, name: str, x: torch.Tensor) -> torch.Tensor:
    w, b = P.get(f"{name}.weight"), P.get(f"{name}.bias")
    return x @ w.T + b


def gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def embeddings(P: Params, cfg, input_ids, token_type_ids) -> torch.Tensor:
    seq = input_ids.shape[1]
    e = (
        P.get("embeddings.word_embeddings.weight")[input_ids]
        + P.get("embeddings.token_type_embeddings.weight")[token_type_ids]
        + P.get("embeddings.position_embeddings.weight")[torch.arange(seq)][None]
    )
    return norm(P, "embeddings.LayerNorm", e, cfg)


def attention(P: Params, lp: str, h: torch.Tensor, cfg, key_mask: torch.Tensor) -> torch.Tensor:
    """F_attn(h): multi-head self-attention including attention.output.dense (dropout = identity in eval)."""
    B, T, H = h.shape
    nh, hs = cfg.num_attention_heads, H // cfg.num_attention_heads

    def heads(t):  # (B, T, H) -> (B, nh, T, hs)
        return t.reshape(B, T, nh, hs).permute(0, 2, 1, 3)

    q, k, v = (heads(linear(P, f"{lp}attention.self.{n}", h)) for n in ("query", "key", "value"))
    hybrid = cfg.norm_placement == "hybrid"
    if cfg.qk_norm or hybrid:  # per head over head_size, one weight shared by the heads
        q = norm(P, f"{lp}attention.self.query_norm", q, cfg)
        k = norm(P, f"{lp}attention.self.key_norm", k, cfg)
    if hybrid:
        v = norm(P, f"{lp}attention.self.value_norm", v, cfg)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hs)
    scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    ctx = probs @ v  # (B, nh, T, hs)
    head_scale = cfg.norm_placement == "normformer" and cfg.normformer_head_scale
    if head_scale:
        g = P.get(f"{lp}attention.output.head_scale.weight")
        assert g.shape == (nh,), tuple(g.shape)
        if NORMFORMER_HEAD_SCALE == "context":
            ctx = ctx * g[None, :, None, None]
    out = linear(P, f"{lp}attention.output.dense", ctx.permute(0, 2, 1, 3).reshape(B, T, H))
    if head_scale and NORMFORMER_HEAD_SCALE == "after_proj":
        out = (out.reshape(B, T, nh, hs) * g[None, None, :, None]).reshape(B, T, H)
    return out


def ffn(P: Params, lp: str, h: torch.Tensor, cfg) -> torch.Tensor:
    """F_ffn(h) = output.dense(act(intermediate.dense(h))), NormFormer's norm after the activation."""
    u = gelu(linear(P, f"{lp}intermediate.dense", h))
    if cfg.norm_placement == "normformer" and cfg.normformer_ffn_norm:
        u = norm(P, f"{lp}intermediate.ffn_norm", u, cfg)
    return linear(P, f"{lp}output.dense", u)


def admin_omega_default(num_layers: int) -> float:
    n = 2 * num_layers
    return math.sqrt((n + 1) / math.log(n + 1) - 1)


def mix_ln_k(cfg) -> int:
    return round(cfg.num_hidden_layers / 4) if cfg.mix_ln_post_layers is None else cfg.mix_ln_post_layers


def layer(P: Params, i: int, x: torch.Tensor, cfg, key_mask) -> torch.Tensor:
    """One layer of the spec, ``i`` 0-based (the spec's l = i + 1)."""
    lp = f"encoder.layer.{i}."
    L, l = cfg.num_hidden_layers, i + 1  # noqa: E741  (the papers' l)
    A = lambda h: attention(P, lp, h, cfg, key_mask)  # noqa: E731
    Fn = lambda h: ffn(P, lp, h, cfg)  # noqa: E731
    Na = lambda h: norm(P, f"{lp}attention.output.LayerNorm", h, cfg)  # noqa: E731
    Nf = lambda h: norm(P, f"{lp}output.LayerNorm", h, cfg)  # noqa: E731
    p = cfg.norm_placement
    if p == "mix_ln":
        p = "post" if i < mix_ln_k(cfg) else "pre"

    if p == "post":
        x = Na(x + A(x))
        return Nf(x + Fn(x))
    if p == "pre":
        x = x + A(Na(x))
        return x + Fn(Nf(x))
    if p in ("sandwich", "peri"):
        x = x + norm(P, f"{lp}attention.output.branch_norm", A(Na(x)), cfg)
        return x + norm(P, f"{lp}output.branch_norm", Fn(Nf(x)), cfg)
    if p == "deepnorm":
        alpha = (2 * L) ** 0.25
        x = Na(alpha * x + A(x))
        return Nf(alpha * x + Fn(x))
    if p == "admin":
        if cfg.admin_learnable_omega:
            wa = P.get(f"{lp}attention.output.residual_scale.weight")
            wf = P.get(f"{lp}output.residual_scale.weight")
            assert wa.shape == (x.shape[-1],) and wf.shape == (x.shape[-1],), (tuple(wa.shape), tuple(wf.shape))
        else:
            wa = wf = cfg.admin_omega if cfg.admin_omega is not None else admin_omega_default(L)
        x = Na(wa * x + A(x))
        return Nf(wf * x + Fn(x))
    if p == "rezero":
        g = P.get(f"{lp}rezero_gate.weight")
        assert g.shape == (1,), tuple(g.shape)
        x = x + g * A(x)
        return x + g * Fn(x)
    if p == "b2t":
        y = Na(x + A(x))
        return Nf(y + Fn(y) + x)
    if p == "lns":
        s = 1.0 / math.sqrt(l)
        x = x + A(Na(x) * s)
        return x + Fn(Nf(x) * s)
    if p == "hybrid":
        if cfg.hybrid_first_pre_norm and i == 0:  # HybridNorm*: Pre-Norm attention (QKV norms kept) and FFN
            y = x + A(Na(x))
            return y + Fn(Nf(y))
        y = x + A(x)  # no attention input norm; Q/K/V norms inside A
        if HYBRID_FFN_FORM == "paper":
            h = Nf(y)
            return h + Fn(h)
        return Nf(y + Fn(y))
    if p == "normformer":
        a = A(Na(x))
        if cfg.normformer_attn_norm:
            a = norm(P, f"{lp}attention.output.branch_norm", a, cfg)
        x = x + a
        skip = x
        if cfg.normformer_resid_scale:
            w = P.get(f"{lp}output.residual_scale.weight")
            assert w.shape == (x.shape[-1],), tuple(w.shape)
            skip = w * x
        return skip + Fn(Nf(x))
    if p == "output_ln":
        x = x + Na(A(x))
        return x + Nf(Fn(x))
    if p == "parallel":
        h = Na(x)
        return x + A(h) + Fn(h)
    raise AssertionError(p)


def reference(model, cfg, input_ids, attention_mask, token_type_ids):
    """(last_hidden_state, hidden_states tuple, pooler_output or None, Params)."""
    P = Params(model)
    key_mask = attention_mask.bool()
    x = embeddings(P, cfg, input_ids, token_type_ids)
    states = [x]
    if cfg.norm_placement == "resi_dual":
        a = d = x
        for i in range(cfg.num_hidden_layers):
            lp = f"encoder.layer.{i}."
            f = attention(P, lp, a, cfg, key_mask)
            d = d + f
            a = norm(P, f"{lp}attention.output.LayerNorm", a + f, cfg)
            f = ffn(P, lp, a, cfg)
            d = d + f
            a = norm(P, f"{lp}output.LayerNorm", a + f, cfg)
            states.append(a)
        last = a + norm(P, "encoder.final_layer_norm", d, cfg)
    else:
        for i in range(cfg.num_hidden_layers):
            x = layer(P, i, x, cfg, key_mask)
            states.append(x)
        last = norm(P, "encoder.final_layer_norm", x, cfg) if cfg.norm_placement in FINAL_NORM else x
    states[-1] = last
    pooled = None
    if P.has("pooler.dense.weight"):
        pooled = torch.tanh(linear(P, "pooler.dense", last[:, 0]))
    return last, tuple(states), pooled, P


def tolerances(cfg):
    # rmsnorm is computed in float32 by spec, so float64 runs keep float32 rounding through the stack
    return dict(rtol=2e-5, atol=2e-5) if cfg.norm_type == "rmsnorm" else dict(rtol=1e-9, atol=1e-9)


def check_forward(cfg, seed: int = 0):
    model = build(cfg, seed)
    ids, mask, tt = make_inputs(seed + 1)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, token_type_ids=tt, output_hidden_states=True)
        last, states, pooled, P = reference(model, cfg, ids, mask, tt)
    tol = tolerances(cfg)
    assert out.hidden_states is not None and len(out.hidden_states) == cfg.num_hidden_layers + 1
    for j, (got, want) in enumerate(zip(out.hidden_states, states, strict=True)):
        torch.testing.assert_close(got, want, **tol, msg=lambda m, j=j: f"hidden_states[{j}]: {m}")
    torch.testing.assert_close(out.last_hidden_state, last, **tol, msg=lambda m: f"last_hidden_state: {m}")
    if pooled is not None and out.pooler_output is not None:
        torch.testing.assert_close(out.pooler_output, pooled, **tol, msg=lambda m: f"pooler_output: {m}")
    return P


# ------------------------------------------------------------------------------------------------------------
# Forward tests
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("qk_norm", [False, True], ids=["noqk", "qk"])
@pytest.mark.parametrize("norm_type", NORM_TYPES)
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_forward_matches_reference(placement, norm_type, qk_norm):
    check_forward(make_config(placement, norm_type, qk_norm))


@pytest.mark.parametrize("norm_type", NORM_TYPES)
@pytest.mark.parametrize("k", [0, 2, 3], ids=lambda k: f"k{k}")
def test_mix_ln_post_layers(norm_type, k):
    check_forward(make_config("mix_ln", norm_type, mix_ln_post_layers=k))


def test_mix_ln_default_k_is_python_round():
    # spec: None -> round(L/4), Python round (banker's): L=3 -> 1, L=6 -> 2, L=10 -> 2, L=12 -> 3
    for layers, want in ((3, 1), (6, 2), (10, 2), (12, 3), (24, 6)):
        assert round(layers / 4) == want
    cfg = make_config("mix_ln")
    check_forward(cfg)  # reference uses round(3/4) = 1


@pytest.mark.parametrize("norm_type", NORM_TYPES)
@pytest.mark.parametrize("variant", ["default", "explicit", "learnable", "learnable_explicit"])
def test_admin_variants(norm_type, variant):
    extra = {
        "default": {},
        "explicit": {"admin_omega": 1.7},
        "learnable": {"admin_learnable_omega": True},
        "learnable_explicit": {"admin_learnable_omega": True, "admin_omega": 2.2},
    }[variant]
    check_forward(make_config("admin", norm_type, **extra))


@pytest.mark.parametrize("qk_norm", [False, True], ids=["noqk", "qk"])
@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_hybrid_star(norm_type, qk_norm):
    check_forward(make_config("hybrid", norm_type, qk_norm, hybrid_first_pre_norm=True))


NORMFORMER_FLAGS = {
    "resid_scale": dict(normformer_resid_scale=True),
    "no_head_scale": dict(normformer_head_scale=False),
    "no_attn_norm": dict(normformer_attn_norm=False),
    "no_ffn_norm": dict(normformer_ffn_norm=False),
    "all_off": dict(normformer_head_scale=False, normformer_attn_norm=False, normformer_ffn_norm=False),
    "all_on": dict(
        normformer_resid_scale=True, normformer_head_scale=True, normformer_attn_norm=True, normformer_ffn_norm=True
    ),
}


@pytest.mark.parametrize("norm_type", NORM_TYPES)
@pytest.mark.parametrize("flags", list(NORMFORMER_FLAGS), ids=list(NORMFORMER_FLAGS))
def test_normformer_flags(norm_type, flags):
    check_forward(make_config("normformer", norm_type, **NORMFORMER_FLAGS[flags]))


def test_normformer_all_off_equals_pre():
    """With every addition off NormFormer is Pre-LN: same weights, same outputs."""
    cfg_nf = make_config(
        "normformer", normformer_head_scale=False, normformer_attn_norm=False, normformer_ffn_norm=False
    )
    cfg_pre = make_config("pre")
    m_nf, m_pre = build(cfg_nf), build(cfg_pre, do_perturb=False)
    missing, unexpected = m_pre.load_state_dict(m_nf.state_dict(), strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    ids, mask, tt = make_inputs()
    with torch.no_grad():
        a = m_nf(input_ids=ids, attention_mask=mask, token_type_ids=tt).last_hidden_state
        b = m_pre(input_ids=ids, attention_mask=mask, token_type_ids=tt).last_hidden_state
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_peri_is_sandwich(norm_type):
    m_peri = build(make_config("peri", norm_type))
    m_sw = build(make_config("sandwich", norm_type), do_perturb=False)
    assert set(m_peri.state_dict()) == set(m_sw.state_dict())
    m_sw.load_state_dict(m_peri.state_dict())
    ids, mask, tt = make_inputs()
    with torch.no_grad():
        a = m_peri(input_ids=ids, attention_mask=mask, token_type_ids=tt).last_hidden_state
        b = m_sw(input_ids=ids, attention_mask=mask, token_type_ids=tt).last_hidden_state
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_dyt_alpha_init_config(norm_type):
    """A non-default dyt_alpha_init, then perturbed (forward) and unperturbed (init)."""
    cfg = make_config("pre", norm_type, dyt_alpha_init=0.8)
    check_forward(cfg)
    if norm_type == "dyt":
        model = build(cfg, do_perturb=False)
        alphas = {k: v for k, v in model.state_dict().items() if k.endswith(".alpha")}
        assert alphas, "no DyT alpha parameters found"
        for k, v in alphas.items():
            assert v.shape == (1,) or v.dim() == 0, (k, tuple(v.shape))
            torch.testing.assert_close(v.reshape(()), torch.tensor(0.8, dtype=v.dtype), msg=k)


@pytest.mark.parametrize("norm_type", NORM_TYPES)
@pytest.mark.parametrize("placement", ["post", "pre", "resi_dual", "rezero"])
def test_mlm_head_transform_norm(placement, norm_type):
    """cls.predictions.transform.LayerNorm is of norm_type too; logits = decoder(N(gelu(dense(last))))."""
    cfg = make_config(placement, norm_type)
    model = build(cfg, cls=LNBertForPreTraining)
    ids, mask, tt = make_inputs()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, token_type_ids=tt, output_hidden_states=True)
        last, _, _, P = reference(model, cfg, ids, mask, tt)
        t = norm(
            P, "cls.predictions.transform.LayerNorm", gelu(linear(P, "cls.predictions.transform.dense", last)), cfg
        )
        dec_w = (
            P.get("cls.predictions.decoder.weight")
            if P.has("cls.predictions.decoder.weight")
            else P.get("embeddings.word_embeddings.weight")
        )
        dec_b = P.get("cls.predictions.bias")
        logits = t @ dec_w.T + dec_b
        nsp = linear(P, "cls.seq_relationship", torch.tanh(linear(P, "pooler.dense", last[:, 0])))
    tol = tolerances(cfg)
    torch.testing.assert_close(out.prediction_logits, logits, **tol)
    torch.testing.assert_close(out.seq_relationship_logits, nsp, **tol)


# ------------------------------------------------------------------------------------------------------------
# Names, shapes and init (no perturbation)
# ------------------------------------------------------------------------------------------------------------


def _layer_keys(sd, i):
    pre = next(p for p in ("bert.encoder.layer.", "encoder.layer.") if any(k.startswith(p) for k in sd))
    return {k[len(f"{pre}{i}.") :]: v for k, v in sd.items() if k.startswith(f"{pre}{i}.")}


def _norm_keys(local: str, norm_type: str) -> set[str]:
    return {
        f"{local}.{s}"
        for s in {"layernorm": ("weight", "bias"), "rmsnorm": ("weight",), "dyt": ("weight", "bias", "alpha"),
                  "derf": ("weight", "bias", "alpha", "shift"), "seednorm": ("weight", "alpha", "beta")}[norm_type]
    }


def expected_layer_params(cfg, i: int) -> set[str]:
    """The layer-local parameter names the spec implies (beyond the projections)."""
    p, t = cfg.norm_placement, cfg.norm_type
    names: set[str] = set()
    for lin in (
        "attention.self.query",
        "attention.self.key",
        "attention.self.value",
        "attention.output.dense",
        "intermediate.dense",
        "output.dense",
    ):
        names |= {f"{lin}.weight", f"{lin}.bias"}
    na, nf = _norm_keys("attention.output.LayerNorm", t), _norm_keys("output.LayerNorm", t)
    if p == "rezero":
        names |= {"rezero_gate.weight"}
    elif p == "parallel":
        names |= na
    elif p == "hybrid":
        names |= nf
        if cfg.hybrid_first_pre_norm and i == 0:
            names |= na
        names |= _norm_keys("attention.self.value_norm", t)
    else:
        names |= na | nf
    if cfg.qk_norm or p == "hybrid":
        names |= _norm_keys("attention.self.query_norm", t) | _norm_keys("attention.self.key_norm", t)
    if p in ("sandwich", "peri"):
        names |= _norm_keys("attention.output.branch_norm", t) | _norm_keys("output.branch_norm", t)
    if p == "admin" and cfg.admin_learnable_omega:
        names |= {"attention.output.residual_scale.weight", "output.residual_scale.weight"}
    if p == "normformer":
        if cfg.normformer_head_scale:
            names.add("attention.output.head_scale.weight")
        if cfg.normformer_attn_norm:
            names |= _norm_keys("attention.output.branch_norm", t)
        if cfg.normformer_ffn_norm:
            names |= _norm_keys("intermediate.ffn_norm", t)
        if cfg.normformer_resid_scale:
            names.add("output.residual_scale.weight")
    return names


SPEC_CONFIGS = (
    [(p, t, q, {}) for p in PLACEMENTS for t in NORM_TYPES for q in (False, True)]
    + [("admin", t, False, {"admin_learnable_omega": True}) for t in NORM_TYPES]
    + [("hybrid", t, False, {"hybrid_first_pre_norm": True}) for t in NORM_TYPES]
    + [("normformer", t, False, {"normformer_resid_scale": True}) for t in NORM_TYPES]
)


@pytest.mark.parametrize(
    "placement,norm_type,qk_norm,extra",
    SPEC_CONFIGS,
    ids=[f"{p}-{t}-{'qk' if q else 'noqk'}-{'-'.join(e) or 'base'}" for p, t, q, e in SPEC_CONFIGS],
)
def test_spec_parameter_names(placement, norm_type, qk_norm, extra):
    """Exactly the spec's parameters per layer (absent modules have none), the final norm where the spec has one,
    and the embedding norm of norm_type."""
    cfg = make_config(placement, norm_type, qk_norm, **extra)
    model = build(cfg, do_perturb=False)
    params = dict(model.named_parameters())
    for i in range(LAYERS):
        got = {k for k in _layer_keys(params, i)}
        want = expected_layer_params(cfg, i)
        assert got == want, f"layer {i}: missing {sorted(want - got)}, unexpected {sorted(got - want)}"
    final = {k for k in params if "final_layer_norm" in k}
    want_final = (
        {f"encoder.final_layer_norm.{s.split('.')[-1]}" for s in _norm_keys("x", norm_type)}
        if placement in FINAL_NORM
        else set()
    )
    assert final == want_final, (sorted(final), sorted(want_final))
    emb = {k for k in params if k.startswith("embeddings.LayerNorm")}
    assert emb == {f"embeddings.LayerNorm.{s.split('.')[-1]}" for s in _norm_keys("x", norm_type)}, sorted(emb)


@pytest.mark.parametrize(
    "placement,norm_type,qk_norm,extra",
    SPEC_CONFIGS,
    ids=[f"{p}-{t}-{'qk' if q else 'noqk'}-{'-'.join(e) or 'base'}" for p, t, q, e in SPEC_CONFIGS],
)
def test_init_values(placement, norm_type, qk_norm, extra):
    cfg = make_config(placement, norm_type, qk_norm, **extra)
    model = build(cfg, do_perturb=False)
    for name, p in model.named_parameters():
        leaf = name.split(".")[-1]
        is_norm = any(s in name for s in ("LayerNorm", "_norm", "branch_norm", "ffn_norm"))
        if is_norm and leaf == "weight":
            assert torch.all(p == 1), name
        elif is_norm and leaf == "bias":
            assert torch.all(p == 0), name
        elif leaf == "alpha":  # DyT's and Derf's scalar at their configured init; SeeDNorm's vector at 1
            want = {"dyt": cfg.dyt_alpha_init, "derf": cfg.derf_alpha_init, "seednorm": 1.0}[norm_type]
            torch.testing.assert_close(p, torch.full_like(p, want), msg=name)
        elif leaf in ("shift", "beta"):  # Derf's shift, SeeDNorm's beta: 0
            assert torch.all(p == 0), name
        elif "rezero_gate" in name:
            assert p.shape == (1,) and torch.all(p == 0), (name, p)
        elif "head_scale" in name:
            assert p.shape == (HEADS,) and torch.all(p == 1), (name, p)
        elif "residual_scale" in name and placement == "normformer":
            assert p.shape == (HIDDEN,) and torch.all(p == 1), (name, p)
        elif "admin_omega" in name or (placement == "admin" and "residual_scale" in name):
            want = cfg.admin_omega if cfg.admin_omega is not None else admin_omega_default(LAYERS)
            assert p.shape == (HIDDEN,), (name, tuple(p.shape))
            torch.testing.assert_close(p, torch.full_like(p, want), msg=name)
    for q_or_k in ("query_norm", "key_norm", "value_norm"):
        for name, p in model.named_parameters():
            if f"attention.self.{q_or_k}.weight" in name:
                assert p.shape == (HEAD_SIZE,), (name, tuple(p.shape))


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_rezero_is_identity_at_init(norm_type):
    """ReZero's gate starts at 0, so at init every layer is the identity and the output is the embedding output."""
    model = build(make_config("rezero", norm_type), do_perturb=False)
    ids, mask, tt = make_inputs()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, token_type_ids=tt, output_hidden_states=True)
    for h in out.hidden_states[1:]:
        torch.testing.assert_close(h, out.hidden_states[0], rtol=0, atol=0)


def test_admin_default_omega_numbers():
    # admin-torch calculate_init('O(logn)'): sqrt((N+1)/ln(N+1) - 1), N = 2L; survey: L = 2, 12, 24, 48
    for layers, want in ((2, 1.451), (12, 2.601), (24, 3.404), (48, 4.495)):
        assert abs(admin_omega_default(layers) - want) < 1e-3, (layers, admin_omega_default(layers))


def test_aliases_not_needed():
    """Every forward check above reads spec names; this fails if any needed an alias (a naming difference)."""
    used = []
    for placement, extra in (("admin", {"admin_learnable_omega": True}), ("rezero", {}), ("normformer", {})):
        P = check_forward(make_config(placement, **extra))
        used += P.aliases_used
    assert not used, f"spec names missing, aliases used: {sorted(set(used))}"


# ------------------------------------------------------------------------------------------------------------
# Extras: the attention kernel, B2T's official rescaling init (when the config has it)
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_eager_attention_matches_reference(placement):
    cfg = make_config(placement, "layernorm", qk_norm=True)
    cfg._attn_implementation = "eager"
    check_forward(cfg)


def test_b2t_rescale_init_matches_official():
    """takase/b2t_connection rescaling_init: every layer parameter whose name has 'weight' and not 'layer_norm'
    (q, k, v, attention output, fc1, fc2 weights; not biases, not norms) times L^(-1/2), L = number of layers."""
    on = build(make_config("b2t", b2t_rescale_init=True), seed=3, do_perturb=False).state_dict()
    off = build(make_config("b2t", b2t_rescale_init=False), seed=3, do_perturb=False).state_dict()
    assert set(on) == set(off)
    scale = LAYERS**-0.5
    for k in on:
        if ".encoder.layer." not in f".{k}":
            torch.testing.assert_close(on[k], off[k], rtol=0, atol=0, msg=k)
            continue
        local = k.split("encoder.layer.", 1)[1].split(".", 1)[1]
        is_linear_weight = local.endswith(".weight") and not any(s in local for s in ("LayerNorm", "_norm"))
        want = off[k] * scale if is_linear_weight else off[k]
        torch.testing.assert_close(on[k], want, rtol=1e-6, atol=1e-12, msg=k)  # sampled in float32
