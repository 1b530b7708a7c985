"""Measurements behind the claims of Xiong et al. 2020, "On Layer Normalization in the Transformer
Architecture", one subcommand each. Every subcommand prints a table, writes it (``table.txt``) and the
raw numbers (``results.json``) into ``--out`` and draws a PNG there.

    python -m pretrain.analysis ln-jacobian   # ||J_LN(x)||_2 = sqrt(d)/||x - mean(x)||  (paper, Sec. 3)
    python -m pretrain.analysis init-scale    # E||x_l||^2/d at init: Post-LN 1.5, Pre-LN in [1+l/2, 1+3l/2]
    python -m pretrain.analysis init-grads    # FFN gradient norms at init per layer and vs depth (Figure 3)
    python -m pretrain.analysis grid          # warm-up x peak-lr grid of short pretraining runs

``python -m pretrain.analysis SUBCOMMAND --help`` explains each one's options.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pretrain.layout import read_metrics, read_status
from pretrain.modeling import NORM_PLACEMENTS, LNBertConfig, LNBertForMaskedLM, LNBertModel

DEFAULT_OUT = Path("runs") / "analysis"


# --------------------------------------------------------------------------------------------------
# Shared output helpers: a plain-text table, results.json, and a headless matplotlib
# --------------------------------------------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Right-aligned plain-text table; floats in 4 significant digits."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def write_outputs(out_dir: Path, table: str, results: dict[str, Any]) -> None:
    """Print the table and store it with the raw numbers, so a figure can be redrawn without rerunning."""
    out_dir.mkdir(parents=True, exist_ok=True)
    print(table)
    (out_dir / "table.txt").write_text(table + "\n")
    (out_dir / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (no display on servers or in tests)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, *, tight_layout: bool = True) -> None:
    """Save at 120 dpi, cropped to the drawing. ``tight_layout=False`` where a colour bar spans several axes
    (matplotlib cannot lay those out and warns)."""
    if tight_layout:
        fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    pyplot().close(fig)
    print(f"wrote {path}")


# --------------------------------------------------------------------------------------------------
# ln-jacobian: the spectral norm of LayerNorm's Jacobian is sqrt(d)/||x - mean(x)||
# --------------------------------------------------------------------------------------------------


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
    save_figure(fig, path)


def cmd_ln_jacobian(args: argparse.Namespace) -> int:
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


# --------------------------------------------------------------------------------------------------
# init-scale: the size of the hidden states at initialisation (paper, Lemma 2)
# --------------------------------------------------------------------------------------------------


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


def mean_and_sem(samples: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per-column mean and standard error of the mean over the rows (independent draws), shape (n, L)."""
    samples = samples.double()
    n = samples.shape[0]
    sem = samples.std(dim=0) / math.sqrt(n) if n > 1 else torch.zeros(samples.shape[1], dtype=torch.float64)
    return samples.mean(dim=0).tolist(), sem.tolist()


def model_config(
    args: argparse.Namespace, placement: str, init_scheme: str, num_layers: int, vocab_size: int, pad_token_id: int = 0
) -> LNBertConfig:
    """A model config from the shared size flags, dropout off (measurements at initialisation)."""
    return LNBertConfig(
        vocab_size=vocab_size,
        pad_token_id=pad_token_id,
        hidden_size=args.hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=args.num_heads,
        intermediate_size=args.intermediate_size or 4 * args.hidden_size,
        max_position_embeddings=max(512, args.seq_len),
        norm_placement=placement,
        init_scheme=init_scheme,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def model_stream_scale(config: LNBertConfig, batch_size: int, seq_len: int, seed: int) -> list[float]:
    """E||.||^2/d per layer of the real model at init, read with forward hooks, on random token ids.

    Post-LN and DeepNorm: the input of the FFN LayerNorm (x_post5 = x_post3 + FFN(x_post3), scaled by
    alpha for DeepNorm). Pre-LN and sandwich: the residual stream after each layer (``hidden_states[-1]``
    would be after the final LN, so the layer outputs are hooked instead).
    """
    torch.manual_seed(seed)
    model = LNBertModel(config, add_pooling_layer=False).eval()
    d = config.hidden_size
    captured: list[float] = []

    def record(v: torch.Tensor) -> None:
        captured.append((v.double().pow(2).sum(-1) / d).mean().item())

    hooks = []
    for layer in model.encoder.layer:
        if config.norm_placement in ("post", "deepnorm"):
            hooks.append(layer.output.LayerNorm.register_forward_pre_hook(lambda _m, inputs: record(inputs[0])))
        else:
            hooks.append(layer.register_forward_hook(lambda _m, _inputs, output: record(output[0])))
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, config.vocab_size, (batch_size, seq_len), generator=generator)
    with torch.no_grad():
        model(input_ids)
    for hook in hooks:
        hook.remove()
    return captured


