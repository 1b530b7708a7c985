"""init-grads: FFN gradient norms at initialisation (paper, Theorem 1 and Figure 3)."""

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
from pretrain.analysis.options import InitGradsConfig, models
from pretrain.common.cli import to_dict
from pretrain.common.reporting import format_table, pyplot, save_figure
from pretrain.config import STANDARD_LABEL
from pretrain.modeling import LNBertConfig, LNBertForMaskedLM


def resolve_device(name: str) -> str:
    return ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name


def load_mlm_data(args: InitGradsConfig) -> Any:
    """Real text through the pretraining data pipeline: Python's own documentation (no download) or a JSONL file.

    ``objective="mlm"`` gives full-length packed sequences; the measurement uses the MLM loss only.
    """
    # Imported here: `datasets` takes seconds to import and the other subcommands do not need it.
    from pretrain.data.pipeline import DataConfig, SourceConfig, build_pretraining_data

    if args.data is not None and not Path(args.data).exists():
        raise FileNotFoundError(f"--data={args.data}: no such file; give a JSON Lines file with a 'text' field")
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
    from pretrain.data.pipeline import MaskingCollator  # lazily, as in load_mlm_data

    n = len(data.train)
    if n < batch_size:
        raise ValueError(
            f"only {n} training instances for --batch_size={batch_size}; raise --max_documents or lower --batch_size"
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
    args: InitGradsConfig,
    data: Any,
    init_scheme: str,
    placement: str,
    depth: int,
    norm_type: str = "layernorm",
    scheme: str = STANDARD_LABEL,
) -> dict[str, list[list[float]]]:
    """Per-seed, per-layer W1/W2 gradient norms of one (init, placement, norm type, residual scheme by its label,
    depth); seed s uses batch s."""
    w1s, w2s = [], []
    tokenizer = data.tokenizer
    for s in range(args.seeds):
        batch = mlm_batch(data, args.batch_size, args.seed + s)
        config = model_config(
            args, placement, init_scheme, depth, len(tokenizer), tokenizer.pad_token_id, norm_type, scheme
        )
        w1, w2 = ffn_gradient_norms(config, batch, args.seed + s, resolve_device(args.device))
        w1s.append(w1)
        w2s.append(w2)
    return {"w1": w1s, "w2": w2s}


def _mean_sem(values: list[float]) -> tuple[float, float]:
    mean, sem = mean_and_sem(torch.tensor(values).unsqueeze(1))
    return mean[0], sem[0]


AXES = ("placements", "norm_types", "residual_schemes", "init_schemes", "depths", "num_layers")
"""The options a cell (init scheme, model, depth) is drawn from; every other option is a setting of each cell."""


def layer_spread(per_layer: list[float]) -> tuple[float, float]:
    """(coefficient of variation across layers, first layer / last layer) of a per-layer profile: the population
    standard deviation of the values over their mean (Mix-LN's uniformity measure; 0 when every layer gets the
    same gradient) and the ratio NormFormer's early/late mismatch is about (nan where the mean or the last layer is
    0, as ReZero's at init)."""
    values = torch.tensor(per_layer, dtype=torch.float64)
    mean = values.mean().item()
    cv = values.std(unbiased=False).item() / mean if mean > 0 else math.nan
    return cv, (per_layer[0] / per_layer[-1] if per_layer[-1] > 0 else math.nan)


