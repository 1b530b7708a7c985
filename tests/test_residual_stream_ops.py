"""The residual schemes' stream operations (pretrain/residual_streams.py) against a frozen copy of their plain form,
the straightforward per-op code they replaced: outputs and every parameter's gradient, float64 with perturbed
parameters (equal to round-off, 1e-12), and under bf16 autocast (to bf16's tolerance).

The frozen copy (``Plain*`` below) reads the model's own parameters and runs the model's own sub-layers, embeddings
and final norm, so a difference can only come from the stream operations: how the state is laid out, fused,
recomputed in the backward or compiled. The papers' equations are checked separately, forward only, in
tests/test_residual_schemes.py.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers.masking_utils import create_bidirectional_mask

from pretrain.modeling import LNBertModel
from pretrain.norms import DyT, RMSNorm, SeeDNorm
from pretrain.residual_streams import normalized_projection
from tests.test_placement_reference import make_inputs, perturb
from tests.test_residual_schemes import scheme_config

# --------------------------------------------------------------------------------------------------
# The frozen plain form (the stream operations before fusion), over the model's modules
# --------------------------------------------------------------------------------------------------


def plain_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def plain_sinkhorn(logits: torch.Tensor, iters: int) -> torch.Tensor:
    m = torch.exp((logits - logits.detach().amax(dim=(-2, -1), keepdim=True)).clamp(min=-60.0))
    for _ in range(iters):
        m = m / m.sum(dim=-2, keepdim=True)
        m = m / m.sum(dim=-1, keepdim=True)
    return m


def plain_mappings(module, state: torch.Tensor):
    """H_pre (..., n), H_post (..., n), H_res (..., n, n) of an HC or mHC module."""
    if module.__class__.__name__ == "HyperConnection":
        alpha, beta = module.static_alpha, module.static_beta
        if module.dynamic:
            with torch.autocast(state.device.type, enabled=False):
                normed = module.norm(state).to(state.dtype)
                alpha = alpha + module.dynamic_alpha_scale * torch.tanh(normed @ module.dynamic_alpha_fn)
                beta = beta + module.dynamic_beta_scale * torch.tanh((normed * module.dynamic_beta_fn).sum(-1))
        return alpha[..., 0], beta, alpha[..., 1:].transpose(-1, -2)
    n = module.streams
    with torch.autocast(state.device.type, enabled=False):
        x = plain_rms(state.flatten(-2), 1e-20)
        phi = torch.cat([module.phi_pre, module.phi_post, module.phi_res], dim=1).to(x.dtype)
        pre, post, res = (x @ phi).split([n, n, n * n], dim=-1)
        h_pre = torch.sigmoid(module.alpha_pre * pre + module.b_pre)
        h_post = 2 * torch.sigmoid(module.alpha_post * post + module.b_post)
        h_res = plain_sinkhorn(module.alpha_res * res.unflatten(-1, (n, n)) + module.b_res, module.sinkhorn_iters)
    return h_pre, h_post, h_res


def plain_mix(module, state: torch.Tensor, sublayer) -> torch.Tensor:
    """x <- H_res x + H_post^T F(H_pre x), the n streams ``state`` (B, T, n, d)."""
    h_pre, h_post, h_res = plain_mappings(module, state)
    with torch.autocast(state.device.type, enabled=False):
        weights = torch.cat([h_pre.unsqueeze(-2), h_res], dim=-2).to(state.dtype)
        mixed = torch.einsum("...kj,...jd->...kd", weights, state)
    out = sublayer(mixed[..., 0, :])
    with torch.autocast(state.device.type, enabled=False):
        return mixed[..., 1:, :] + h_post.unsqueeze(-1).to(state.dtype) * out.unsqueeze(-2).to(state.dtype)


def plain_aggregate(module, values: list[torch.Tensor], keys: list[torch.Tensor]) -> torch.Tensor:
    """AttnRes: the sources weighted by the softmax over depth of w^T key."""
    with torch.autocast(values[0].device.type, enabled=False):
        logits = torch.stack([(key * module.pseudo_query.to(key.dtype)).sum(-1) for key in keys])
        weights = logits.softmax(dim=0)
        h = weights[0].unsqueeze(-1) * values[0]
        for weight, value in zip(weights[1:], values[1:], strict=True):
            h = h + weight.unsqueeze(-1) * value
    return h


def plain_encoder(model: LNBertModel, input_ids, attention_mask, token_type_ids):
    """(last_hidden_state, hidden_states) of ``model`` with the plain stream operations."""
    config, encoder = model.config, model.encoder
    x = model.embeddings(input_ids, token_type_ids)
    mask = create_bidirectional_mask(config=config, inputs_embeds=x, attention_mask=attention_mask)
    hidden, eps = [x], config.layer_norm_eps
    if config.residual_scheme == "attn_res":
        size = config.attn_res_block_size or 1
        values, keys, partial, filled = [x], [plain_rms(x, eps)], None, 0
        for layer in encoder.layer:
            subs = [
                (layer.attention_residual, lambda h, layer=layer: layer.attend(layer.norm_a(h), mask)[0]),
                (layer.ffn_residual, lambda h, layer=layer: layer.feed_forward(layer.norm_f(h))),
            ]
            for module, sublayer in subs:
                extra = [] if partial is None else [partial]
                h = plain_aggregate(module, values + extra, keys + [plain_rms(p, eps) for p in extra])
                out = sublayer(h).to(x.dtype)
                partial, filled = (out if partial is None else partial + out), filled + 1
                if filled == size:
                    values, keys, partial, filled = [*values, partial], [*keys, plain_rms(partial, eps)], None, 0
            hidden.append(sum(values[1:] + ([] if partial is None else [partial]), values[0]))
        extra = [] if partial is None else [partial]
        out = plain_aggregate(encoder.output_residual, values + extra, keys + [plain_rms(p, eps) for p in extra])
    else:
        state = x.unsqueeze(-2).expand(*x.shape[:-1], config.hc_streams, x.shape[-1])
        for layer in encoder.layer:
            state = plain_mix(
                layer.attention_residual, state, lambda h, layer=layer: layer.attend(layer.norm_a(h), mask)[0]
            )
            state = plain_mix(layer.ffn_residual, state, lambda h, layer=layer: layer.feed_forward(layer.norm_f(h)))
            hidden.append(state.sum(dim=-2))
        out = state.sum(dim=-2)
    last = encoder.final_layer_norm(out)
    return last, (*hidden[:-1], last)


# --------------------------------------------------------------------------------------------------
# Outputs and gradients, the model's against the plain form's
# --------------------------------------------------------------------------------------------------


def outputs_and_gradients(model: LNBertModel, plain: bool, autocast: bool = False):
    """The hidden states and every parameter's gradient of a fixed random projection of them."""
    ids, mask, tt = make_inputs()
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        if plain:
            hidden = plain_encoder(model, ids, mask, tt)[1]
        else:
            hidden = model(
                input_ids=ids, attention_mask=mask, token_type_ids=tt, output_hidden_states=True
            ).hidden_states
    gen = torch.Generator().manual_seed(0)
    loss = sum((h * torch.randn(h.shape, generator=gen, dtype=torch.float64).to(h.dtype)).sum() for h in hidden)
    loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return [h.detach() for h in hidden], grads


