"""init-scale: the size of the hidden states at initialisation (paper, Lemma 2)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from pretrain.analysis.common import (
    cell_result,
    cell_settings,
    mean_and_sem,
    model_config,
    placement_color,
    write_outputs,
)
from pretrain.analysis.options import InitScaleConfig, models
from pretrain.common.cli import to_dict
from pretrain.common.reporting import format_table, pyplot, save_figure
from pretrain.config import STANDARD_LABEL
from pretrain.modeling import LNBertConfig, LNBertModel
from pretrain.residual_streams import DepthSources
from pretrain.variants import INIT_SCHEMES, NORM_TYPES


def paper_bounds(layer: int) -> tuple[float, float]:
    """Lemma 2's Pre-LN bounds on E||x_l||^2/d, with ``layer`` = number of layers applied to x_0 ~ N(0, I)."""
    return 1 + layer / 2, 1 + 3 * layer / 2


def simplified_stream_scale(
    placement: str, hidden_size: int, num_layers: int, seq_len: int, num_sequences: int, num_draws: int, seed: int
) -> torch.Tensor:
    """||.||^2/d per weight draw and layer, shape ``(num_draws, num_layers)``, in the paper's simplified Transformer.

    Single head, W_Q = W_K = 0 (so attention is the uniform average over the sequence), Xavier-normal
    d x d weights for W_V, W_O, W_1, W_2 (std 1/sqrt(d)), zero biases, ReLU FFN of width d, gamma 1 /
    beta 0 LayerNorms, inputs x_0 ~ N(0, I_d). For ``post``: ||x_post5||^2/d (the FFN output added to its
    normalised input, the quantity of Lemma 2); for ``pre``: ||x_l||^2/d (the residual stream after layer
    l); each averaged over the ``num_sequences x seq_len`` tokens of one independent draw of all weights.

    Uniform attention makes the tokens of a sequence ever more alike with depth, so precision comes from
    many weight draws, not many tokens. The draws run batched (one bmm per projection) because thousands
    of tiny matmuls crawl on a busy CPU; float32 is ample for a mean of squares.
    """
    if placement not in ("post", "pre"):
        raise ValueError(f"placement={placement!r}: the paper's simplified setting covers 'post' and 'pre' only")
    generator = torch.Generator().manual_seed(seed)
    d = hidden_size

    def xavier() -> torch.Tensor:  # one Xavier-normal d x d matrix per draw: std sqrt(2 / (d + d))
        return torch.randn(num_draws, d, d, generator=generator) / math.sqrt(d)

    def layer_norm(v: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(v, (d,), eps=1e-12)

    def mean_sq(v: torch.Tensor) -> torch.Tensor:
        return v.double().pow(2).sum(-1).mean(dim=(1, 2)) / d  # (S,)

    x = torch.randn(num_draws, num_sequences, seq_len, d, generator=generator)  # (S, B, T, d)
    scales = []
    for _ in range(num_layers):
        w_v, w_o, w_1, w_2 = xavier(), xavier(), xavier(), xavier()  # (S, d, d), shared by a draw's sequences

        def attention(v: torch.Tensor, w_v: torch.Tensor = w_v, w_o: torch.Tensor = w_o) -> torch.Tensor:
            mean = v.mean(dim=2).bmm(w_v).bmm(w_o)  # (S, B, d): uniform attention weights 1/T
            return mean.unsqueeze(2).expand_as(v)

        def ffn(v: torch.Tensor, w_1: torch.Tensor = w_1, w_2: torch.Tensor = w_2) -> torch.Tensor:
            flat = v.reshape(num_draws, -1, d)  # (S, B*T, d)
            return torch.relu(flat.bmm(w_1)).bmm(w_2).view_as(v)

        if placement == "post":
            x3 = layer_norm(x + attention(x))
            x5 = x3 + ffn(x3)
            scales.append(mean_sq(x5))
            x = layer_norm(x5)
        else:
            x3 = x + attention(layer_norm(x))
            x = x3 + ffn(layer_norm(x3))
            scales.append(mean_sq(x))
    return torch.stack(scales, dim=1)


def model_stream_scale(config: LNBertConfig, batch_size: int, seq_len: int, seed: int) -> list[float]:
    """E||.||^2/d per layer of the real model at init, read with forward hooks, on random token ids.

    Layers whose block ends in a norm (post, deepnorm, admin, b2t, mix_ln's Post-LN layers): the input of that
    norm, the un-normalised sum (x_post5 = x_post3 + FFN(x_post3), scaled by alpha for DeepNorm). ResiDual: its
    un-normalised stream d. The others: the residual stream after each layer (``hidden_states[-1]`` would be
    after the final norm, so the layer outputs are hooked instead); for HC and mHC the mean of E||x_j||^2/d over
    their n streams (each is Pre-LN's stream at their Pre-LN-equivalent init), for AttnRes the plain sum of its
    sources (the Pre-LN stream its sub-layers' outputs add up to).
    """
    torch.manual_seed(seed)
    model = LNBertModel(config, add_pooling_layer=False).eval()
    d = config.hidden_size
    captured: list[float] = []

    def record(v: torch.Tensor) -> None:
        captured.append((v.double().pow(2).sum(-1) / d).mean().item())

    hooks = []
    for layer in model.encoder.layer:
        if layer.block.ends_in_norm:
            hooks.append(layer.output.LayerNorm.register_forward_pre_hook(lambda _m, inputs: record(inputs[0])))
        elif config.placement.two_streams:
            hooks.append(layer.register_forward_hook(lambda _m, _inputs, output: record(output[0][1])))
        else:
            hooks.append(layer.register_forward_hook(lambda _m, _inputs, output: record(stream_of(output[0]))))
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, config.vocab_size, (batch_size, seq_len), generator=generator)
    with torch.no_grad():
        model(input_ids)
    for hook in hooks:
        hook.remove()
    return captured


