"""The 2025-26 designs inside the layer (docs/placements.md): Derf and SeeDNorm (norm types), GPAS (an option of the
placements its official code defines it on), gated attention and value residual (attention options). Each against
its formula written out here, in float64 with every parameter perturbed, and each identity with its base model
(copied weights) where the design has one; where each is refused; what a logged step measures of each."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import torch
import torch.nn.functional as F
from torch import nn

from pretrain import export
from pretrain.modeling import LNBertConfig, LNBertForPreTraining, LNBertModel
from pretrain.norms import GPAS, Derf, SeeDNorm
from pretrain.optim import weight_decay_groups
from pretrain.tracking.design_stats import gpas_alarms, measure
from pretrain.tracking.metrics import layer_grad_norms
from pretrain.tracking.wandb_logging import CURVES_ONLY
from tests.conftest import TINY

GPAS_PLACEMENTS = ("pre", "sandwich", "deepnorm", "mix_ln", "lns")
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def build(placement: str = "pre", seed: int = 0, attn: str = "sdpa", **options) -> LNBertForPreTraining:
    """A tiny float64 model, dropout off, every parameter moved off its init (norms, gates and scales included)."""
    torch.manual_seed(seed)
    config = LNBertConfig(**{**TINY, **NO_DROPOUT, "norm_placement": placement, **options})
    config._attn_implementation = attn
    model = LNBertForPreTraining(config)
    model = model.double().eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.2 * torch.randn(param.shape, generator=g, dtype=param.dtype))
    return model


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Three sequences of 9 tokens, the last two padded."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:], mask[2, 4:] = 0, 0
    return dict(input_ids=torch.randint(5, TINY["vocab_size"], (3, 9), generator=g), attention_mask=mask)


def copy_shared(source: nn.Module, target: nn.Module) -> list[str]:
    """Load ``source``'s parameters into ``target``; the names ``source`` has and ``target`` lacks (its design's own)."""
    state = source.state_dict()
    missing, unexpected = target.load_state_dict(state, strict=False)
    assert not missing, missing
    return unexpected


def logits_and_grads(model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    out = model(**batch()).prediction_logits
    out.pow(2).mean().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_model(design: nn.Module, base: nn.Module, own: set[str]) -> None:
    """Equal logits and equal gradients of every shared parameter, bit for bit."""
    out, grads = logits_and_grads(design)
    base_out, base_grads = logits_and_grads(base)
    torch.testing.assert_close(out, base_out, rtol=0, atol=0)
    assert set(grads) - own == set(base_grads)
    for name, grad in base_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=0, atol=0, msg=name)


# --------------------------------------------------------------------------------------------------
# Derf and SeeDNorm
# --------------------------------------------------------------------------------------------------


def test_derf_is_weight_erf_alpha_x_plus_shift_plus_bias_from_alpha_one_half():
    model = LNBertModel(LNBertConfig(**{**TINY, "norm_placement": "pre", "norm_type": "derf"}))
    derfs = [m for m in model.modules() if isinstance(m, Derf)]
    assert derfs and all((m.alpha.item(), m.shift.item()) == (0.5, 0.0) for m in derfs)
    other = LNBertModel(LNBertConfig(**{**TINY, "norm_type": "derf", "derf_alpha_init": 0.8}))
    assert other.embeddings.LayerNorm.alpha.item() == pytest.approx(0.8)
    norm = build("pre", norm_type="derf").bert.encoder.layer[1].output.LayerNorm
    x = 3 * torch.randn(4, 5, TINY["hidden_size"], dtype=torch.float64)
    expected = norm.weight * torch.special.erf(norm.alpha * x + norm.shift) + norm.bias
    torch.testing.assert_close(norm(x), expected, rtol=0, atol=0)
    assert ((norm(x) - norm.bias).abs() <= norm.weight.abs()).all()  # erf maps into [-1, 1] (1 in float64 past 6)


def seednorm_by_hand(x: torch.Tensor, norm: SeeDNorm) -> torch.Tensor:
    """Cai et al. 2025: [tanh(x . beta^T) alpha + gamma] * x / RMS(x), RMS(x) = sqrt(mean(x^2) + eps); x . beta^T
    one scalar per token (the single-head form, the paper's language models')."""
    scale = torch.tanh(x @ norm.beta)[..., None] * norm.alpha + norm.weight
    return scale * x / torch.sqrt((x * x).mean(-1, keepdim=True) + norm.eps)


def test_seednorm_is_its_formula():
    for name, norm in build("post", norm_type="seednorm", qk_norm=True).named_modules():
        if isinstance(norm, SeeDNorm):  # every role: embeddings, sub-layers, per-head Q and K, the MLM transform
            x = 3 * torch.randn(4, 5, norm.weight.shape[0], dtype=torch.float64)
            torch.testing.assert_close(norm(x), seednorm_by_hand(x, norm), rtol=1e-12, atol=1e-12, msg=name)


def test_seednorm_starts_at_the_papers_init():
    """gamma (``weight``) 1, alpha 1, beta 0 in every role: the paper's language-model init."""
    norms = [m for m in LNBertForPreTraining(LNBertConfig(**{**TINY, "norm_type": "seednorm", "qk_norm": True})).modules()
             if isinstance(m, SeeDNorm)]  # fmt: skip
    assert norms and all(m.weight.eq(1).all() and m.alpha.eq(1).all() and m.beta.eq(0).all() for m in norms)


