"""nGPT (``norm_placement="ngpt"``): a reference forward written from the paper and the official code over the
parameter names of docs/placements.md, with perturbed weights; the unit-norm invariants after init and after
optimizer steps of pretraining and fine-tuning; the eigen learning rates' limits; the scale trick; bf16 steps at
depth 2 and 24; save/reload; the refusals; weight decay; the [CLS] classifier; the measurements and the counts.

The reference reads every tensor from ``state_dict()`` and calls no sub-module of the model; its constants (0.05,
1/sqrt(d), sqrt(d), sqrt(d_k)) are the paper's §2.6 and the official ``model.py``, written here again.
"""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch
from torch import nn
from transformers import AutoModelForMaskedLM, AutoModelForPreTraining, AutoModelForSequenceClassification

from pretrain.modeling import (
    LNBertConfig,
    LNBertForMaskedLM,
    LNBertForPreTraining,
    LNBertForSequenceClassification,
    LNBertModel,
    count_layer_norms,
)
from pretrain.ngpt import ngpt_stats, normalize_matrices
from pretrain.optim import build_adamw, weight_decay_groups
from pretrain.variants import variant_name
from tests.conftest import TINY
from tests.test_placement_reference import LAYERS, Params, gelu, make_config, make_inputs, perturb

# The matrices on the sphere and the dimension of each that is normalised (the embedding dimension), in
# nn.Linear's (out, in) layout: docs/placements.md, "nGPT".
ROWS = ("attention.self.query", "attention.self.key", "attention.self.value", "intermediate.dense")
COLUMNS = ("attention.output.dense", "output.dense")
EMBEDDINGS = ("word_embeddings", "position_embeddings", "token_type_embeddings")
# Each scaler: (name under the layer or the head, s_init, s_scale as a function of d), §2.6 and model.py.
SCALERS = {
    "attn_alpha": (0.05, lambda d: d**-0.5),
    "mlp_alpha": (0.05, lambda d: d**-0.5),
    "attention.self.sqk": (1.0, lambda d: d**-0.5),
    "intermediate.su": (1.0, lambda d: 1.0),
}
SZ = (1.0, lambda d: d**-0.5)


def ngpt_config(**extra) -> LNBertConfig:
    """The tiny model of the tests (hidden 32, 2 layers, 4 heads, FFN 37, vocabulary 99) as nGPT."""
    return LNBertConfig(**{**TINY, "norm_placement": "ngpt", **extra})


def sphere_weights(model: nn.Module) -> dict[str, tuple[torch.Tensor, int]]:
    """Every matrix the spec puts on the sphere, by name, with the dimension along which it has unit norm."""
    sd = model.state_dict()
    prefix = "bert." if any(k.startswith("bert.") for k in sd) else ""
    out = {f"{prefix}embeddings.{e}.weight": (sd[f"{prefix}embeddings.{e}.weight"], 1) for e in EMBEDDINGS}
    for key, value in sd.items():
        local = re.fullmatch(r"(?:bert\.)?encoder\.layer\.\d+\.(.+)\.weight", key)
        if local and local[1] in ROWS:
            out[key] = (value, 1)
        elif local and local[1] in COLUMNS:
            out[key] = (value, 0)
    if "cls.predictions.decoder.weight" in sd:
        out["cls.predictions.decoder.weight"] = (sd["cls.predictions.decoder.weight"], 1)
    assert len(out) == 3 + 6 * model.config.num_hidden_layers + ("cls.predictions.decoder.weight" in sd), sorted(out)
    return out


def assert_on_sphere(model: nn.Module, atol: float = 2e-6) -> None:
    for name, (weight, dim) in sphere_weights(model).items():
        norms = torch.linalg.vector_norm(weight.float(), dim=dim)
        torch.testing.assert_close(norms, torch.ones_like(norms), rtol=0, atol=atol, msg=name)


def largest_norm_error(model: nn.Module) -> float:
    return max(
        float((torch.linalg.vector_norm(w.float(), dim=dim) - 1).abs().max())
        for w, dim in sphere_weights(model).values()
    )