def stream_of(state: torch.Tensor | DepthSources) -> torch.Tensor:
    """What ``model_stream_scale`` measures of a layer's output: the stream itself, HC's and mHC's n streams
    (B, T, n, d), whose mean over n ``record`` takes with the tokens', or AttnRes's sources summed."""
    return state.total() if isinstance(state, DepthSources) else state


AXES = ("placements", "norm_types", "residual_schemes", "init_schemes")
"""The options the model cells (ii) are drawn from; every other option is a setting of each cell."""
NORM_LINESTYLES = ("-", "--", ":", "-.")
SCHEME_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def curve_style(placement: str, norm_type: str, init_scheme: str, scheme_index: int = 0) -> dict[str, Any]:
    """How panel (ii) draws one model cell, so that cells differing in any axis (post/bert and post-rmsnorm/bert)
    are told apart: colour per placement, line style per norm type, marker per residual scheme (its index among
    those compared), filled markers for the first init scheme (bert), hollow for the other (xavier)."""
    color = placement_color(placement)
    return {
        "color": color,
        "linestyle": NORM_LINESTYLES[NORM_TYPES.index(norm_type) % len(NORM_LINESTYLES)],
        "marker": SCHEME_MARKERS[scheme_index % len(SCHEME_MARKERS)],
        "markerfacecolor": color if INIT_SCHEMES.index(init_scheme) == 0 else "white",
    }


