"""The placements after Post-LN and Pre-LN (pretrain/placements.py) and the norm types (pretrain/norms.py): the
structure, the constants and the defining property of each, exports to plain BERT, and every placement x norm type
through Auto classes, training steps and bf16 autocast. tests/test_placement_reference.py checks every forward
against implementations written from the papers' equations."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModelForPreTraining, BertForPreTraining

import pretrain.modeling  # noqa: F401  (registers "lnbert" with the Auto classes)
from pretrain import export
from pretrain.modeling import (
    NORM_PLACEMENTS,
    NORM_TYPES,
    LNBertConfig,
    LNBertForPreTraining,
    LNBertLayer,
    LNBertModel,
    count_layer_norms,
)
from pretrain.norms import NORM_MODULES, DyT, RMSNorm, Scale
from pretrain.placements import BLOCKS, PLACEMENTS, admin_omega_default
from tests.conftest import ROOT


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
    parts = config.layer_parts(0)
    assert parts.skip_scale == pytest.approx((2 * num_layers) ** 0.25)
    assert list(parts.init_gains.values()) == pytest.approx([(8 * num_layers) ** -0.25] * 4)
    model = LNBertForPreTraining(config)
    scales = [layer.residual_scale for layer in model.bert.encoder.layer]
    assert scales == pytest.approx([(2 * num_layers) ** 0.25] * num_layers)
    assert make_config(tiny_kwargs, "post", num_hidden_layers=num_layers).layer_parts(0).skip_scale == 1.0


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
        for linear in (layer.attention.self.value, layer.attention.output.dense, layer.intermediate.dense,
                       layer.output.dense):  # fmt: skip
            # Xavier: the paper's Xavier-normal with gain beta; bert: torchscale's bert_init, N(0, 0.02 beta).
            scaled_std = xavier_std(linear, beta) if init_scheme == "xavier" else config.initializer_range * beta
            assert linear.weight.std().item() == pytest.approx(scaled_std, rel=0.05)
            assert linear.weight.mean().abs().item() < 0.1 * scaled_std
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
    # Xavier: branches large enough beside the stream that the residual scale shows in the output.
    config = make_config(tiny_kwargs, "deepnorm", num_hidden_layers=3, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0, init_scheme="xavier")  # fmt: skip
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


# --------------------------------------------------------------------------------------------------
# Every placement x norm type
# --------------------------------------------------------------------------------------------------

def allowed(**options) -> bool:
    """Whether the model takes these options together (nGPT has no norm to choose, nor QK-norm on top of its own)."""
    try:
        LNBertConfig(**options)
    except ValueError:
        return False
    return True


ALL = [(p, t) for p in NORM_PLACEMENTS for t in NORM_TYPES if allowed(norm_placement=p, norm_type=t)]


def perturb(model: nn.Module, seed: int = 0) -> None:
    """Move every norm, gate and scale off its init, so a norm applied in the wrong place cannot hide."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            for param in module.parameters(recurse=False):
                if isinstance(module, (*NORM_MODULES, Scale)):
                    param.add_(0.3 * torch.randn(param.shape, generator=g))


def batch_of(vocab: int, shape: tuple[int, int] = (3, 11), seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, shape, generator=g)
    labels = torch.where(torch.rand(shape, generator=g) < 0.3, ids, -100)
    labels[0, 0] = ids[0, 0]
    return dict(input_ids=ids, labels=labels, next_sentence_label=torch.tensor([0, 1, 0])[: shape[0]])


@pytest.mark.parametrize(("placement", "norm_type"), ALL)
def test_builds_through_auto_classes_and_reloads_identically(tiny_kwargs, placement, norm_type, tmp_path):
    config = make_config(tiny_kwargs, placement, norm_type=norm_type, num_hidden_layers=3)
    config.save_pretrained(tmp_path / "config")
    torch.manual_seed(0)
    model = AutoModelForPreTraining.from_config(AutoConfig.from_pretrained(tmp_path / "config")).eval()
    assert type(model) is LNBertForPreTraining
    assert (model.config.norm_placement, model.config.norm_type) == (placement, norm_type)
    perturb(model)
    model.save_pretrained(tmp_path / "model")
    loaded = AutoModelForPreTraining.from_pretrained(tmp_path / "model").eval()
    batch = batch_of(tiny_kwargs["vocab_size"])
    with torch.no_grad():
        expected, got = model(batch["input_ids"]), loaded(batch["input_ids"])
    torch.testing.assert_close(got.prediction_logits, expected.prediction_logits, rtol=0, atol=0)


