"""init-scale: the size of the hidden states at initialisation (paper, Lemma 2)."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from pretrain.analysis import common
from pretrain.analysis.options import InitScaleConfig, Model
from pretrain.common.cli import to_dict
from pretrain.common.reporting import pyplot, save_figure
from pretrain.config import STANDARD_LABEL
from pretrain.modeling import LNBertConfig, LNBertModel
from pretrain.residual_streams import DepthSources
from pretrain.variants import INIT_SCHEMES, NORM_TYPES


def paper_bounds(layer: int) -> tuple[float, float]:
    """Lemma 2's Pre-LN bounds on E||x_l||^2/d, with ``layer`` = number of layers applied to x_0 ~ N(0, I)."""
    return 1 + layer / 2, 1 + 3 * layer / 2


def simplified_stream_scale(placement: str, hidden_size: int, num_layers: int, seq_len: int, num_sequences: int,
                            num_draws: int, seed: int) -> torch.Tensor:  # fmt: skip
    """||.||^2/d per weight draw and layer, shape ``(num_draws, num_layers)``, in the paper's simplified Transformer
    (options.InitScaleConfig, (i)): ``post``: ||x_post5||^2/d, ``pre``: ||x_l||^2/d, each averaged over the
    ``num_sequences x seq_len`` tokens of one draw of all weights. Uniform attention makes a sequence's tokens ever
    more alike with depth, so precision comes from many weight draws, not many tokens; the draws run batched (one
    bmm per projection): thousands of tiny matmuls crawl on a CPU."""
    if placement not in ("post", "pre"):
        raise ValueError(f"placement={placement!r}: the paper's simplified setting covers 'post' and 'pre' only")
    generator = torch.Generator().manual_seed(seed)
    d = hidden_size

    def layer_norm(v: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(v, (d,), eps=1e-12)

    def mean_sq(v: torch.Tensor) -> torch.Tensor:
        return v.double().pow(2).sum(-1).mean(dim=(1, 2)) / d  # (S,)

    def attention(v: torch.Tensor, w_v: torch.Tensor, w_o: torch.Tensor) -> torch.Tensor:
        return v.mean(dim=2).bmm(w_v).bmm(w_o).unsqueeze(2).expand_as(v)  # uniform attention weights 1/T

    def ffn(v: torch.Tensor, w_1: torch.Tensor, w_2: torch.Tensor) -> torch.Tensor:
        return torch.relu(v.reshape(num_draws, -1, d).bmm(w_1)).bmm(w_2).view_as(v)  # as (S, B*T, d)

    x = torch.randn(num_draws, num_sequences, seq_len, d, generator=generator)  # (S, B, T, d)
    scales = []
    for _ in range(num_layers):
        # Xavier-normal d x d weights (std sqrt(2 / (d + d))), one set per draw shared by its sequences: (S, d, d)
        w_v, w_o, w_1, w_2 = (torch.randn(num_draws, d, d, generator=generator) / math.sqrt(d) for _ in range(4))
        if placement == "post":
            x3 = layer_norm(x + attention(x, w_v, w_o))
            x5 = x3 + ffn(x3, w_1, w_2)
            scales.append(mean_sq(x5))
            x = layer_norm(x5)
        else:
            x3 = x + attention(layer_norm(x), w_v, w_o)
            x = x3 + ffn(layer_norm(x3), w_1, w_2)
            scales.append(mean_sq(x))
    return torch.stack(scales, dim=1)


def model_stream_scale(config: LNBertConfig, batch_size: int, seq_len: int, seed: int) -> list[float]:
    """E||.||^2/d per layer of the real model at init, read with forward hooks, on random token ids. Layers whose
    block ends in a norm (post, deepnorm, admin, b2t, mix_ln's Post-LN layers): that norm's un-normalised input
    (x_post5, scaled by alpha for DeepNorm). ResiDual: its un-normalised stream d. The others: the residual stream
    after each layer (``hidden_states[-1]`` is after the final norm); for HC and mHC the mean over their n streams,
    for AttnRes the plain sum of its sources (the Pre-LN stream its sub-layers' outputs add up to); for nGPT the unit
    vectors h (1/d by construction)."""
    torch.manual_seed(seed)
    model = LNBertModel(config, add_pooling_layer=False).eval()
    d = config.hidden_size
    captured: list[float] = []

    def record(v: torch.Tensor | DepthSources) -> None:
        v = v.total() if isinstance(v, DepthSources) else v
        captured.append((v.double().pow(2).sum(-1) / d).mean().item())

    for layer in model.encoder.layer:  # the model is this function's own: its hooks go with it
        if not config.placement.sphere and layer.block.ends_in_norm:
            layer.output.LayerNorm.register_forward_pre_hook(lambda _m, inputs: record(inputs[0]))
        elif config.placement.two_streams:
            layer.register_forward_hook(lambda _m, _inputs, output: record(output[0][1]))
        else:
            layer.register_forward_hook(lambda _m, _inputs, output: record(output[0]))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model(torch.randint(0, config.vocab_size, (batch_size, seq_len), generator=generator))
    return captured


AXES = ("placements", "norm_types", "residual_schemes", "init_schemes")
"""The options the model cells (ii) are drawn from; every other option is a setting of each cell."""
NORM_LINESTYLES = ("-", "--", ":", "-.")
SCHEME_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def curve_style(placement: str, norm_type: str, init_scheme: str, scheme_index: int = 0) -> dict[str, Any]:
    """How panel (ii) draws one model cell, so that cells differing in any axis are told apart: colour per placement,
    line style per norm type, marker per residual scheme (its index), hollow markers for init schemes after bert."""
    color = common.placement_color(placement)
    return {
        "color": color,
        "linestyle": NORM_LINESTYLES[NORM_TYPES.index(norm_type) % len(NORM_LINESTYLES)],
        "marker": SCHEME_MARKERS[scheme_index % len(SCHEME_MARKERS)],
        "markerfacecolor": color if INIT_SCHEMES.index(init_scheme) == 0 else "white",
    }


def simplified_stats(args: InitScaleConfig, placement: str) -> dict[str, list[float]]:
    """Mean and standard error per layer of ``simplified_stream_scale`` over the weight draws."""
    samples = simplified_stream_scale(placement, args.paper_hidden_size, args.num_layers, args.paper_seq_len,
                                      args.paper_sequences, args.seeds, args.seed)  # fmt: skip
    mean, sem = common.mean_and_sem(samples)
    return {"mean": mean, "sem": sem}


def model_stats(args: InitScaleConfig, model: Model, init_scheme: str) -> dict[str, Any]:
    """Mean and standard error per layer of ``model_stream_scale`` over ``model_seeds`` initialisations."""
    config = common.model_config(args, model.placement, init_scheme, args.num_layers, args.vocab_size,
                                 norm_type=model.norm_type, scheme=model.scheme)  # fmt: skip
    samples = [model_stream_scale(config, args.batch_size, args.seq_len, args.seed + s)
               for s in range(args.model_seeds)]  # fmt: skip
    mean, sem = common.mean_and_sem(torch.tensor(samples))
    return {"mean": mean, "sem": sem, "placement": model.placement}


def run(args: InitScaleConfig) -> int:
    out, settings = Path(args.out), common.cell_settings(args, AXES)
    # Each cell is written as soon as it is measured: a killed run keeps its cells, a rerun reads them.
    simplified = {p: common.cell_result(out, f"simplified/{p}", settings, partial(simplified_stats, args, p))
                  for p in ("post", "pre")}  # fmt: skip
    cells = {f"{m.label}/{i}": (m, i) for i in args.init_schemes for m in args.models.values()}
    measured = {key: common.cell_result(out, f"model/{key}", settings, partial(model_stats, args, m, i))
                for key, (m, i) in cells.items()}  # fmt: skip
    post, pre = simplified["post"], simplified["pre"]
    bounds = [paper_bounds(layer) for layer in range(1, args.num_layers + 1)]
    rows = [[i + 1, post["mean"][i], post["sem"][i], 1.5, pre["mean"][i], pre["sem"][i], low, high,
             "yes" if low <= pre["mean"][i] <= high else "NO"] for i, (low, high) in enumerate(bounds)]  # fmt: skip
    table = common.titled_table(
        f"(i) paper's simplified setting: d={args.paper_hidden_size}, T={args.paper_seq_len} tokens, uniform "
        f"attention, Xavier, ReLU FFN width d, {args.seeds} seeds x {args.paper_sequences} sequences",
        ["layer", "post ||x5||^2/d", "sem", "paper", "pre ||x_l||^2/d", "sem", "bound lo", "bound hi", "inside"], rows,
    ) + "\n\n" + common.titled_table(
        f"(ii) LNBertModel at init (hidden {args.hidden_size}, FFN {args.intermediate_size or 4 * args.hidden_size}, "
        f"GELU, {args.num_heads} heads, random ids, batch {args.batch_size} x {args.seq_len}, {args.model_seeds} "
        "seeds): E||.||^2/d per layer; layers ending in a norm (post, deepnorm, admin, b2t): that norm's input "
        "x_post5; resi_dual: its stream d; the others: the residual stream x_l"
        + ("" if args.residual_schemes == [STANDARD_LABEL] else
           " (HC, mHC: the mean over their n streams; AttnRes: the sum of its sources)"),
        ["placement", "init", *(f"l={layer}" for layer in range(1, args.num_layers + 1))],
        [[m.label, i, *(f"{v:.4g}" for v in measured[key]["mean"])] for key, (m, i) in cells.items()],
    )  # fmt: skip
    common.write_outputs(out, table, {"args": to_dict(args), "simplified": simplified, "model": measured})
    styles = {key: curve_style(m.placement, m.norm_type, i, args.residual_schemes.index(m.scheme))
              for key, (m, i) in cells.items()}  # fmt: skip
    plot_init_scale(simplified, measured, styles, out / "init_scale.png")
    return 0


def plot_init_scale(simplified: dict[str, Any], measured: dict[str, Any], styles: dict[str, dict[str, Any]],
                    path: Path) -> None:  # fmt: skip
    """(i) the simplified setting against Lemma 2's bounds; (ii) every model cell, drawn as ``styles`` says
    (curve_style) and labelled by its variant and init scheme."""
    layers = list(range(1, len(simplified["pre"]["mean"]) + 1))
    fig, (ax1, ax2) = pyplot().subplots(1, 2, figsize=(11, 4.4))
    bounds = [paper_bounds(layer) for layer in layers]
    ax1.fill_between(layers, *zip(*bounds, strict=True), color="C1", alpha=0.15, label="Pre-LN bounds (1+l/2, 1+3l/2)")
    ax1.axhline(1.5, color="C0", ls=":", label="Post-LN paper: 1.5")
    for color, placement, what in (("C0", "post", "||x_post5||^2/d"), ("C1", "pre", "||x_l||^2/d")):
        stats = simplified[placement]
        ax1.errorbar(layers, stats["mean"], yerr=stats["sem"], fmt="o-", color=color, label=f"{placement}: {what}")
    ax1.set(title="(i) paper's simplified Transformer (Lemma 2)", xlabel="layer l", ylabel="E||x||^2 / d")
    ax1.legend(fontsize=8)
    for key, stats in measured.items():
        ax2.plot(layers, stats["mean"], label=key, **styles[key])
    ax2.set_title("(ii) LNBertModel at init\ncolour: placement; line: norm type; marker: residual scheme; "
                  f"hollow: {', '.join(INIT_SCHEMES[1:])} init", fontsize="small")  # fmt: skip
    ax2.set(xlabel="layer l", ylabel="E||x||^2 / d  (post: FFN-LN input; pre: stream)", yscale="log")
    ax2.legend(fontsize=6, ncol=2)
    print(f"wrote {save_figure(fig, path)}")