def test_seednorm_at_init_is_the_rmsnorm_model():
    """beta = 0 (its init): tanh(0) = 0, so with alpha and every other parameter perturbed SeeDNorm is RMSNorm,
    and the model the rmsnorm model with copied weights, bit for bit."""
    seed = build("pre", norm_type="seednorm", qk_norm=True)
    with torch.no_grad():
        for module in seed.modules():
            if isinstance(module, SeeDNorm):
                module.beta.zero_()
    rms = build("pre", norm_type="rmsnorm", qk_norm=True, seed=1)
    rms.load_state_dict({k: v for k, v in seed.state_dict().items() if k in rms.state_dict()})
    own = {n for n in dict(seed.named_parameters()) if n.endswith((".alpha", ".beta"))}
    torch.testing.assert_close(logits_and_grads(seed)[0], logits_and_grads(rms)[0], rtol=0, atol=0)
    assert len(own) == 2 * sum(isinstance(m, SeeDNorm) for m in seed.modules())


# --------------------------------------------------------------------------------------------------
# GPAS
# --------------------------------------------------------------------------------------------------


def test_gpas_scales_the_forward_and_passes_the_gradient_unscaled():
    gpas = GPAS().double()
    with torch.no_grad():
        gpas.gate.fill_(0.7)
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(3, 5, 8, dtype=torch.float64)
    y = gpas(x)
    torch.testing.assert_close(y, (1 - F.silu(torch.tensor(0.7, dtype=torch.float64))) * x, rtol=1e-15, atol=0)
    y.backward(upstream)
    torch.testing.assert_close(x.grad, upstream, rtol=0, atol=0)  # not (1 - SiLU(g)) * upstream
    s = torch.sigmoid(torch.tensor(0.7, dtype=torch.float64))
    silu_prime = s * (1 + 0.7 * (1 - s))
    torch.testing.assert_close(gpas.gate.grad, -silu_prime * (upstream * x).sum().reshape(1))


@pytest.mark.parametrize("placement", GPAS_PLACEMENTS)
def test_gpas_at_init_is_its_base_placement(placement):
    """Gate 0 (its init; everything else perturbed): x - SiLU(0) sg(x) = x, so the model equals its base placement
    with copied weights, logits and every shared gradient bit for bit."""
    design, base = build(placement, gpas=True), build(placement, seed=1)
    with torch.no_grad():
        for layer in design.bert.encoder.layer:
            layer.gpas.gate.zero_()
    own = set(copy_shared(design, base))
    assert own == {f"bert.encoder.layer.{i}.gpas.gate" for i in range(TINY["num_hidden_layers"])}
    assert_same_model(design, base, own)