@pytest.mark.parametrize("depth", [2, 24])
@pytest.mark.parametrize(("placement", "norm_type"), ALL)
def test_a_training_step_is_finite(tiny_kwargs, placement, norm_type, depth):
    torch.manual_seed(0)
    model = LNBertForPreTraining(make_config(tiny_kwargs, placement, norm_type=norm_type, num_hidden_layers=depth))
    out = model.train()(**batch_of(tiny_kwargs["vocab_size"]))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
    # Every parameter is wired in (none cut off by the placement). Not at depth 24, where some placements' lowest
    # layers legitimately get (near-)zero gradient at init (Post-LN with DyT halves the signal per norm), nor for
    # ReZero, whose layers get gradient only through their gates at init (g = 0), nor SeeDNorm's alpha, whose
    # gradient is tanh(<x, beta>) = 0 while beta is at its init 0 (beta's own is not: alpha moves from step 2).
    if placement != "rezero" and depth == 2:
        cut = norm_type == "seednorm"
        assert all(p.grad.abs().sum() > 0 for n, p in model.bert.encoder.named_parameters() if not (cut and n.endswith(".alpha")))


@pytest.mark.parametrize("placement", NORM_PLACEMENTS)
def test_two_steps_under_bf16_autocast_on_cpu(tiny_kwargs, placement):
    torch.manual_seed(0)
    qk_norm = allowed(norm_placement=placement, qk_norm=True)
    model = LNBertForPreTraining(make_config(tiny_kwargs, placement, qk_norm=qk_norm)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(**batch_of(tiny_kwargs["vocab_size"], seed=step)).loss
        loss.backward()
        assert torch.isfinite(loss)
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        optimizer.step()
        optimizer.zero_grad()


def test_parameter_counts_match_docs_placements_md():
    """BERT-base's parameter count per placement and norm type, as docs/placements.md states it."""
    table = (ROOT / "docs" / "placements.md").read_text().split("<!-- parameter counts -->")[1].split("<!-- end")[0]
    documented = {
        cells[0].strip("` "): [None if c == "—" else int(c.replace(",", "")) for c in cells[1 : 1 + len(NORM_TYPES)]]
        for line in table.splitlines()
        if line.startswith("| `") and (cells := [c.strip() for c in line.strip("|").split("|")])
    }
    assert set(documented) == set(NORM_PLACEMENTS)
    for placement in NORM_PLACEMENTS:
        for norm_type, expected in zip(NORM_TYPES, documented[placement], strict=True):
            # "—": a combination the model refuses
            assert (expected is not None) == allowed(norm_placement=placement, norm_type=norm_type), (placement, norm_type)
            if expected is None:
                continue
            config = LNBertConfig(vocab_size=30522, norm_placement=placement, norm_type=norm_type)
            with torch.device("meta"):
                model = LNBertForPreTraining(config)
            assert num_params(model) == expected, (placement, norm_type)


def test_every_placement_has_a_row_and_every_row_a_block():
    assert tuple(PLACEMENTS) == NORM_PLACEMENTS
    config = LNBertConfig()
    for row in PLACEMENTS.values():
        parts = row.layer_parts(config, 0)
        assert parts is None or parts.block in BLOCKS
    with pytest.raises(ValueError, match=r"norm_placement='preln' is not a valid choice \(did you mean 'pre'\?\)"):
        LNBertConfig(norm_placement="preln")
    with pytest.raises(ValueError, match=r"norm_type='layer_norm'.*valid choices: layernorm, rmsnorm, dyt"):
        LNBertConfig(norm_type="layer_norm")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [(dict(qk_norm="false"), "qk_norm='false' must be true or false"), (dict(gpas=1), "gpas=1 must be true or false"),
     (dict(hc_streams=True), "hc_streams=True must be an integer"),
     (dict(frac_parts=4.0), "frac_parts=4.0 must be an integer"),
     (dict(mix_ln_post_layers="3"), "mix_ln_post_layers='3' must be an integer or null"),
     (dict(dyt_alpha_init="0.5"), "dyt_alpha_init='0.5' must be a number")],
)  # fmt: skip
def test_an_option_of_the_wrong_type_is_refused_naming_its_type(overrides, message):
    """A config built in Python or read from a config.json meets the types the command line's parser checks: the
    string "false" is no False (it is truthy), 4.0 streams no count."""
    with pytest.raises(ValueError, match=re.escape(message)):
        LNBertConfig(**overrides)
    assert LNBertConfig(dyt_alpha_init=1, admin_omega=None).dyt_alpha_init == 1  # an integer is a number


