"""The configurable-norm BERT: equivalence with Hugging Face BERT, placement structure, save/load, sparse MLM."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import (
    AutoModelForMaskedLM,
    AutoModelForPreTraining,
    AutoModelForSequenceClassification,
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertForSequenceClassification,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import pretrain.modeling  # noqa: F401  (registers the Auto classes)
from pretrain.modeling import (
    NORM_PLACEMENTS,
    LNBertConfig,
    LNBertForMaskedLM,
    LNBertForPreTraining,
    LNBertForSequenceClassification,
    LNBertModel,
    count_layer_norms,
)
from tests.conftest import TINY

ROOT = Path(__file__).resolve().parents[1]
ATTN = ("sdpa", "eager")


def make_batch(vocab: int = 99, batch: int = 3, seq: int = 11, padded: bool = True, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, vocab, (batch, seq), generator=g)
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, seq // 2 :] = 1
    attention_mask = torch.ones_like(input_ids)
    if padded:  # rows of different true lengths, as a real batch padded to its longest
        attention_mask[1, 7:] = 0
        attention_mask[2, 3:] = 0
        input_ids[attention_mask == 0] = 0
    return dict(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)


def mlm_labels(input_ids: torch.Tensor, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    labels = torch.full_like(input_ids, -100)
    chosen = torch.rand(input_ids.shape, generator=g) < 0.3
    chosen[0, 1] = True  # at least one labelled position
    labels[chosen] = input_ids[chosen]
    return labels


def tiny_config(tiny_kwargs: dict, placement: str = "post", attn: str = "sdpa", **extra) -> LNBertConfig:
    config = LNBertConfig(norm_placement=placement, **tiny_kwargs, **extra)
    config._attn_implementation = attn
    return config


def hf_model(cls, tiny_kwargs: dict, attn: str, seed: int = 0, **extra):
    torch.manual_seed(seed)
    config = BertConfig(**tiny_kwargs, **extra)
    config._attn_implementation = attn
    return cls(config).eval()


# --------------------------------------------------------------------------------------------------
# Equivalence with Hugging Face BERT
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
@pytest.mark.parametrize("attn", ATTN)
def test_post_ln_equals_hf_bert_for_pretraining(tiny_kwargs, attn, padded):
    hf = hf_model(BertForPreTraining, tiny_kwargs, attn)
    ours = LNBertForPreTraining(tiny_config(tiny_kwargs, "post", attn))
    ours.load_state_dict(hf.state_dict(), strict=True)
    ours.eval()
    batch = make_batch(padded=padded)
    with torch.no_grad():
        expected = hf(**batch, output_hidden_states=True)
        got = ours(**batch, output_hidden_states=True)
    torch.testing.assert_close(got.prediction_logits, expected.prediction_logits)
    torch.testing.assert_close(got.seq_relationship_logits, expected.seq_relationship_logits)
    assert len(got.hidden_states) == len(expected.hidden_states) == tiny_kwargs["num_hidden_layers"] + 1
    for ours_h, hf_h in zip(got.hidden_states, expected.hidden_states, strict=True):
        torch.testing.assert_close(ours_h, hf_h)


@pytest.mark.parametrize("attn", ATTN)
def test_hf_bert_loads_our_post_ln_weights(tiny_kwargs, attn):
    """The reverse direction: our Post-LN state dict loads strictly into Hugging Face BERT."""
    torch.manual_seed(1)
    ours = LNBertForPreTraining(tiny_config(tiny_kwargs, "post", attn)).eval()
    hf = hf_model(BertForPreTraining, tiny_kwargs, attn, seed=2)
    hf.load_state_dict(ours.state_dict(), strict=True)
    batch = make_batch()
    with torch.no_grad():
        got, expected = ours(**batch), hf(**batch)
    torch.testing.assert_close(got.prediction_logits, expected.prediction_logits)
    torch.testing.assert_close(got.seq_relationship_logits, expected.seq_relationship_logits)


def test_pretraining_loss_equals_hf(tiny_kwargs):
    hf = hf_model(BertForPreTraining, tiny_kwargs, "sdpa")
    ours = LNBertForPreTraining(tiny_config(tiny_kwargs, "post", sparse_mlm_head=True))
    ours.load_state_dict(hf.state_dict(), strict=True)
    ours.eval()
    batch = make_batch()
    labels, nsp = mlm_labels(batch["input_ids"]), torch.tensor([0, 1, 0])
    with torch.no_grad():
        expected = hf(**batch, labels=labels, next_sentence_label=nsp).loss
        got = ours(**batch, labels=labels, next_sentence_label=nsp)
    torch.testing.assert_close(got.loss, expected)
    torch.testing.assert_close(got.mlm_loss + got.nsp_loss, expected)


@pytest.mark.parametrize(
    ("hf_cls", "our_cls"),
    [(BertForMaskedLM, LNBertForMaskedLM), (BertForSequenceClassification, LNBertForSequenceClassification)],
)
def test_task_models_equal_hf(tiny_kwargs, hf_cls, our_cls):
    hf = hf_model(hf_cls, tiny_kwargs, "sdpa", num_labels=2)
    ours = our_cls(tiny_config(tiny_kwargs, "post", num_labels=2))
    ours.load_state_dict(hf.state_dict(), strict=True)
    ours.eval()
    batch = make_batch()
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch).logits, hf(**batch).logits)


@pytest.mark.parametrize("cls", [LNBertModel, LNBertForPreTraining, LNBertForMaskedLM, LNBertForSequenceClassification])
def test_return_dict_false_returns_the_outputs_tuple(tiny_kwargs, cls):
    """As Hugging Face: ``return_dict=False`` (or ``config.return_dict = False``) gives ``output.to_tuple()``."""
    model = cls(tiny_config(tiny_kwargs, "pre", num_labels=2)).eval()
    batch = make_batch()
    labels = {"labels": mlm_labels(batch["input_ids"])} if cls is LNBertForMaskedLM else {}
    with torch.no_grad():
        expected = model(**batch, **labels).to_tuple()
        as_tuple = model(**batch, **labels, return_dict=False)
        model.config.return_dict = False
        from_config = model(**batch, **labels)
        assert not isinstance(model(**batch, **labels, return_dict=True), tuple)
    for got in (as_tuple, from_config):
        assert isinstance(got, tuple) and len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_flex_attention_gives_sdpas_outputs(tiny_kwargs, placement, monkeypatch):
    """The ``_supports_flex_attn`` claim: flex attention runs our attention with the padding mask and agrees with
    sdpa. Without gradients (torch has no backward for flex attention on CPU)."""
    calls = []
    flex = ALL_ATTENTION_FUNCTIONS["flex_attention"]
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "flex_attention", lambda *a, **k: calls.append(1) or flex(*a, **k))
    sdpa = LNBertForPreTraining(tiny_config(tiny_kwargs, placement, "sdpa")).eval()
    config = tiny_config(tiny_kwargs, placement)
    flex_model = LNBertForPreTraining._from_config(config, attn_implementation="flex_attention").eval()
    flex_model.load_state_dict(sdpa.state_dict())
    batch = make_batch()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        expected, got = sdpa(**batch), flex_model(**batch)
    assert len(calls) == tiny_kwargs["num_hidden_layers"]
    torch.testing.assert_close(got.prediction_logits[real], expected.prediction_logits[real])
    torch.testing.assert_close(got.seq_relationship_logits, expected.seq_relationship_logits)


def test_padding_positions_do_not_leak(tiny_kwargs):
    """Changing tokens under the padding mask must not change the outputs at real positions."""
    for placement in NORM_PLACEMENTS:
        for attn in ATTN:
            model = LNBertForPreTraining(tiny_config(tiny_kwargs, placement, attn)).eval()
            batch = make_batch()
            noisy = dict(batch, input_ids=batch["input_ids"].clone())
            noisy["input_ids"][batch["attention_mask"] == 0] = 7
            with torch.no_grad():
                a, b = model(**batch), model(**noisy)
            real = batch["attention_mask"].bool()
            torch.testing.assert_close(a.prediction_logits[real], b.prediction_logits[real])
            torch.testing.assert_close(a.seq_relationship_logits, b.seq_relationship_logits)


# --------------------------------------------------------------------------------------------------
# Placement structure
# --------------------------------------------------------------------------------------------------


def layer_norm_params(config: LNBertConfig) -> int:
    return 2 * config.hidden_size


def test_pre_ln_adds_exactly_one_layer_norm(tiny_kwargs):
    post = LNBertForPreTraining(tiny_config(tiny_kwargs, "post"))
    pre = LNBertForPreTraining(tiny_config(tiny_kwargs, "pre"))
    n_post = sum(p.numel() for p in post.parameters())
    n_pre = sum(p.numel() for p in pre.parameters())
    assert n_pre - n_post == layer_norm_params(pre.config)
    assert count_layer_norms(pre) == count_layer_norms(post) + 1
    extra = set(pre.state_dict()) - set(post.state_dict())
    assert extra == {"bert.encoder.final_layer_norm.weight", "bert.encoder.final_layer_norm.bias"}
    assert set(post.state_dict()) <= set(pre.state_dict())


@pytest.mark.parametrize("placement", NORM_PLACEMENTS)
def test_word_embeddings_are_tied(tiny_kwargs, placement):
    model = LNBertForPreTraining(tiny_config(tiny_kwargs, placement))
    assert model.config.tie_word_embeddings is True
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


@pytest.mark.parametrize("placement", ["pre", "sandwich"])
def test_final_layer_norm_feeds_every_output(tiny_kwargs, placement):
    config = tiny_config(tiny_kwargs, placement)
    model = LNBertForPreTraining(config).eval()
    final_ln = model.bert.encoder.final_layer_norm
    assert isinstance(final_ln, nn.LayerNorm)
    with torch.no_grad():  # non-trivial gamma/beta so that "applied" is visible
        final_ln.weight.uniform_(0.5, 1.5)
        final_ln.bias.uniform_(-0.5, 0.5)
    raw = {}

    def keep_residual_stream(module, inputs, output):  # returns None: the output is left unchanged
        raw["x"] = output[0]

    model.bert.encoder.layer[-1].register_forward_hook(keep_residual_stream)
    batch = make_batch(padded=False)
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True)
        normed = final_ln(raw["x"])
        base = model.bert(**batch)
        torch.testing.assert_close(base.last_hidden_state, normed)
        torch.testing.assert_close(out.hidden_states[-1], normed)
        torch.testing.assert_close(base.pooler_output, model.bert.pooler(normed))
        torch.testing.assert_close(out.prediction_logits, model.cls.predictions(normed))
        torch.testing.assert_close(out.seq_relationship_logits, model.cls.seq_relationship(base.pooler_output))
    # The intermediate hidden states are the raw residual stream, not normalised.
    assert not torch.allclose(out.hidden_states[-2], final_ln(out.hidden_states[-2]))


@pytest.mark.parametrize("placement", NORM_PLACEMENTS)
def test_gradients_finite_and_reach_every_parameter(tiny_kwargs, placement):
    model = LNBertForPreTraining(tiny_config(tiny_kwargs, placement))
    batch = make_batch()
    out = model(**batch, labels=mlm_labels(batch["input_ids"]), next_sentence_label=torch.tensor([0, 1, 1]))
    out.loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, f"{name} gets no gradient"
        assert torch.isfinite(param.grad).all(), f"{name} has non-finite gradients"


def test_xavier_init_option(tiny_kwargs):
    model = LNBertForPreTraining(tiny_config(tiny_kwargs, "pre", init_scheme="xavier"))
    w = model.bert.encoder.layer[0].intermediate.dense.weight  # (37, 32)
    expected = (2 / (37 + 32)) ** 0.5
    assert abs(w.std().item() - expected) / expected < 0.1
    bert_init = LNBertForPreTraining(tiny_config(tiny_kwargs, "pre"))
    assert abs(bert_init.bert.encoder.layer[0].intermediate.dense.weight.std().item() - 0.02) < 0.003
    assert torch.equal(model.bert.encoder.final_layer_norm.weight, torch.ones(32))


@pytest.mark.parametrize(
    ("placement", "where", "dropout_first"),
    [
        ("sandwich", "attention.output.branch_norm", True),  # CogView: third_layernorm after output_dropout
        ("peri", "output.branch_norm", True),  # and fourth_layernorm after the FFN's dropout
        ("output_ln", "attention.output.LayerNorm", True),  # N(dropout(F))
        ("normformer", "attention.output.branch_norm", False),  # fairseq: attn_ln, then dropout_module
    ],
)
def test_branch_norm_and_dropout_order_in_train_mode(tiny_kwargs, placement, where, dropout_first):
    """Where dropout acts first, the norm's input has dropout's exact zeros and what joins the residual sum has
    none; the other way round, the reverse."""
    torch.manual_seed(0)
    model = LNBertForPreTraining(tiny_config(tiny_kwargs, placement, hidden_dropout_prob=0.5)).train()
    norm = model.bert.encoder.layer[0].get_submodule(where)
    seen = {}
    norm.register_forward_hook(lambda module, inputs, output: seen.update(norm_in=inputs[0], norm_out=output))
    sublayer = model.bert.encoder.layer[0].get_submodule(where.rsplit(".", 1)[0])
    sublayer.register_forward_hook(lambda module, inputs, output: seen.update(branch=output))
    model(**make_batch(padded=False))
    joins_residual = seen["norm_out"] if placement == "output_ln" else seen["branch"]
    assert bool((seen["norm_in"] == 0).any()) is dropout_first
    assert bool((joins_residual == 0).any()) is not dropout_first


# --------------------------------------------------------------------------------------------------
# Sparse MLM head
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_sparse_mlm_head_equals_dense(tiny_kwargs, placement):
    torch.manual_seed(0)
    dense = LNBertForPreTraining(tiny_config(tiny_kwargs, placement, sparse_mlm_head=False))
    sparse = LNBertForPreTraining(tiny_config(tiny_kwargs, placement, sparse_mlm_head=True))
    sparse.load_state_dict(dense.state_dict())
    dense.eval(), sparse.eval()
    batch = make_batch()
    labels, nsp = mlm_labels(batch["input_ids"]), torch.tensor([1, 0, 1])
    out_dense = dense(**batch, labels=labels, next_sentence_label=nsp)
    out_sparse = sparse(**batch, labels=labels, next_sentence_label=nsp)
    out_dense.loss.backward()
    out_sparse.loss.backward()
    torch.testing.assert_close(out_sparse.loss, out_dense.loss)
    selected = labels != -100
    assert out_sparse.prediction_logits.shape == (int(selected.sum()), tiny_kwargs["vocab_size"])
    torch.testing.assert_close(out_sparse.prediction_logits, out_dense.prediction_logits[selected])
    dense_grads = dict(dense.named_parameters())
    for name, param in sparse.named_parameters():
        torch.testing.assert_close(param.grad, dense_grads[name].grad, msg=f"gradient of {name}")


def test_masked_lm_sparse_equals_dense(tiny_kwargs):
    torch.manual_seed(0)
    dense = LNBertForMaskedLM(tiny_config(tiny_kwargs, "pre", sparse_mlm_head=False)).eval()
    sparse = LNBertForMaskedLM(tiny_config(tiny_kwargs, "pre", sparse_mlm_head=True)).eval()
    sparse.load_state_dict(dense.state_dict())
    batch = make_batch()
    labels = mlm_labels(batch["input_ids"])
    torch.testing.assert_close(sparse(**batch, labels=labels).loss, dense(**batch, labels=labels).loss)


# --------------------------------------------------------------------------------------------------
# LayerNorm Jacobian lemma (paper: ||J_LN(x)||_2 = sqrt(d) / ||x - mean(x)||_2 with gamma=1, beta=0)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [0.1, 1.0, 10.0, 300.0])
def test_layer_norm_jacobian_spectral_norm(tiny_kwargs, scale):
    model = LNBertForPreTraining(tiny_config(tiny_kwargs, "pre")).double()
    ln = model.bert.encoder.final_layer_norm  # the model's own module, gamma 1, beta 0 at init
    assert torch.equal(ln.weight, torch.ones_like(ln.weight)) and torch.equal(ln.bias, torch.zeros_like(ln.bias))
    d = ln.normalized_shape[0]
    x = torch.randn(d, dtype=torch.float64, generator=torch.Generator().manual_seed(int(scale * 10))) * scale
    jac = torch.autograd.functional.jacobian(ln, x)  # (d, d)
    spectral = torch.linalg.matrix_norm(jac, ord=2).item()
    expected = d**0.5 / torch.linalg.vector_norm(x - x.mean()).item()
    assert abs(spectral - expected) / expected < 1e-3


# --------------------------------------------------------------------------------------------------
# Save / load through the Auto classes
# --------------------------------------------------------------------------------------------------

_RELOAD_SCRIPT = """
import sys, torch
import pretrain.modeling  # noqa: F401  (registers lnbert with the Auto classes)
from transformers import AutoModelForPreTraining
root = sys.argv[1]
torch.set_num_threads(int(sys.argv[2]))  # the parent's count: same reduction order, same bits
batch = torch.load(f"{root}/batch.pt")
outputs = {}
for name in sys.argv[3:]:
    model = AutoModelForPreTraining.from_pretrained(f"{root}/{name}").eval()
    with torch.no_grad():
        out = model(**batch)
    outputs[name] = {"mlm": out.prediction_logits, "nsp": out.seq_relationship_logits, "cls": type(model).__name__}
