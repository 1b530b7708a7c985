"""The model as a Hugging Face model, used the way transformers users and tools use BERT: ``from_pretrained`` by
keyword, ``problem_type``, activation (gradient) checkpointing, ``inputs_embeds``, the padded-input warning, BERT's
task heads (loaded strictly from BERT checkpoints), ``output_attentions`` under sdpa, and the decoder inputs refused.
Every placement and residual scheme where a point depends on the encoder (``VARIANTS``)."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch import nn
from transformers import (
    AutoModel,
    AutoModelForMultipleChoice,
    AutoModelForNextSentencePrediction,
    AutoModelForQuestionAnswering,
    AutoModelForTokenClassification,
    BertConfig,
    BertForMultipleChoice,
    BertForNextSentencePrediction,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    Trainer,
    TrainingArguments,
    modeling_utils,
)

import pretrain.modeling
from pretrain.modeling import (
    NORM_PLACEMENTS,
    LNBertConfig,
    LNBertForMaskedLM,
    LNBertForMultipleChoice,
    LNBertForNextSentencePrediction,
    LNBertForPreTraining,
    LNBertForQuestionAnswering,
    LNBertForSequenceClassification,
    LNBertForTokenClassification,
    LNBertModel,
)
from pretrain.residual_streams import recording
from tests.conftest import TINY
from tests.test_residual_schemes import SCHEMES

# Every placement, every kind of residual scheme (a Block AttnRes whose blocks close mid-layer), two other norm types.
VARIANTS = {
    **{placement: dict(norm_placement=placement) for placement in NORM_PLACEMENTS},
    **{f"pre-{name}": dict(norm_placement="pre", **SCHEMES[name]) for name in ("shc4", "hc4", "mhc4", "attnres", "attnres-b3", "mhclite4", "frac4", "denseformer")},
    "pre-rmsnorm": dict(norm_placement="pre", norm_type="rmsnorm"),
    "post-dyt": dict(norm_placement="post", norm_type="dyt"),
    # The designs inside the layer, each in one of two models.
    "pre-gpas-gated-vres-learn-derf": dict(norm_placement="pre", gpas=True, attention_gate="elementwise",
                                           value_residual="learnable", norm_type="derf"),
    "deepnorm-gpas-gated-head-vres-seednorm": dict(norm_placement="deepnorm", gpas=True, attention_gate="headwise",
                                                   value_residual="identity", norm_type="seednorm"),
}  # fmt: skip
# What passes between their layers is not one tensor (ResiDual's pair, AttnRes's sources, DenseFormer's outputs, the
# first layer's values).
NOT_ONE_TENSOR = {"resi_dual", "pre-attnres", "pre-attnres-b3", "pre-denseformer", "pre-gpas-gated-vres-learn-derf",
                  "deepnorm-gpas-gated-head-vres-seednorm"}  # fmt: skip
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# BERT's task heads: ours, Hugging Face's, the Auto class that opens a snapshot with it, and its labels' keywords.
HEADS = {
    "sequence": (LNBertForSequenceClassification, BertForSequenceClassification, None),
    "token": (LNBertForTokenClassification, BertForTokenClassification, AutoModelForTokenClassification),
    "qa": (LNBertForQuestionAnswering, BertForQuestionAnswering, AutoModelForQuestionAnswering),
    "choice": (LNBertForMultipleChoice, BertForMultipleChoice, AutoModelForMultipleChoice),
    "nsp": (LNBertForNextSentencePrediction, BertForNextSentencePrediction, AutoModelForNextSentencePrediction),
}


def config(name: str = "post", **extra) -> LNBertConfig:
    return LNBertConfig(**{**TINY, **VARIANTS[name], **extra})


def inputs(choices: int = 0, seed: int = 0) -> dict[str, torch.Tensor]:
    """A padded batch of 3 (of 3 x ``choices`` sequences for multiple choice), its token types and mask."""
    gen = torch.Generator().manual_seed(seed)
    shape = (3, choices, 9) if choices else (3, 9)
    input_ids = torch.randint(1, TINY["vocab_size"], shape, generator=gen)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, ..., 6:] = 0
    input_ids[attention_mask == 0] = 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[..., 4:] = 1
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)


def labels(head: str, num_labels: int = 2, seed: int = 1) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    if head == "token":
        return {"labels": torch.randint(0, num_labels, (3, 9), generator=gen)}
    if head == "qa":
        return {"start_positions": torch.tensor([1, 4, 30]), "end_positions": torch.tensor([3, 5, 2])}  # 30: outside
    return {"labels": torch.randint(0, 3 if head == "choice" else 2, (3,), generator=gen)}


def batch_for(head: str) -> dict[str, torch.Tensor]:
    return inputs(choices=3 if head == "choice" else 0)


# --------------------------------------------------------------------------------------------------
# from_pretrained by keyword
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [LNBertModel, LNBertForSequenceClassification, LNBertForMaskedLM])
def test_from_pretrained_takes_the_path_by_keyword(cls, tmp_path):
    """Trainer callbacks, PEFT and many scripts pass ``pretrained_model_name_or_path=``; the check of the saved
    config still runs."""
    LNBertForPreTraining(config("pre")).save_pretrained(tmp_path)
    model = cls.from_pretrained(pretrained_model_name_or_path=tmp_path)
    assert isinstance(model, cls) and model.config.norm_placement == "pre"
    assert isinstance(AutoModel.from_pretrained(pretrained_model_name_or_path=tmp_path), LNBertModel)
    with pytest.raises(ValueError, match=re.escape("norm_placement='post' (trained with 'pre')")):
        cls.from_pretrained(pretrained_model_name_or_path=tmp_path, norm_placement="post")


# --------------------------------------------------------------------------------------------------
# problem_type
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("problem_type", "num_labels", "make_labels", "inferred"),
    [
        (None, 1, lambda: torch.tensor([0.5, -1.0, 2.0]), "regression"),
        (None, 3, lambda: torch.tensor([0, 2, 1]), "single_label_classification"),
        (None, 3, lambda: torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]]), "multi_label_classification"),
        ("multi_label_classification", 3, lambda: torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]]), None),
        ("regression", 2, lambda: torch.tensor([[0.5, 1.0], [0.0, -1.0], [2.0, 0.0]]), None),
    ],
    ids=["regression", "single-label", "multi-label-inferred", "multi-label", "regression-2d"],
)  # fmt: skip
def test_problem_type_picks_the_loss_as_bert(problem_type, num_labels, make_labels, inferred):
    """``config.problem_type`` (or, when None, the number of labels and their dtype, recorded in the config as BERT
    does) picks MSE, cross-entropy or BCE: the loss equals ``BertForSequenceClassification``'s with the same weights."""
    torch.manual_seed(0)
    kwargs = dict(num_labels=num_labels, problem_type=problem_type)
    hf = BertForSequenceClassification(BertConfig(**TINY, **kwargs)).eval()
    ours = LNBertForSequenceClassification(config("post", **kwargs)).eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    batch, target = inputs(), make_labels()
    with torch.no_grad():
        expected, got = hf(**batch, labels=target).loss, ours(**batch, labels=target).loss
    torch.testing.assert_close(got, expected)
    assert ours.config.problem_type == hf.config.problem_type == (problem_type or inferred)


