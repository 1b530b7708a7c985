"""init-perturb: the output change from a small random change of the weights at initialisation (Admin's measure)."""

from __future__ import annotations

import itertools
import math
from functools import partial
from pathlib import Path
from typing import Any

import torch

from pretrain.analysis import common
from pretrain.analysis.options import InitPerturbConfig, Model
from pretrain.common.cli import to_dict
from pretrain.common.reporting import pyplot, save_figure
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


def measure(args: InitPerturbConfig, init_scheme: str, model: Model, depth: int) -> list[float]:
    """``output_change`` of one (init scheme, model, depth) under each seed."""
    config = common.model_config(args, model.placement, init_scheme, depth, args.vocab_size,
                                 norm_type=model.norm_type, scheme=model.scheme)  # fmt: skip
    seeds = range(args.seed, args.seed + args.seeds)
    return [output_change(config, args.batch_size, args.seq_len, args.epsilon, seed) for seed in seeds]


def run(args: InitPerturbConfig) -> int:
    out = Path(args.out)
    depths = sorted(args.depths)
    raw: dict[str, list[float]] = common.cell_results(out, common.cell_settings(args, AXES), {
        f"{init}/{model.label}/{depth}": partial(measure, args, init, model, depth)
        for init, model, depth in itertools.product(args.init_schemes, args.models.values(), depths)
    })  # fmt: skip
    sections = [f"E||f(x,W) - f(x,W+delta)||^2 / E||f(x,W)||^2 at init, delta = {args.epsilon:g} x rms(W) x N(0,1) on "
                f"every encoder weight matrix; hidden {args.hidden_size}, {args.num_heads} heads, random ids, batch "
                f"{args.batch_size} x {args.seq_len}, mean over {args.seeds} seeds (+- standard error); dropout off. "
                f"Last rows: growth from depth {depths[0]} to {depths[-1]}, against O(N) = {depths[-1] / depths[0]:g} "
                f"and O(log N) = {math.log(2 * depths[-1] + 1) / math.log(2 * depths[0] + 1):.3g} (ln(N+1), N = 2L "
                "sub-layers)"]  # fmt: skip
    labels = list(args.models)
    for init in args.init_schemes:
        rows: list[list[Any]] = [[depth, *(common.mean_sem_text(raw[f"{init}/{label}/{depth}"]) for label in labels)]
                                 for depth in depths]  # fmt: skip
        growth = [[sum(raw[f"{init}/{label}/{depth}"]) for depth in (depths[0], depths[-1])] for label in labels]
        rows.append([f"{depths[-1]}/{depths[0]}", *(f"{last / first:.3g}" if first > 0 else "n/a (0)"
                                                    for first, last in growth)])  # fmt: skip
        sections.append(common.titled_table(f"init {init}", ["depth", *labels], rows))
    common.write_outputs(out, "\n\n".join(sections), {"args": to_dict(args), "depths": depths, "raw": raw})
    plot_init_perturb(args, raw, out / "init_perturb.png")
    return 0


def plot_init_perturb(args: InitPerturbConfig, raw: dict[str, list[float]], path: Path) -> None:
    n = len(args.init_schemes)
    fig, axes = pyplot().subplots(1, n, figsize=(5.5 * n, 4.2), squeeze=False)
    depths = sorted(args.depths)
    colors = common.model_colors((label, model.placement) for label, model in args.models.items())
    for ax, init_scheme in zip(axes[0], args.init_schemes, strict=True):
        for label in args.models:
            mean, sem = zip(*(common.mean_sem(raw[f"{init_scheme}/{label}/{d}"]) for d in depths), strict=True)
            ax.errorbar(depths, mean, yerr=sem, fmt="o-", color=colors[label], label=label, capsize=2)
        ax.set(xscale="log", yscale="log", xlabel="number of layers L", ylabel="||f(W) - f(W + delta)||^2 / ||f(W)||^2",
               title=f"{init_scheme} init: output change, delta = {args.epsilon:g} rms(W)")
        ax.set_xticks(depths, [str(d) for d in depths])
        ax.set_xticks([], minor=True)
        ax.legend(fontsize=7)
    print(f"wrote {save_figure(fig, path)}")