@pytest.mark.parametrize(
    ("overrides", "owner"),
    [(dict(norm_placement="pre", admin_omega=2.0), "admin"), (dict(norm_placement="peri", normformer_ffn_norm=False),
     "normformer"), (dict(norm_placement="post", b2t_rescale_init=False), "b2t")],
)  # fmt: skip
def test_another_placements_option_is_refused_naming_the_placement_that_takes_it(overrides, owner):
    key = next(k for k in overrides if k != "norm_placement")
    with pytest.raises(ValueError, match=rf"{key}=.* is an option of norm_placement={owner}, not of "):
        LNBertConfig(**overrides)
    LNBertConfig(**{**overrides, "norm_placement": owner})  # its own placement takes it


# --------------------------------------------------------------------------------------------------
# Each placement's defining property
# --------------------------------------------------------------------------------------------------


def encoder_io(model: LNBertModel, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    return out.hidden_states[0], out.last_hidden_state


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_rezero_is_the_identity_at_init(tiny_kwargs, norm_type):
    torch.manual_seed(0)
    model = LNBertModel(make_config(tiny_kwargs, "rezero", norm_type=norm_type, num_hidden_layers=4)).eval()
    gates = [layer.rezero_gate.weight for layer in model.encoder.layer]
    assert all(g.shape == (1,) and g.item() == 0.0 for g in gates)
    embeddings, output = encoder_io(model, torch.randint(5, 99, (2, 9)))
    torch.testing.assert_close(output, embeddings, rtol=0, atol=0)
    assert count_layer_norms(model.encoder) == 0


def copy_weights(source: nn.Module, target: nn.Module) -> None:
    target.load_state_dict(source.state_dict(), strict=True)


def test_mix_ln_with_no_post_layers_is_pre_ln_and_with_all_is_post_ln_plus_a_final_norm(tiny_kwargs):
    ids = torch.randint(5, 99, (2, 9))
    torch.manual_seed(0)
    pre = LNBertModel(make_config(tiny_kwargs, "pre", num_hidden_layers=3)).eval()
    perturb(pre)
    mix0 = LNBertModel(make_config(tiny_kwargs, "mix_ln", num_hidden_layers=3, mix_ln_post_layers=0)).eval()
    copy_weights(pre, mix0)
    torch.testing.assert_close(encoder_io(mix0, ids)[1], encoder_io(pre, ids)[1], rtol=0, atol=0)

    mix3 = LNBertModel(make_config(tiny_kwargs, "mix_ln", num_hidden_layers=3, mix_ln_post_layers=3)).eval()
    copy_weights(pre, mix3)
    post = LNBertModel(make_config(tiny_kwargs, "post", num_hidden_layers=3)).eval()
    post.load_state_dict({k: v for k, v in pre.state_dict().items() if "final_layer_norm" not in k}, strict=True)
    _, post_out = encoder_io(post, ids)
    torch.testing.assert_close(encoder_io(mix3, ids)[1], mix3.encoder.final_layer_norm(post_out), rtol=0, atol=0)


@pytest.mark.parametrize(("layers", "expected"), [(2, 0), (12, 3), (24, 6)])
def test_mix_ln_default_post_layers(tiny_kwargs, layers, expected):
    config = make_config(tiny_kwargs, "mix_ln", num_hidden_layers=layers)
    blocks = [config.layer_parts(i).block for i in range(layers)]
    assert blocks == ["post"] * expected + ["pre"] * (layers - expected)


def test_lns_scales_each_layer_by_one_over_sqrt_of_its_index(tiny_kwargs):
    model = LNBertModel(make_config(tiny_kwargs, "lns", num_hidden_layers=5))
    assert [layer.norm_scale for layer in model.encoder.layer] == pytest.approx([1 / math.sqrt(i) for i in range(1, 6)])
    assert all(layer.norm_scale == 1.0 for layer in LNBertModel(make_config(tiny_kwargs, "pre")).encoder.layer)


@pytest.mark.parametrize(("layers", "omega"), [(2, 1.451), (12, 2.601), (24, 3.404), (48, 4.495)])
def test_admin_omega_follows_admin_torch_default_rule(tiny_kwargs, layers, omega):
    config = make_config(tiny_kwargs, "admin", num_hidden_layers=layers)
    assert config.layer_parts(0).skip_scale == pytest.approx(omega, abs=1e-3)
    assert make_config(tiny_kwargs, "admin", admin_omega=2.0).layer_parts(0).skip_scale == 2.0


def test_admin_learnable_omega_is_a_vector_per_sub_layer(tiny_kwargs):
    model = LNBertModel(make_config(tiny_kwargs, "admin", admin_learnable_omega=True))
    omega = admin_omega_default(tiny_kwargs["num_hidden_layers"])
    for layer in model.encoder.layer:
        assert layer.residual_scale == 1.0  # no fixed scalar on top
        for sub in (layer.attention.output, layer.output):
            assert isinstance(sub.residual_scale, Scale)
            torch.testing.assert_close(sub.residual_scale.weight, torch.full((tiny_kwargs["hidden_size"],), omega))


@pytest.mark.parametrize("placement", ["deepnorm", "admin", "post"])
def test_scaled_post_ln_exports_to_plain_hugging_face_bert(tiny_kwargs, placement, tmp_path):
    config = make_config(tiny_kwargs, placement, num_hidden_layers=3, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)  # fmt: skip
    torch.manual_seed(0)
    model = LNBertForPreTraining(config).eval()
    perturb(model)
    model.save_pretrained(tmp_path / "snapshot")
    assert export.main([f"--model={tmp_path / 'snapshot'}", f"--out={tmp_path / 'bert'}"]) == 0
    bert = AutoModelForPreTraining.from_pretrained(tmp_path / "bert").eval()
    assert type(bert) is BertForPreTraining
    ids = torch.randint(5, 99, (3, 11))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.no_grad():
        ours, theirs = model(ids, attention_mask=mask), bert(ids, attention_mask=mask)
    torch.testing.assert_close(theirs.prediction_logits, ours.prediction_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(theirs.seq_relationship_logits, ours.seq_relationship_logits, rtol=1e-4, atol=1e-4)
    if placement != "post":  # the check sees the scale: without the division the outputs differ far more
        plain = BertForPreTraining(export.bert_config(config)).eval()
        plain.load_state_dict(model.state_dict(), strict=True)
        with torch.no_grad():
            unscaled = (plain(ids, attention_mask=mask).prediction_logits - ours.prediction_logits).abs().max()
        assert unscaled > 100 * (theirs.prediction_logits - ours.prediction_logits).abs().max()


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(norm_placement="pre"), "does not export"),
        (dict(norm_placement="admin", admin_learnable_omega=True), "vector omega"),
        (dict(norm_placement="deepnorm", norm_type="rmsnorm"), "norm_type='rmsnorm'"),
    ],
)
def test_export_refuses_what_plain_bert_cannot_compute(tiny_kwargs, overrides, match):
    with pytest.raises(ValueError, match=match):
        export.export_to_bert(LNBertForPreTraining(LNBertConfig(**{**tiny_kwargs, **overrides})))