# --------------------------------------------------------------------------------------------------
# Activation (gradient) checkpointing
# --------------------------------------------------------------------------------------------------


def pretraining_loss(model: nn.Module, seed: int = 0) -> torch.Tensor:
    """The pretraining loss (MLM + NSP) on a padded batch, dropout drawn from ``seed``."""
    batch = inputs()
    mlm = torch.full_like(batch["input_ids"], -100)
    mlm[:, [1, 4]] = batch["input_ids"][:, [1, 4]]
    torch.manual_seed(seed)
    return model(**batch, labels=mlm, next_sentence_label=torch.tensor([0, 1, 1])).loss


def pretraining_gradients(model: nn.Module, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every parameter's gradient of ``pretraining_loss``."""
    model.zero_grad(set_to_none=True)
    pretraining_loss(model, seed).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_equal(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """The same parameters have gradients, equal to the bit."""
    assert got.keys() == expected.keys()
    for key, grad in expected.items():
        torch.testing.assert_close(got[key], grad, rtol=0, atol=0, msg=key)


def count_calls(module: nn.Module) -> list[int]:
    """A list that grows by one at each call of ``module`` (a checkpointed layer's modules run again in backward)."""
    calls: list[int] = []
    module.register_forward_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("name", VARIANTS)
def test_checkpointing_gives_the_same_gradients(name):
    """float64, dropout off: gradient_checkpointing_enable() changes no gradient by a bit, and the layers really are
    recomputed in the backward pass (their sub-modules run twice per step). Reentrant checkpointing gives gradients
    only through tensor arguments: the same gradients where the layers pass one tensor, refused (not silently
    missing gradients) where they pass a pair or AttnRes's sources."""
    torch.manual_seed(0)
    model = LNBertForPreTraining(config(name, **NO_DROPOUT)).double().train()
    calls = count_calls(model.bert.encoder.layer[0].intermediate)
    expected = pretraining_gradients(model)
    assert len(calls) == 1 and len(expected) == sum(p.requires_grad for p in model.parameters())
    with pytest.warns(FutureWarning, match="activation_checkpointing_enable"):  # transformers 5's new name
        model.gradient_checkpointing_enable()
    assert model.is_activation_checkpointing
    assert_equal(pretraining_gradients(model), expected)
    assert len(calls) == 3

    model.activation_checkpointing_disable()
    if name in NOT_ONE_TENSOR:
        for kwargs in ({"use_reentrant": True}, {"preserve_rng_state": True}):  # torch's default is reentrant
            with pytest.raises(ValueError, match=r"reentrant activation checkpointing.*use_reentrant=False"):
                model.activation_checkpointing_enable(kwargs)
            assert not model.is_activation_checkpointing
        return
    model.activation_checkpointing_enable({"use_reentrant": True})
    assert_equal(pretraining_gradients(model), expected)


@pytest.mark.parametrize("name", ["post", "pre", "ngpt", "pre-hc4", "pre-attnres"])
def test_checkpointing_with_dropout_is_bit_identical(name):
    """float32 with BERT's dropout: the recomputation draws the same dropout masks (the RNG state is replayed), so a
    run may turn train.gradient_checkpointing on or off when it continues."""
    torch.manual_seed(0)
    model = LNBertForPreTraining(config(name)).train()
    expected = pretraining_gradients(model, seed=3)
    model.activation_checkpointing_enable()
    assert_equal(pretraining_gradients(model, seed=3), expected)


@pytest.mark.parametrize("name", ["pre-hc4", "pre-mhc4", "pre-attnres-b3", "pre-frac4", "pre-denseformer"])
def test_residual_recording_under_checkpointing(name):
    """The training loop records the residual scheme during its forward; the recomputation in backward, outside
    the recording, adds nothing to it."""
    torch.manual_seed(0)
    model = LNBertForPreTraining(config(name, **NO_DROPOUT)).train()

    def recorded() -> dict[str, torch.Tensor]:
        with recording(model, inputs()["attention_mask"]) as recorder:
            loss = pretraining_loss(model)
        loss.backward()
        return {k: v for k, v in vars(recorder.stats()).items() if v is not None}

    expected = recorded()
    model.activation_checkpointing_enable()
    got = recorded()
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, msg=key)


def test_trainers_gradient_checkpointing_flag(tmp_path):
    """``Trainer(args=TrainingArguments(gradient_checkpointing=True))`` turns it on and trains."""
    torch.manual_seed(0)
    model = LNBertForSequenceClassification(config("pre-hc4", num_labels=2))
    batch = inputs()
    rows = [{key: value[i] for key, value in batch.items()} | {"labels": torch.tensor(i % 2)} for i in range(3)]
    args = TrainingArguments(output_dir=str(tmp_path), gradient_checkpointing=True, max_steps=1,
                             per_device_train_batch_size=3, report_to=[], save_strategy="no", use_cpu=True)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # gradient_checkpointing: transformers 5's deprecated alias
        result = Trainer(model=model, args=args, train_dataset=rows).train()
    assert model.is_activation_checkpointing and torch.isfinite(torch.tensor(result.training_loss))


# --------------------------------------------------------------------------------------------------
# inputs_embeds
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", VARIANTS)
def test_inputs_embeds_equal_input_ids(name):
    """``inputs_embeds`` (the word embeddings' rows, or anything of their shape) in place of ``input_ids``: the same
    outputs, and a gradient with respect to them (integrated gradients, prompt tuning, adversarial training)."""
    torch.manual_seed(0)
    model = LNBertForPreTraining(config(name)).eval()
    batch = inputs()
    embeds = model.get_input_embeddings()(batch.pop("input_ids")).detach().requires_grad_()
    with torch.no_grad():
        expected = model(**inputs(), output_hidden_states=True)
    got = model(**batch, inputs_embeds=embeds, output_hidden_states=True)
    torch.testing.assert_close(got.prediction_logits, expected.prediction_logits)
    torch.testing.assert_close(got.seq_relationship_logits, expected.seq_relationship_logits)
    torch.testing.assert_close(got.hidden_states[-1], expected.hidden_states[-1])
    got.seq_relationship_logits.sum().backward()
    assert embeds.grad is not None and embeds.grad.abs().sum() > 0


@pytest.mark.parametrize("head", HEADS)
def test_every_head_takes_inputs_embeds(head):
    torch.manual_seed(0)
    model = HEADS[head][0](config("pre")).eval()
    batch = batch_for(head)
    embeds = model.get_input_embeddings()(batch.pop("input_ids"))
    with torch.no_grad():
        expected, got = model(**batch_for(head)), model(**batch, inputs_embeds=embeds)
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, msg=key)


