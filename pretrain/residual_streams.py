"""Residual schemes on Pre-LN (docs/placements.md, "Residual schemes"): Hyper-Connections (HC, static and dynamic),
manifold-constrained Hyper-Connections (mHC) and Attention Residuals (AttnRes, Full and Block).

``LNBertConfig.residual_scheme`` picks one on ``norm_placement="pre"`` (its entry: ``pretrain/residual_schemes.py``,
which builds these modules and starts the state); the sub-layers stay Pre-LN's, with their
names and pre-norms ``N``. Layer ``i`` holds ``attention_residual`` (sub-layer ``k = 2i``) and ``ffn_residual``
(``k = 2i + 1``); its block (``placements.residual_scheme_block``) runs, per sub-layer F:

    h, pending = residual.read(state)                   # the sub-layer's input, from the residual state
    state = residual.write(state, pending, F(N(h)))     # its output, into the state

The residual state per token, and how the encoder ends (``collapse``):

    hc, mhc    n streams of width d, (B, T, n, d): n copies of the embedding output at the start, summed at the
               end before ``encoder.final_layer_norm`` (HC's Algorithm 1; mHC states no collapse)
    attn_res   ``DepthSources``: the embedding output and the sub-layers' outputs (Full) or block sums (Block),
               aggregated at the end by ``encoder.output_residual``, then ``encoder.final_layer_norm``

HC and mHC in mHC's common form (its Eq. 3), ``x`` the n streams (n x d): ``x <- H_res x + H_post^T F(N(H_pre x))``

    SHC   H_pre = A_m^T, H_post = B, H_res = A_r^T, learned static matrices                HC paper, Eqs. 1-5
    DHC   the same plus s tanh(norm(x) W) per token                                         HC paper, dynamic HC
    mHC   from RMSNorm(vec x): sigmoid, 2 sigmoid, Sinkhorn-Knopp (doubly stochastic)       mHC paper, Eqs. 7-9

The state and its mixing run with autocast off in the state's dtype (float32 under bf16 autocast, as Pre-LN's sum),
mHC's mappings in at least float32. ``recording`` measures what the papers' claims are about
(``pretrain.tracking.design_stats.measuring``: at a training run's log steps).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import initialization as init

HC_DYNAMIC_SCALE_INIT = 0.01  # DHC's s_alpha and s_beta at init (HC paper, Algorithm 2)
MHC_GATE_INIT = 0.01  # mHC's alpha_pre, alpha_post, alpha_res at init (mHC paper, Table 5)
MHC_NORM_EPS = 1e-20  # mHC's RMSNorm over the flattened streams (mHC paper, Table 5)
SINKHORN_LOGIT_FLOOR = -60.0  # exp's input floor in ``sinkhorn``, relative to each matrix's largest logit
MHC_IDENTITY_DIAGONAL = 0.99  # mhc_bias_init="identity": H_res's diagonal at init (gates at 0), from b_res = c I


def _autocast_off(x: torch.Tensor) -> AbstractContextManager[Any]:
    """The residual state and its mixing weights stay in the state's dtype: bf16 autocast would round the state
    (a matmul there runs in bf16) where Pre-LN's residual sum, an addition, stays float32."""
    return torch.autocast(x.device.type, enabled=False)


def _rms_scale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / sqrt(mean(x^2) + eps) over the last dimension, the sum of squares as a norm (x^2 would be as large as x)."""
    return torch.rsqrt(torch.linalg.vector_norm(x, dim=-1).square() / x.shape[-1] + eps)


def inverse_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / sqrt(mean(x^2) + eps) over the last dimension, in at least float32: RMSNorm(x) without a gain is x times it."""
    return _InverseRms.apply(x.to(torch.promote_types(x.dtype, torch.float32)), eps)