def compare(model: LNBertModel, autocast: bool):
    """(the model's, the plain form's) hidden states and gradients."""
    want = outputs_and_gradients(model, plain=True, autocast=autocast)
    got = outputs_and_gradients(model, plain=False, autocast=autocast)
    assert len(got[0]) == len(want[0]) and got[1].keys() == want[1].keys()
    return got, want


# Every scheme kind, its corner cases (one stream; Block AttnRes with an odd block size, and one whose last block is
# partial); DHC with each norm type, the only norm inside the stream operations.
CASES = [(name, "layernorm") for name in ("shc4", "shc1", "hc4", "hc1", "mhc4", "mhc1", "attnres", "attnres-b2",
                                          "attnres-b3", "attnres-b4")] + [("hc4", "rmsnorm"), ("hc4", "dyt")]  # fmt: skip


@pytest.mark.parametrize(("name", "norm_type"), CASES)
def test_float64_outputs_and_gradients_are_the_plain_forms(name, norm_type):
    torch.manual_seed(0)
    model = LNBertModel(scheme_config(name, norm_type)).double().train()  # dropout 0: train mode, deterministic
    perturb(model, seed=5)
    (got_hidden, got_grads), (want_hidden, want_grads) = compare(model, autocast=False)
    for j, (got, want) in enumerate(zip(got_hidden, want_hidden, strict=True)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=lambda m, j=j: f"hidden_states[{j}]: {m}")
    for key, want in want_grads.items():
        torch.testing.assert_close(got_grads[key], want, rtol=1e-12, atol=1e-12, msg=lambda m, key=key: f"{key}: {m}")