def test_exactly_one_of_input_ids_and_inputs_embeds():
    model = LNBertModel(config())
    ids = inputs()["input_ids"]
    for given in ({}, {"input_ids": ids, "inputs_embeds": model.get_input_embeddings()(ids)}):
        with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
            model(**given)


# --------------------------------------------------------------------------------------------------
# The padded-input warning, output_attentions under sdpa, the decoder inputs
# --------------------------------------------------------------------------------------------------


def test_padded_input_without_attention_mask_warns(monkeypatch):
    """transformers' ``warn_if_padding_and_no_attention_mask``: [PAD] first or last and no mask; silent with a mask
    or without padding."""
    said: list[str] = []
    monkeypatch.setattr(modeling_utils.logger, "warning_once", said.append)
    model = LNBertModel(config()).eval()
    batch = inputs()
    with torch.no_grad():
        model(batch["input_ids"], batch["attention_mask"])
        model(batch["input_ids"][[0, 2]])  # rows without padding
        assert said == []
        model(batch["input_ids"])
    assert len(said) == 1 and "attention_mask" in said[0]


@pytest.mark.parametrize("name", ["post", "pre", "resi_dual", "ngpt", "pre-hc4", "pre-attnres"])
def test_output_attentions_as_bert(name, monkeypatch):
    """sdpa computes no attention probabilities: an empty tuple, as ``BertModel`` 5.x returns, with a warning that
    names the fix; eager (at load, or switched to with ``set_attn_implementation`` as in BERT) gives each layer's
    (B, heads, T, T)."""
    said: list[str] = []
    monkeypatch.setattr(pretrain.modeling.logger, "warning_once", said.append)
    batch = inputs()
    sdpa = LNBertModel(config(name)).eval()
    eager = LNBertModel(config(name, attn_implementation="eager")).eval()
    eager.load_state_dict(sdpa.state_dict())
    bert = BertModel(BertConfig(**TINY)).eval()
    with torch.no_grad():
        assert bert(**batch, output_attentions=True).attentions == ()
        assert sdpa(**batch, output_attentions=True).attentions == ()
        assert len(said) == 1 and "attn_implementation='eager'" in said[0]
        probs = eager(**batch, output_attentions=True).attentions
        assert sdpa(**batch).attentions is None
        sdpa.set_attn_implementation("eager")
        switched = sdpa(**batch, output_attentions=True).attentions
    torch.testing.assert_close(switched, probs, rtol=0, atol=0)
    assert len(probs) == TINY["num_hidden_layers"]
    assert all(p.shape == (3, TINY["num_attention_heads"], 9, 9) for p in probs)
    torch.testing.assert_close(probs[0].sum(-1), torch.ones(3, TINY["num_attention_heads"], 9))