def test_rmsnorm_equals_torch_rms_norm():
    torch.manual_seed(0)
    ours, theirs = RMSNorm(37, eps=1e-6), nn.RMSNorm(37, eps=1e-6)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        theirs.weight.copy_(ours.weight)
    x = 3 * torch.randn(4, 5, 37)
    torch.testing.assert_close(ours(x), theirs(x))
    # A bf16 input is normalised in float32 (as Hugging Face's LlamaRMSNorm), so only its rounding to bf16 differs.
    low = x.bfloat16()
    torch.testing.assert_close(ours(low).float(), theirs(low.float().bfloat16().float()), rtol=1e-2, atol=1e-2)


def test_dyt_starts_at_alpha_one_half_and_is_weight_tanh_alpha_x_plus_bias(tiny_kwargs):
    model = LNBertModel(make_config(tiny_kwargs, "pre", norm_type="dyt"))
    dyts = [m for m in model.modules() if isinstance(m, DyT)]
    assert len(dyts) == count_layer_norms(model) > 0
    assert all(m.alpha.item() == 0.5 and m.alpha.shape == (1,) for m in dyts)
    assert LNBertModel(
        make_config(tiny_kwargs, "pre", norm_type="dyt", dyt_alpha_init=0.8)
    ).embeddings.LayerNorm.alpha.item() == pytest.approx(0.8)
    norm = dyts[0]
    perturb(norm)
    x = torch.randn(3, tiny_kwargs["hidden_size"])
    torch.testing.assert_close(norm(x), norm.weight * torch.tanh(norm.alpha * x) + norm.bias)