@pytest.mark.parametrize("name", ["shc4", "hc4", "mhc4", "attnres", "attnres-b2"])
def test_bf16_autocast_outputs_and_gradients_are_the_plain_forms(name):
    """To bf16's precision: the sub-layers round to bf16, so a float32 difference of the order of its rounding in
    the state can round a sub-layer's input the other way; the gradient, through the bf16 sub-layers, to 1% of its
    norm, in every parameter (some gradients, such as the attention's key bias, are 0 but for that rounding)."""
    torch.manual_seed(0)
    model = LNBertModel(scheme_config(name)).train()
    perturb(model, seed=5)
    (got_hidden, got_grads), (want_hidden, want_grads) = compare(model, autocast=True)
    for j, (got, want) in enumerate(zip(got_hidden, want_hidden, strict=True)):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2, msg=lambda m, j=j: f"hidden_states[{j}]: {m}")
    norm = torch.cat([g.flatten() for g in want_grads.values()]).norm()
    errors = {key: float((got_grads[key] - want).norm() / norm) for key, want in want_grads.items()}
    assert max(errors.values()) < 1e-2, sorted(errors.items(), key=lambda kv: -kv[1])[:3]


@pytest.mark.parametrize("norm", [torch.nn.LayerNorm(48), RMSNorm(48, eps=1e-6)], ids=["layernorm", "rmsnorm"])
def test_normalized_projection_is_the_norms_output_projected(norm):
    """DHC's dynamic weights project norm(H) without forming it (the statistics divide after the matmul): the value
    and the gradients of x, the projection and the norm's parameters equal autograd's through ``norm`` itself, to
    round-off in float64; in float32, with rows whose mean is 30 times their spread (the centring after the matmul
    loses digits to cancellation there), within 1e-5 of each result's largest entry (plain float32: 3e-6)."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in norm.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    x = torch.randn(3, 5, 4, 48, generator=gen, dtype=torch.float64)
    x = x + 30 * torch.randn(3, 5, 4, 1, generator=gen, dtype=torch.float64)
    projection = torch.randn(6, 48, generator=gen, dtype=torch.float64) / 7
    g = torch.randn(3, 5, 4, 6, generator=gen, dtype=torch.float64)

    def value_and_grads(dtype, project):
        module = copy.deepcopy(norm).to(dtype)
        leaves = [x.to(dtype).requires_grad_(), projection.to(dtype).requires_grad_()]
        out = project(module, *leaves)
        grads = torch.autograd.grad(out, [*leaves, *module.parameters()], g.to(dtype))
        return [t.double() for t in (out, *grads)]

    want = value_and_grads(torch.float64, lambda module, x, w: torch.nn.functional.linear(module(x), w))
    names = ["value", "x", "projection", "weight", "bias"][: len(want)]  # RMSNorm has no bias
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        got = value_and_grads(dtype, normalized_projection)
        for name, a, b in zip(names, got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=tol * float(b.detach().abs().max()), msg=lambda m, n=name: f"{n}: {m}")


def test_a_norm_that_is_not_a_statistic_times_a_gain_is_not_folded():
    """SeeDNorm's gain depends on x and DyT has no statistic: DHC projects their output, recomputed in backward."""
    x, projection = torch.randn(2, 4, 48), torch.randn(6, 48)
    assert normalized_projection(SeeDNorm(48, eps=1e-6), x, projection) is None
    assert normalized_projection(DyT(48, alpha_init=0.5), x, projection) is None


def test_a_layernorm_without_gain_or_bias_is_folded_as_itself():
    x, projection = torch.randn(2, 3, 4, 16, dtype=torch.float64), torch.randn(6, 16, dtype=torch.float64)
    norm = torch.nn.LayerNorm(16, elementwise_affine=False).double()
    want = torch.nn.functional.linear(norm(x), projection)
    torch.testing.assert_close(normalized_projection(norm, x, projection), want, rtol=1e-12, atol=1e-12)