def cmd_init_scale(args: argparse.Namespace) -> int:
    layers = list(range(1, args.num_layers + 1))
    results: dict[str, Any] = {"args": _jsonable_args(args), "simplified": {}}
    for placement in ("post", "pre"):
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
        results["simplified"][placement] = {"mean": mean, "sem": sem}
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
    model_rows = []
    for init_scheme in args.init_schemes:
        for placement in args.placements:
            config = model_config(args, placement, init_scheme, args.num_layers, args.vocab_size)
            samples = [
                model_stream_scale(config, args.batch_size, args.seq_len, args.seed + s)
                for s in range(args.model_seeds)
            ]
            mean, sem = mean_and_sem(torch.tensor(samples))
            results["model"][f"{placement}/{init_scheme}"] = {"mean": mean, "sem": sem}
            model_rows.append([placement, init_scheme, *(f"{m:.3f}" for m in mean)])
    table += (
        f"\n\n(ii) LNBertModel at init (hidden {args.hidden_size}, FFN {args.intermediate_size or 4 * args.hidden_size}, "
        f"GELU, {args.num_heads} heads, random ids, batch {args.batch_size} x {args.seq_len}, {args.model_seeds} seeds): "
        "E||.||^2/d per layer; post/deepnorm: FFN-LN input x_post5, pre/sandwich: residual stream x_l\n"
        + format_table(["placement", "init", *(f"l={layer}" for layer in layers)], model_rows)
    )
    out = Path(args.out)
    write_outputs(out, table, results)
    plot_init_scale(results, layers, out / "init_scale.png")
    return 0


def plot_init_scale(results: dict[str, Any], layers: list[int], path: Path) -> None:
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
        placement, init_scheme = key.split("/")
        color = f"C{NORM_PLACEMENTS.index(placement)}"  # one colour per placement, line style per init
        ax2.plot(layers, stats["mean"], "o-" if init_scheme == "xavier" else "s--", color=color, label=key)
    ax2.set_title("(ii) LNBertModel at init")
    ax2.set_xlabel("layer l")
    ax2.set_ylabel("E||x||^2 / d  (post: FFN-LN input; pre: stream)")
    ax2.set_yscale("log")
    ax2.legend(fontsize=8)
    save_figure(fig, path)


# --------------------------------------------------------------------------------------------------
# init-grads: FFN gradient norms at initialisation (paper, Theorem 1 and Figure 3)
# --------------------------------------------------------------------------------------------------


def load_mlm_data(args: argparse.Namespace) -> Any:
    """Real text through the pretraining data pipeline: Python's own documentation (no download) or a JSONL file.

    ``objective="mlm"`` gives full-length packed sequences; the measurement uses the MLM loss only.
    """
    # Imported here: `datasets` takes seconds to import and the other subcommands do not need it.
    from pretrain.data import DataConfig, SourceConfig, build_pretraining_data

    if args.data is not None and not Path(args.data).exists():
        raise FileNotFoundError(f"--data {args.data}: no such file; give a JSON Lines file with a 'text' field")
    source = SourceConfig(kind="json", path=str(args.data)) if args.data else SourceConfig(kind="python_docs")
    cfg = DataConfig(
        sources=[source],
        tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        max_seq_length=args.seq_len,
        objective="mlm",
        max_documents=args.max_documents,
        cache_dir=str(args.cache_dir),
    )
    return build_pretraining_data(cfg, seed=0)


