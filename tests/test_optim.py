"""AdamW: weight-decay groups chosen by module type, each parameter once; one builder for every kernel."""

from __future__ import annotations

import copy

import pytest
import torch

from pretrain.modeling import LNBertConfig, LNBertForPreTraining
from pretrain.optim import build_adamw, weight_decay_groups


def test_no_decay_on_every_norm_and_bias_and_tied_weights_once(tiny_kwargs):
    model = LNBertForPreTraining(LNBertConfig(norm_placement="sandwich", **tiny_kwargs))
    decay, no_decay = weight_decay_groups(model, 0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}  # tied weights listed once
    decayed = {names[id(p)] for p in decay["params"]}
    exempt = {names[id(p)] for p in no_decay["params"]}
    assert len(decay["params"]) + len(no_decay["params"]) == len(names)
    # Norms named in ways a "LayerNorm.weight" substring rule would miss:
    assert {"bert.encoder.final_layer_norm.weight", "bert.encoder.layer.0.output.branch_norm.weight"} <= exempt
    assert all(n.endswith("bias") or "norm" in n.lower() for n in exempt)
    assert "bert.embeddings.word_embeddings.weight" in decayed
    assert all(n.endswith("weight") and "norm" not in n.lower() for n in decayed)


def test_frozen_parameters_are_left_out(tiny_kwargs):
    model = LNBertForPreTraining(LNBertConfig(**tiny_kwargs))
    model.bert.embeddings.position_embeddings.weight.requires_grad_(False)
    groups = weight_decay_groups(model, 0.01)
    frozen = model.bert.embeddings.position_embeddings.weight
    assert all(p is not frozen for g in groups for p in g["params"])
    torch.optim.AdamW(groups, lr=1e-3)  # a valid optimizer


@pytest.mark.parametrize("implementation", ["auto", "fused", "foreach", "for_loop"])
def test_build_adamw_kernels_take_the_same_step(tiny_kwargs, implementation):
    """One builder for pretraining, fine-tuning and the benchmarks: every kernel, the settings as given."""
    torch.manual_seed(0)
    model = LNBertForPreTraining(LNBertConfig(**tiny_kwargs))
    reference = copy.deepcopy(model)
    settings = dict(lr=1e-2, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    steps = []
    for net, impl in ((model, implementation), (reference, "for_loop")):
        optimizer = build_adamw(net, **settings, implementation=impl)
        assert optimizer.defaults["betas"] == (0.9, 0.98) and optimizer.defaults["eps"] == 1e-6
        assert [g["weight_decay"] for g in optimizer.param_groups] == [0.01, 0.0]
        net.bert.embeddings.word_embeddings.weight.sum().backward()
        optimizer.step()
        steps.append(net.bert.embeddings.word_embeddings.weight.detach())
    torch.testing.assert_close(steps[0], steps[1])


def test_build_adamw_rejects_an_unknown_kernel(tiny_kwargs):
    model = LNBertForPreTraining(LNBertConfig(**tiny_kwargs))
    with pytest.raises(ValueError, match=r"'loop' is not valid; valid choices: auto, fused, foreach, for_loop"):
        build_adamw(model, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, implementation="loop")
