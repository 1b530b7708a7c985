"""init-perturb: the output change from a small random change of the weights at initialisation (Admin's measure)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pretrain.analysis.common import (
    DEFAULT_OUT,
    ModelSize,
    cell_result,
    cell_settings,
    mean_and_sem,
    model_config,
    placement_color,
    variants,
    write_outputs,
)
from pretrain.common.cli import require, to_dict
from pretrain.common.reporting import format_table, pyplot, save_figure
from pretrain.modeling import InitScheme, LNBertConfig, LNBertModel
from pretrain.norms import NormType
from pretrain.placements import NormPlacement


@dataclass(kw_only=True)
class InitPerturbConfig(ModelSize):
    """Output change from a small random weight change at init against depth (Liu et al. 2020, Admin).

    For each init scheme, model and depth, under seeds seeds: initialise LNBertModel (dropout off), compute the
    encoder output f(x, W) (last_hidden_state: after the last norm or the final norm) on random token ids, add
    to every weight matrix of the encoder layers (2-D parameters: Q, K, V, attention output, FFN; not the
    embeddings, norms, gates or scales) delta = epsilon * rms(W) * N(0, 1) elementwise, and report
    E||f(x, W) - f(x, W + delta)||^2 / E||f(x, W)||^2 over the tokens. Admin's claim: this grows like O(N) with
    the number of sub-layers N for Post-LN, like O(log N) for Admin and Pre-LN. Writes table.txt, results.json,
    init_perturb.png."""

    placements: list[NormPlacement] = field(default_factory=lambda: ["post", "admin", "deepnorm", "pre"])
    """Placements to measure."""
    norm_types: list[NormType] = field(default_factory=lambda: ["layernorm"])
    """Norm types to measure, each with every placement."""
    init_schemes: list[InitScheme] = field(default_factory=lambda: ["xavier", "bert"])
    """xavier: Admin's and the paper's analysis setting; bert: normal(0, 0.02)."""
    depths: list[int] = field(default_factory=lambda: [3, 6, 12, 24, 48])
    """Numbers of layers L (N = 2L sub-layers)."""
    epsilon: float = 1e-2
    """Size of the perturbation relative to each weight matrix's root mean square."""
    seeds: int = 5
    """Model initialisations (each with its own perturbation and token ids)."""
    hidden_size: int = 128
    num_heads: int = 2
    vocab_size: int = 2048
    seq_len: int = 64
    out: str = str(DEFAULT_OUT / "init_perturb")

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.seeds > 0, "seeds", f"must be a positive integer; got {self.seeds}")
        require(self.epsilon >= 0, "epsilon", f"must be >= 0; got {self.epsilon}")
        require(bool(self.depths) and all(d > 0 for d in self.depths), "depths", f"must be positive; got {self.depths}")


AXES = ("placements", "norm_types", "init_schemes", "depths")
"""The options a cell (init scheme, model, depth) is drawn from; every other option is a setting of each cell."""


@torch.no_grad()
def output_change(config: LNBertConfig, batch_size: int, seq_len: int, epsilon: float, seed: int) -> float:
    """E||f(x, W) - f(x, W + delta)||^2 / E||f(x, W)||^2 over the tokens of random ids, for one model initialised
    under ``seed``; delta = epsilon * rms(W) * N(0, 1) on every 2-D parameter of the encoder layers."""
    torch.manual_seed(seed)
    model = LNBertModel(config, add_pooling_layer=False).eval()
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (batch_size, seq_len), generator=generator)
    before = model(ids).last_hidden_state.double()
    for param in model.encoder.layer.parameters():
        if param.dim() >= 2:
            rms = param.double().pow(2).mean().sqrt()
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float64)
            param.add_((epsilon * rms * noise).to(param.dtype))
    after = model(ids).last_hidden_state.double()
    return ((after - before).pow(2).sum(-1).mean() / before.pow(2).sum(-1).mean()).item()


