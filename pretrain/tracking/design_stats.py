"""What a logged training step measures inside the layers, for the claims of docs/placements.md: forward hooks on one
forward pass (the step's own; for a compiled model one of their own, without gradients), with the residual scheme's
recorder on the same pass (``measuring``), reduced over the batch's
real tokens, and the designs' learned scalars. Names, LL a layer, KK a sub-layer (2 LL its attention, 2 LL + 1 its FFN):

    hidden/variance/LL        variance over the width of the stream layer LL outputs, mean over tokens (GPAS: Pre-LN's
                              grows with depth)
    hidden/absmax/LL          the largest |value| in that stream over the real tokens (gated attention: the massive
                              activations it removes)
    hidden/token_similarity/LL  the mean cosine similarity of two distinct real tokens of a sequence in that stream,
                              mean over sequences (value residuals: over-smoothing)
    attention/first_token/LL  attention probability on position 0 ([CLS]), mean over heads and real queries, over the
                              real keys (gated attention: the sink it removes)
    attention/sep/LL          the same on the [SEP] tokens together (BERT's other sink), where the caller names them
    attention/value_norm/LL   the mean over real tokens of ||x W_V + b_V||, the layer's own values (value residuals)
    attention/entropy/LL      entropy (nats) of each key's attention summed over the real queries, heads averaged,
                              mean over sequences (ResFormer's concentration metric, its analyze/get_entropy.py)
    attention/top_key/LL      the largest of those shares, mean over sequences: a sink wherever it is ([SEP] too)
    attention/gate/LL         gated attention's mean gate sigmoid(x W + b) (its sparsity)
    attention/gate_head/LL/HH the same per head HH
    preact/absmax/KK          the largest |z| of sub-layer KK's norm's pre-activation z (DyT, Derf: per element alpha x
                              (+ shift); SeeDNorm: per token <x, beta>)
    preact/saturated/KK       the fraction of those with |z| > 2 (tanh 0.964, erf 0.995: flat)
    gpas/scale/LL             GPAS's forward scale 1 - SiLU(g)
    seednorm/alpha_norm/KK    the norm ||alpha|| of sub-layer KK's SeeDNorm (0 would leave RMSNorm)
    value_residual/lambda1/LL, .../lambda2/LL   learned value residual's mixing weights

nGPT's layers are left out (their invariants are its placement's ``step_stats``); so is a stream that is not one
(B, T, d) tensor (ResiDual's pair, a residual scheme's state).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.hooks import RemovableHandle

from pretrain.attention import project_qkv
from pretrain.modeling import LNBertLayer
from pretrain.norms import GPAS, SeeDNorm
from pretrain.residual_streams import ResidualStats, recording

SATURATED = 2.0  # |z| past which tanh and erf are flat


@dataclass
class DesignProbe:
    """The measurements of one forward pass, as 0-d tensors until ``stats`` reads them all at once."""

    token_mask: torch.Tensor  # (B, T), True at real tokens
    sep_mask: torch.Tensor | None = None  # (B, T), True at [SEP]; None: not measured
    found: dict[str, torch.Tensor] = field(default_factory=dict)

    def stats(self) -> dict[str, float]:
        values = torch.stack([v.float().reshape(()) for v in self.found.values()]).tolist() if self.found else []
        return dict(zip(self.found, values, strict=True))

    def watch(self, module: nn.Module, measure: Callable[..., dict[str, torch.Tensor]]) -> RemovableHandle:
        """Record ``measure(module, inputs, output)`` at each forward of ``module``, without gradients or autocast."""

        def hook(module: nn.Module, inputs: tuple, output: object) -> None:
            with torch.no_grad(), torch.autocast(self.token_mask.device.type, enabled=False):
                self.found.update(measure(module, inputs, output))

        return module.register_forward_hook(hook)

    def stream(self, index: int, output: tuple) -> dict[str, torch.Tensor]:
        stream = output[0]
        if not (isinstance(stream, torch.Tensor) and stream.dim() == 3):
            return {}
        stream = stream.float()
        real = stream[self.token_mask]  # (M, d)
        # Over the pairs i != j of a sequence's n real tokens: (||sum_i u_i||^2 - n) / (n (n - 1)), u_i unit vectors.
        units = F.normalize(stream, dim=-1) * self.token_mask[..., None]
        n = self.token_mask.sum(-1).float()
        pairs = ((units.sum(1) ** 2).sum(-1) - n) / (n * (n - 1)).clamp_min(1)
        return {f"hidden/variance/{index:02d}": real.var(-1, unbiased=False).mean(),
                f"hidden/absmax/{index:02d}": real.abs().amax(),
                f"hidden/token_similarity/{index:02d}": pairs[n > 1].mean()}  # fmt: skip

    def attention_mass(self, index: int, attention: nn.Module, h: torch.Tensor) -> dict[str, torch.Tensor]:
        """The softmax weight on key 0, and the entropy and largest of the shares the keys receive, from the
        attention's own Q and K (any attention kernel: SDPA returns no probabilities)."""
        h = h.to(attention.query.weight.dtype)
        q, k = project_qkv(h, (attention.query, attention.key), attention.head_size, fused=False)
        q, k = attention.query_norm(q), attention.key_norm(k)  # (B, nh, T, hs)
        scores = (q @ k.transpose(-1, -2)) * attention.scaling
        scores = scores.masked_fill(~self.token_mask[:, None, None, :], float("-inf"))
        probs = scores.softmax(-1).mean(1)  # (B, T queries, T keys), mean over heads
        received = (probs * self.token_mask[:, :, None]).sum(1)  # (B, T keys): summed over the real queries
        shares = received / received.sum(-1, keepdim=True)
        values = attention.value(h).float().norm(dim=-1)  # (B, T): the layer's own values, before any mixing
        found = {f"attention/first_token/{index:02d}": probs[..., 0][self.token_mask].mean(),
                 f"attention/entropy/{index:02d}": torch.special.entr(shares).sum(-1).mean(),
                 f"attention/top_key/{index:02d}": shares.amax(-1).mean(),
                 f"attention/value_norm/{index:02d}": values[self.token_mask].mean()}  # fmt: skip
        if self.sep_mask is not None:
            found[f"attention/sep/{index:02d}"] = (probs * self.sep_mask[:, None, :]).sum(-1)[self.token_mask].mean()
        return found

    def preactivation(self, k: int, norm: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
        z = norm.preactivation(x).float()[self.token_mask].abs()
        return {f"preact/absmax/{k:02d}": z.amax(), f"preact/saturated/{k:02d}": (z > SATURATED).float().mean()}

    def gate(self, index: int, out: torch.Tensor, heads: int) -> dict[str, torch.Tensor]:
        """Gated attention's gates over the real tokens (M, width): their mean, and per head (elementwise: d_h each)."""
        gates = torch.sigmoid(out.float())[self.token_mask]
        by_head = gates.reshape(len(gates), heads, -1).mean((0, 2))
        return {f"attention/gate/{index:02d}": gates.mean(),
                **{f"attention/gate_head/{index:02d}/{h:02d}": value for h, value in enumerate(by_head)}}

    def parameters(self, index: int, layer: LNBertLayer) -> None:
        for k, norm in ((2 * index, layer.norm_a), (2 * index + 1, layer.norm_f)):
            if isinstance(norm, SeeDNorm):
                self.found[f"seednorm/alpha_norm/{k:02d}"] = norm.alpha.detach().norm()
        if isinstance(layer.gpas, GPAS):
            self.found[f"gpas/scale/{index:02d}"] = 1 - F.silu(layer.gpas.gate.detach())
        if (mix := layer.attention.self.value_lambda) is not None:
            for j, value in enumerate(mix.weight.detach()):
                self.found[f"value_residual/lambda{j + 1}/{index:02d}"] = value


def where_token(input_ids: torch.Tensor, token_id: int | None) -> torch.Tensor | None:
    """(B, T) True where ``input_ids`` is ``token_id``; None for a tokenizer without that token."""
    return None if token_id is None else input_ids == token_id


@contextmanager
def probing(model: nn.Module, token_mask: torch.Tensor, sep_mask: torch.Tensor | None = None) -> Iterator[DesignProbe]:
    """Measure one forward pass of ``model`` (``with probing(model, batch["attention_mask"]) as probe: model(**batch)``,
    then ``probe.stats()``); ``token_mask`` (B, T) keeps padding out of every mean and maximum; ``sep_mask`` (B, T)
    names the [SEP] tokens."""
    probe = DesignProbe(token_mask.bool(), None if sep_mask is None else sep_mask.bool())
    handles = []
    for i, layer in enumerate(model.base_model.encoder.layer):
        if not isinstance(layer, LNBertLayer):
            continue
        probe.parameters(i, layer)
        attention = layer.attention.self
        handles.append(probe.watch(layer, lambda m, args, out, i=i: probe.stream(i, out)))
        handles.append(probe.watch(attention, lambda m, args, out, i=i: probe.attention_mass(i, m, args[0])))
        if attention.gate is not None:
            heads = model.config.num_attention_heads
            handles.append(probe.watch(attention.gate, lambda m, args, out, i=i, h=heads: probe.gate(i, out, h)))
        for k, norm in ((2 * i, layer.norm_a), (2 * i + 1, layer.norm_f)):
            if hasattr(norm, "preactivation"):
                handles.append(probe.watch(norm, lambda m, args, out, k=k: probe.preactivation(k, m, args[0])))
    try:
        yield probe
    finally:
        for handle in handles:
            handle.remove()


@dataclass(frozen=True)
class LayerMeasurement:
    """What one forward pass showed: the residual scheme's recorder (None for the standard scheme) and the probes."""

    residual: ResidualStats | None
    design: dict[str, float]


@contextmanager
def measuring(model: nn.Module, token_mask: torch.Tensor,
              sep_mask: torch.Tensor | None = None) -> Iterator[Callable[[], LayerMeasurement]]:  # fmt: skip
    """The residual scheme's ``recording`` (where the model has one) and ``probing`` on one forward pass:
    ``with measuring(model, batch["attention_mask"]) as measured: model(**batch)``, then ``measured()``."""
    scheme = model.config.scheme.module
    with (recording(model, token_mask) if scheme else nullcontext() as recorder,
          probing(model, token_mask, sep_mask) as probe):  # fmt: skip
        yield lambda: LayerMeasurement(recorder.stats() if recorder is not None else None, probe.stats())


@torch.no_grad()
def measure(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
            token_type_ids: torch.Tensor | None = None, sep_token_id: int | None = None) -> LayerMeasurement:  # fmt: skip
    """``measuring`` one forward pass of ``model``'s encoder in eval mode (no dropout), without gradients: a compiled
    model's log step, whose own forward is not hooked. The caller's autocast applies; the model's mode is restored."""
    sep_mask = where_token(input_ids, sep_token_id)
    was_training = model.training
    model.eval()
    try:
        with measuring(model, attention_mask, sep_mask) as measured:
            model.base_model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, pool=False)
    finally:
        model.train(was_training)
    return measured()
