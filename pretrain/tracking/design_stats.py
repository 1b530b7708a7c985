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
    attention/max_logit/LL    the largest attention logit q.k / sqrt(d_h) over the real query-key pairs and heads (QK-norm:
                              the logit growth it prevents)
    attention/first_token/LL  attention probability on position 0 ([CLS]), mean over heads and real queries, over the
                              real keys (gated attention: the sink it removes)
    attention/sep/LL          the same on the [SEP] tokens together (BERT's other sink), where the caller names them
    attention/value_norm/LL   the mean over real tokens of ||x W_V + b_V||, the layer's own values (value residuals)
    attention/entropy/LL      entropy (nats) of each key's attention summed over the real queries, heads averaged,
                              mean over sequences (ResFormer's concentration metric, its analyze/get_entropy.py)
    attention/top_key/LL      the largest of those shares, mean over sequences: a sink wherever it is ([SEP] too)
    attention/gate/LL         gated attention's mean gate sigmoid(x W + b) (its sparsity)
    attention/gate_head/LL/HH the same per head HH
    attention/gate_histogram/LL  the gates' histogram over [0, 1] (its sparsity), metrics.jsonl only
    branch/ratio/KK           ||F|| / ||skip|| per real token, mean: what sub-layer KK adds to the stream over what its
                              skip adds (GPAS: ||F(LN(x))|| / ||x||, the skip dominating deep layers); Post-LN's and
                              Pre-LN's blocks and those built on them, where the sum is F + skip
    preact/absmax/KK          the largest |z| of sub-layer KK's norm's pre-activation z (DyT, Derf: per element alpha x
                              (+ shift); SeeDNorm: per token <x, beta>)
    preact/saturated/KK       the fraction of those with |z| > 2 (tanh 0.964, erf 0.995: flat)
    preact/histogram/KK       the histogram of the squashed tanh(z) or erf(z) over [-1, 1] (SeeDNorm: unused near 0,
                              saturated near +-1), metrics.jsonl only
    norm/alpha/KK, norm/shift/KK  DyT's and Derf's learned scalars of sub-layer KK's norm
    gpas/scale/LL             GPAS's forward scale 1 - SiLU(g); a gate g past 1.2 is an alarm (``gpas_alarms``)
    rezero/gate/LL            ReZero's gate
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
from pretrain.norms import GPAS, DyT, SeeDNorm
from pretrain.residual_streams import ResidualStats, recording

SATURATED = 2.0  # |z| past which tanh and erf are flat
HISTOGRAM_BINS = 10  # of a histogram in metrics.jsonl: the fraction of the values in each of 10 equal bins
GPAS_GATE_ALARM = 1.2  # docs/placements.md: GPAS's gate past it is an alarm (its scale 1 - SiLU(g) below 0.077)


@dataclass
class DesignProbe:
    """The measurements of one forward pass, as 0-d tensors until ``stats`` reads them all at once."""

    token_mask: torch.Tensor  # (B, T), True at real tokens
    sep_mask: torch.Tensor | None = None  # (B, T), True at [SEP]; None: not measured
    found: dict[str, torch.Tensor] = field(default_factory=dict)
    histograms: dict[str, torch.Tensor] = field(default_factory=dict)  # (HISTOGRAM_BINS,) fractions
    norms: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)  # sub-layer's per-token norms, until paired

    def stats(self) -> dict[str, float]:
        values = torch.stack([v.float().reshape(()) for v in self.found.values()]).tolist() if self.found else []
        return dict(zip(self.found, values, strict=True))

    def histogram_lists(self) -> dict[str, list[float]]:
        return {key: value.tolist() for key, value in self.histograms.items()}

    def histogram(self, key: str, values: torch.Tensor, low: float, high: float) -> None:
        self.histograms[key] = torch.histc(values.float(), HISTOGRAM_BINS, low, high) / max(values.numel(), 1)

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
        largest = scores.float().amax((1, 3))[self.token_mask].amax()  # over heads, real keys, then real queries
        probs = scores.softmax(-1).mean(1)  # (B, T queries, T keys), mean over heads
        received = (probs * self.token_mask[:, :, None]).sum(1)  # (B, T keys): summed over the real queries
        shares = received / received.sum(-1, keepdim=True)
        values = attention.value(h).float().norm(dim=-1)  # (B, T): the layer's own values, before any mixing
        found = {f"attention/max_logit/{index:02d}": largest,
                 f"attention/first_token/{index:02d}": probs[..., 0][self.token_mask].mean(),
                 f"attention/entropy/{index:02d}": torch.special.entr(shares).sum(-1).mean(),
                 f"attention/top_key/{index:02d}": shares.amax(-1).mean(),
                 f"attention/value_norm/{index:02d}": values[self.token_mask].mean()}  # fmt: skip
        if self.sep_mask is not None:
            found[f"attention/sep/{index:02d}"] = (probs * self.sep_mask[:, None, :]).sum(-1)[self.token_mask].mean()
        return found

    def preactivation(self, k: int, norm: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
        z = norm.preactivation(x).float()[self.token_mask]
        self.histogram(f"preact/histogram/{k:02d}", norm.squash(z), -1.0, 1.0)
        z = z.abs()
        return {f"preact/absmax/{k:02d}": z.amax(), f"preact/saturated/{k:02d}": (z > SATURATED).float().mean()}

    def update_ratio(self, k: int, part: str, out: torch.Tensor) -> dict[str, torch.Tensor]:
        """``branch/ratio/KK`` once sub-layer ``k``'s two summands have been seen, its branch's output and its skip's
        (``part``), in either order."""
        self.norms[k, part] = out.float().norm(dim=-1)[self.token_mask]
        if (k, "branch") not in self.norms or (k, "skip") not in self.norms:
            return {}
        branch, skip = self.norms.pop((k, "branch")), self.norms.pop((k, "skip"))
        return {f"branch/ratio/{k:02d}": (branch / skip.clamp_min(torch.finfo(torch.float32).tiny)).mean()}

    def gate(self, index: int, out: torch.Tensor, heads: int) -> dict[str, torch.Tensor]:
        """Gated attention's gates over the real tokens (M, width): their mean, and per head (elementwise: d_h each)."""
        gates = torch.sigmoid(out.float())[self.token_mask]
        self.histogram(f"attention/gate_histogram/{index:02d}", gates, 0.0, 1.0)
        by_head = gates.reshape(len(gates), heads, -1).mean((0, 2))
        return {f"attention/gate/{index:02d}": gates.mean(),
                **{f"attention/gate_head/{index:02d}/{h:02d}": value for h, value in enumerate(by_head)}}

    def parameters(self, index: int, layer: LNBertLayer) -> None:
        for k, norm in ((2 * index, layer.norm_a), (2 * index + 1, layer.norm_f)):
            if isinstance(norm, SeeDNorm):
                self.found[f"seednorm/alpha_norm/{k:02d}"] = norm.alpha.detach().norm()
            if isinstance(norm, DyT):  # and Derf: their learned scalars, alpha (and shift)
                for name in norm.inits:
                    self.found[f"norm/{name}/{k:02d}"] = getattr(norm, name).detach()
        if isinstance(layer.gpas, GPAS):
            self.found[f"gpas/scale/{index:02d}"] = 1 - F.silu(layer.gpas.gate.detach())
        if hasattr(layer, "rezero_gate"):
            self.found[f"rezero/gate/{index:02d}"] = layer.rezero_gate.weight.detach()
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
        for k, sublayer in ((2 * i, layer.attention.output), (2 * i + 1, layer.output)):
            for part, module in (("branch", sublayer), ("skip", sublayer.residual_scale)):
                handles.append(probe.watch(module, lambda m, args, out, k=k, p=part: probe.update_ratio(k, p, out)))
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
    """What one forward pass showed: the residual scheme's recorder (None for the standard scheme) and the probes, as
    scalars (``design``) and histograms (for metrics.jsonl only)."""

    residual: ResidualStats | None
    design: dict[str, float]
    histograms: dict[str, list[float]] = field(default_factory=dict)


@contextmanager
def measuring(model: nn.Module, token_mask: torch.Tensor,
              sep_mask: torch.Tensor | None = None) -> Iterator[Callable[[], LayerMeasurement]]:  # fmt: skip
    """The residual scheme's ``recording`` (where the model has one) and ``probing`` on one forward pass:
    ``with measuring(model, batch["attention_mask"]) as measured: model(**batch)``, then ``measured()``."""
    scheme = model.config.scheme.module
    with (recording(model, token_mask) if scheme else nullcontext() as recorder,
          probing(model, token_mask, sep_mask) as probe):  # fmt: skip
        yield lambda: LayerMeasurement(recorder.stats() if recorder is not None else None, probe.stats(),
                                       probe.histogram_lists())  # fmt: skip


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


def gpas_alarms(design: dict[str, float]) -> dict[str, str]:
    """The logged GPAS scales in a step's ``design`` whose gate is past ``GPAS_GATE_ALARM``, each with its line: read
    from the scale 1 - SiLU(g), which is below 1 - SiLU(1.2) exactly when g > 1.2 (SiLU is below SiLU(1.2) for every
    smaller g)."""
    floor = 1 - F.silu(torch.tensor(GPAS_GATE_ALARM, dtype=torch.float64)).item()
    return {key: f"{key} = {value:.4f}: its gate is past {GPAS_GATE_ALARM} (1 - SiLU(g) < {floor:.4f}), an alarm for "
                 f"GPAS's paper" for key, value in design.items() if key.startswith("gpas/scale/") and value < floor}