def run(args: InitPerturbConfig) -> int:
    out = Path(args.out)
    settings = cell_settings(args, AXES)
    depths = sorted(args.depths)
    labels = variants(args.placements, args.norm_types)
    raw: dict[str, list[float]] = {}
    for init_scheme in args.init_schemes:
        for label, placement, norm_type in labels:
            for depth in depths:
                config = model_config(args, placement, init_scheme, depth, args.vocab_size, norm_type=norm_type)
                key = f"{init_scheme}/{label}/{depth}"
                raw[key] = cell_result(out, key, settings, lambda c=config: [
                    output_change(c, args.batch_size, args.seq_len, args.epsilon, args.seed + s)
                    for s in range(args.seeds)
                ])  # fmt: skip
                print(f"measured {key}", flush=True)
    sections = [
        f"E||f(x,W) - f(x,W+delta)||^2 / E||f(x,W)||^2 at init, delta = {args.epsilon:g} x rms(W) x N(0,1) on every "
        f"encoder weight matrix; hidden {args.hidden_size}, {args.num_heads} heads, random ids, batch "
        f"{args.batch_size} x {args.seq_len}, mean over {args.seeds} seeds (+- standard error); dropout off. Last rows: "
        f"growth from depth {depths[0]} to {depths[-1]}, against O(N) = {depths[-1] / depths[0]:g} and O(log N) = "
        f"{math.log(2 * depths[-1] + 1) / math.log(2 * depths[0] + 1):.3g} (ln(N+1), N = 2L sub-layers)"
    ]
    for init_scheme in args.init_schemes:
        rows = []
        for depth in depths:
            row: list[Any] = [depth]
            for label, _, _ in labels:
                (mean,), (sem,) = mean_and_sem(torch.tensor(raw[f"{init_scheme}/{label}/{depth}"]).unsqueeze(1))
                row.append(f"{mean:.4g} +- {sem:.2g}")
            rows.append(row)
        growth: list[Any] = [f"{depths[-1]}/{depths[0]}"]
        for label, _, _ in labels:
            first = sum(raw[f"{init_scheme}/{label}/{depths[0]}"]) / args.seeds
            last = sum(raw[f"{init_scheme}/{label}/{depths[-1]}"]) / args.seeds
            growth.append(f"{last / first:.3g}" if first > 0 else "n/a (0)")
        rows.append(growth)
        sections.append(f"init {init_scheme}\n" + format_table(["depth", *(lab for lab, _, _ in labels)], rows))
    write_outputs(out, "\n\n".join(sections), {"args": to_dict(args), "depths": depths, "raw": raw})
    plot_init_perturb(args, raw, out / "init_perturb.png")
    return 0


def plot_init_perturb(args: InitPerturbConfig, raw: dict[str, list[float]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(args.init_schemes), figsize=(5.5 * len(args.init_schemes), 4.2), squeeze=False)
    depths = sorted(args.depths)
    for ax, init_scheme in zip(axes[0], args.init_schemes, strict=True):
        for label, placement, _ in variants(args.placements, args.norm_types):
            mean, sem = zip(*(
                (m[0], e[0]) for m, e in (mean_and_sem(torch.tensor(raw[f"{init_scheme}/{label}/{d}"]).unsqueeze(1))
                                           for d in depths)
            ), strict=True)  # fmt: skip
            ax.errorbar(depths, mean, yerr=sem, fmt="o-", color=placement_color(placement), label=label, capsize=2)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(depths, [str(d) for d in depths])
        ax.set_xticks([], minor=True)
        ax.set_xlabel("number of layers L")
        ax.set_ylabel("||f(W) - f(W + delta)||^2 / ||f(W)||^2")
        ax.set_title(f"{init_scheme} init: output change, delta = {args.epsilon:g} rms(W)")
        ax.legend(fontsize=7)
    print(f"wrote {save_figure(fig, path)}")