def test_norm_type_reaches_every_norm_at_the_hugging_face_names(tiny_kwargs):
    post = LNBertForPreTraining(make_config(tiny_kwargs, "pre"))
    rms = LNBertForPreTraining(make_config(tiny_kwargs, "pre", norm_type="rmsnorm"))
    assert not any(isinstance(m, nn.LayerNorm) for m in rms.modules())
    norms = {n for n, m in rms.named_modules() if isinstance(m, RMSNorm)}
    assert norms == {n for n, m in post.named_modules() if isinstance(m, nn.LayerNorm)}
    assert {"bert.embeddings.LayerNorm", "bert.encoder.final_layer_norm", "cls.predictions.transform.LayerNorm",
            "bert.encoder.layer.0.attention.output.LayerNorm", "bert.encoder.layer.0.output.LayerNorm"} <= norms  # fmt: skip
    assert set(rms.state_dict()) == {
        k for k in post.state_dict() if not ((k.endswith(".bias") and "Norm" in k) or "layer_norm.bias" in k)
    }


def test_qk_norm_normalises_each_heads_queries_and_keys(tiny_kwargs):
    model = LNBertModel(make_config(tiny_kwargs, "pre", qk_norm=True))
    head = tiny_kwargs["hidden_size"] // tiny_kwargs["num_attention_heads"]
    for layer in model.encoder.layer:
        attention = layer.attention.self
        assert attention.query_norm.weight.shape == attention.key_norm.weight.shape == (head,)
        assert isinstance(attention.value_norm, nn.Identity)
    hybrid = LNBertModel(make_config(tiny_kwargs, "hybrid"))
    assert hybrid.encoder.layer[0].attention.self.value_norm.weight.shape == (head,)
    assert isinstance(hybrid.encoder.layer[0].attention.output.LayerNorm, nn.Identity)


@pytest.mark.parametrize(("placement", "norm_type"), [("pre", "rmsnorm"), ("post", "dyt"), ("normformer", "layernorm")])
def test_loading_into_another_placement_or_norm_type_fails(tiny_kwargs, placement, norm_type, tmp_path):
    LNBertForPreTraining(make_config(tiny_kwargs, placement, norm_type=norm_type)).save_pretrained(tmp_path)
    others = ({"norm_type": "layernorm" if norm_type != "layernorm" else "rmsnorm"}, {"norm_placement": "lns"},
              {"norm_placement": "mix_ln"})  # fmt: skip
    for other in others:
        with pytest.raises(ValueError, match="Checkpoint does not match"):
            LNBertForPreTraining.from_pretrained(tmp_path, **other)