def mlm_batch(data: Any, batch_size: int, seed: int) -> dict[str, torch.Tensor]:
    """``batch_size`` training instances drawn by ``seed``, dynamically masked as in pretraining (15%)."""
    from pretrain.data import MaskingCollator  # lazily, as in load_mlm_data

    n = len(data.train)
    if n < batch_size:
        raise ValueError(
            f"only {n} training instances for --batch-size {batch_size}; raise --max-documents or lower --batch-size"
        )
    rows = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:batch_size].tolist()
    collator = MaskingCollator(data.tokenizer, mlm_probability=0.15, seed=seed)
    return collator([data.train[i] for i in rows])


def ffn_gradient_norms(
    config: LNBertConfig, batch: dict[str, torch.Tensor], seed: int, device: str = "cpu"
) -> tuple[list[float], list[float]]:
    """Frobenius norms of dL/dW1 and dL/dW2 (``intermediate.dense.weight``, ``output.dense.weight``) per layer.

    A fresh model initialised under ``seed``; L is the MLM loss of one batch. Dropout is off (eval mode and
    zero dropout probabilities) so the numbers are those of the deterministic network; autograd still runs.
    """
    torch.manual_seed(seed)
    model = LNBertForMaskedLM(config).to(device).eval()
    inputs = {k: batch[k].to(device) for k in ("input_ids", "attention_mask", "token_type_ids", "labels")}
    model(**inputs).loss.backward()
    layers = model.bert.encoder.layer
    w1 = [layer.intermediate.dense.weight.grad.norm().item() for layer in layers]
    w2 = [layer.output.dense.weight.grad.norm().item() for layer in layers]
    return w1, w2


def measure_init_grads(
    args: argparse.Namespace, data: Any, init_scheme: str, placement: str, depth: int
) -> dict[str, list[list[float]]]:
    """Per-seed, per-layer W1/W2 gradient norms of one (init, placement, depth); seed s uses batch s."""
    w1s, w2s = [], []
    for s in range(args.seeds):
        batch = mlm_batch(data, args.batch_size, args.seed + s)
        config = model_config(args, placement, init_scheme, depth, len(data.tokenizer), data.tokenizer.pad_token_id)
        w1, w2 = ffn_gradient_norms(config, batch, args.seed + s, args.device)
        w1s.append(w1)
        w2s.append(w2)
    return {"w1": w1s, "w2": w2s}


def _mean_sem(values: list[float]) -> tuple[float, float]:
    mean, sem = mean_and_sem(torch.tensor(values).unsqueeze(1))
    return mean[0], sem[0]


def cmd_init_grads(args: argparse.Namespace) -> int:
    data = load_mlm_data(args)
    depths = sorted(set(args.depths) | {args.num_layers})
    raw: dict[str, Any] = {}
    for init_scheme in args.init_schemes:
        for placement in args.placements:
            for depth in depths:
                raw[f"{init_scheme}/{placement}/{depth}"] = measure_init_grads(
                    args, data, init_scheme, placement, depth
                )
                print(f"measured {init_scheme}/{placement}/depth {depth}", flush=True)

    source = args.data or "python_docs"
    header = (
        f"MLM on {source} (vocab {len(data.tokenizer)}), hidden {args.hidden_size}, FFN "
        f"{args.intermediate_size or 4 * args.hidden_size}, batch {args.batch_size} x {args.seq_len}, "
        f"mean over {args.seeds} seeds (+- standard error); dropout off"
    )
    sections = [header]
    for init_scheme in args.init_schemes:
        per_layer = []
        for layer in range(args.num_layers):
            row: list[Any] = [layer + 1]
            for placement in args.placements:
                grads = raw[f"{init_scheme}/{placement}/{args.num_layers}"]
                row += [_mean_sem([g[layer] for g in grads["w1"]])[0], _mean_sem([g[layer] for g in grads["w2"]])[0]]
            per_layer.append(row)
        headers = ["layer", *(f"{p} {w}" for p in args.placements for w in ("W1", "W2"))]
        sections.append(
            f"init {init_scheme}: ||dL/dW||_F per layer, depth {args.num_layers}\n" + format_table(headers, per_layer)
        )
        by_depth = []
        for depth in args.depths:
            row = [depth]
            for placement in args.placements:
                mean, sem = _mean_sem([g[-1] for g in raw[f"{init_scheme}/{placement}/{depth}"]["w2"]])
                row.append(f"{mean:.4g} +- {sem:.2g}")
            by_depth.append(row)
        ratio_row: list[Any] = [f"{min(args.depths)}/{max(args.depths)}"]
        for placement in args.placements:
            shallow = _mean_sem([g[-1] for g in raw[f"{init_scheme}/{placement}/{min(args.depths)}"]["w2"]])[0]
            deep = _mean_sem([g[-1] for g in raw[f"{init_scheme}/{placement}/{max(args.depths)}"]["w2"]])[0]
            ratio_row.append(f"{shallow / deep:.3f}")
        by_depth.append(ratio_row)
        sections.append(
            f"init {init_scheme}: last layer ||dL/dW2||_F vs depth (last row: ratio shallow/deep; Pre-LN theory "
            f"sqrt({max(args.depths)}/{min(args.depths)}) = {math.sqrt(max(args.depths) / min(args.depths)):.3f}, "
            "Post-LN theory 1)\n" + format_table(["depth", *args.placements], by_depth)
        )
    out = Path(args.out)
    results = {"args": _jsonable_args(args), "vocab_size": len(data.tokenizer), "depths": depths, "raw": raw}
    write_outputs(out, "\n\n".join(sections), results)
    plot_init_grads(args, raw, out / "init_grads.png")
    return 0