torch.save(outputs, f"{root}/outputs.pt")
"""
_FRESH_VARIANTS = [(placement, "layernorm") for placement in NORM_PLACEMENTS] + [("pre", "rmsnorm"), ("post", "dyt"),
                                                                                  ("pre", "derf"), ("post", "seednorm")]  # fmt: skip


@pytest.fixture(scope="module")
def reloaded_in_fresh_process(tmp_path_factory) -> tuple[dict, dict]:
    """Every placement (and the other norm types) saved here, loaded through the Auto classes in ONE fresh
    process (a process per model cost the suite 10 s each, its imports)."""
    root = tmp_path_factory.mktemp("fresh")
    batch = make_batch()
    torch.save(batch, root / "batch.pt")
    expected = {}
    for placement, norm_type in _FRESH_VARIANTS:
        torch.manual_seed(0)
        model = LNBertForPreTraining(tiny_config(dict(TINY), placement, norm_type=norm_type)).eval()
        model.save_pretrained(root / f"{placement}-{norm_type}")
        with torch.no_grad():
            out = model(**batch)
        expected[f"{placement}-{norm_type}"] = {"mlm": out.prediction_logits, "nsp": out.seq_relationship_logits}
    names = list(expected)
    subprocess.run([sys.executable, "-c", _RELOAD_SCRIPT, str(root), str(torch.get_num_threads()), *names],
                   check=True, cwd=ROOT)  # fmt: skip
    return expected, torch.load(root / "outputs.pt"), root


@pytest.mark.parametrize(("placement", "norm_type"), _FRESH_VARIANTS)
def test_save_and_load_in_fresh_process(reloaded_in_fresh_process, placement, norm_type):
    expected, outputs, root = reloaded_in_fresh_process
    name = f"{placement}-{norm_type}"
    assert (root / name / "model.safetensors").is_file()
    saved = json.loads((root / name / "config.json").read_text())
    assert (saved["model_type"], saved["norm_placement"], saved["norm_type"]) == ("lnbert", placement, norm_type)
    got = outputs[name]
    assert got["cls"] == "LNBertForPreTraining"
    torch.testing.assert_close(got["mlm"], expected[name]["mlm"])
    torch.testing.assert_close(got["nsp"], expected[name]["nsp"])


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_mlm_snapshot_opens_as_sequence_classifier(tiny_kwargs, placement, tmp_path):
    mlm = LNBertForMaskedLM(tiny_config(tiny_kwargs, placement))
    mlm.save_pretrained(tmp_path)
    clf = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=2)
    assert isinstance(clf, LNBertForSequenceClassification)
    assert clf.config.norm_placement == placement
    for name, value in mlm.bert.state_dict().items():
        torch.testing.assert_close(clf.bert.state_dict()[name], value, msg=name)
    assert AutoModelForMaskedLM.from_pretrained(tmp_path).config.norm_placement == placement
    batch = make_batch()
    logits = clf(**batch).logits
    assert logits.shape == (3, 2) and torch.isfinite(logits).all()


# --------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------


def test_unknown_placement_is_rejected(tiny_kwargs):
    with pytest.raises(ValueError, match=r"norm_placement='middle'.*valid choices: post, pre, sandwich, peri, deepnorm, admin"):
        LNBertConfig(norm_placement="middle", **tiny_kwargs)


def test_unknown_init_scheme_is_rejected(tiny_kwargs):
    with pytest.raises(ValueError, match="init_scheme='kaiming'"):
        LNBertConfig(init_scheme="kaiming", **tiny_kwargs)


def test_hidden_size_not_divisible_by_heads(tiny_kwargs):
    with pytest.raises(ValueError, match=r"hidden_size=30 is not divisible by num_attention_heads=4"):
        LNBertConfig(**{**tiny_kwargs, "hidden_size": 30})


@pytest.mark.parametrize(("saved", "loaded"), [("pre", "post"), ("post", "pre"), ("sandwich", "pre")])
def test_loading_another_placement_fails_loudly(tiny_kwargs, tmp_path, saved, loaded):
    LNBertForPreTraining(tiny_config(tiny_kwargs, saved)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"does not match norm_placement='{loaded}'"):
        LNBertForPreTraining.from_pretrained(tmp_path, norm_placement=loaded)
    with pytest.raises(ValueError, match="does not match norm_placement"):
        AutoModelForPreTraining.from_pretrained(tmp_path, norm_placement=loaded)


def test_hf_checkpoint_loads_into_post_ln_via_from_pretrained(tiny_kwargs, tmp_path):
    """A Hugging Face BERT folder opens as our Post-LN model with no missing or unexpected weights."""
    hf = hf_model(BertForPreTraining, tiny_kwargs, "sdpa")
    hf.save_pretrained(tmp_path)
    ours, info = LNBertForPreTraining.from_pretrained(tmp_path, output_loading_info=True)
    assert ours.config.norm_placement == "post"
    assert not info["missing_keys"] and not info["unexpected_keys"]
    batch = make_batch()
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(**batch).prediction_logits, hf(**batch).prediction_logits)


def test_attention_defaults_to_sdpa_with_eager_as_option(tiny_kwargs):
    assert LNBertForPreTraining(LNBertConfig(**tiny_kwargs)).config._attn_implementation == "sdpa"
    eager = LNBertForPreTraining(LNBertConfig(**tiny_kwargs, attn_implementation="eager"))
    assert eager.config._attn_implementation == "eager"


@pytest.mark.parametrize(
    ("saved", "loaded", "message"),
    [
        ({"norm_placement": "post"}, {"norm_placement": "deepnorm"}, "norm_placement='deepnorm' (trained with 'post')"),
        ({"norm_placement": "deepnorm"}, {"norm_placement": "post"}, "norm_placement='post' (trained with 'deepnorm')"),
        ({"norm_placement": "pre"}, {"norm_placement": "pre", "embedding_layer_norm": False}, "embedding_layer_norm=False"),
    ],
)
def test_same_parameter_names_other_computation_is_refused(tiny_kwargs, tmp_path, saved, loaded, message):
    """Post-LN and DeepNorm share every parameter name; the saved config tells them apart."""
    LNBertForPreTraining(LNBertConfig(**{**tiny_kwargs, **saved})).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=re.escape(message)):
        LNBertForPreTraining.from_pretrained(tmp_path, **loaded)
    with pytest.raises(ValueError, match=re.escape(message)):
        AutoModelForPreTraining.from_pretrained(tmp_path, **loaded)


def test_fused_qkv_may_differ_from_the_saved_config(tiny_kwargs, tmp_path):
    LNBertForPreTraining(LNBertConfig(**tiny_kwargs)).save_pretrained(tmp_path)
    assert LNBertForPreTraining.from_pretrained(tmp_path, fused_qkv=True).config.fused_qkv
