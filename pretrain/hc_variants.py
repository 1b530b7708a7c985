"""Two residual schemes of the Hyper-Connections family on Pre-LN (docs/placements.md): mHC-lite, mHC with an exactly
doubly stochastic H_res, and Frac-Connections, HC over fractions of the hidden state instead of copies of it.

Each module is one of ``pretrain/residual_streams.py``'s with one mapping changed, and reads and writes the residual
state through the same interface (``placements.residual_scheme_block``):

    mhc_lite   ``MhcLite(ManifoldHyperConnection)``: H_res a convex combination of the n! permutation matrices
               instead of Sinkhorn-Knopp's iterations; the n streams, their reads and writes are mHC's
    frac       ``FracConnection(HyperConnection)``: the state is Pre-LN's one stream (B, T, d), read as m fractions
               of d/m; HC's static and dynamic weights, with A_m widened from a column to an m x m matrix Gamma
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import nn
from transformers import initialization as init

from pretrain.residual_streams import HyperConnection, ManifoldHyperConnection

MHC_LITE_OTHER_BIAS = -8.0  # mhc_bias_init="identity": b_res at every permutation but the identity (official code)


def permutation_matrices(n: int) -> torch.Tensor:
    """The n! permutation matrices (n!, n, n) in ``itertools.permutations``' lexicographic order, the identity first:
    P_r[i, j] = 1 where j = perm_r(i) (mHC-lite's ``get_all_permutations``, ``eye[perm]``)."""
    return torch.eye(n)[torch.tensor(list(itertools.permutations(range(n))))]


class MhcLite(ManifoldHyperConnection):
    """mHC-lite for one sub-layer (Yang, Gao, arXiv 2601.05732; ``FFTYYY/mhc-lite``, ``hyper_conn/mhc_lite.py``):
    mHC (``ManifoldHyperConnection``: x' = vec(x) / rms(vec(x)), H_pre, H_post, x <- H_res x + H_post^T F(H_pre x))
    with

        c      = softmax(alpha_res (x' phi_res) + b_res)         1 x n!
        H_res  = sum_r c_r P_r^T                                  n x n

    a convex combination of permutation matrices, so doubly stochastic to rounding (Birkhoff-von Neumann) with no
    iteration. The official code mixes new_t = sum_s A[s, t] x_s with A = sum_r c_r P_r, hence the transpose.
    ``phi_res`` is (n d, n!), ``b_res`` (n!,); the permutations a non-persistent buffer. Init as the official code:
    phi 0 (the mappings start static), gates 0.01; the biases by ``mhc_bias_init``: zero (H_pre = 1/2, H_post = 1,
    H_res = J/n: the Pre-LN model) or identity (b_res 0 at the identity, -8 elsewhere: H_res's diagonal 0.994 at
    n = 4; b_pre and b_post 0).
    """

    def __init__(self, hidden_size: int, streams: int, bias_init: str) -> None:
        super().__init__(hidden_size, streams, sinkhorn_iters=0, bias_init=bias_init)
        self.phi_res = nn.Parameter(torch.zeros(streams * hidden_size, math.factorial(streams)))
        self.register_buffer("permutations", permutation_matrices(streams), persistent=False)

    def initial_b_res(self) -> torch.Tensor:
        """b_res (n!,) at init: zero (c uniform), or identity (the official code's 0 at the identity, -8 elsewhere)."""
        b_res = torch.zeros(math.factorial(self.streams))
        if self.bias_init == "identity":
            b_res[1:] = MHC_LITE_OTHER_BIAS
        return b_res

    def init_parameters(self, std: float) -> None:
        super().init_parameters(std)
        for phi in (self.phi_pre, self.phi_post, self.phi_res):
            init.zeros_(phi)
        init.copy_(self.permutations, permutation_matrices(self.streams))  # a buffer: transformers loads it empty

    def residual_mixing(self, res: torch.Tensor) -> torch.Tensor:
        """H_res = sum_r c_r P_r^T (..., n, n), c = softmax(alpha_res res + b_res) over the n! permutations."""
        c = torch.softmax(self.alpha_res * res + self.b_res, dim=-1)  # (..., n!)
        if self.recorder is not None:
            self.recorder.permutation_weights(c)
        return torch.einsum("...r,rji->...ij", c, self.permutations.to(c.dtype))

    def extra_repr(self) -> str:
        return f"streams={self.streams}, bias_init={self.bias_init!r}"


class FracConnection(HyperConnection):
    """Frac-Connections for one sub-layer (Zhu, Huang et al., ByteDance Seed, arXiv 2503.14125: its Eqs. 6-15 and
    Algorithm 2, whose names are kept; no code was released). The stream h (d) is split into m fractions H (m x d/m):

        h  = flatten(Gamma^T H)                               the sub-layer's input
        H <- diag(beta) unflatten(F(N(h))) + A^T H            fraction k of the output scaled by beta_k

    ``static_alpha`` is [Gamma | A] (m x 2m), ``static_beta`` beta (m): HC's names, whose [A_m | A_r] has A_m as
    one column where Gamma has m. Dynamic FC adds HC's per-token terms, from a norm over each fraction's d/m:
    ``dynamic_alpha_scale * tanh(norm(H) @ dynamic_alpha_fn)`` (d/m x 2m) and ``dynamic_beta_scale * tanh(norm(H)
    @ dynamic_beta_fn)``. Init (Eq. 15): Gamma = A = I, beta = 1, W = 0, s 0.01: the Pre-LN model, bit for bit. With
    m = 1 it is HC with one stream (the paper's Fig. 1).
    """

    def __init__(self, hidden_size: int, fractions: int, norm: nn.Module | None) -> None:
        """``norm``: the dynamic weights' norm over d/m, None for static FC."""
        super().__init__(hidden_size // fractions, fractions, 0, norm)
        if self.dynamic:  # HC's W_alpha has one column for A_m, Frac's m for Gamma
            self.dynamic_alpha_fn = nn.Parameter(torch.zeros(hidden_size // fractions, 2 * fractions))

    def initial_static_alpha(self) -> torch.Tensor:
        """[Gamma | A] at init: [I | I]."""
        return torch.eye(self.streams).repeat(1, 2)

    def mappings(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Gamma^T, beta, A^T of the fractions ``state`` (B, T, m, d/m), per token under dynamic FC: HC's mappings,
        which hand [Gamma | A] back as its first column and the rest transposed, split at m columns instead."""
        first, beta, rest = super().mappings(state)
        alpha = torch.cat([first.unsqueeze(-1), rest.transpose(-1, -2)], dim=-1)  # [Gamma | A], (..., m, 2m)
        m = self.streams
        return alpha[..., :m].transpose(-1, -2), beta, alpha[..., m:].transpose(-1, -2)

    def read(self, state: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The sub-layer's input flatten(Gamma^T H) (B, T, d) of the stream ``state`` (B, T, d), and A^T H and beta
        for ``write``."""
        fractions = state.unflatten(-1, (self.streams, -1))  # (B, T, m, d/m), a view
        gamma_t, beta, a_t = self.mappings(fractions)
        if self.recorder is not None:  # H_pre is Gamma^T here (m x m), row-major
            self.recorder.mixing(gamma_t.flatten(-2), beta, a_t)
        with torch.autocast(state.device.type, enabled=False):
            weights = torch.cat([gamma_t, a_t], dim=-2).to(state.dtype)  # (..., 2m, m)
            mixed = torch.einsum("...kj,...jd->...kd", weights, fractions)  # (B, T, 2m, d/m)
        return mixed[..., : self.streams, :].flatten(-2), (mixed[..., self.streams :, :], beta)

    def write(self, state: torch.Tensor, pending: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor) -> torch.Tensor:
        """The new stream flatten(A^T H + diag(beta) unflatten(out)), ``out`` (B, T, d) the sub-layer's output."""
        if self.recorder is not None:
            self.recorder.output(out)
        mixed, beta = pending
        with torch.autocast(state.device.type, enabled=False):
            out = out.unflatten(-1, (self.streams, -1)).to(mixed.dtype)
            return (mixed + beta.unsqueeze(-1).to(mixed.dtype) * out).flatten(-2)

    def extra_repr(self) -> str:
        return f"fractions={self.streams}, dynamic={self.dynamic}"