def _jsonable_args(args: argparse.Namespace) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}


def plot_init_grads(args: argparse.Namespace, raw: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    n_rows = len(args.init_schemes)
    fig, axes = plt.subplots(n_rows, 3, figsize=(15, 4.2 * n_rows), squeeze=False)
    layers = list(range(1, args.num_layers + 1))
    for row, init_scheme in enumerate(args.init_schemes):
        ax_w1, ax_w2, ax_depth = axes[row]
        for placement in args.placements:
            color = f"C{NORM_PLACEMENTS.index(placement)}"
            grads = raw[f"{init_scheme}/{placement}/{args.num_layers}"]
            for ax, key in ((ax_w1, "w1"), (ax_w2, "w2")):
                mean, sem = mean_and_sem(torch.tensor(grads[key]))
                ax.errorbar(layers, mean, yerr=sem, fmt="o-", color=color, label=placement, capsize=2)
            stats = [_mean_sem([g[-1] for g in raw[f"{init_scheme}/{placement}/{d}"]["w2"]]) for d in args.depths]
            ax_depth.errorbar(args.depths, [m for m, _ in stats], yerr=[s for _, s in stats], fmt="o-",
                              color=color, label=placement, capsize=2)  # fmt: skip
        for ax, title in ((ax_w1, "W1 (intermediate.dense)"), (ax_w2, "W2 (output.dense)")):
            ax.set_title(f"{init_scheme} init: ||dL/d{title.split()[0]}||_F per layer, depth {args.num_layers}")
            ax.set_xlabel("layer")
        ax_depth.set_title(f"{init_scheme} init: last layer ||dL/dW2||_F vs depth")
        ax_depth.set_xlabel("number of layers")
        for ax in (ax_w1, ax_w2, ax_depth):
            ax.set_yscale("log")
            ax.set_ylabel("gradient norm")
            ax.legend(fontsize=8)
    save_figure(fig, path)


# --------------------------------------------------------------------------------------------------
# grid: warm-up x peak learning rate, each cell a short pretraining run through pretrain/run.py
# --------------------------------------------------------------------------------------------------


def cell_name(placement: str, warmup: int, lr: float) -> str:
    return f"{placement}-w{warmup}-lr{lr:g}"


def cell_overrides(args: argparse.Namespace, placement: str, warmup: int, lr: float, run_dir: Path) -> list[str]:
    """pretrain/run.py arguments of one cell: the grid's size and this cell's placement, warm-up and lr.

    Evaluation, checkpoint and snapshot happen once, at the end (only the final validation loss is read);
    ``--set`` overrides come last, so they win.
    """
    argv = [f"--config={args.config}"] if args.config else []
    argv += [
        f"--model.norm_placement={placement}",
        f"--optim.lr={lr}",
        f"--optim.warmup_steps={warmup}",
        f"--train.max_steps={args.max_steps}",
        f"--train.output_dir={run_dir}",
        f"--train.run_name=grid-{cell_name(placement, warmup, lr)}",
        f"--train.seed={args.seed}",
        f"--model.num_hidden_layers={args.num_layers}",
        f"--model.hidden_size={args.hidden_size}",
        f"--model.num_attention_heads={args.num_heads}",
        f"--model.intermediate_size={args.intermediate_size or 4 * args.hidden_size}",
        "--train.eval_every=0",
        "--train.checkpoint_every=0",
        "--train.snapshot_at_start=false",
        "--train.snapshot_at_end=false",
        "--tracking.backend=none",
    ]
    return argv + [f"--{item}" for item in args.set]


def read_cell(run_dir: Path) -> dict[str, Any]:
    """Outcome of one finished cell: status, final validation MLM loss, divergence step (pretrain.layout)."""
    status = read_status(run_dir)
    val = [row for row in read_metrics(run_dir) if "val/mlm_loss" in row]
    return {
        "status": status.get("status", "unknown"),
        "diverged_at_step": status.get("diverged_at_step"),
        "val_mlm_loss": val[-1]["val/mlm_loss"] if val else None,
        "val_step": val[-1]["step"] if val else None,
        "message": status.get("message", ""),
    }


def run_cell(args: argparse.Namespace, placement: str, warmup: int, lr: float) -> dict[str, Any]:
    """Run one cell in a subprocess (a fresh interpreter per run, as a user would launch it); a cell whose
    run directory already holds a finished or diverged run is read, not rerun, so a stopped grid continues."""
    name = cell_name(placement, warmup, lr)
    run_dir = Path(args.out) / "runs" / name
    if read_status(run_dir).get("status") in ("finished", "diverged"):
        print(f"{name}: already done, reading {run_dir}", flush=True)
        return read_cell(run_dir)
    argv = cell_overrides(args, placement, warmup, lr, run_dir)
    if run_dir.exists():
        argv.append("--train.resume=auto")  # an interrupted cell continues from its last checkpoint
    log = Path(args.out) / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"{name}: python -m pretrain.run {' '.join(argv)}  (log: {log})", flush=True)
    with log.open("w") as f:
        code = subprocess.run(
            [sys.executable, "-m", "pretrain.run", *argv], stdout=f, stderr=subprocess.STDOUT
        ).returncode
    cell = read_cell(run_dir)
    if code != 0:
        tail = log.read_text().strip().splitlines()[-3:]
        cell.update(status="failed", message=f"exit code {code}: {' | '.join(tail)}")
    return cell