def test_the_decoder_inputs_are_refused():
    """BERT's decoder mode (cross-attention, causal masking) is not built: asking for it is an error, not ignored."""
    model = LNBertModel(config()).eval()
    batch = inputs()
    for key in ("encoder_hidden_states", "encoder_attention_mask"):
        with pytest.raises(ValueError, match=f"{key} given: lnbert is an encoder without cross-attention"):
            model(**batch, **{key: torch.ones(3, 9, TINY["hidden_size"])})
    for key in ("add_cross_attention", "is_decoder"):
        with pytest.raises(ValueError, match=f"{key}=True: lnbert is an encoder"):
            LNBertForMaskedLM(config(**{key: True}))


# --------------------------------------------------------------------------------------------------
# BERT's task heads
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("head", HEADS)
def test_head_loads_a_bert_checkpoint_strictly(head, tmp_path):
    """A Hugging Face ``BertFor...`` saved with save_pretrained opens as our Post-LN head with no missing or
    unexpected weight, and gives BERT's logits and loss to the bit (BERT opened from the same folder, sdpa and
    eager), as BERT's tuple with ``return_dict=False``."""
    ours_cls, bert_cls, _ = HEADS[head]
    torch.manual_seed(0)
    bert_cls(BertConfig(**TINY)).save_pretrained(tmp_path)
    bert = bert_cls.from_pretrained(tmp_path).eval()
    ours, info = ours_cls.from_pretrained(tmp_path, output_loading_info=True)
    assert isinstance(ours, ours_cls) and ours.config.norm_placement == "post"
    assert not any(info.values()), info
    ours.eval().load_state_dict(bert.state_dict(), strict=True)
    batch, target = batch_for(head), labels(head)
    for attention in ("sdpa", "eager"):
        bert.set_attn_implementation(attention)
        ours.set_attn_implementation(attention)
        with torch.no_grad():
            expected, got = bert(**batch, **target), ours(**batch, **target)
            as_tuple = ours(**batch, **target, return_dict=False)
        assert expected.keys() == got.keys() and ours.config._attn_implementation == attention
        for key, value in expected.items():
            torch.testing.assert_close(got[key], value, rtol=0, atol=0, msg=f"{attention} {key}")
        torch.testing.assert_close(as_tuple, expected.to_tuple(), rtol=0, atol=0)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("head", HEADS)