def pretraining_batch(seed: int = 0, vocab: int = 99) -> dict[str, torch.Tensor]:
    """A padded MLM + NSP batch; [PAD] is token 0 (``pad_token_id``), as the data pipeline pads."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, vocab, (3, 11), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 7:] = 0
    attention_mask[2, 4:] = 0
    input_ids[attention_mask == 0] = 0
    labels = torch.where((torch.rand(input_ids.shape, generator=g) < 0.3) & (attention_mask == 1), input_ids, -100)
    labels[0, 1] = input_ids[0, 1]
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 5:] = 1
    return dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        token_type_ids=token_type_ids,
        labels=labels,
        next_sentence_label=torch.tensor([0, 1, 0]),
    )


# --------------------------------------------------------------------------------------------------
# The reference: the paper's equations and the official model.py, over the state dict
# --------------------------------------------------------------------------------------------------


def justnorm(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(p=2, dim=-1, keepdim=True)


def ngpt_reference(model, cfg: LNBertConfig, inputs):
    """(hidden states h_0 .. h_L, MLM logits, NSP logits or None) of nGPT as a BERT, from the paper's Eqs. 3, 10-11,
    15-21 and model.py's Block.forward (including its justnorm(h) before each update), in the model's dtype."""
    ids, mask, tt = inputs
    P = Params(model)
    d, nh = cfg.hidden_size, cfg.num_attention_heads
    dk, base = d // nh, 1 / math.sqrt(d)
    B, T = ids.shape
    emb = (
        P.get("embeddings.word_embeddings.weight")[ids]
        + P.get("embeddings.token_type_embeddings.weight")[tt]
        + P.get("embeddings.position_embeddings.weight")[torch.arange(T)][None]
    )
    h = justnorm(emb)
    states = [h]
    key_mask = mask.bool()[:, None, None, :]  # (B, 1, 1, T): keys only, as BERT
    for i in range(cfg.num_hidden_layers):
        lp = f"encoder.layer.{i}."
        q, k, v = (h @ P.get(f"{lp}attention.self.{n}.weight").T for n in ("query", "key", "value"))
        assert not P.has(f"{lp}attention.self.query.bias")
        q, k, v = (x.view(B, T, nh, dk) for x in (q, k, v))
        sqk = (P.get(f"{lp}attention.self.sqk") * (1.0 / base)).view(1, 1, nh, dk)
        q, k = sqk * justnorm(q), sqk * justnorm(k)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * math.sqrt(dk)  # softmax scale sqrt(d_k)
        probs = scores.masked_fill(~key_mask, float("-inf")).softmax(-1)
        y = torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(B, T, d)
        h_att = y @ P.get(f"{lp}attention.output.dense.weight").T
        lr = torch.abs(P.get(f"{lp}attn_alpha") * (0.05 / base))
        a_norm, b_norm = justnorm(h), justnorm(h_att)
        h = justnorm(a_norm + lr * (b_norm - a_norm))
        u = h @ P.get(f"{lp}intermediate.dense.weight").T
        u = u * (P.get(f"{lp}intermediate.su") * ((1.0 / 1.0) * d**0.5))
        h_mlp = gelu(u) @ P.get(f"{lp}output.dense.weight").T
        lr = torch.abs(P.get(f"{lp}mlp_alpha") * (0.05 / base))
        a_norm, b_norm = justnorm(h), justnorm(h_mlp)
        h = justnorm(a_norm + lr * (b_norm - a_norm))
        states.append(h)
    decoder = (
        P.get("cls.predictions.decoder.weight")
        if P.has("cls.predictions.decoder.weight")
        else P.get("embeddings.word_embeddings.weight")
    )
    logits = (h @ decoder.T) * (P.get("cls.predictions.sz") * (1.0 / base)) if P.has("cls.predictions.sz") else None
    nsp = None
    if P.has("pooler.dense.weight") and P.has("cls.seq_relationship.weight"):
        pooled = torch.tanh((h[:, 0] * math.sqrt(d)) @ P.get("pooler.dense.weight").T + P.get("pooler.dense.bias"))
        nsp = pooled @ P.get("cls.seq_relationship.weight").T + P.get("cls.seq_relationship.bias")
    return states, logits, nsp


EXACT = dict(rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_forward_matches_the_reference_with_perturbed_weights(tied, attn):
    """Random matrices (not on the sphere: the forward must not depend on it) and every scaler off its init."""
    cfg = make_config("ngpt", tie_word_embeddings=tied)
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    model = LNBertForPreTraining(cfg).double().eval()
    perturb(model, seed=3)
    ids, mask, tt = make_inputs()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, token_type_ids=tt, output_hidden_states=True)
        states, logits, nsp = ngpt_reference(model, cfg, (ids, mask, tt))
    assert len(out.hidden_states) == LAYERS + 1
    for j, (got, want) in enumerate(zip(out.hidden_states, states, strict=True)):
        torch.testing.assert_close(got, want, **EXACT, msg=lambda m, j=j: f"hidden_states[{j}]: {m}")
    torch.testing.assert_close(out.prediction_logits, logits, **EXACT)
    torch.testing.assert_close(out.seq_relationship_logits, nsp, **EXACT)
    assert (model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight) == tied


def test_sparse_mlm_head_and_fused_qkv_compute_the_same():
    cfg = make_config("ngpt")
    torch.manual_seed(0)
    model = LNBertForPreTraining(cfg).double().eval()
    perturb(model, seed=5)
    fused = LNBertForPreTraining(LNBertConfig(**{**cfg.to_dict(), "fused_qkv": True})).double().eval()
    fused.load_state_dict(model.state_dict())
    batch = pretraining_batch()
    with torch.no_grad():
        a, b = model(**batch), fused(**batch)
        dense = LNBertForPreTraining(LNBertConfig(**{**cfg.to_dict(), "sparse_mlm_head": False})).double().eval()
        dense.load_state_dict(model.state_dict())
        c = dense(**batch)
    torch.testing.assert_close(a.loss, b.loss, **EXACT)
    torch.testing.assert_close(a.loss, c.loss, **EXACT)


def test_names_shapes_and_no_norm_bias_or_dropout_in_the_encoder():
    cfg = make_config("ngpt")
    model = LNBertForPreTraining(cfg)
    d, ff = cfg.hidden_size, cfg.intermediate_size
    want = {
        "attn_alpha": (d,),
        "mlp_alpha": (d,),
        "attention.self.sqk": (d,),
        "attention.self.query.weight": (d, d),
        "attention.self.key.weight": (d, d),
        "attention.self.value.weight": (d, d),
        "attention.output.dense.weight": (d, d),
        "intermediate.dense.weight": (ff, d),
        "intermediate.su": (ff,),
        "output.dense.weight": (d, ff),
    }
    params = {k: tuple(v.shape) for k, v in model.named_parameters()}
    for i in range(LAYERS):
        got = {k.split(f"bert.encoder.layer.{i}.", 1)[1]: v for k, v in params.items() if f"layer.{i}." in k}
        assert got == want, i
    others = {k: v for k, v in params.items() if ".encoder.layer." not in k}
    assert others == {
        "bert.embeddings.word_embeddings.weight": (cfg.vocab_size, d),
        "bert.embeddings.position_embeddings.weight": (cfg.max_position_embeddings, d),
        "bert.embeddings.token_type_embeddings.weight": (cfg.type_vocab_size, d),
        "bert.pooler.dense.weight": (d, d),
        "bert.pooler.dense.bias": (d,),
        "cls.predictions.sz": (cfg.vocab_size,),
        "cls.seq_relationship.weight": (2, d),
        "cls.seq_relationship.bias": (2,),
    }  # the decoder is the word embeddings (tied), listed once
    assert count_layer_norms(model) == 0
    body = [model.bert.embeddings, model.bert.encoder, model.cls.predictions]
    assert not any(isinstance(m, nn.Dropout) for part in body for m in part.modules())
    assert model.bert.embeddings.word_embeddings.padding_idx is None  # Norm(0) would be NaN


def test_init_puts_every_matrix_on_the_sphere_and_the_scalers_at_their_stored_values():
    cfg = ngpt_config()
    d = cfg.hidden_size
    for cls in (LNBertForPreTraining, LNBertForSequenceClassification):
        torch.manual_seed(0)
        model = cls(cfg)
        assert_on_sphere(model)
        sd = model.state_dict()
        for i in range(cfg.num_hidden_layers):
            for name, (s_init, s_scale) in SCALERS.items():
                stored = sd[f"bert.encoder.layer.{i}.{name}"]
                assert torch.equal(stored, torch.full_like(stored, s_scale(d))), name
                # the effective value is s_init: stored * s_init / s_scale
                torch.testing.assert_close(stored * (s_init / s_scale(d)), torch.full_like(stored, s_init))
        if cls is LNBertForPreTraining:
            assert torch.equal(sd["cls.predictions.sz"], torch.full((cfg.vocab_size,), d**-0.5))
    # The heads that are not nGPT's keep BERT's init, not the sphere.
    clf = LNBertForSequenceClassification(cfg)
    assert clf.classifier.weight.std().item() == pytest.approx(cfg.initializer_range, rel=0.5)
    assert clf.bert.pooler.dense.weight.std().item() == pytest.approx(cfg.initializer_range, rel=0.2)


# --------------------------------------------------------------------------------------------------
# The invariants over training steps
# --------------------------------------------------------------------------------------------------


def test_every_matrix_and_hidden_state_stays_unit_norm_over_pretraining_steps():
    torch.manual_seed(0)
    model = LNBertForPreTraining(ngpt_config(tie_word_embeddings=False)).train()
    optimizer = build_adamw(model, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01, implementation="for_loop")
    for step in range(4):
        out = model(**pretraining_batch(seed=step), output_hidden_states=True)
        for h in out.hidden_states:
            norms = h.detach().norm(dim=-1)
            torch.testing.assert_close(norms, torch.ones_like(norms), rtol=0, atol=2e-6)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        drifted = largest_norm_error(model)
        model.after_optimizer_step()
        assert drifted > 1e-4  # the step left the sphere, so the re-normalisation is what this checks
        assert_on_sphere(model)
    assert torch.isfinite(out.loss)


def test_every_matrix_stays_unit_norm_over_fine_tuning_steps():
    torch.manual_seed(0)
    model = LNBertForSequenceClassification(ngpt_config(num_labels=3)).train()
    optimizer = build_adamw(model, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, implementation="fused")
    batch = pretraining_batch()
    for step in range(4):
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            labels=torch.tensor([0, 2, step % 3]),
            output_hidden_states=True,
        )
        assert all(torch.allclose(h.detach().norm(dim=-1), torch.ones(()), atol=2e-6) for h in out.hidden_states)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        assert largest_norm_error(model) > 1e-4
        model.after_optimizer_step()
        assert_on_sphere(model)
    # The classifier and the pooler are BERT's heads: not on the sphere, not re-normalised.
    assert (model.classifier.weight.norm(dim=1) - 1).abs().max() > 0.1


def test_renormalisation_through_a_ddp_wrapper_and_under_no_grad(tmp_path):
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        ddp = nn.parallel.DistributedDataParallel(LNBertForPreTraining(ngpt_config()))
        optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-2, weight_decay=0.0)
        ddp(**pretraining_batch()).loss.backward()
        optimizer.step()
        assert largest_norm_error(ddp.module) > 1e-4
        with torch.no_grad():
            normalize_matrices(ddp)  # any wrapper: what ddp.module.after_optimizer_step() runs
        assert_on_sphere(ddp.module)
    finally:
        torch.distributed.destroy_process_group()


def test_after_optimizer_step_changes_nothing_for_other_placements():
    model = LNBertForPreTraining(LNBertConfig(**TINY, norm_placement="pre"))
    before = copy.deepcopy(model.state_dict())
    model.after_optimizer_step()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not model.weight_decay_exempt


# --------------------------------------------------------------------------------------------------
# The eigen learning rates and the scale trick
# --------------------------------------------------------------------------------------------------


def set_alphas(model: nn.Module, attn: float, mlp: float) -> None:
    """Stored values that give the effective |alpha| wanted: stored = alpha * s_scale / s_init."""
    d = model.config.hidden_size
    with torch.no_grad():
        for layer in model.bert.encoder.layer:
            layer.attn_alpha.fill_(attn * d**-0.5 / 0.05)
            layer.mlp_alpha.fill_(mlp * d**-0.5 / 0.05)


def test_effective_alpha_zero_makes_every_block_the_identity():
    cfg = make_config("ngpt")
    model = LNBertForPreTraining(cfg).double().eval()
    perturb(model, seed=2)
    set_alphas(model, 0.0, 0.0)
    ids, mask, tt = make_inputs()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, token_type_ids=tt, output_hidden_states=True)
    for h in out.hidden_states[1:]:
        torch.testing.assert_close(h, out.hidden_states[0], **EXACT)


def test_effective_alpha_one_returns_the_sub_layers_normalised_output():
    """alpha_A = 1, alpha_M = 0: each layer's output is h_A = Norm(Attn(h)); alpha_A = 0, alpha_M = 1: h_M."""
    cfg = make_config("ngpt")
    model = LNBertForPreTraining(cfg).double().eval()
    perturb(model, seed=2)
    ids, mask, tt = make_inputs()
    for attn, mlp in ((1.0, 0.0), (0.0, 1.0)):
        set_alphas(model, attn, mlp)
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, token_type_ids=tt, output_hidden_states=True)
        P, d, nh = Params(model), cfg.hidden_size, cfg.num_attention_heads
        for i in range(cfg.num_hidden_layers):
            h, lp = out.hidden_states[i], f"encoder.layer.{i}."
            if attn:  # h_A from the reference's attention alone
                B, T, _ = h.shape
                q, k, v = (
                    (h @ P.get(f"{lp}attention.self.{n}.weight").T).view(B, T, nh, -1)
                    for n in ("query", "key", "value")
                )
                sqk = (P.get(f"{lp}attention.self.sqk") * d**0.5).view(1, 1, nh, -1)
                scores = torch.einsum("bqhd,bkhd->bhqk", sqk * justnorm(q), sqk * justnorm(k)) * math.sqrt(d // nh)
                probs = scores.masked_fill(~mask.bool()[:, None, None, :], float("-inf")).softmax(-1)
                y = torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(B, T, d)
                want = justnorm(y @ P.get(f"{lp}attention.output.dense.weight").T)
            else:
                u = (h @ P.get(f"{lp}intermediate.dense.weight").T) * P.get(f"{lp}intermediate.su") * d**0.5
                want = justnorm(gelu(u) @ P.get(f"{lp}output.dense.weight").T)
            torch.testing.assert_close(out.hidden_states[i + 1], want, **EXACT)


def test_one_adam_step_moves_each_effective_scaler_by_lr_times_init_over_scale():
    """Adam's first step moves every stored value by lr (m / sqrt(v) = +-1), so the effective one by
    lr * s_init / s_scale (§2.5)."""
    torch.manual_seed(0)
    model = LNBertForPreTraining(ngpt_config())
    d, lr = model.config.hidden_size, 1e-3
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = build_adamw(model, lr=lr, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.1, implementation="for_loop")
    model(**pretraining_batch()).loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    optimizer.step()
    after = model.state_dict()
    layers = range(model.config.num_hidden_layers)
    names = {f"bert.encoder.layer.{i}.{n}": spec for i in layers for n, spec in SCALERS.items()}
    names["cls.predictions.sz"] = SZ
    for key, (s_init, s_scale) in names.items():
        moved = (after[key] - before[key]) * (s_init / s_scale(d))  # the effective value's change
        live = grads[key].abs() > 1e-7  # well above eps: Adam's first step is then lr * sign(g)
        assert live.float().mean() > 0.5, key
        want = lr * s_init / s_scale(d)
        torch.testing.assert_close(moved[live].abs(), torch.full_like(moved[live], want), rtol=1e-3, atol=0, msg=key)


def test_no_weight_decay_anywhere_under_ngpt():
    model = LNBertForSequenceClassification(ngpt_config())
    decay, no_decay = weight_decay_groups(model, 0.01)
    assert decay["params"] == [] and len(no_decay["params"]) == len(list(model.parameters()))
    assert model.weight_decay_exempt


# --------------------------------------------------------------------------------------------------
# Training steps, padding, the classifier
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [2, 24])
def test_a_bf16_autocast_training_step_is_finite(depth):
    torch.manual_seed(0)
    model = LNBertForPreTraining(ngpt_config(num_hidden_layers=depth)).train()
    optimizer = build_adamw(model, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, implementation="for_loop")
    for step in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(**pretraining_batch(seed=step), output_hidden_states=True)
        assert torch.isfinite(out.loss)
        # The stream stays float32 under autocast and on the sphere.
        assert all(h.dtype == torch.float32 for h in out.hidden_states)
        assert all(torch.allclose(h.detach().norm(dim=-1), torch.ones(()), atol=1e-5) for h in out.hidden_states)
        out.loss.backward()
        for key, param in model.named_parameters():
            assert param.grad is not None and torch.isfinite(param.grad).all(), key
            if depth == 2:
                assert param.grad.abs().sum() > 0, f"{key} gets no gradient"
        optimizer.step()
        optimizer.zero_grad()
        model.after_optimizer_step()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert_on_sphere(model)