@pytest.mark.parametrize("placement", ["pre", "deepnorm"])
def test_gpas_scales_the_stream_after_each_sum_in_pre_ln_and_the_skip_in_post_ln(placement):
    """One layer against its block written out with the layer's own sub-layers, one gate used twice (official code):
    Pre-LN x = G(x + Attn(N_a x)), x = G(x + FFN(N_f x)); DeepNorm x = N_a(alpha G(x) + Attn(x)), likewise FFN."""
    layer = build(placement, gpas=True).bert.encoder.layer[1]
    x = torch.randn(2, 7, TINY["hidden_size"], dtype=torch.float64)
    scale = 1 - F.silu(layer.gpas.gate)
    with torch.no_grad():
        got, _ = layer(x, None)
        if placement == "pre":
            x = scale * (x + layer.attend(layer.norm_a(x), None)[0])
            expected = scale * (x + layer.feed_forward(layer.norm_f(x)))
        else:
            alpha = layer.residual_scale
            assert alpha == (2 * TINY["num_hidden_layers"]) ** 0.25  # DeepNorm's alpha, (2L)^(1/4)
            x = layer.norm_a(alpha * scale * x + layer.attend(x, None)[0])
            expected = layer.norm_f(alpha * scale * x + layer.feed_forward(x))
    torch.testing.assert_close(got, expected, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (dict(norm_placement="post", gpas=True), r"gpas=True is an option of norm_placement=pre or sandwich or peri or deepnorm or mix_ln or lns, not of 'post'"),
        (dict(norm_placement="normformer", gpas=True), r"not of 'normformer' \(its paper and code define it on those only\)"),
        (dict(norm_placement="pre", gpas=True, residual_scheme="hc"), r"GPAS scales Pre-LN's one residual stream, which a residual scheme rebuilds"),
        (dict(norm_placement="ngpt", attention_gate="headwise"), r"nGPT's attention is its own, and no source defines a gate"),
        (dict(norm_placement="ngpt", value_residual="identity"), r"no source defines value residuals on the sphere"),
    ],
)  # fmt: skip
def test_where_a_design_does_not_fit_it_is_refused_with_the_reason(options, match):
    with pytest.raises(ValueError, match=match):
        LNBertConfig(**{**TINY, **options})


@pytest.mark.parametrize(
    "options",
    [dict(norm_placement="deepnorm", gpas=True), dict(attention_gate="elementwise"), dict(value_residual="identity"),
     dict(norm_type="derf"), dict(norm_type="seednorm")],
)  # fmt: skip
def test_export_to_plain_bert_refuses_each_design(options):
    key, value = next((k, v) for k, v in options.items() if k != "norm_placement")
    with pytest.raises(ValueError, match=rf"{key}={value!r} does not export to plain BERT"):
        export.export_to_bert(LNBertForPreTraining(LNBertConfig(**{**TINY, **options})))


# --------------------------------------------------------------------------------------------------
# Gated attention and value residual
# --------------------------------------------------------------------------------------------------


def attention_io(model: nn.Module) -> list[dict[str, torch.Tensor]]:
    """Each layer's self-attention input and output (B, T, H) in one forward of ``batch()``."""
    seen: list[dict[str, torch.Tensor]] = []
    hooks = [layer.attention.self.register_forward_hook(lambda m, args, out: seen.append({"h": args[0], "out": out[0]}))
             for layer in model.bert.encoder.layer]  # fmt: skip
    with torch.no_grad():
        model(**batch())
    for hook in hooks:
        hook.remove()
    return seen