def test_peri_is_another_name_of_sandwich(tiny_kwargs, tmp_path):
    torch.manual_seed(0)
    sandwich = LNBertModel(make_config(tiny_kwargs, "sandwich")).eval()
    perturb(sandwich)
    peri = LNBertModel(make_config(tiny_kwargs, "peri")).eval()
    copy_weights(sandwich, peri)
    ids = torch.randint(5, 99, (2, 9))
    torch.testing.assert_close(encoder_io(peri, ids)[1], encoder_io(sandwich, ids)[1], rtol=0, atol=0)
    sandwich.save_pretrained(tmp_path)
    assert LNBertModel.from_pretrained(tmp_path, norm_placement="peri").config.norm_placement == "peri"


def test_weight_decay_skips_every_norm_gate_and_scale(tiny_kwargs):
    from pretrain.optim import weight_decay_groups

    for placement, norm_type, extra in [("normformer", "dyt", dict(normformer_resid_scale=True)),
                                        ("rezero", "rmsnorm", {}), ("admin", "layernorm", dict(admin_learnable_omega=True)),
                                        ("hybrid", "dyt", {})]:  # fmt: skip
        model = LNBertForPreTraining(make_config(tiny_kwargs, placement, norm_type=norm_type, qk_norm=True, **extra))
        decayed, _ = weight_decay_groups(model, 0.01)
        decayed_names = {n for n, p in model.named_parameters() if any(p is q for q in decayed["params"])}
        for name, module in model.named_modules():
            if isinstance(module, (*NORM_MODULES, Scale)):
                assert not {f"{name}.{p}" for p, _ in module.named_parameters()} & decayed_names, name
        assert all(n.endswith(".weight") and p.dim() == 2 for n, p in model.named_parameters() if n in decayed_names)


def test_pre_ln_equals_hugging_face_roberta_prelayernorm(tiny_kwargs):
    from transformers import RobertaPreLayerNormConfig, RobertaPreLayerNormModel

    torch.manual_seed(0)
    ours = LNBertModel(make_config(tiny_kwargs, "pre", num_hidden_layers=3)).eval()
    perturb(ours)
    hf_config = RobertaPreLayerNormConfig(**{**tiny_kwargs, "num_hidden_layers": 3, "pad_token_id": 0})
    theirs = RobertaPreLayerNormModel(hf_config).eval()
    mine = ours.state_dict()
    state = {}
    for key in theirs.state_dict():
        source = key
        for hf, lnbert in (("attention.LayerNorm", "attention.output.LayerNorm"),
                           ("intermediate.LayerNorm", "output.LayerNorm")):  # fmt: skip
            source = source.replace(hf, lnbert)
        source = "encoder.final_layer_norm" + key[len("LayerNorm") :] if key.startswith("LayerNorm.") else source
        state[key] = mine[source]
    theirs.load_state_dict(state, strict=True)
    ids = torch.randint(5, 99, (3, 11))
    mask = torch.ones_like(ids)
    mask[2, 5:] = 0
    positions = torch.arange(11)[None].expand(3, -1)
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask, position_ids=positions).last_hidden_state
        got = ours(ids, attention_mask=mask, position_ids=positions).last_hidden_state
    torch.testing.assert_close(got, expected)


def test_model_config_reaches_lnbert_config_and_names_the_run(tmp_path):
    from pretrain.config import ModelConfig, PretrainConfig

    model = ModelConfig(norm_placement="mix_ln", norm_type="dyt", qk_norm=True, mix_ln_post_layers=1)
    config = model.to_lnbert(vocab_size=123)
    assert (config.norm_placement, config.norm_type, config.qk_norm, config.mix_ln_post_layers) == (
        "mix_ln",
        "dyt",
        True,
        1,
    )
    assert PretrainConfig(model=model).train.run_name == "lnbert-mix_ln-dyt-qknorm"
    assert PretrainConfig().train.run_name == "lnbert-post"  # the default run keeps its name