def test_a_padded_batch_gives_no_nan_and_padding_does_not_leak():
    torch.manual_seed(0)
    model = LNBertForPreTraining(ngpt_config()).eval()
    batch = pretraining_batch()
    assert (batch["input_ids"] == model.config.pad_token_id).any()
    noisy = dict(batch, input_ids=batch["input_ids"].clone())
    noisy["input_ids"][batch["attention_mask"] == 0] = 7
    with torch.no_grad():
        a = model(**batch, output_hidden_states=True)
        b = model(**noisy)
    assert torch.isfinite(a.loss) and all(torch.isfinite(h).all() for h in a.hidden_states)
    assert torch.isfinite(a.prediction_logits).all()
    torch.testing.assert_close(a.loss, b.loss)


def test_a_cls_classifier_trains_on_a_toy_task():
    """Label: whether the first token is in the upper half of the vocabulary; the [CLS] vector (times sqrt(d)) and
    BERT's pooler and classifier read it. The held-out loss falls well below chance in a few dozen steps."""
    torch.manual_seed(0)
    model = LNBertForSequenceClassification(ngpt_config(num_labels=2)).train()
    optimizer = build_adamw(model, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, implementation="for_loop")
    g = torch.Generator().manual_seed(0)

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(1, 99, (n, 9), generator=g)
        return ids, (ids[:, 0] >= 50).long()

    held_ids, held_labels = batch(128)

    def held_out_loss() -> float:
        with torch.no_grad():
            return model.eval()(input_ids=held_ids, labels=held_labels).loss.item()

    start = held_out_loss()
    model.train()
    for _ in range(40):
        ids, labels = batch(32)
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        model.after_optimizer_step()
    assert start == pytest.approx(math.log(2), abs=0.05)
    assert held_out_loss() < 0.4