def attention_by_hand(attention: nn.Module, h: torch.Tensor, v: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d_h) + padding mask) V per head, V the layer's own values unless given, (B, T, H)."""
    heads = TINY["num_attention_heads"]
    split = lambda t: t.unflatten(-1, (heads, -1)).transpose(1, 2)  # noqa: E731
    q, k = split(attention.query(h)), split(attention.key(h))
    v = split(attention.value(h)) if v is None else v
    scores = q @ k.transpose(-1, -2) / (h.shape[-1] // heads) ** 0.5
    scores = scores.masked_fill(~batch()["attention_mask"].bool()[:, None, None, :], float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2)  # (B, T, heads, d_h)


@pytest.mark.parametrize("gate", ["elementwise", "headwise"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_gated_attention_multiplies_each_head_by_its_query_dependent_sigmoid_gate(gate, attn):
    """Y' = Y * sigmoid(X W + b) after SDPA, before the output projection; X the attention's input (G1)."""
    model = build("pre", attn=attn, attention_gate=gate)
    for layer, seen in zip(model.bert.encoder.layer, attention_io(model), strict=True):
        attention, h = layer.attention.self, seen["h"]
        g = torch.sigmoid(attention.gate(h)).unflatten(-1, (TINY["num_attention_heads"], -1))
        expected = (attention_by_hand(attention, h) * g).flatten(2)
        real = batch()["attention_mask"].bool()
        torch.testing.assert_close(seen["out"][real], expected[real], rtol=1e-12, atol=1e-12)
    assert model.bert.encoder.layer[0].attention.self.gate.weight.shape == (
        TINY["hidden_size"] if gate == "elementwise" else TINY["num_attention_heads"], TINY["hidden_size"])


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_gated_attention_with_a_zero_gate_is_the_base_model_with_half_the_output_projection(placement):
    """Gate weights and bias 0: sigmoid(0) = 1/2 on every head, so the model is its base with attention.output.dense's
    weight halved (exact in floating point), bit for bit."""
    design, base = build(placement, attention_gate="elementwise"), build(placement, seed=1)
    with torch.no_grad():
        for layer in design.bert.encoder.layer:
            layer.attention.self.gate.weight.zero_()
            layer.attention.self.gate.bias.zero_()
    own = set(copy_shared(design, base))
    with torch.no_grad():
        for layer in base.bert.encoder.layer:
            layer.attention.output.dense.weight.mul_(0.5)
    out, _ = logits_and_grads(design)
    torch.testing.assert_close(out, logits_and_grads(base)[0], rtol=0, atol=0)
    assert own == {f"bert.encoder.layer.{i}.attention.self.gate.{p}" for i in range(2) for p in ("weight", "bias")}


def test_headwise_gate_is_the_elementwise_gate_with_one_row_per_head():
    head = build("pre", attention_gate="headwise")
    element = build("pre", attention_gate="elementwise", seed=1)
    element.load_state_dict({k: v for k, v in head.state_dict().items() if ".gate." not in k}, strict=False)
    d_h = TINY["hidden_size"] // TINY["num_attention_heads"]
    with torch.no_grad():
        for ours, theirs in zip(element.bert.encoder.layer, head.bert.encoder.layer, strict=True):
            ours.attention.self.gate.weight.copy_(theirs.attention.self.gate.weight.repeat_interleave(d_h, 0))
            ours.attention.self.gate.bias.copy_(theirs.attention.self.gate.bias.repeat_interleave(d_h, 0))
    torch.testing.assert_close(logits_and_grads(element)[0], logits_and_grads(head)[0], rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("mode", ["identity", "learnable"])
def test_value_residual_mixes_the_first_layers_values_into_every_later_layer(mode):
    """V'_n = lambda_1 V_1 + lambda_2 V_n before attention (0.5 and 0.5 fixed, as the official code, or learned);
    the first layer is its own. V_1 is the first layer's value projection of its own input."""
    model = build("pre", num_hidden_layers=3, value_residual=mode)
    seen = attention_io(model)
    first = model.bert.encoder.layer[0].attention.self
    heads = TINY["num_attention_heads"]
    v1 = first.value(seen[0]["h"]).unflatten(-1, (heads, -1)).transpose(1, 2)
    real = batch()["attention_mask"].bool()
    for n, (layer, io) in enumerate(zip(model.bert.encoder.layer, seen, strict=True)):
        attention = layer.attention.self
        v = attention.value(io["h"]).unflatten(-1, (heads, -1)).transpose(1, 2)
        if n:
            lambdas = attention.value_lambda.weight if mode == "learnable" else torch.tensor([0.5, 0.5])
            assert mode == "identity" or lambdas.tolist() != [0.5, 0.5]  # perturbed
            v = lambdas[0] * v1 + lambdas[1] * v
        expected = attention_by_hand(attention, io["h"], v).flatten(2)
        torch.testing.assert_close(io["out"][real], expected[real], rtol=1e-12, atol=1e-12)
    learned = {n for n, _ in model.named_parameters() if "value_lambda" in n}
    assert learned == ({f"bert.encoder.layer.{i}.attention.self.value_lambda.weight" for i in (1, 2)}
                       if mode == "learnable" else set())  # fmt: skip


def test_learnable_value_residual_with_lambdas_zero_and_one_is_the_base_model():
    design, base = build("pre", value_residual="learnable"), build("pre", seed=1)
    with torch.no_grad():
        design.bert.encoder.layer[1].attention.self.value_lambda.weight.copy_(torch.tensor([0.0, 1.0]))
    own = set(copy_shared(design, base))
    assert_same_model(design, base, own)


# --------------------------------------------------------------------------------------------------
# Weight decay and what a logged step measures
# --------------------------------------------------------------------------------------------------


def test_weight_decay_on_seednorms_alpha_and_beta_and_the_gate_projection_not_the_other_scalars():
    """SeeDNorm's paper decays alpha and beta; its gain ``weight`` stays undecayed as every norm's gain."""
    model = LNBertForPreTraining(LNBertConfig(**{**TINY, "norm_placement": "pre", "norm_type": "seednorm", "gpas": True,
                                                 "attention_gate": "headwise", "value_residual": "learnable"}))  # fmt: skip
    decayed, _ = weight_decay_groups(model, 0.01)
    decayed_names = {n for n, p in model.named_parameters() if any(p is q for q in decayed["params"])}
    assert "bert.encoder.layer.0.attention.self.gate.weight" in decayed_names
    seednorms = [n for n, m in model.named_modules() if isinstance(m, SeeDNorm)]
    assert {n for n in decayed_names if n.endswith((".alpha", ".beta"))} == {f"{n}.{p}" for n in seednorms
                                                                             for p in ("alpha", "beta")}  # fmt: skip
    assert not {f"{n}.weight" for n in seednorms} & decayed_names
    assert not {n for n in decayed_names if n.endswith((".gpas.gate", "value_lambda.weight"))}


def test_a_logged_step_gives_seednorms_alpha_and_headwise_gates():
    """SeeDNorm's ||alpha|| per sub-layer's norm, and a headwise gate's mean per head (one gate a head)."""
    model = build("pre", norm_type="seednorm", attention_gate="headwise").float()
    torch.manual_seed(0)
    with torch.no_grad():
        for norm in (m for m in model.modules() if isinstance(m, SeeDNorm)):
            norm.alpha.uniform_(0.5, 1.5)
    inputs, attention_inputs = batch(), []
    stats = measure(model, **inputs).design
    hooks = [layer.attention.self.register_forward_hook(lambda m, args, out: attention_inputs.append(args[0]))
             for layer in model.bert.encoder.layer]  # fmt: skip
    with torch.no_grad():
        model(**inputs)
    for hook in hooks:
        hook.remove()
    real = inputs["attention_mask"].bool()
    for i, layer in enumerate(model.bert.encoder.layer):
        for k, norm in ((2 * i, layer.norm_a), (2 * i + 1, layer.norm_f)):
            assert stats[f"seednorm/alpha_norm/{k:02d}"] == pytest.approx(norm.alpha.norm().item(), rel=1e-6)
        with torch.no_grad():
            gates = torch.sigmoid(layer.attention.self.gate(attention_inputs[i]))[real]  # (M, heads)
        for h in range(TINY["num_attention_heads"]):
            assert stats[f"attention/gate_head/{i:02d}/{h:02d}"] == pytest.approx(gates[:, h].mean().item(), rel=1e-5)


def test_a_logged_step_measures_each_designs_claim():
    """The stream's variance and largest |value| after each layer (GPAS; gated attention: massive activations), the
    attention mass on [CLS] and on [SEP] (gated attention: the sinks), the norms' pre-activation range (Derf,
    SeeDNorm), the gates and lambdas; the masses as eager attention's probabilities give them, whatever the kernel."""
    options = dict(norm_type="derf", gpas=True, attention_gate="elementwise", value_residual="learnable")
    model = build("pre", **options).float()
    inputs = batch()
    sep = inputs["input_ids"][0, 3].item()  # a token of every real part of sequence 0, and maybe elsewhere
    measured = measure(model, **inputs, sep_token_id=sep)
    stats = measured.design
    layers = range(TINY["num_hidden_layers"])
    expected = {f"{kind}/{i:02d}" for i in layers for kind in ("hidden/variance", "hidden/absmax",
                                                               "hidden/token_similarity", "attention/first_token",
                                                               "attention/sep", "attention/entropy", "attention/top_key",
                                                               "attention/value_norm", "attention/gate", "gpas/scale",
                                                               "attention/max_logit")}  # fmt: skip
    expected |= {f"{kind}/{k:02d}" for k in range(2 * len(layers))
                 for kind in ("preact/absmax", "preact/saturated", "norm/alpha", "norm/shift", "branch/ratio")}  # fmt: skip
    heads = range(TINY["num_attention_heads"])
    expected |= {f"attention/gate_head/{i:02d}/{h:02d}" for i in layers for h in heads}
    expected |= {f"value_residual/lambda{j}/01" for j in (1, 2)}
    assert set(stats) == expected
    assert all(key.startswith(CURVES_ONLY) for key in stats)  # W&B keeps them out of the run's summary
    eager = build("pre", attn="eager", **options).float()
    with torch.no_grad():
        probs = eager(**batch(), output_attentions=True).attentions
    real = batch()["attention_mask"].bool()
    is_sep = inputs["input_ids"] == sep
    streams, attention_inputs = [], []  # each layer's output (hidden_states' last is after Pre-LN's final norm)
    layer_inputs, branches = [], []  # each layer's input stream; each sub-layer's output, attention's then FFN's
    norm_inputs = []  # each sub-layer norm's input, attention's then FFN's
    encoder = model.bert.encoder.layer
    hooks = [layer.register_forward_hook(lambda m, args, out: streams.append(out[0])) for layer in encoder]
    hooks += [layer.attention.self.register_forward_hook(lambda m, args, out: attention_inputs.append(args[0]))
              for layer in encoder]  # fmt: skip
    hooks += [layer.register_forward_pre_hook(lambda m, args: layer_inputs.append(args[0])) for layer in encoder]
    hooks += [sub.register_forward_hook(lambda m, args, out: branches.append(out))
              for layer in encoder for sub in (layer.attention.output, layer.output)]  # fmt: skip
    hooks += [norm.register_forward_hook(lambda m, args, out: norm_inputs.append(args[0]))
              for layer in encoder for norm in (layer.norm_a, layer.norm_f)]  # fmt: skip
    with torch.no_grad():
        model(**inputs)
    for hook in hooks:
        hook.remove()
    for i in layers:
        mass = probs[i][..., 0].mean(1)[real].mean().item()
        assert stats[f"attention/first_token/{i:02d}"] == pytest.approx(mass, rel=1e-5)
        on_sep = (probs[i] * is_sep[:, None, None, :]).sum(-1).mean(1)[real].mean().item()
        assert stats[f"attention/sep/{i:02d}"] == pytest.approx(on_sep, rel=1e-5)
        assert stats[f"hidden/absmax/{i:02d}"] == pytest.approx(streams[i][real].abs().max().item(), rel=1e-6)
        # Over-smoothing, pair by pair: the mean cosine of distinct real tokens of a sequence, mean over sequences
        cosines = [F.cosine_similarity(x[:, None], x[None], dim=-1) for x in (streams[i][b][real[b]] for b in range(3))]
        off_diagonal = [c[~torch.eye(len(c), dtype=torch.bool)].mean().item() for c in cosines]
        assert stats[f"hidden/token_similarity/{i:02d}"] == pytest.approx(float(np.mean(off_diagonal)), rel=1e-5)
        gates = torch.sigmoid(model.bert.encoder.layer[i].attention.self.gate(attention_inputs[i]))[real]
        head_size = gates.shape[-1] // len(heads)
        for h in heads:  # elementwise: each head's d_h gates
            by_head = gates[:, h * head_size : (h + 1) * head_size].mean().item()
            assert stats[f"attention/gate_head/{i:02d}/{h:02d}"] == pytest.approx(by_head, rel=1e-5)
        values = model.bert.encoder.layer[i].attention.self.value(attention_inputs[i])
        assert stats[f"attention/value_norm/{i:02d}"] == pytest.approx(values.norm(dim=-1)[real].mean().item(), rel=1e-6)
        # ResFormer's analyze/get_entropy.py, one sequence at a time on its real tokens: heads averaged, each key's
        # attention summed over the queries, normalised, scipy's entropy; then the mean over sequences
        shares = [(a := probs[i][b][:, real[b]][:, :, real[b]].mean(0).sum(0)) / a.sum() for b in range(len(real))]
        official = [scipy.stats.entropy(share) for share in shares]
        assert stats[f"attention/entropy/{i:02d}"] == pytest.approx(float(np.mean(official)), rel=1e-5)
        top = [share.max().item() for share in shares]
        assert stats[f"attention/top_key/{i:02d}"] == pytest.approx(float(np.mean(top)), rel=1e-5)
    assert stats["gpas/scale/00"] == pytest.approx(1 - F.silu(model.bert.encoder.layer[0].gpas.gate).item())
    for i, layer in enumerate(encoder):
        # QK-norm's claim: the largest logit q.k / sqrt(d_h) over the real query-key pairs, from the projections
        heads, size = TINY["num_attention_heads"], TINY["hidden_size"] // TINY["num_attention_heads"]
        q, k = (p(attention_inputs[i]).unflatten(-1, (heads, size)) for p in (layer.attention.self.query,
                                                                                  layer.attention.self.key))  # fmt: skip
        logits = torch.einsum("bqhd,bkhd->bhqk", q, k) / size**0.5
        pairs = real[:, None, :, None] & real[:, None, None, :]
        assert stats[f"attention/max_logit/{i:02d}"] == pytest.approx(logits[pairs.expand_as(logits)].max().item(),
                                                                      rel=1e-5)  # fmt: skip
        # GPAS's ||F(LN(x))|| / ||x|| with x the stream each sub-layer reads: the layer's input, then G(x + Attn)
        skips = (layer_inputs[i], layer.gpas(layer_inputs[i] + branches[2 * i]))
        for k, skip in zip((2 * i, 2 * i + 1), skips, strict=True):
            ratio = (branches[k].norm(dim=-1) / skip.norm(dim=-1))[real].mean().item()
            assert stats[f"branch/ratio/{k:02d}"] == pytest.approx(ratio, rel=1e-5)
            norm = (layer.norm_a, layer.norm_f)[k % 2]
            assert (stats[f"norm/alpha/{k:02d}"], stats[f"norm/shift/{k:02d}"]) == (norm.alpha.item(), norm.shift.item())
            # The histogram of erf(alpha x + shift) over [-1, 1], per element of the real tokens
            squashed = torch.special.erf(norm.alpha * norm_inputs[k] + norm.shift)[real].flatten().detach()
            counts, _ = np.histogram(squashed.numpy(), bins=10, range=(-1, 1))
            np.testing.assert_allclose(measured.histograms[f"preact/histogram/{k:02d}"], counts / squashed.numel(),
                                       atol=1e-4)  # fmt: skip
        gates = torch.sigmoid(layer.attention.self.gate(attention_inputs[i]))[real].flatten().detach()
        counts, _ = np.histogram(gates.numpy(), bins=10, range=(0, 1))
        np.testing.assert_allclose(measured.histograms[f"attention/gate_histogram/{i:02d}"], counts / gates.numel(),
                                   atol=1e-4)  # fmt: skip
    assert set(measured.histograms) == {f"preact/histogram/{k:02d}" for k in range(2 * len(layers))} | {
        f"attention/gate_histogram/{i:02d}" for i in layers}


def test_a_logged_step_gives_rezeros_gates_seednorms_beta_gradients_and_alarms_on_a_gpas_gate_past_1_2():
    layers = range(TINY["num_hidden_layers"])
    rezero = build("rezero")
    with torch.no_grad():
        for i, layer in enumerate(rezero.bert.encoder.layer):
            layer.rezero_gate.weight.fill_(0.1 * (i + 1))
    stats = measure(rezero, **batch()).design
    assert [stats[f"rezero/gate/{i:02d}"] for i in layers] == pytest.approx([0.1, 0.2])
    assert not [k for k in stats if k.startswith("branch/ratio/")]  # ReZero's block adds no skip module's output

    seednorm = build("pre", norm_type="seednorm")
    logits_and_grads(seednorm)
    norms = layer_grad_norms(seednorm)
    for i, layer in enumerate(seednorm.bert.encoder.layer):
        for k, norm in ((2 * i, layer.norm_a), (2 * i + 1, layer.norm_f)):
            assert norms[f"grad_norm/seednorm_beta/{k:02d}"] == pytest.approx(norm.beta.grad.norm().item(), rel=1e-6)
            assert norm.beta.grad.norm() > 0  # beta's gradient is not zero at init (alpha's is)

    gpas = build("pre", gpas=True)
    with torch.no_grad():
        for layer, gate in zip(gpas.bert.encoder.layer, (1.3, 1.1), strict=True):
            layer.gpas.gate.fill_(gate)
    assert all(key.startswith(CURVES_ONLY) for key in [*stats, *norms])
    alarms = gpas_alarms(measure(gpas, **batch()).design)
    assert list(alarms) == ["gpas/scale/00"] and "past 1.2" in alarms["gpas/scale/00"]
