"""ln-jacobian: the spectral norm of LayerNorm's Jacobian is sqrt(d)/||x - mean(x)|| (paper, Sec. 3)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pretrain.analysis.common import write_outputs
from pretrain.analysis.options import LnJacobianConfig
from pretrain.common.reporting import format_table, pyplot, save_figure
from pretrain.modeling import LNBertConfig, LNBertModel


def model_layer_norm(hidden_size: int, eps: float) -> nn.LayerNorm:
    """The FFN sub-layer's LayerNorm of a freshly initialised one-layer model (gamma 1, beta 0), in float64: taken
    from the model itself so that the measurement covers exactly the module the model runs."""
    config = LNBertConfig(vocab_size=8, hidden_size=hidden_size, num_hidden_layers=1, num_attention_heads=1,
                          intermediate_size=1, max_position_embeddings=1, layer_norm_eps=eps)  # fmt: skip
    norm = LNBertModel(config, add_pooling_layer=False).encoder.layer[0].output.LayerNorm.double()
    if not (torch.all(norm.weight == 1) and torch.all(norm.bias == 0)):
        raise RuntimeError("the model's LayerNorm is not initialised to gamma 1, beta 0; the identity assumes it")
    return norm


def ln_jacobian_rows(dims: Sequence[int], scales: Sequence[float], eps: float, seed: int) -> list[dict[str, Any]]:
    """One row per (d, scale): x = scale * (z + 3), z ~ N(0, I_d); the offset checks that the mean drops out.
    ``paper`` is sqrt(d)/||y|| with y = x - mean(x); ``with_eps`` is the exact value for LayerNorm's variance
    epsilon, sqrt(d)/sqrt(||y||^2 + d * eps), which the paper's formula approaches when ||y||^2/d >> eps."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for d in dims:
        norm = model_layer_norm(d, eps)
        z = torch.randn(d, generator=generator, dtype=torch.float64)
        for scale in scales:
            x = scale * (z + 3.0)
            y = x - x.mean()
            y_norm = torch.linalg.vector_norm(y).item()
            jacobian = torch.autograd.functional.jacobian(norm, x, vectorize=True)  # (d, d)
            measured = torch.linalg.matrix_norm(jacobian, ord=2).item()
            paper = math.sqrt(d) / y_norm
            with_eps = math.sqrt(d) / math.sqrt(y_norm**2 + d * eps)
            rows.append(dict(d=d, scale=scale, y_norm=y_norm, measured=measured, paper=paper,
                             rel_err=abs(measured - paper) / paper, with_eps=with_eps,
                             rel_err_eps=abs(measured - with_eps) / with_eps))  # fmt: skip
    return rows


def plot_ln_jacobian(rows: list[dict[str, Any]], path: Path) -> None:
    fig, (ax1, ax2) = pyplot().subplots(1, 2, figsize=(11, 4.4))
    for i, d in enumerate(sorted({r["d"] for r in rows})):
        sub = [r for r in rows if r["d"] == d]
        scales = [r["scale"] for r in sub]
        ax1.plot(scales, [r["paper"] for r in sub], "-", color=f"C{i}", label=f"sqrt(d)/||y||, d={d}")
        ax1.plot(scales, [r["measured"] for r in sub], "o", color=f"C{i}", mfc="none")
        # A relative error of exactly 0 has no place on a log axis; 1e-17 is below float64 resolution.
        ax2.plot(scales, [max(r["rel_err"], 1e-17) for r in sub], "o-", color=f"C{i}", label=f"d={d}")
    ax1.set(ylabel="||J_LN(x)||_2", title="autograd (circles) vs sqrt(d)/||x - mean x|| (lines)")
    ax2.set(ylabel="relative error", title="|autograd - sqrt(d)/||y||| / (sqrt(d)/||y||)  (eps effect)")
    for ax in (ax1, ax2):
        ax.set(xscale="log", yscale="log", xlabel="input scale s  (x = s (z + 3), z ~ N(0, I))")
        ax.legend(fontsize=8)
    print(f"wrote {save_figure(fig, path)}")


def run(args: LnJacobianConfig) -> int:
    rows = ln_jacobian_rows(args.dims, args.scales, args.eps, args.seed)
    table = format_table(
        ["d", "scale", "||y||", "||J||_2 autograd", "sqrt(d)/||y||", "rel err", "rel err (eps-exact)"],
        [[r["d"], r["scale"], r["y_norm"], r["measured"], r["paper"], f"{r['rel_err']:.2e}", f"{r['rel_err_eps']:.2e}"]
         for r in rows],
    )  # fmt: skip
    worst = max(r["rel_err"] for r in rows)
    table += f"\nlargest relative error vs sqrt(d)/||y||: {worst:.2e} (LayerNorm eps = {args.eps:g}, float64)"
    out = Path(args.out)
    write_outputs(out, table, {"eps": args.eps, "seed": args.seed, "rows": rows})
    plot_ln_jacobian(rows, out / "ln_jacobian.png")
    return 0