# --------------------------------------------------------------------------------------------------
# Save / reload, refusals, labels
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_save_and_reload_through_the_auto_classes_is_bit_identical(tied, tmp_path):
    torch.manual_seed(0)
    model = LNBertForPreTraining(ngpt_config(tie_word_embeddings=tied)).eval()
    perturb(model, seed=4)  # every parameter off its init, so that a re-initialised or re-normalised one shows
    model.save_pretrained(tmp_path)
    loaded = AutoModelForPreTraining.from_pretrained(tmp_path).eval()
    assert type(loaded) is LNBertForPreTraining and loaded.config.norm_placement == "ngpt"
    saved, got = model.state_dict(), loaded.state_dict()
    assert saved.keys() == got.keys()
    assert all(torch.equal(saved[k], got[k]) for k in saved), [k for k in saved if not torch.equal(saved[k], got[k])]
    assert (loaded.cls.predictions.decoder.weight is loaded.bert.embeddings.word_embeddings.weight) == tied
    batch = pretraining_batch()
    with torch.no_grad():
        a, b = model(**batch), loaded(**batch)
    assert torch.equal(a.prediction_logits, b.prediction_logits)
    assert torch.equal(a.seq_relationship_logits, b.seq_relationship_logits)
    mlm = AutoModelForMaskedLM.from_pretrained(tmp_path)
    assert isinstance(mlm, LNBertForMaskedLM)
    assert all(torch.equal(v, saved[f"bert.{k}"]) for k, v in mlm.bert.state_dict().items())
    clf = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=2)
    assert isinstance(clf, LNBertForSequenceClassification)
    assert all(torch.equal(v, saved[f"bert.{k}"]) for k, v in clf.bert.state_dict().items())