def run(args: InitGradsConfig) -> int:
    data = load_mlm_data(args)
    depths = sorted(set(args.depths) | {args.num_layers})
    out = Path(args.out)
    settings = {**cell_settings(args, AXES), "vocab": len(data.tokenizer)}
    raw: dict[str, Any] = {}
    compared = models(args.placements, args.norm_types, args.residual_schemes)
    for init_scheme in args.init_schemes:
        for model in compared:
            for depth in depths:
                key = f"{init_scheme}/{model.label}/{depth}"
                # Each cell is written as soon as it is measured: a killed run keeps its cells, a rerun reads them.
                raw[key] = cell_result(
                    out, key, settings,
                    lambda m=model, d=depth, i=init_scheme: measure_init_grads(
                        args, data, i, m.placement, d, m.norm_type, m.scheme
                    ),
                )  # fmt: skip
                print(f"measured {init_scheme}/{model.label}/depth {depth}", flush=True)
    labels = [model.label for model in compared]

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
            for placement in labels:
                grads = raw[f"{init_scheme}/{placement}/{args.num_layers}"]
                row += [_mean_sem([g[layer] for g in grads["w1"]])[0], _mean_sem([g[layer] for g in grads["w2"]])[0]]
            per_layer.append(row)
        headers = ["layer", *(f"{p} {w}" for p in labels for w in ("W1", "W2"))]
        sections.append(
            f"init {init_scheme}: ||dL/dW||_F per layer, depth {args.num_layers}\n" + format_table(headers, per_layer)
        )
        spread = []
        for placement in labels:
            grads = raw[f"{init_scheme}/{placement}/{args.num_layers}"]
            row = [placement]
            for key in ("w1", "w2"):
                mean = [_mean_sem([g[layer] for g in grads[key]])[0] for layer in range(args.num_layers)]
                row += [f"{v:.3g}" for v in layer_spread(mean)]
            spread.append(row)
        sections.append(
            f"init {init_scheme}: spread of the per-layer gradient norms at depth {args.num_layers} (of the seed means): "
            "CV = std / mean across layers (population std), L1/L = first layer over last\n"
            + format_table(["model", "W1 CV", "W1 L1/L", "W2 CV", "W2 L1/L"], spread)
        )
        by_depth = []
        for depth in args.depths:
            row = [depth]
            for placement in labels:
                mean, sem = _mean_sem([g[-1] for g in raw[f"{init_scheme}/{placement}/{depth}"]["w2"]])
                row.append(f"{mean:.4g} +- {sem:.2g}")
            by_depth.append(row)
        ratio_row: list[Any] = [f"{min(args.depths)}/{max(args.depths)}"]
        for placement in labels:
            shallow = _mean_sem([g[-1] for g in raw[f"{init_scheme}/{placement}/{min(args.depths)}"]["w2"]])[0]
            deep = _mean_sem([g[-1] for g in raw[f"{init_scheme}/{placement}/{max(args.depths)}"]["w2"]])[0]
            # ReZero's FFN gradients are exactly 0 at init (its gates are 0): no ratio to give.
            ratio_row.append(f"{shallow / deep:.3f}" if deep else "n/a (0)")
        by_depth.append(ratio_row)
        sections.append(
            f"init {init_scheme}: last layer ||dL/dW2||_F vs depth (last row: ratio shallow/deep; Pre-LN theory "
            f"sqrt({max(args.depths)}/{min(args.depths)}) = {math.sqrt(max(args.depths) / min(args.depths)):.3f}, "
            "Post-LN theory 1)\n" + format_table(["depth", *labels], by_depth)
        )
    results = {"args": to_dict(args), "vocab_size": len(data.tokenizer), "depths": depths, "raw": raw}
    write_outputs(out, "\n\n".join(sections), results)
    plot_init_grads(args, raw, out / "init_grads.png")
    return 0


def plot_init_grads(args: InitGradsConfig, raw: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    n_rows = len(args.init_schemes)
    fig, axes = plt.subplots(n_rows, 3, figsize=(15, 4.2 * n_rows), squeeze=False)
    layers = list(range(1, args.num_layers + 1))
    for row, init_scheme in enumerate(args.init_schemes):
        ax_w1, ax_w2, ax_depth = axes[row]
        for model in models(args.placements, args.norm_types, args.residual_schemes):
            label, color = model.label, model_color(model)
            grads = raw[f"{init_scheme}/{label}/{args.num_layers}"]
            for ax, key in ((ax_w1, "w1"), (ax_w2, "w2")):
                mean, sem = mean_and_sem(torch.tensor(grads[key]))
                ax.errorbar(layers, mean, yerr=sem, fmt="o-", color=color, label=label, capsize=2)
            stats = [_mean_sem([g[-1] for g in raw[f"{init_scheme}/{label}/{d}"]["w2"]]) for d in args.depths]
            ax_depth.errorbar(args.depths, [m for m, _ in stats], yerr=[s for _, s in stats], fmt="o-",
                              color=color, label=label, capsize=2)  # fmt: skip
        for ax, title in ((ax_w1, "W1 (intermediate.dense)"), (ax_w2, "W2 (output.dense)")):
            ax.set_title(f"{init_scheme} init: ||dL/d{title.split()[0]}||_F per layer, depth {args.num_layers}")
            ax.set_xlabel("layer")
        ax_depth.set_title(f"{init_scheme} init: last layer ||dL/dW2||_F vs depth")
        ax_depth.set_xlabel("number of layers")
        for ax in (ax_w1, ax_w2, ax_depth):
            ax.set_yscale("log")
            ax.set_ylabel("gradient norm")
            ax.legend(fontsize=6, ncol=2)
    print(f"wrote {save_figure(fig, path)}")