def test_head_trains_on_every_variant(head, name):
    """Each head over each encoder: logits of BERT's shape, a finite loss, a gradient for every parameter."""
    torch.manual_seed(0)
    model = HEADS[head][0](config(name, num_labels=3 if head == "token" else 2)).train()
    out = model(**batch_for(head), **labels(head, num_labels=3))
    shapes = {"sequence": (3, 2), "token": (3, 9, 3), "choice": (3, 3), "nsp": (3, 2)}
    logits = (out.start_logits, out.end_logits) if head == "qa" else (out.logits,)
    assert all(x.shape == shapes.get(head, (3, 9)) for x in logits)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing


@pytest.mark.parametrize("name", ["post", "pre-hc4", "ngpt"])
@pytest.mark.parametrize("head", [h for h in HEADS if HEADS[h][2] is not None])
def test_auto_class_opens_a_snapshot_with_the_head(head, name, tmp_path):
    """An lnbert snapshot (the pretraining model's) opens with transformers' Auto class of each head."""
    LNBertForPreTraining(config(name)).save_pretrained(tmp_path)
    model = HEADS[head][2].from_pretrained(tmp_path)
    assert isinstance(model, HEADS[head][0]) and model.config.norm_placement == config(name).norm_placement
    with torch.no_grad():
        out = model.eval()(**batch_for(head))
    assert all(torch.isfinite(v).all() for v in out.values())


def test_ngpt_token_heads_read_bert_scale_hidden_states():
    """nGPT's hidden states have norm 1; the token-level heads read them times sqrt(d), as its pooler does."""
    torch.manual_seed(0)
    model = LNBertForTokenClassification(config("ngpt")).eval()
    with torch.no_grad():
        hidden, _ = model.encode(inputs()["input_ids"])
    torch.testing.assert_close(hidden.norm(dim=-1), torch.full((3, 9), TINY["hidden_size"] ** 0.5))