@pytest.mark.parametrize(("saved", "loaded"), [("ngpt", "pre"), ("pre", "ngpt"), ("post", "ngpt")])
def test_loading_into_another_placement_is_refused(tmp_path, saved, loaded):
    LNBertForPreTraining(LNBertConfig(**TINY, norm_placement=saved)).save_pretrained(tmp_path)
    message = f"norm_placement='{loaded}' (trained with '{saved}')"
    for cls in (LNBertForPreTraining, AutoModelForPreTraining):
        with pytest.raises(ValueError, match=re.escape(message)):
            cls.from_pretrained(tmp_path, norm_placement=loaded)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"norm_type": "rmsnorm"}, "norm_type='rmsnorm' does not apply to norm_placement='ngpt'"),
        ({"qk_norm": True}, "nGPT normalises each head's queries and keys itself"),
        ({"embedding_layer_norm": False}, "leave embedding_layer_norm at its default (True"),
        ({"residual_scheme": "hc"}, "residual_scheme='hc' needs norm_placement='pre' (got 'ngpt')"),
    ],
)
def test_options_that_name_a_norm_are_refused(settings, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ngpt_config(**settings)


def test_variant_label():
    assert variant_name("ngpt") == "ngpt"


# --------------------------------------------------------------------------------------------------
# Measurements and parameter counts
# --------------------------------------------------------------------------------------------------


def test_stats_read_the_invariants_and_the_effective_scalers():
    torch.manual_seed(0)
    model = LNBertForPreTraining(ngpt_config())
    out = model(**pretraining_batch(), output_hidden_states=True)
    stats = ngpt_stats(model, out.hidden_states)
    assert stats.weight_norm_error < 1e-6 and stats.hidden_norm_error < 1e-6
    torch.testing.assert_close(stats.attn_alpha, torch.full((2,), 0.05))
    torch.testing.assert_close(stats.sqk, torch.ones(2))
    assert stats.sz == pytest.approx(1.0)
    out.loss.backward()
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    assert ngpt_stats(model).weight_norm_error > 1e-3  # off the sphere until after_optimizer_step
    model.after_optimizer_step()
    assert ngpt_stats(model).weight_norm_error < 1e-6
    assert set(stats.scalars()) == {
        "weight_norm_error", "hidden_norm_error", "sz",
        *(f"{n}/{i:02d}" for n in ("attn_alpha", "mlp_alpha", "sqk", "su") for i in range(2)),
    }  # fmt: skip
    with pytest.raises(ValueError, match="no nGPT matrices"):
        ngpt_stats(LNBertForPreTraining(LNBertConfig(**TINY, norm_placement="pre")))


def bert_base_count(cls, **settings) -> int:
    config = LNBertConfig(vocab_size=30522, **settings)
    with torch.device("meta"):
        return sum(p.numel() for p in cls(config).parameters())


def test_parameter_counts_at_bert_base():
    """docs/placements.md, "nGPT": against Post-LN, per layer 4 LayerNorm-free scalers (3 d + d_ff) in, two
    LayerNorms and 4 d + d_ff + d biases out; the embedding LayerNorm, the MLM transform and the decoder bias out,
    s_z in."""
    d, ff, L, V = 768, 3072, 12, 30522
    post, ngpt = bert_base_count(LNBertModel), bert_base_count(LNBertModel, norm_placement="ngpt")
    assert post == 109_482_240 and ngpt == 109_425_408
    assert ngpt - post == L * (3 * d + ff) - 2 * d - L * (2 * 2 * d + 5 * d + ff)
    full = bert_base_count(LNBertForPreTraining, norm_placement="ngpt")
    assert full == 109_457_468
    assert full - ngpt == V + 2 * d + 2  # s_z, NSP head (the decoder is tied)
    untied = bert_base_count(LNBertForPreTraining, norm_placement="ngpt", tie_word_embeddings=False)
    assert untied - full == V * d == 23_440_896
