"""init-perturb: the output change from a small random change of the weights at initialisation (Admin's measure)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from pretrain.analysis.common import (
    cell_result,
    cell_settings,
    mean_and_sem,
    model_color,
    model_config,
    write_outputs,
)
from pretrain.analysis.options import InitPerturbConfig, models
from pretrain.common.cli import to_dict
from pretrain.common.reporting import format_table, pyplot, save_figure
from pretrain.modeling import LNBertConfig, LNBertModel

AXES = ("placements", "norm_types", "residual_schemes", "init_schemes", "depths")
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
    compared = models(args.placements, args.norm_types, args.residual_schemes)
    labels = [model.label for model in compared]
    raw: dict[str, list[float]] = {}
    for init_scheme in args.init_schemes:
        for model in compared:
            for depth in depths:
                config = model_config(
                    args, model.placement, init_scheme, depth, args.vocab_size, norm_type=model.norm_type,
                    scheme=model.scheme,
                )  # fmt: skip
                key = f"{init_scheme}/{model.label}/{depth}"
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
            for label in labels:
                (mean,), (sem,) = mean_and_sem(torch.tensor(raw[f"{init_scheme}/{label}/{depth}"]).unsqueeze(1))
                row.append(f"{mean:.4g} +- {sem:.2g}")
            rows.append(row)
        growth: list[Any] = [f"{depths[-1]}/{depths[0]}"]
        for label in labels:
            first = sum(raw[f"{init_scheme}/{label}/{depths[0]}"]) / args.seeds
            last = sum(raw[f"{init_scheme}/{label}/{depths[-1]}"]) / args.seeds
            growth.append(f"{last / first:.3g}" if first > 0 else "n/a (0)")
        rows.append(growth)
        sections.append(f"init {init_scheme}\n" + format_table(["depth", *labels], rows))
    write_outputs(out, "\n\n".join(sections), {"args": to_dict(args), "depths": depths, "raw": raw})
    plot_init_perturb(args, raw, out / "init_perturb.png")
    return 0


def plot_init_perturb(args: InitPerturbConfig, raw: dict[str, list[float]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(args.init_schemes), figsize=(5.5 * len(args.init_schemes), 4.2), squeeze=False)
    depths = sorted(args.depths)
    for ax, init_scheme in zip(axes[0], args.init_schemes, strict=True):
        for model in models(args.placements, args.norm_types, args.residual_schemes):
            label = model.label
            mean, sem = zip(*(
                (m[0], e[0]) for m, e in (mean_and_sem(torch.tensor(raw[f"{init_scheme}/{label}/{d}"]).unsqueeze(1))
                                           for d in depths)
            ), strict=True)  # fmt: skip
            ax.errorbar(depths, mean, yerr=sem, fmt="o-", color=model_color(model), label=label, capsize=2)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(depths, [str(d) for d in depths])
        ax.set_xticks([], minor=True)
        ax.set_xlabel("number of layers L")
        ax.set_ylabel("||f(W) - f(W + delta)||^2 / ||f(W)||^2")
        ax.set_title(f"{init_scheme} init: output change, delta = {args.epsilon:g} rms(W)")
        ax.legend(fontsize=7)
    print(f"wrote {save_figure(fig, path)}")