def describe_cell(cell: dict[str, Any]) -> str:
    if cell["status"] == "diverged":
        return f"div@{cell['diverged_at_step']}"
    if cell["status"] == "finished" and cell["val_mlm_loss"] is not None:
        return f"{cell['val_mlm_loss']:.3f}"
    return cell["status"]


def cmd_grid(args: argparse.Namespace) -> int:
    out = Path(args.out)
    grid = [(p, w, lr) for p in args.placements for w in args.warmup_steps for lr in args.lrs]
    # Each cell is its own process, so threads only wait on them; give each process its share of the cores
    # (OMP_NUM_THREADS) when running several.
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        outcomes = pool.map(lambda cell: run_cell(args, *cell), grid)
        cells = {cell_name(*cell): outcome for cell, outcome in zip(grid, outcomes, strict=True)}
    sections = [
        f"final val/mlm_loss after {args.max_steps} steps (depth {args.num_layers}, hidden {args.hidden_size}); "
        "div@N: diverged (non-finite loss or gradient) at step N"
    ]
    for placement in args.placements:
        rows = [
            [warmup, *(describe_cell(cells[cell_name(placement, warmup, lr)]) for lr in args.lrs)]
            for warmup in args.warmup_steps
        ]
        sections.append(f"{placement}-LN\n" + format_table(["warm-up \\ lr", *(f"{lr:g}" for lr in args.lrs)], rows))
    failed = {name: cell["message"] for name, cell in cells.items() if cell["status"] not in ("finished", "diverged")}
    if failed:
        sections.append("cells that did not complete:\n" + "\n".join(f"  {k}: {v}" for k, v in failed.items()))
    write_outputs(out, "\n\n".join(sections), {"args": _jsonable_args(args), "cells": cells})
    plot_grid(args, cells, out / "grid.png")
    return 1 if failed else 0