def run(args: InitScaleConfig) -> int:
    layers = list(range(1, args.num_layers + 1))
    out = Path(args.out)
    settings = cell_settings(args, AXES)
    results: dict[str, Any] = {"args": to_dict(args), "simplified": {}}

    def simplified(placement: str) -> dict[str, list[float]]:
        samples = simplified_stream_scale(
            placement,
            args.paper_hidden_size,
            args.num_layers,
            args.paper_seq_len,
            args.paper_sequences,
            args.seeds,
            args.seed,
        )
        mean, sem = mean_and_sem(samples)
        return {"mean": mean, "sem": sem}

    for placement in ("post", "pre"):
        # Each cell is written as soon as it is measured: a killed run keeps its cells, a rerun reads them.
        results["simplified"][placement] = cell_result(
            out, f"simplified/{placement}", settings, lambda p=placement: simplified(p)
        )
    rows = []
    for i, layer in enumerate(layers):
        low, high = paper_bounds(layer)
        post = results["simplified"]["post"]
        pre = results["simplified"]["pre"]
        rows.append(
            [
                layer,
                post["mean"][i],
                post["sem"][i],
                1.5,
                pre["mean"][i],
                pre["sem"][i],
                low,
                high,
                "yes" if low <= pre["mean"][i] <= high else "NO",
            ]
        )
    table = (
        f"(i) paper's simplified setting: d={args.paper_hidden_size}, T={args.paper_seq_len} tokens, uniform "
        f"attention, Xavier, ReLU FFN width d, {args.seeds} seeds x {args.paper_sequences} sequences\n"
        + format_table(
            ["layer", "post ||x5||^2/d", "sem", "paper", "pre ||x_l||^2/d", "sem", "bound lo", "bound hi", "inside"],
            rows,
        )
    )

    results["model"] = {}
    styles = {}
    model_rows = []
    compared = models(args.placements, args.norm_types, args.residual_schemes)
    for init_scheme in args.init_schemes:
        for model in compared:
            label, placement = model.label, model.placement
            config = model_config(
                args, placement, init_scheme, args.num_layers, args.vocab_size, norm_type=model.norm_type,
                scheme=model.scheme,
            )  # fmt: skip

            def measure(config: LNBertConfig = config, placement: str = placement) -> dict[str, Any]:
                samples = [
                    model_stream_scale(config, args.batch_size, args.seq_len, args.seed + s)
                    for s in range(args.model_seeds)
                ]
                mean, sem = mean_and_sem(torch.tensor(samples))
                return {"mean": mean, "sem": sem, "placement": placement}

            key = f"{label}/{init_scheme}"
            scheme_index = args.residual_schemes.index(model.scheme)
            styles[key] = curve_style(placement, model.norm_type, init_scheme, scheme_index)
            results["model"][key] = cell_result(out, f"model/{key}", settings, measure)
            mean = results["model"][key]["mean"]
            model_rows.append([label, init_scheme, *(f"{m:.4g}" for m in mean)])
    table += (
        f"\n\n(ii) LNBertModel at init (hidden {args.hidden_size}, FFN {args.intermediate_size or 4 * args.hidden_size}, "
        f"GELU, {args.num_heads} heads, random ids, batch {args.batch_size} x {args.seq_len}, {args.model_seeds} seeds): "
        "E||.||^2/d per layer; layers ending in a norm (post, deepnorm, admin, b2t): that norm's input x_post5; "
        "resi_dual: its stream d; the others: the residual stream x_l"
        + ("" if all(m.scheme == STANDARD_LABEL for m in compared) else
           " (HC, mHC: the mean over their n streams; AttnRes: the sum of its sources)")
        + "\n" + format_table(["placement", "init", *(f"l={layer}" for layer in layers)], model_rows)
    )
    write_outputs(out, table, results)
    plot_init_scale(results, layers, styles, out / "init_scale.png")
    return 0


def plot_init_scale(results: dict[str, Any], layers: list[int], styles: dict[str, dict[str, Any]], path: Path) -> None:
    """(i) the simplified setting against Lemma 2's bounds; (ii) every model cell, drawn as ``styles`` says
    (curve_style) and labelled by its variant and init scheme."""
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.4))
    ax1.fill_between(
        layers,
        [paper_bounds(lay)[0] for lay in layers],
        [paper_bounds(lay)[1] for lay in layers],
        color="C1",
        alpha=0.15,
        label="Pre-LN bounds (1+l/2, 1+3l/2)",
    )
    ax1.axhline(1.5, color="C0", ls=":", label="Post-LN paper: 1.5")
    for color, placement, what in (("C0", "post", "||x_post5||^2/d"), ("C1", "pre", "||x_l||^2/d")):
        stats = results["simplified"][placement]
        ax1.errorbar(layers, stats["mean"], yerr=stats["sem"], fmt="o-", color=color, label=f"{placement}: {what}")
    ax1.set_title("(i) paper's simplified Transformer (Lemma 2)")
    ax1.set_xlabel("layer l")
    ax1.set_ylabel("E||x||^2 / d")
    ax1.legend(fontsize=8)
    for key, stats in results["model"].items():
        ax2.plot(layers, stats["mean"], label=key, **styles[key])
    ax2.set_title("(ii) LNBertModel at init\ncolour: placement; line: norm type; marker: residual scheme; "
                  f"hollow: {', '.join(INIT_SCHEMES[1:])} init", fontsize="small")  # fmt: skip
    ax2.set_xlabel("layer l")
    ax2.set_ylabel("E||x||^2 / d  (post: FFN-LN input; pre: stream)")
    ax2.set_yscale("log")
    ax2.legend(fontsize=6, ncol=2)
    print(f"wrote {save_figure(fig, path)}")