class _InverseRms(torch.autograd.Function):
    """``inverse_rms`` with one pass over x each way (``_rms_scale``), and a backward of one product, -x s^3 / d
    (autograd's would form two or three tensors of x's size)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, eps: float) -> torch.Tensor:
        scale = _rms_scale(x, eps)
        ctx.save_for_backward(x, scale)
        return scale

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        x, scale = ctx.saved_tensors
        return x * (g * scale.pow(3) / -x.shape[-1]).unsqueeze(-1), None


def normalized_projection(norm: nn.Module, x: torch.Tensor, projection: torch.Tensor) -> torch.Tensor | None:
    """``norm(x) @ projection^T`` (x (..., d), projection (m, d)) for a LayerNorm or RMSNorm ``norm``, in x's dtype
    (at least float32), without forming norm(x), which would be as large as x: the gain folds into the projection,
    the bias into a constant, and the statistics divide after the matmul, as mHC's kernels do. None for another norm.
    """
    # torch's LayerNorm is centred; the project's norms declare it (``pretrain.norms.RMSNorm.centred``)
    centred = True if isinstance(norm, nn.LayerNorm) else getattr(norm, "centred", None)
    if centred is None:
        return None
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    projection = projection.to(x.dtype)
    gain = projection if norm.weight is None else projection * norm.weight.to(x.dtype)  # a LayerNorm may have none
    projected = _NormalizedProjection.apply(x, gain, centred, norm.eps)
    bias = getattr(norm, "bias", None)  # copied: a matrix-vector product's rounding on CPU depends on the vector's
    # alignment, and a reloaded model's parameters sit elsewhere; a new tensor is always aligned alike
    return projected if bias is None else projected + projection @ bias.to(x.dtype, copy=True)


class _NormalizedProjection(torch.autograd.Function):
    """``(x - mean) / sqrt(var + eps) @ weight^T`` (``centred``: LayerNorm's statistics, over the last dimension), or
    ``x / sqrt(mean(x^2) + eps) @ weight^T``: forward one pass for the statistics and one GEMM; backward one GEMM and
    one multiply-add for x's gradient, one GEMM for the weight's; nothing saved of x's size but x."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, centred: bool, eps: float) -> torch.Tensor:
        projected = nn.functional.linear(x, weight)
        if centred:  # LayerNorm's own statistics (torch.var is 7x slower on CPU); its normalised rows are dropped
            _, mean, scale = (t.squeeze(-1) for t in torch.native_layer_norm(x, x.shape[-1:], None, None, eps))
            projected = projected - mean.unsqueeze(-1) * weight.sum(-1)  # (x - mean) W^T = x W^T - mean (W 1)
        else:
            mean, scale = None, _rms_scale(x, eps)
        ctx.save_for_backward(x, weight, scale, projected, mean)
        return projected * scale.unsqueeze(-1)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        x, weight, scale, projected, mean = ctx.saved_tensors
        d = x.shape[-1]
        g_projected = g * scale.unsqueeze(-1)
        # Through scale = (var + eps)^(-1/2): -scale^3 (x - mean) / d per row, times g . projected.
        coef = (g * projected).sum(-1) * scale.pow(3) / -d
        rows, flat_x = g_projected.reshape(-1, g.shape[-1]), x.reshape(-1, d)
        if mean is None:
            g_x = (rows @ weight).view_as(x)
            g_weight = rows.T @ flat_x
        else:  # and through the centring: a constant per row (minus the mean over d of g_projected W), in the GEMM
            shift = -(g_projected @ weight.sum(-1)) / d - coef * mean
            g_x = torch.addmm(shift.reshape(-1, 1), rows, weight).view_as(x)
            g_weight = rows.T @ flat_x - (rows * mean.reshape(-1, 1)).sum(0).unsqueeze(-1)
        return g_x.addcmul_(x, coef.unsqueeze(-1)), g_weight, None, None


# The stream operations. On the n x d state of every token they are memory-bound (a few FLOPs per number read), so
# their cost is the passes over the state: each is one matmul (static weights: one GEMM over all tokens; per-token
# weights: one batched GEMM) and one fused multiply-add, with a backward written out so that no (n x d) product is
# materialised to be reduced, and nothing of the state saved but the state itself (which every design must keep).


def _apply(weights: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``weights`` (m, n), or per token (B, T, m, n), times the rows of ``x`` (B, T, n, d): (B, T, m, d). Static
    weights go through one GEMM over the tokens in the streams' memory order, (m, n) @ (n, B T d), so a state that
    one wrote is read without a copy and the result is written in that order (a view of shape (B, T, m, d))."""
    if weights.dim() == 2:
        rows = x.movedim(-2, 0)
        return (weights @ rows.reshape(rows.shape[0], -1)).view(weights.shape[0], *rows.shape[1:]).movedim(0, -2)
    return torch.matmul(weights, _strided(x))


def _outer(g: torch.Tensor, x: torch.Tensor, static: bool) -> torch.Tensor:
    """The gradient of the weights of ``_apply(weights, x)`` given the output's gradient ``g`` (B, T, m, d): (m, n)
    summed over the tokens (``static``), else per token (B, T, m, n)."""
    if static:
        return g.movedim(-2, 0).flatten(1) @ x.movedim(-2, 0).flatten(1).T
    return torch.matmul(_strided(g), _strided(x).transpose(-1, -2))


def _strided(x: torch.Tensor) -> torch.Tensor:
    """``x`` without broadcast dimensions (the first state, n copies of one stream; the gradient of the streams'
    sum): a batched matmul on CPU falls back to a loop over the tokens for a matrix with a zero stride."""
    return x.contiguous() if 0 in x.stride() else x


class _ReadStreams(torch.autograd.Function):
    """(H_pre x, H_res x) of the n streams x (B, T, n, d), from ``weights`` [H_pre; H_res] (n + 1, n) or per token
    (B, T, n + 1, n): one matmul; the backward saves x and the weights only."""

    @staticmethod
    def forward(ctx: Any, weights: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(weights, x)
        mixed = _apply(weights, x)
        # The input is copied out: the sub-layer's norm saves it, which would keep all of ``mixed`` alive.
        return mixed[..., 0, :].clone(memory_format=torch.contiguous_format), mixed[..., 1:, :]

    @staticmethod
    def backward(ctx: Any, g_input: torch.Tensor, g_rest: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        weights, x = ctx.saved_tensors
        static = weights.dim() == 2
        g_weights = None
        if ctx.needs_input_grad[0]:
            g_weights = torch.cat([_outer(g_input.unsqueeze(-2), x, static), _outer(g_rest, x, static)], dim=-2)
        g_x = _apply(weights[..., 1:, :].transpose(-1, -2), g_rest)
        g_x.addcmul_(weights[..., 0, :].unsqueeze(-1), g_input.unsqueeze(-2))
        return g_weights, g_x


class _WriteStreams(torch.autograd.Function):
    """The new streams ``rest + H_post^T out``: ``rest`` (B, T, n, d) = H_res x, ``h_post`` (n) or per token (B, T, n),
    ``out`` (B, T, d) the sub-layer's output in its own dtype (promoted in the sum, saved as it is)."""

    @staticmethod
    def forward(ctx: Any, rest: torch.Tensor, h_post: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h_post, out)
        return torch.addcmul(rest, h_post.unsqueeze(-1), out.unsqueeze(-2))

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h_post, out = ctx.saved_tensors
        static = h_post.dim() == 1
        g_out = _apply(h_post.unsqueeze(-2), g).squeeze(-2)  # sum_k H_post[k] g_k
        g_post = _outer(g, out.to(g.dtype).unsqueeze(-2), static).squeeze(-1)  # g_k . out
        return g, g_post, g_out.to(out.dtype)


class StreamMixer(nn.Module):
    """What HC and mHC share: ``x <- H_res x + H_post^T F(N(H_pre x))`` over the n streams ``x`` (B, T, n, d)."""

    recorder: ResidualRecorder | None = None  # set by ``recording``

    def mappings(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """H_pre (..., n), H_post (..., n), H_res (..., n, n); ``...`` is (B, T) where they depend on the token."""
        raise NotImplementedError

    def read(self, state: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The sub-layer's input H_pre x (B, T, d), and H_res x and H_post for ``write``."""
        h_pre, h_post, h_res = self.mappings(state)
        if self.recorder is not None:
            self.recorder.mixing(h_pre, h_post, h_res)
        with _autocast_off(state):
            weights = torch.cat([h_pre.unsqueeze(-2), h_res], dim=-2).to(state.dtype)  # (..., n + 1, n)
            h, rest = _ReadStreams.apply(weights, state)
        return h, (rest, h_post)

    def write(self, state: torch.Tensor, pending: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor) -> torch.Tensor:
        """The new streams H_res x + H_post^T out, ``out`` (B, T, d) the sub-layer's output."""
        if self.recorder is not None:
            self.recorder.output(out)
        rest, h_post = pending
        with _autocast_off(rest):
            return _WriteStreams.apply(rest, h_post.to(rest.dtype), out)


class HyperConnection(StreamMixer):
    """Hyper-Connections for one sub-layer (Zhu et al., ICLR 2025, arXiv 2409.19606), with the parameter names of
    the paper's Algorithm 2. With H the n streams (n x d):

        h = A_m^T H                     the sub-layer's input
        H <- B^T F(N(h)) + A_r^T H

    ``static_alpha`` is [A_m | A_r] (n x (n + 1)), ``static_beta`` is B (n). Dynamic HC adds, per token,
    ``dynamic_alpha_scale * tanh(norm(H) @ dynamic_alpha_fn)`` to [A_m | A_r] and ``dynamic_beta_scale *
    tanh(norm(H) @ dynamic_beta_fn)`` to B, ``norm`` over each stream's d (the model's ``norm_type``: LayerNorm, as
    Algorithm 2, by default). The init equals Pre-Norm (Eq. 14): B = 1, A_m = e_(k mod n), A_r = I, W = 0, s 0.01.
    """

    # HC paper §4: no weight decay on the static matrices, weight decay on the dynamic projections W. The scales
    # are learned scalar gains, exempt as every gain of the model is (the paper does not single them out).
    no_weight_decay = frozenset({"static_alpha", "static_beta", "dynamic_alpha_scale", "dynamic_beta_scale"})

    def __init__(self, hidden_size: int, streams: int, sublayer: int, norm: nn.Module | None) -> None:
        """``sublayer``: k, 0-based (A_m's one-hot init); ``norm``: the dynamic weights' norm, None for static HC."""
        super().__init__()
        self.streams, self.sublayer, self.dynamic = streams, sublayer, norm is not None
        self.static_beta = nn.Parameter(torch.ones(streams))
        self.static_alpha = nn.Parameter(self.initial_static_alpha())
        if norm is not None:
            self.norm = norm
            self.dynamic_alpha_fn = nn.Parameter(torch.zeros(hidden_size, streams + 1))
            self.dynamic_alpha_scale = nn.Parameter(torch.full((1,), HC_DYNAMIC_SCALE_INIT))
            self.dynamic_beta_fn = nn.Parameter(torch.zeros(hidden_size))
            self.dynamic_beta_scale = nn.Parameter(torch.full((1,), HC_DYNAMIC_SCALE_INIT))

    def initial_static_alpha(self) -> torch.Tensor:
        """[A_m | A_r] at init: A_m = e_(k mod n), A_r = I (Eq. 14)."""
        alpha = torch.cat([torch.zeros(self.streams, 1), torch.eye(self.streams)], dim=1)
        alpha[self.sublayer % self.streams, 0] = 1.0
        return alpha

    def init_parameters(self, std: float) -> None:
        """The Pre-Norm-equivalent init (the model's ``_init_weights``; the dynamic norm is initialised there)."""
        init.ones_(self.static_beta)
        init.copy_(self.static_alpha, self.initial_static_alpha())
        if self.dynamic:
            init.zeros_(self.dynamic_alpha_fn)
            init.zeros_(self.dynamic_beta_fn)
            init.constant_(self.dynamic_alpha_scale, HC_DYNAMIC_SCALE_INIT)
            init.constant_(self.dynamic_beta_scale, HC_DYNAMIC_SCALE_INIT)

    def mappings(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        alpha, beta = self.static_alpha, self.static_beta  # (n, n + 1), (n,)
        if self.dynamic:
            with _autocast_off(state):
                dynamic_alpha, dynamic_beta = self.dynamic_terms(state)
            alpha, beta = alpha + dynamic_alpha, beta + dynamic_beta  # (B, T, n, n + 1), (B, T, n)
        # h = A_m^T H: H_pre[j] = A_m[j]; (A_r^T H)_k = sum_j A_r[j, k] H_j: H_res = A_r^T.
        return alpha[..., 0], beta, alpha[..., 1:].transpose(-1, -2)

    def dynamic_terms(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """DHC's s_alpha tanh(norm(H) W_alpha) (B, T, n, n + 1) and s_beta tanh(norm(H) W_beta) (B, T, n): one
        projection of the normalised streams onto [W_alpha | W_beta]."""
        # In nn.Linear's layout, (n + 2, d): on CPU its GEMMs are 2.5-3x faster than (d, n + 2)'s, backward included.
        projection = torch.cat([self.dynamic_alpha_fn.T, self.dynamic_beta_fn.unsqueeze(0)]).to(state.dtype)
        projected = normalized_projection(self.norm, state, projection)
        if projected is None:  # another norm type: norm(H), which the projection would keep, recomputed in backward
            projected = checkpoint(self.project, state, projection, use_reentrant=False, preserve_rng_state=False)
        dynamic = torch.tanh(projected.to(state.dtype))
        return self.dynamic_alpha_scale * dynamic[..., :-1], self.dynamic_beta_scale * dynamic[..., -1]

    def project(self, state: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(self.norm(state).to(state.dtype), projection)

    def extra_repr(self) -> str:
        return f"streams={self.streams}, sublayer={self.sublayer}, dynamic={self.dynamic}"


def sinkhorn(logits: torch.Tensor, iters: int) -> torch.Tensor:
    """mHC's Sinkhorn-Knopp projection of each (n x n) matrix of ``logits`` (mHC Eqs. 8-9): M = exp(logits), then
    ``iters`` rounds of normalising the columns, then the rows (rows sum to 1, columns once converged). Subtracting
    each matrix's largest logit changes nothing and keeps exp finite; the floor exp(-60) keeps every sum positive
    (no 0 / 0) and changes only entries 26 orders of magnitude below the largest."""
    m = torch.exp((logits - logits.detach().amax(dim=(-2, -1), keepdim=True)).clamp(min=SINKHORN_LOGIT_FLOOR))
    return _SinkhornRounds.apply(m, iters)


def _normalisations(m: torch.Tensor, iters: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, int]]:
    """Sinkhorn-Knopp's steps on positive matrices ``m`` stored (n, n, ...): (the matrix after, the sums divided
    by, their dimension) for the columns' and then the rows' normalisation of each round."""
    for _ in range(iters):
        for dim in (0, 1):  # columns (sums over i of M[i, j]), then rows
            sums = m.sum(dim, keepdim=True)
            m = m / sums
            yield m, sums, dim


class _SinkhornRounds(torch.autograd.Function):
    """The rounds of ``sinkhorn`` on positive matrices (..., n, n). They run in the memory order (n, n, ...), where
    every row and column sum is over the tokens' contiguous memory (about 5x faster than over the last dimensions);
    the backward recomputes the rounds from their input, as the mHC paper's kernels do, instead of autograd keeping
    2 ``iters`` matrices per token."""

    @staticmethod
    def forward(ctx: Any, m: torch.Tensor, iters: int) -> torch.Tensor:
        m = m.movedim((-2, -1), (0, 1)).contiguous()
        ctx.iters = iters
        ctx.save_for_backward(m)
        *_, (normalised, _, _) = _normalisations(m, iters)
        return normalised.movedim((0, 1), (-2, -1))

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (m,) = ctx.saved_tensors
        g = g.movedim((-2, -1), (0, 1)).contiguous()
        for normalised, sums, dim in reversed(list(_normalisations(m, ctx.iters))):
            g = (g - (g * normalised).sum(dim, keepdim=True)) / sums  # through y = m / sum(m)
        return g.movedim((0, 1), (-2, -1)), None


class ManifoldHyperConnection(StreamMixer):
    """mHC for one sub-layer (Xie, Wei, Cao et al., DeepSeek-AI, arXiv 2512.24880), in the paper's notation. With
    x the n streams (n x C) and x' = vec(x) / rms(vec(x)) (1 x nC, over all nC numbers; eps 1e-20; no gain, which
    folds into phi as in the paper's kernels):

        H_pre  = sigmoid(alpha_pre (x' phi_pre) + b_pre)                   1 x n
        H_post = 2 sigmoid(alpha_post (x' phi_post) + b_post)              1 x n
        H_res  = Sinkhorn-Knopp(alpha_res mat(x' phi_res) + b_res)         n x n, doubly stochastic
        x <- H_res x + H_post^T F(N(H_pre x))

    ``phi_pre``, ``phi_post`` (nC x n) and ``phi_res`` (nC x n^2) multiply from the right (not ``nn.Linear``'s
    layout); vec is row-major (stream s, channel c at s C + c), and so is mat (H_res[i, j] from column i n + j).
    The mappings run in at least float32, autocast off. Init: phi ~ N(0, initializer_range), the gates 0.01, the
    biases by ``mhc_bias_init`` (zero: H_pre = 1/2, H_post = 1, H_res = J/n; identity: H_res's diagonal 0.99).
    """

    # No weight-decay rule in the paper; HC's (§4) applies: the projections phi decay, biases and scalar gates do not.
    no_weight_decay = frozenset({"b_pre", "b_post", "b_res", "alpha_pre", "alpha_post", "alpha_res"})

    def __init__(self, hidden_size: int, streams: int, sinkhorn_iters: int, bias_init: str) -> None:
        super().__init__()
        n, width = streams, streams * hidden_size
        self.streams, self.sinkhorn_iters, self.bias_init = n, sinkhorn_iters, bias_init
        self.phi_pre = nn.Parameter(torch.zeros(width, n))
        self.phi_post = nn.Parameter(torch.zeros(width, n))
        self.phi_res = nn.Parameter(torch.zeros(width, n * n))
        self.b_pre = nn.Parameter(torch.zeros(n))
        self.b_post = nn.Parameter(torch.zeros(n))
        self.b_res = nn.Parameter(self.initial_b_res())
        self.alpha_pre = nn.Parameter(torch.full((1,), MHC_GATE_INIT))
        self.alpha_post = nn.Parameter(torch.full((1,), MHC_GATE_INIT))
        self.alpha_res = nn.Parameter(torch.full((1,), MHC_GATE_INIT))

    def initial_b_res(self) -> torch.Tensor:
        """b_res at init: zero, or c I with exp(c) / (exp(c) + n - 1) = 0.99, the diagonal Sinkhorn then gives."""
        n = self.streams
        if self.bias_init == "zero" or n == 1:  # n = 1: H_res is 1 whatever b_res is
            return torch.zeros(n, n)
        d = MHC_IDENTITY_DIAGONAL
        return math.log(d * (n - 1) / (1 - d)) * torch.eye(n)

    def init_parameters(self, std: float) -> None:
        for phi in (self.phi_pre, self.phi_post, self.phi_res):
            init.normal_(phi, mean=0.0, std=std)
        init.zeros_(self.b_pre)
        init.zeros_(self.b_post)
        init.copy_(self.b_res, self.initial_b_res())
        for gate in (self.alpha_pre, self.alpha_post, self.alpha_res):
            init.constant_(gate, MHC_GATE_INIT)

    def mappings(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = self.streams
        with _autocast_off(state):
            x = state.flatten(-2)  # (B, T, n d)
            x = x.to(torch.promote_types(x.dtype, torch.float32))
            # [phi_pre | phi_post | phi_res]^T, (2n + n^2, n d): nn.Linear's layout, whose GEMMs are faster on CPU
            phi = torch.cat([self.phi_pre.T, self.phi_post.T, self.phi_res.T]).to(x.dtype)
            # x' phi = (x phi) / rms(x), as the paper's kernels compute it: x' would be saved, as large as the state
            projected = _NormalizedProjection.apply(x, phi, False, MHC_NORM_EPS)
            pre, post, res = projected.split([n, n, self.phi_res.shape[1]], dim=-1)
            h_pre = torch.sigmoid(self.alpha_pre * pre + self.b_pre)
            h_post = 2 * torch.sigmoid(self.alpha_post * post + self.b_post)
            h_res = self.residual_mixing(res)
        return h_pre, h_post, h_res

    def residual_mixing(self, res: torch.Tensor) -> torch.Tensor:
        """H_res (..., n, n) from x' phi_res (..., n^2), autocast off: Sinkhorn-Knopp (mHC-lite replaces this step)."""
        n = self.streams
        return sinkhorn(self.alpha_res * res.unflatten(-1, (n, n)) + self.b_res, self.sinkhorn_iters)

    def extra_repr(self) -> str:
        return f"streams={self.streams}, sinkhorn_iters={self.sinkhorn_iters}, bias_init={self.bias_init!r}"


@dataclass(frozen=True)
class DepthSources:
    """AttnRes's residual state: what a sub-layer's input is made of, oldest first, each one's key scale, and its
    keys' dot products with the pseudo-queries of the sub-layers that will read it.

    Block AttnRes (Eqs. 5-6), blocks of ``block_size`` sub-layers: ``values`` holds b_0 (the embedding output) and
    the sum b_n of each completed block, ``partial`` the current block's sum so far (None at its first sub-layer); a
    sub-layer attends over both. Full AttnRes (Eqs. 1-4) is ``block_size`` 1. Values are kept in the embedding
    output's dtype (float32 under autocast). A key, RMSNorm(value) without a gain, is its value times a scale per
    token, computed once; the keys themselves are never formed. Its logit for reader k, w_k^T key, is the dot
    v . w_k times that scale, and a value's dots with every later reader's w are one matmul when it joins: each
    source is read once for its logits, not once per reader (and once in the backward for their gradients).
    """

    block_size: int
    eps: float  # the keys' RMSNorm eps (the model's layer_norm_eps)
    queries: torch.Tensor  # (R, d): the readers' pseudo-queries, sub-layer k's row k, the encoder output's last
    values: tuple[torch.Tensor, ...]  # each (B, T, d)
    scales: tuple[torch.Tensor, ...]  # each (B, T): inverse_rms(value)
    dots: tuple[torch.Tensor, ...]  # each (B, T, R - j): value . w_k for the readers k >= j that follow it
    partial: torch.Tensor | None = None
    filled: int = 0  # sub-layers in the current block so far

    @classmethod
    def start(cls, embeddings: torch.Tensor, block_size: int, eps: float, queries: list[torch.Tensor]) -> DepthSources:
        """The state the first sub-layer reads; ``queries``: every reader's pseudo-query (d), in reading order."""
        with _autocast_off(embeddings):
            queries = torch.stack(queries).to(embeddings.dtype)
            dots = embeddings @ queries.T
        return cls(block_size, eps, queries, (embeddings,), (inverse_rms(embeddings, eps),), (dots,))

    @property
    def reader(self) -> int:
        """Which reads next: sub-layer k, or the encoder's output (R - 1)."""
        return (len(self.values) - 1) * self.block_size + self.filled

    def sources(self) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """The values the next reader attends over, their key scales, and their dots with its pseudo-query."""
        k, readers = self.reader, self.queries.shape[0]
        dots = tuple(dot[..., k - readers + dot.shape[-1]] for dot in self.dots)
        if self.partial is None:
            return self.values, self.scales, dots
        with _autocast_off(self.partial):
            partial_dot = self.partial @ self.queries[k]
        return (
            (*self.values, self.partial), (*self.scales, inverse_rms(self.partial, self.eps)), (*dots, partial_dot)
        )

    def add(self, out: torch.Tensor) -> DepthSources:
        """The state after a sub-layer with output ``out``: added to its block, which closes after ``block_size``."""
        partial = out.to(self.values[0].dtype) if self.partial is None else self.partial + out  # promoted, as Pre-LN's
        if self.filled + 1 < self.block_size:
            return replace(self, partial=partial, filled=self.filled + 1)
        with _autocast_off(partial):
            dots = partial @ self.queries[self.reader + 1 :].T
        return replace(self, values=(*self.values, partial), scales=(*self.scales, inverse_rms(partial, self.eps)),
                       dots=(*self.dots, dots), partial=None, filled=0)  # fmt: skip

    def total(self) -> torch.Tensor:
        """The plain sum of the embedding output and every sub-layer's output so far: Pre-LN's stream with these
        outputs (what ``hidden_states`` reports for AttnRes)."""
        later = self.values[1:] if self.partial is None else (*self.values[1:], self.partial)
        return sum(later, self.values[0])


class _AttendOverDepth(torch.autograd.Function):
    """AttnRes's aggregation h = sum_i alpha_i v_i, alpha = softmax_i(dot_i s_i), of K sources v_i (B, T, d), given
    their dots with the reader's query, dot_i = v_i . w, and key scales s_i (both (B, T)): one pass per source
    forward, and a backward written out, one pass and one gradient (B, T, d) per source; nothing saved but the
    sources (which the state keeps anyway), the weights, the dots and the scales. Arguments: the K dots, the K
    values, the K scales. Returns h and alpha (K, B, T), the latter without a gradient (for the recorder)."""

    @staticmethod
    def forward(ctx: Any, *sources: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        count = len(sources) // 3
        dots, scales, values = torch.stack(sources[:count]), torch.stack(sources[2 * count :]), sources[count:-count]
        weights = (dots * scales).softmax(dim=0)
        h = values[0] * weights[0].unsqueeze(-1)
        for weight, value in zip(weights[1:], values[1:], strict=True):
            h.addcmul_(weight.unsqueeze(-1), value)
        ctx.save_for_backward(weights, dots, scales, *values)
        ctx.mark_non_differentiable(weights)
        return h, weights

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor, _: torch.Tensor) -> tuple[torch.Tensor, ...]:
        weights, dots, scales, *values = ctx.saved_tensors
        products = torch.empty_like(g)  # one buffer for the K products (a new tensor each would cost page faults)
        g_weights = torch.stack([torch.mul(g, value, out=products).sum(-1) for value in values])  # (K, B, T)
        g_logits = weights * (g_weights - (g_weights * weights).sum(0))  # through the softmax
        g_values = [g * weight.unsqueeze(-1) for weight in weights]
        return *(g_logits * scales).unbind(), *g_values, *(g_logits * dots).unbind()


class AttentionResidual(nn.Module):
    """Attention Residuals for one sub-layer's input, or for the encoder's output (Kimi Team, Moonshot AI, arXiv
    2603.15031): a softmax over the sources v_i of the state (``DepthSources``), per token, with one learned,
    input-independent pseudo-query w (d) against RMS-normalised keys:

        h = sum_i alpha_i v_i,   alpha_i = softmax_i(w^T RMSNorm(v_i))          Eqs. 2-4 (Block: Eq. 6)

    w starts at zero (§5: "must"), so every input starts as the mean of its sources. The keys' RMSNorm has no gain:
    w^T (g * RMSNorm(v)) = (w * g)^T RMSNorm(v) adds no function. The sum over sources is a loop over depth (stacking
    them would keep a copy of every source for every sub-layer that reads it: O(N^2) memory in Full).
    """

    # No weight-decay rule in the report; none here: decay would pull the input-independent queries to the init.
    no_weight_decay = frozenset({"pseudo_query"})
    recorder: ResidualRecorder | None = None  # set by ``recording``

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.pseudo_query = nn.Parameter(torch.zeros(hidden_size))

    def init_parameters(self, std: float) -> None:
        init.zeros_(self.pseudo_query)

    def read(self, state: DepthSources) -> tuple[torch.Tensor, None]:
        """The input h (B, T, d): the sources weighted by their softmax over depth."""
        values, scales, dots = state.sources()
        with _autocast_off(values[0]):
            h, weights = _AttendOverDepth.apply(*dots, *values, *scales)
        if self.recorder is not None:
            self.recorder.depth_weights(weights)
        return h, None

    def write(self, state: DepthSources, pending: None, out: torch.Tensor) -> DepthSources:
        if self.recorder is not None:
            self.recorder.output(out)
        return state.add(out)


ResidualModule = HyperConnection | ManifoldHyperConnection | AttentionResidual
ResidualState = torch.Tensor | DepthSources


def collapse(state: ResidualState) -> torch.Tensor:
    """The one stream a state stands for: the sum of the n streams (HC's end), or of AttnRes's sources."""
    return state.total() if isinstance(state, DepthSources) else state.sum(dim=-2)


@dataclass
class ResidualStats:
    """What one forward pass showed of a residual scheme over the batch's real tokens; N sub-layers (k = 2i, 2i + 1
    for layer i), n streams. HC's matrices in mHC's form: H_pre = A_m, H_post = B, H_res = A_r^T (DHC's per token)."""

    output_norm: torch.Tensor
    """(N,): the mean over real tokens of each sub-layer's output norm ||F_k||_2 (every scheme)."""
    pre: torch.Tensor | None = None
    """(N, n): H_pre of each sub-layer, the mean over real tokens (HC, mHC)."""
    post: torch.Tensor | None = None
    """(N, n): H_post, the mean over real tokens (HC, mHC)."""
    res: torch.Tensor | None = None
    """(N, n, n): H_res, the mean over real tokens (HC, mHC)."""
    composite_gain: torch.Tensor | None = None
    """(N, 2): per k, the largest over real tokens of the max absolute row ([:, 0]) and column ([:, 1]) sum of
    P_k = H_res^k ... H_res^0; the last row is mHC's "Amax gain magnitude" (1 when doubly stochastic)."""
    stochastic_error: torch.Tensor | None = None
    """(N,): per k, the largest over real tokens of |a row or column sum of H_res^k - 1|: 0 to rounding for mHC-lite,
    what Sinkhorn's finite iterations leave for mHC, unconstrained for HC (HC, mHC)."""
    permutation_entropy: torch.Tensor | None = None
    """(N,): mHC-lite's entropy (nats) of its weights over the n! permutations, the mean over real tokens (0: one
    permutation, ln n!: all alike)."""
    depth_weights: torch.Tensor | None = None
    """(N + 1, K): AttnRes's mean weights over depth, row k for sub-layer k's input, the last for the output; column
    j is source j in ``DepthSources`` order (the embedding output first, a partial sum last), 0 past a row's own."""

    def scalars(self) -> dict[str, float]:
        """The headline numbers as flat names for a logger: ``output_norm/k`` (k two digits), for HC and mHC
        ``composite_gain/row`` and ``composite_gain/col`` over the whole depth and ``stochastic_error/k``, and for
        mHC-lite ``permutation_entropy/k``."""
        out = {f"output_norm/{k:02d}": float(v) for k, v in enumerate(self.output_norm)}
        if self.composite_gain is not None:
            out["composite_gain/row"], out["composite_gain/col"] = (float(v) for v in self.composite_gain[-1])
        for name in ("stochastic_error", "permutation_entropy"):
            if (values := getattr(self, name)) is not None:
                out.update({f"{name}/{k:02d}": float(v) for k, v in enumerate(values)})
        return out


@dataclass
class ResidualRecorder:
    """Collects ``ResidualStats`` during one forward pass, reduced over the real tokens as it goes (detached)."""

    token_mask: torch.Tensor | None = None  # (B, T), nonzero at real tokens; None: every token
    _rows: dict[str, list[torch.Tensor]] = field(default_factory=lambda: defaultdict(list))  # per ResidualStats field
    _product: torch.Tensor | None = None  # the composite H_res so far, per real token

    def _tokens(self, x: torch.Tensor, item_dims: int) -> torch.Tensor:
        """The real tokens' values (M, *item) of ``x`` (B, T, *item), or (1, *item) when ``x`` is static (SHC)."""
        x = x.detach().float()
        if x.dim() == item_dims:
            return x.unsqueeze(0)
        return x[self.token_mask.bool()] if self.token_mask is not None else x.flatten(0, 1)

    def mixing(self, h_pre: torch.Tensor, h_post: torch.Tensor, h_res: torch.Tensor) -> None:
        self._rows["pre"].append(self._tokens(h_pre, 1).mean(0))
        self._rows["post"].append(self._tokens(h_post, 1).mean(0))
        res = self._tokens(h_res, 2)  # (M, n, n)
        self._rows["res"].append(res.mean(0))
        self._product = res if self._product is None else res @ self._product
        magnitude = self._product.abs()
        self._rows["composite_gain"].append(torch.stack([magnitude.sum(-1).amax(), magnitude.sum(-2).amax()]))
        self._rows["stochastic_error"].append((torch.cat([res.sum(-1), res.sum(-2)], -1) - 1).abs().amax())

    def permutation_weights(self, c: torch.Tensor) -> None:
        self._rows["permutation_entropy"].append(torch.special.entr(self._tokens(c, 1)).sum(-1).mean())

    def output(self, out: torch.Tensor) -> None:
        self._rows["output_norm"].append(self._tokens(out.detach().float().norm(dim=-1), 0).mean())

    def depth_weights(self, weights: torch.Tensor) -> None:
        self._rows["depth_weights"].append(self._tokens(weights.movedim(0, -1), 1).mean(0))  # (K,)

    def stats(self) -> ResidualStats:
        rows = dict(self._rows)
        if "depth_weights" in rows:  # fewer sources in the earlier rows: padded with 0
            width = max(w.numel() for w in rows["depth_weights"])
            rows["depth_weights"] = [nn.functional.pad(w, (0, width - w.numel())) for w in rows["depth_weights"]]
        return ResidualStats(**{name: torch.stack(values) for name, values in rows.items()})


@contextmanager
def recording(model: nn.Module, token_mask: torch.Tensor | None = None) -> Iterator[ResidualRecorder]:
    """Record one forward pass of ``model``'s residual scheme: ``with recording(model, batch["attention_mask"]) as
    rec: model(**batch)``, then ``rec.stats()``; a few small reductions per sub-layer. ``token_mask`` (B, T) keeps
    padding out of the means and maxima."""
    modules = [m for m in model.modules() if hasattr(m, "recorder")]  # every residual scheme's modules have one
    if not modules:
        raise ValueError("the model has no residual scheme to record (residual_scheme='standard')")
    recorder = ResidualRecorder(token_mask)
    for module in modules:
        module.recorder = recorder
    try:
        yield recorder
    finally:
        for module in modules:
            module.recorder = None