def plot_grid(args: argparse.Namespace, cells: dict[str, dict[str, Any]], path: Path) -> None:
    """One heat map per placement (rows warm-up, columns lr) on a shared colour scale of the final val loss."""
    plt = pyplot()
    losses = [c["val_mlm_loss"] for c in cells.values() if c["status"] == "finished" and c["val_mlm_loss"] is not None]
    vmin, vmax = (min(losses), max(losses)) if losses else (0.0, 1.0)
    n = len(args.placements)
    fig, axes = plt.subplots(1, n, figsize=(1.6 + 1.3 * len(args.lrs) * n, 1.4 + 0.8 * len(args.warmup_steps)),
                             squeeze=False)  # fmt: skip
    cmap = plt.get_cmap("viridis").with_extremes(bad="lightgray")  # NaN: diverged / failed cells
    image = None
    for ax, placement in zip(axes[0], args.placements, strict=True):
        grid = torch.full((len(args.warmup_steps), len(args.lrs)), float("nan"))
        for i, warmup in enumerate(args.warmup_steps):
            for j, lr in enumerate(args.lrs):
                cell = cells[cell_name(placement, warmup, lr)]
                if cell["status"] == "finished" and cell["val_mlm_loss"] is not None:
                    grid[i, j] = cell["val_mlm_loss"]
                value = grid[i, j].item()
                dark = not math.isnan(value) and value < (vmin + vmax) / 2  # the low end of viridis is dark
                ax.text(j, i, describe_cell(cell), ha="center", va="center", fontsize=9,
                        color="white" if dark else "black")  # fmt: skip
        image = ax.imshow(grid.numpy(), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
        ax.set_xticks(range(len(args.lrs)), [f"{lr:g}" for lr in args.lrs])
        ax.set_yticks(range(len(args.warmup_steps)), [str(w) for w in args.warmup_steps])
        ax.set_xlabel("peak learning rate")
        ax.set_ylabel("warm-up steps")
        ax.set_title(f"{placement}-LN: final val MLM loss")
    if image is not None:
        fig.colorbar(image, ax=list(axes[0]), shrink=0.9, label="val/mlm_loss (gray: diverged)")
    save_figure(fig, path, tight_layout=False)


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def _override(text: str) -> str:
    key, sep, _ = text.removeprefix("--").partition("=")
    if not sep or "." not in key:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not KEY=VALUE with a dotted key, e.g. train.per_device_batch_size=16"
        )
    return text.removeprefix("--")


