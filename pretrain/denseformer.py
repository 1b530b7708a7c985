"""DenseFormer on Pre-LN (Pagliardini, Mohtashami, Fleuret, Jaggi, NeurIPS 2024, arXiv 2402.02622; official code
``epfml/DenseFormer``, the package ``denseformer/denseformer.py``): after a layer, the stream becomes a learned
weighted average of every earlier layer's output, the depth-weighted average (DWA). With X_0 the embedding output,
X_(i+1) = B_i(Y_i) the output of layer i (0-based: Pre-LN's attention and FFN, each adding to Y_i) and k x p the
dilation and period:

    Y_(i+1) = sum_m dwa_weight[m] X_(g + m k),  g = (i + 1) mod k      where (i + 1) mod p = 0, else Y_(i+1) = X_(i+1)

the sum over the stored outputs X_j with j = i + 1 mod k, oldest first; the encoder's output is the final norm of Y_L.
``dwa_weight`` of layer i has (i + 1 + k) // k entries and starts at (0, .., 0, 1), so DenseFormer starts as the
Pre-LN model, bit for bit (1 X + 0 Y is X). The residual state (``LayerOutputs``) is the stream and every output so far
(L + 1 tensors of d per token at the end), in the embedding output's dtype (float32 under bf16 autocast).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from torch import nn
from transformers import initialization as init

if TYPE_CHECKING:
    from pretrain.residual_streams import ResidualRecorder


@dataclass(frozen=True)
class LayerOutputs:
    """DenseFormer's residual state: the stream ``current`` (Y) the next sub-layer reads, and the layers' outputs
    X_0 (the embedding output) .. X_i, oldest first."""

    current: torch.Tensor  # (B, T, d)
    outputs: tuple[torch.Tensor, ...]

    @classmethod
    def start(cls, embeddings: torch.Tensor) -> LayerOutputs:
        return cls(embeddings, (embeddings,))


class DepthWeightedAverage(nn.Module):
    """DenseFormer's residual for sub-layer k (layer k // 2): Pre-LN's sum into the stream; the FFN's (k odd) then
    stores the layer's output and, on the layers of the period, replaces the stream by the DWA over the stored
    outputs (``dwa_weight``, on those layers only)."""

    # The official experiments decay the DWA weights with every nn.Linear weight (toward 0, not toward the init).
    no_weight_decay: frozenset[str] = frozenset()
    recorder: ResidualRecorder | None = None  # set by ``residual_streams.recording``

    def __init__(self, sublayer: int, dilation: int, period: int) -> None:
        super().__init__()
        self.layer, self.dilation = sublayer // 2, dilation
        self.ends_layer = sublayer % 2 == 1
        self.averages = self.ends_layer and (self.layer + 1) % period == 0
        if self.averages:
            self.dwa_weight = nn.Parameter(self.initial_weight())

    def initial_weight(self) -> torch.Tensor:
        """(0, .., 0, 1): the layer's own output (the package's ``_init_weights``)."""
        weight = torch.zeros((self.layer + 1 + self.dilation) // self.dilation)
        weight[-1] = 1.0
        return weight

    def init_parameters(self, std: float) -> None:
        if self.averages:
            init.copy_(self.dwa_weight, self.initial_weight())

    def read(self, state: LayerOutputs) -> tuple[torch.Tensor, None]:
        return state.current, None

    def write(self, state: LayerOutputs, pending: None, out: torch.Tensor) -> LayerOutputs:
        """Y + out (promoted, as Pre-LN's sum); after the FFN, stored as X_(i+1) and averaged over depth."""
        if self.recorder is not None:
            self.recorder.output(out)
        x = state.current + out
        if not self.ends_layer:
            return replace(state, current=x)
        outputs = (*state.outputs, x)
        return LayerOutputs(self.average(outputs) if self.averages else x, outputs)

    def average(self, outputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """sum_m dwa_weight[m] X_(g + m k): a loop over depth, whose products read the stored outputs (a stack of
        them would copy every output for every average that reads it)."""
        first = (self.layer + 1) % self.dilation
        sources = outputs[first :: self.dilation]
        weights = self.dwa_weight.to(sources[0].dtype)
        y = weights[0] * sources[0]
        for weight, source in zip(weights[1:], sources[1:], strict=True):
            y = y + weight * source
        if self.recorder is not None:  # the weights over X_0 .. X_(i+1), 0 off the dilation's outputs
            row = self.dwa_weight.detach().new_zeros(len(outputs))
            row[first :: self.dilation] = self.dwa_weight.detach()
            self.recorder.depth_weights(row)
        return y

    def extra_repr(self) -> str:
        return f"layer={self.layer}, dilation={self.dilation}, averages={self.averages}"
