"""ln-jacobian: the spectral norm of LayerNorm's Jacobian is sqrt(d)/||x - mean(x)|| (paper, Sec. 3)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pretrain.analysis.common import DEFAULT_OUT, write_outputs
from pretrain.common.cli import require
from pretrain.common.reporting import format_table, pyplot, save_figure
from pretrain.modeling import LNBertConfig, LNBertModel


@dataclass(kw_only=True)
class LnJacobianConfig:
    """Spectral norm of the LayerNorm Jacobian vs sqrt(d)/||x - mean(x)||.

    Compute the Jacobian of the model's own LayerNorm (gamma 1, beta 0, float64) with autograd at
    x = s (z + 3), z ~ N(0, I_d), take its spectral norm and compare with the paper's sqrt(d)/||y||,
    y = x - mean(x), over scales s and dimensions d. The identity holds up to LayerNorm's eps: the exact value
    is sqrt(d)/sqrt(||y||^2 + d eps), also reported. Writes table.txt, results.json, ln_jacobian.png."""

    dims: list[int] = field(default_factory=lambda: [16, 64, 256, 1024])
    """Dimensions d."""
    scales: list[float] = field(default_factory=lambda: [1e-2, 1e-1, 1.0, 1e1, 1e2])
    """Input scales s."""
    eps: float = LNBertConfig().layer_norm_eps
    """LayerNorm eps (default: the model's layer_norm_eps)."""
    seed: int = 0
    """Seed of z."""
    out: str = str(DEFAULT_OUT / "ln_jacobian")
    """Output folder for table.txt, results.json and ln_jacobian.png."""

    def __post_init__(self) -> None:
        require(bool(self.dims) and all(d > 0 for d in self.dims), "dims", f"must be positive integers; got {self.dims}")
        require(bool(self.scales) and all(s > 0 for s in self.scales), "scales", f"must be > 0; got {self.scales}")
        require(self.eps >= 0, "eps", f"must be >= 0; got {self.eps}")


def model_layer_norm(hidden_size: int, eps: float) -> nn.LayerNorm:
    """The FFN sub-layer's LayerNorm of a freshly initialised one-layer model (gamma 1, beta 0), in float64.

    Taken from the model itself so that the measurement covers exactly the module the model runs.
    """
    config = LNBertConfig(
        vocab_size=8,
        hidden_size=hidden_size,
        num_hidden_layers=1,
        num_attention_heads=1,
        intermediate_size=1,
        max_position_embeddings=1,
        layer_norm_eps=eps,
    )
    norm = LNBertModel(config, add_pooling_layer=False).encoder.layer[0].output.LayerNorm.double()
    if not (torch.all(norm.weight == 1) and torch.all(norm.bias == 0)):
        raise RuntimeError("the model's LayerNorm is not initialised to gamma 1, beta 0; the identity assumes it")
    return norm


def layer_norm_jacobian_norm(norm: nn.LayerNorm, x: torch.Tensor) -> float:
    """||dLN(x)/dx||_2 for one vector ``x`` of shape ``(d,)``, by autograd and an SVD."""
    jac = torch.autograd.functional.jacobian(norm, x, vectorize=True)  # (d, d)
    return torch.linalg.matrix_norm(jac, ord=2).item()


def ln_jacobian_rows(dims: Sequence[int], scales: Sequence[float], eps: float, seed: int) -> list[dict[str, Any]]:
    """One row per (d, scale): x = scale * (z + 3), z ~ N(0, I_d); the offset checks that the mean drops out.

    ``paper`` is sqrt(d)/||y|| with y = x - mean(x); ``with_eps`` is the exact value for LayerNorm's
    variance epsilon, sqrt(d)/sqrt(||y||^2 + d * eps), which the paper's formula approaches when
    ||y||^2/d >> eps.
    """
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for d in dims:
        norm = model_layer_norm(d, eps)
        z = torch.randn(d, generator=generator, dtype=torch.float64)
        for scale in scales:
            x = scale * (z + 3.0)
            y = x - x.mean()
            y_norm = torch.linalg.vector_norm(y).item()
            measured = layer_norm_jacobian_norm(norm, x)
            paper = math.sqrt(d) / y_norm
            with_eps = math.sqrt(d) / math.sqrt(y_norm**2 + d * eps)
            rows.append(
                dict(
                    d=d,
                    scale=scale,
                    y_norm=y_norm,
                    measured=measured,
                    paper=paper,
                    rel_err=abs(measured - paper) / paper,
                    with_eps=with_eps,
                    rel_err_eps=abs(measured - with_eps) / with_eps,
                )
            )
    return rows


def plot_ln_jacobian(rows: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.4))
    for i, d in enumerate(sorted({r["d"] for r in rows})):
        sub = [r for r in rows if r["d"] == d]
        scales = [r["scale"] for r in sub]
        ax1.plot(scales, [r["paper"] for r in sub], "-", color=f"C{i}", label=f"sqrt(d)/||y||, d={d}")
        ax1.plot(scales, [r["measured"] for r in sub], "o", color=f"C{i}", mfc="none")
        # A relative error of exactly 0 has no place on a log axis; 1e-17 is below float64 resolution.
        ax2.plot(scales, [max(r["rel_err"], 1e-17) for r in sub], "o-", color=f"C{i}", label=f"d={d}")
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("input scale s  (x = s (z + 3), z ~ N(0, I))")
    ax1.set_ylabel("||J_LN(x)||_2")
    ax1.set_title("autograd (circles) vs sqrt(d)/||x - mean x|| (lines)")
    ax1.legend(fontsize=8)
    ax2.set_ylabel("relative error")
    ax2.set_title("|autograd - sqrt(d)/||y||| / (sqrt(d)/||y||)  (eps effect)")
    ax2.legend(fontsize=8)
    print(f"wrote {save_figure(fig, path)}")


def run(args: LnJacobianConfig) -> int:
    rows = ln_jacobian_rows(args.dims, args.scales, args.eps, args.seed)
    table = format_table(
        ["d", "scale", "||y||", "||J||_2 autograd", "sqrt(d)/||y||", "rel err", "rel err (eps-exact)"],
        [
            [
                r["d"],
                r["scale"],
                r["y_norm"],
                r["measured"],
                r["paper"],
                f"{r['rel_err']:.2e}",
                f"{r['rel_err_eps']:.2e}",
            ]
            for r in rows
        ],
    )
    worst = max(r["rel_err"] for r in rows)
    table += f"\nlargest relative error vs sqrt(d)/||y||: {worst:.2e} (LayerNorm eps = {args.eps:g}, float64)"
    out = Path(args.out)
    write_outputs(out, table, {"eps": args.eps, "seed": args.seed, "rows": rows})
    plot_ln_jacobian(rows, out / "ln_jacobian.png")
    return 0