def _add_model_size_flags(parser: argparse.ArgumentParser, hidden: int, seq_len: int, batch: int) -> None:
    group = parser.add_argument_group("model size (LNBertModel measurements)")
    group.add_argument("--hidden-size", type=_positive_int, default=hidden, help="hidden size d (default %(default)s)")
    group.add_argument(
        "--num-heads", type=_positive_int, default=max(1, hidden // 64), help="attention heads (default %(default)s)"
    )
    group.add_argument(
        "--intermediate-size", type=_positive_int, default=None, help="FFN width (default 4 * hidden size)"
    )
    group.add_argument("--vocab-size", type=_positive_int, default=30522, help="vocabulary size (default %(default)s)")
    group.add_argument(
        "--seq-len", type=_positive_int, default=seq_len, help="tokens per sequence (default %(default)s)"
    )
    group.add_argument(
        "--batch-size", type=_positive_int, default=batch, help="sequences per batch (default %(default)s)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pretrain.analysis",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")

    p = sub.add_parser(
        "ln-jacobian",
        help="spectral norm of the LayerNorm Jacobian vs sqrt(d)/||x - mean(x)||",
        description=(
            "Compute the Jacobian of the model's own LayerNorm (gamma 1, beta 0, float64) with autograd at "
            "x = s (z + 3), z ~ N(0, I_d), take its spectral norm and compare with the paper's sqrt(d)/||y||, "
            "y = x - mean(x), over scales s and dimensions d. The identity holds up to LayerNorm's eps: the exact "
            "value is sqrt(d)/sqrt(||y||^2 + d eps), also reported. Writes table.txt, results.json, ln_jacobian.png."
        ),
    )
    p.add_argument("--dims", type=_positive_int, nargs="+", default=[16, 64, 256, 1024], help="dimensions d")
    p.add_argument("--scales", type=_positive_float, nargs="+", default=[1e-2, 1e-1, 1.0, 1e1, 1e2], help="scales s")
    p.add_argument(
        "--eps",
        type=float,
        default=LNBertConfig().layer_norm_eps,
        help="LayerNorm eps (default: the model's layer_norm_eps, %(default)g)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(DEFAULT_OUT / "ln_jacobian"), help="output folder (default %(default)s)")
    p.set_defaults(func=cmd_ln_jacobian)

    p = sub.add_parser(
        "init-scale",
        help="E||x_l||^2/d at init: Post-LN about 1.5, Pre-LN within (1 + l/2, 1 + 3l/2)",
        description=(
            "(i) The paper's simplified Transformer (Lemma 2): single head with W_Q = W_K = 0 (uniform attention), "
            "Xavier-normal d x d weights, zero biases, ReLU FFN of width d, inputs x_0 ~ N(0, I_d). Post-LN: "
            "E||x_post5||^2/d, the FFN output added to its normalised input (paper: 1.5 at every layer). Pre-LN: "
            "E||x_l||^2/d of the residual stream after l layers against the bounds 1 + l/2 and 1 + 3l/2. Averaged "
            "over --seeds weight draws x --paper-sequences sequences. (ii) The same quantities on LNBertModel at its "
            "real initialisation (GELU, FFN 4d, BERT 0.02 or Xavier), read with forward hooks, dropout off. "
            "Writes table.txt, results.json, init_scale.png."
        ),
    )
    p.add_argument("--num-layers", type=_positive_int, default=12, help="layers L (default %(default)s)")
    p.add_argument("--paper-hidden-size", type=_positive_int, default=256, help="d of (i) (default %(default)s)")
    p.add_argument(
        "--paper-seq-len",
        type=_positive_int,
        default=8,
        help="tokens per sequence in (i); uniform attention averages over them (default %(default)s)",
    )
    p.add_argument(
        "--paper-sequences",
        type=_positive_int,
        default=4,
        help="sequences per weight draw in (i) (default %(default)s)",
    )
    p.add_argument("--seeds", type=_positive_int, default=200, help="weight draws in (i) (default %(default)s)")
    p.add_argument("--model-seeds", type=_positive_int, default=3, help="model inits in (ii) (default %(default)s)")
    p.add_argument(
        "--placements",
        nargs="+",
        choices=NORM_PLACEMENTS,
        default=["post", "pre"],
        help="placements measured in (ii) (default: post pre)",
    )
    p.add_argument(
        "--init-schemes",
        nargs="+",
        choices=("bert", "xavier"),
        default=["bert", "xavier"],
        help="initialisations measured in (ii) (default: bert xavier)",
    )
    _add_model_size_flags(p, hidden=256, seq_len=128, batch=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(DEFAULT_OUT / "init_scale"), help="output folder (default %(default)s)")
    p.set_defaults(func=cmd_init_scale)

    p = sub.add_parser(
        "init-grads",
        help="FFN W1/W2 gradient norms at init per layer and per depth (paper's Figure 3)",
        description=(
            "For each init scheme and placement, initialise LNBertForMaskedLM under --seeds seeds, take the MLM "
            "loss of one real masked batch per seed (the pretraining data pipeline: Python's documentation by "
            "default, or --data FILE.jsonl) with dropout off, and record ||dL/dW1||_F and ||dL/dW2||_F of every "
            "layer's FFN (intermediate.dense.weight, output.dense.weight). Reports the per-layer profile at "
            "--num-layers and the last layer's W2 gradient against --depths. Paper: Post-LN's last-layer gradient "
            "does not depend on depth and per-layer gradients grow toward the output; Pre-LN's shrink like "
            "1/sqrt(L) and are nearly uniform across layers. Writes table.txt, results.json, init_grads.png."
        ),
    )
    p.add_argument("--placements", nargs="+", choices=NORM_PLACEMENTS, default=list(NORM_PLACEMENTS),
                   help="placements (default: all)")  # fmt: skip
    p.add_argument("--init-schemes", nargs="+", choices=("bert", "xavier"), default=["xavier", "bert"],
                   help="xavier: the paper's setting; bert: normal(0, 0.02) (default: both)")  # fmt: skip
    p.add_argument("--num-layers", type=_positive_int, default=12, help="depth of the per-layer profile (%(default)s)")
    p.add_argument("--depths", type=_positive_int, nargs="+", default=[6, 8, 10, 12, 14],
                   help="depths for the last-layer W2 curve (default: 6 8 10 12 14)")  # fmt: skip
    p.add_argument("--seeds", type=_positive_int, default=10, help="model inits and batches to average (%(default)s)")
    _add_model_size_flags(p, hidden=128, seq_len=128, batch=8)
    p.set_defaults(vocab_size=8000)
    data = p.add_argument_group("data (real text through pretrain.data)")
    data.add_argument("--data", type=Path, default=None,
                      help="JSON Lines file with a 'text' field (default: Python's own documentation, no download)")  # fmt: skip
    data.add_argument("--tokenizer", default=None,
                      help="tokenizer name or folder (default: train WordPiece of --vocab-size on the data)")  # fmt: skip
    data.add_argument("--max-documents", type=_positive_int, default=400, help="documents read (default %(default)s)")
    data.add_argument("--cache-dir", type=Path, default=Path("runs") / ".cache" / "data",
                      help="data cache, shared with pretraining (default %(default)s)")  # fmt: skip
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="(default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(DEFAULT_OUT / "init_grads"), help="output folder (default %(default)s)")
    p.set_defaults(func=cmd_init_grads)

    p = sub.add_parser(
        "grid",
        help="warm-up x peak-lr grid of short pretraining runs per placement (paper's warm-up claim)",
        description=(
            "Each cell is a short pretraining run through the normal pipeline (python -m pretrain.run in a "
            "subprocess; --jobs at once) with this cell's placement, --optim.warmup_steps and --optim.lr, "
            "evaluated once at the end. Reads the final val/mlm_loss from RUN/metrics.jsonl or the divergence "
            "step from RUN/status.json, prints a table per placement and draws annotated heat maps. Runs live in "
            "OUT/runs/<placement>-w<warmup>-lr<lr>, logs in OUT/logs; cells already finished or diverged are "
            "read, not rerun. Anything else of pretrain/run.py (data, batch size, sequence length, ...) goes "
            "through --config and --set. Paper: Post-LN needs warm-up; Pre-LN trains without it. "
            "Writes table.txt, results.json, grid.png."
        ),
    )
    p.add_argument("--placements", nargs="+", choices=NORM_PLACEMENTS, default=["post", "pre"],
                   help="placements (default: post pre)")  # fmt: skip
    p.add_argument("--warmup-steps", type=int, nargs="+", default=[0, 30, 100],
                   help="warm-up steps, rows of the grid (default: 0 30 100)")  # fmt: skip
    p.add_argument("--lrs", type=_positive_float, nargs="+", default=[1e-4, 3e-4, 1e-3, 3e-3],
                   help="peak learning rates, columns of the grid (default: 1e-4 3e-4 1e-3 3e-3)")  # fmt: skip
    p.add_argument("--max-steps", type=_positive_int, default=300, help="steps per run (default %(default)s)")
    p.add_argument("--num-layers", type=_positive_int, default=12, help="depth (default %(default)s)")
    p.add_argument("--hidden-size", type=_positive_int, default=128, help="hidden size (default %(default)s)")
    p.add_argument("--num-heads", type=_positive_int, default=2, help="attention heads (default %(default)s)")
    p.add_argument("--intermediate-size", type=_positive_int, default=None, help="FFN width (default 4 * hidden)")
    p.add_argument("--config", default=None, help="a pretrain/run.py preset YAML applied to every cell first")
    p.add_argument("--set", type=_override, action="append", default=[], metavar="KEY=VALUE",
                   help="extra pretrain/run.py override for every cell, repeatable, e.g. --set train.per_device_batch_size=16")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="train.seed of every cell (default %(default)s)")
    p.add_argument("--jobs", type=_positive_int, default=1,
                   help="cells run at once, each its own process (default %(default)s); on a CPU, set "
                        "OMP_NUM_THREADS to cores / jobs")  # fmt: skip
    p.add_argument("--out", default=str(DEFAULT_OUT / "grid"), help="output folder (default %(default)s)")
    p.set_defaults(func=cmd_grid)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    raise SystemExit(main())
