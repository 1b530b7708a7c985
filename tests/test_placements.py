"""The later placements: sandwich-LN (Pre-LN plus a LayerNorm on each branch output) and DeepNorm (Post-LN
with residual scale alpha = (2N)^(1/4) and init gain beta = (8N)^(-1/4), Wang et al. 2022)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForPreTraining

import pretrain  # noqa: F401  (registers "lnbert" with the Auto classes)
from pretrain.modeling import LNBertConfig, LNBertForPreTraining, LNBertLayer, count_layer_norms


def make_config(tiny_kwargs: dict, placement: str, **overrides) -> LNBertConfig:
    return LNBertConfig(**{**tiny_kwargs, "norm_placement": placement, **overrides})


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------------------
# Structure
# --------------------------------------------------------------------------------------------------


def test_sandwich_adds_two_branch_norms_per_layer_to_pre(tiny_kwargs):
    torch.manual_seed(0)
    pre = LNBertForPreTraining(make_config(tiny_kwargs, "pre"))
    sandwich = LNBertForPreTraining(make_config(tiny_kwargs, "sandwich"))
    n_layers, d = tiny_kwargs["num_hidden_layers"], tiny_kwargs["hidden_size"]
    assert count_layer_norms(sandwich) - count_layer_norms(pre) == 2 * n_layers
    assert num_params(sandwich) - num_params(pre) == 2 * n_layers * 2 * d  # gamma and beta of each
    for layer in sandwich.bert.encoder.layer:
        assert isinstance(layer.attention.output.branch_norm, nn.LayerNorm)
        assert isinstance(layer.output.branch_norm, nn.LayerNorm)
    assert isinstance(sandwich.bert.encoder.final_layer_norm, nn.LayerNorm)
    extra = set(sandwich.state_dict()) - set(pre.state_dict())
    assert extra == {
        f"bert.encoder.layer.{i}.{where}.branch_norm.{p}"
        for i in range(n_layers)
        for where in ("attention.output", "output")
        for p in ("weight", "bias")
    }


def test_deepnorm_has_exactly_post_ln_parameters(tiny_kwargs):
    post = LNBertForPreTraining(make_config(tiny_kwargs, "post"))
    deepnorm = LNBertForPreTraining(make_config(tiny_kwargs, "deepnorm"))
    shapes = {k: v.shape for k, v in post.state_dict().items()}
    assert {k: v.shape for k, v in deepnorm.state_dict().items()} == shapes
    assert count_layer_norms(deepnorm) == count_layer_norms(post)
    assert isinstance(deepnorm.bert.encoder.final_layer_norm, nn.Identity)


@pytest.mark.parametrize("placement", ["sandwich", "deepnorm"])
def test_forward_backward_finite(tiny_kwargs, placement):
    torch.manual_seed(0)
    model = LNBertForPreTraining(make_config(tiny_kwargs, placement)).train()
    ids = torch.randint(5, tiny_kwargs["vocab_size"], (3, 11))
    labels = torch.where(torch.rand(ids.shape) < 0.3, ids, -100)
    labels[0, 0] = ids[0, 0]
    out = model(ids, labels=labels, next_sentence_label=torch.tensor([0, 1, 0]))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
    # Every parameter learns something (none is cut off by the placement's wiring).
    assert all(p.grad.abs().sum() > 0 for p in model.bert.encoder.parameters())


@pytest.mark.parametrize("placement", ["sandwich", "deepnorm"])
def test_save_and_reload_through_auto_classes(tiny_kwargs, placement, tmp_path):
    torch.manual_seed(0)
    model = LNBertForPreTraining(make_config(tiny_kwargs, placement)).eval()
    with torch.no_grad():  # move gamma/beta off their init so a dropped norm would show
        for module in model.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.1)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForPreTraining.from_pretrained(tmp_path).eval()
    assert type(loaded) is LNBertForPreTraining
    assert loaded.config.norm_placement == placement
    ids = torch.randint(5, tiny_kwargs["vocab_size"], (2, 9))
    with torch.no_grad():
        expected, got = model(ids), loaded(ids)
    torch.testing.assert_close(got.prediction_logits, expected.prediction_logits, rtol=0, atol=0)
    torch.testing.assert_close(got.seq_relationship_logits, expected.seq_relationship_logits, rtol=0, atol=0)


# --------------------------------------------------------------------------------------------------
# DeepNorm's constants
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_layers", [1, 6])
def test_deepnorm_alpha_and_beta(tiny_kwargs, num_layers):
    config = make_config(tiny_kwargs, "deepnorm", num_hidden_layers=num_layers)
    assert config.deepnorm_alpha == pytest.approx((2 * num_layers) ** 0.25)
    assert config.deepnorm_beta == pytest.approx((8 * num_layers) ** -0.25)
    model = LNBertForPreTraining(config)
    scales = [layer.residual_scale for layer in model.bert.encoder.layer]
    assert scales == pytest.approx([(2 * num_layers) ** 0.25] * num_layers)
    assert make_config(tiny_kwargs, "post", num_hidden_layers=num_layers).deepnorm_alpha == 1.0


@pytest.mark.parametrize("init_scheme", ["bert", "xavier"])
def test_deepnorm_init_gain_on_value_output_and_ffn_only(init_scheme):
    # Large enough matrices that the sample std is within ~2% of the true one (4096+ entries each).
    n_layers, d, ffn = 4, 96, 192
    config = LNBertConfig(
        vocab_size=1000, hidden_size=d, num_hidden_layers=n_layers, num_attention_heads=4, intermediate_size=ffn,
        max_position_embeddings=64, norm_placement="deepnorm", init_scheme=init_scheme,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LNBertForPreTraining(config)
    beta = (8 * n_layers) ** -0.25

    def xavier_std(linear: nn.Linear, gain: float = 1.0) -> float:
        fan_out, fan_in = linear.weight.shape
        return gain * math.sqrt(2.0 / (fan_in + fan_out))

    def plain_std(linear: nn.Linear) -> float:
        return xavier_std(linear) if init_scheme == "xavier" else config.initializer_range

    for layer in model.bert.encoder.layer:
        scaled = layer.deepnorm_scaled_linears()
        assert scaled == (layer.attention.self.value, layer.attention.output.dense, layer.intermediate.dense,
                          layer.output.dense)  # fmt: skip
        for linear in scaled:
            assert linear.weight.std().item() == pytest.approx(xavier_std(linear, beta), rel=0.05)
            assert linear.weight.mean().abs().item() < 0.1 * xavier_std(linear, beta)
            assert torch.all(linear.bias == 0)
        for linear in (layer.attention.self.query, layer.attention.self.key):
            assert linear.weight.std().item() == pytest.approx(plain_std(linear), rel=0.05)
    for linear in (model.bert.pooler.dense, model.cls.predictions.transform.dense):
        assert linear.weight.std().item() == pytest.approx(plain_std(linear), rel=0.05)
    # The same layers under Post-LN keep the plain init: the gain is DeepNorm's alone.
    torch.manual_seed(0)
    post = LNBertForPreTraining(LNBertConfig(**{**config.to_diff_dict(), "norm_placement": "post"}))
    value = post.bert.encoder.layer[0].attention.self.value
    assert value.weight.std().item() == pytest.approx(plain_std(value), rel=0.05)


# --------------------------------------------------------------------------------------------------
# One layer by hand: the data flow of each placement
# --------------------------------------------------------------------------------------------------


def attention_by_hand(layer: LNBertLayer, x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Softmax attention over all positions plus the output projection, from the layer's weights."""
    attn = layer.attention.self
    batch, seq, d = x.shape

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.view(batch, seq, num_heads, d // num_heads).transpose(1, 2)  # (B, nh, T, hs)

    q, k, v = (heads(F.linear(x, m.weight, m.bias)) for m in (attn.query, attn.key, attn.value))
    probs = (q @ k.transpose(-1, -2) / math.sqrt(d // num_heads)).softmax(-1)
    context = (probs @ v).transpose(1, 2).reshape(batch, seq, d)
    dense = layer.attention.output.dense
    return F.linear(context, dense.weight, dense.bias)


def ffn_by_hand(layer: LNBertLayer, x: torch.Tensor) -> torch.Tensor:
    w1, w2 = layer.intermediate.dense, layer.output.dense
    return F.linear(F.gelu(F.linear(x, w1.weight, w1.bias)), w2.weight, w2.bias)


def layer_norm_by_hand(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def randomise_norms(model: nn.Module) -> None:
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.2)


def test_deepnorm_layer_forward_by_hand(tiny_kwargs):
    config = make_config(tiny_kwargs, "deepnorm", num_hidden_layers=3, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)  # fmt: skip
    torch.manual_seed(0)
    layer = LNBertForPreTraining(config).bert.encoder.layer[0].eval()
    randomise_norms(layer)
    alpha = (2 * 3) ** 0.25
    x = torch.randn(2, 7, config.hidden_size)
    ln_a, ln_f = layer.attention.output.LayerNorm, layer.output.LayerNorm
    with torch.no_grad():
        got = layer(x, None)[0]
        h = layer_norm_by_hand(ln_a, attention_by_hand(layer, x, config.num_attention_heads) + alpha * x)
        expected = layer_norm_by_hand(ln_f, ffn_by_hand(layer, h) + alpha * h)
        # Without the residual scale the result is clearly different: the check can see alpha.
        h1 = layer_norm_by_hand(ln_a, attention_by_hand(layer, x, config.num_attention_heads) + x)
        unscaled = layer_norm_by_hand(ln_f, ffn_by_hand(layer, h1) + h1)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert (got - unscaled).abs().max() > 1e-2


def test_sandwich_layer_forward_by_hand(tiny_kwargs):
    config = make_config(tiny_kwargs, "sandwich", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    layer = LNBertForPreTraining(config).bert.encoder.layer[0].eval()
    randomise_norms(layer)
    out_a, out_f = layer.attention.output, layer.output
    x = 3 * torch.randn(2, 7, config.hidden_size)
    with torch.no_grad():
        got = layer(x, None)[0]
        attn = attention_by_hand(layer, layer_norm_by_hand(out_a.LayerNorm, x), config.num_attention_heads)
        h = x + layer_norm_by_hand(out_a.branch_norm, attn)
        expected = h + layer_norm_by_hand(out_f.branch_norm, ffn_by_hand(layer, layer_norm_by_hand(out_f.LayerNorm, h)))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
