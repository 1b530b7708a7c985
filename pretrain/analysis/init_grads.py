"""init-grads: FFN gradient norms at initialisation (paper, Theorem 1 and Figure 3)."""

from __future__ import annotations

import itertools
import math
from functools import partial
from pathlib import Path
from typing import Any

import torch

from pretrain.analysis import common
from pretrain.analysis.options import InitGradsConfig
from pretrain.common.cli import to_dict
from pretrain.common.device import pick_device
from pretrain.common.reporting import pyplot, save_figure
from pretrain.config import STANDARD_LABEL
from pretrain.modeling import LNBertConfig, LNBertForMaskedLM


def load_mlm_data(args: InitGradsConfig) -> Any:
    """Real text through the pretraining data pipeline (objective mlm: full-length packed sequences): Python's own
    documentation (no download) or a JSONL file."""
    from pretrain.data.config import DataConfig, SourceConfig
    from pretrain.data.pipeline import build_pretraining_data  # `datasets`: seconds to import

    if args.data is not None and not Path(args.data).exists():
        raise FileNotFoundError(f"--data={args.data}: no such file; give a JSON Lines file with a 'text' field")
    source = SourceConfig(kind="json", path=str(args.data)) if args.data else SourceConfig(kind="python_docs")
    cfg = DataConfig(
        sources=[source], tokenizer=args.tokenizer, vocab_size=args.vocab_size, objective="mlm",
        max_seq_length=args.seq_len, max_documents=args.max_documents, cache_dir=str(args.cache_dir),
    )  # fmt: skip
    return build_pretraining_data(cfg, seed=0)


def mlm_batch(data: Any, batch_size: int, seed: int) -> dict[str, torch.Tensor]:
    """``batch_size`` training instances drawn by ``seed``, dynamically masked as in pretraining (15%)."""
    from pretrain.data.collator import MaskingCollator  # lazily, as in load_mlm_data

    n = len(data.train)
    if n < batch_size:
        raise ValueError(f"only {n} training instances for --batch_size={batch_size}; "
                         "raise --max_documents or lower --batch_size")  # fmt: skip
    rows = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:batch_size].tolist()
    collator = MaskingCollator(data.tokenizer, mlm_probability=0.15, seed=seed)
    return collator([data.train[i] for i in rows])


def ffn_gradient_norms(config: LNBertConfig, batch: dict[str, torch.Tensor], seed: int,
                       device: str | torch.device = "cpu") -> tuple[list[float], list[float]]:  # fmt: skip
    """Per layer, ||dL/dW1||_F and ||dL/dW2||_F (``intermediate.dense.weight``, ``output.dense.weight``) of a fresh
    model initialised under ``seed``, L the MLM loss of one batch, dropout off (eval mode)."""
    torch.manual_seed(seed)
    model = LNBertForMaskedLM(config).to(device).eval()
    inputs = {k: batch[k].to(device) for k in ("input_ids", "attention_mask", "token_type_ids", "labels")}
    model(**inputs).loss.backward()
    layers = model.bert.encoder.layer
    return ([layer.intermediate.dense.weight.grad.norm().item() for layer in layers],
            [layer.output.dense.weight.grad.norm().item() for layer in layers])  # fmt: skip


def measure_init_grads(args: InitGradsConfig, data: Any, init_scheme: str, placement: str, depth: int,
                       norm_type: str = "layernorm", scheme: str = STANDARD_LABEL) -> dict[str, list[list[float]]]:
    """Per-seed, per-layer W1/W2 gradient norms of one (init, placement, norm type, residual scheme by its label,
    depth); seed s uses batch s."""
    tokenizer = data.tokenizer
    device = pick_device(args.device)
    config = common.model_config(args, placement, init_scheme, depth, len(tokenizer), tokenizer.pad_token_id,
                                 norm_type, scheme)  # fmt: skip
    norms = [ffn_gradient_norms(config, mlm_batch(data, args.batch_size, seed), seed, device)
             for seed in range(args.seed, args.seed + args.seeds)]  # fmt: skip
    return {"w1": [w1 for w1, _ in norms], "w2": [w2 for _, w2 in norms]}


AXES = ("placements", "norm_types", "residual_schemes", "init_schemes", "depths", "num_layers")
"""The options a cell (init scheme, model, depth) is drawn from; every other option is a setting of each cell."""


def layer_spread(per_layer: list[float]) -> tuple[float, float]:
    """(population CV across layers: Mix-LN's uniformity measure, first layer / last layer: NormFormer's early/late
    mismatch) of a per-layer profile; nan where the mean or the last layer is 0 (ReZero's at init)."""
    values = torch.tensor(per_layer, dtype=torch.float64)
    mean = values.mean().item()
    cv = values.std(unbiased=False).item() / mean if mean > 0 else math.nan
    return cv, (per_layer[0] / per_layer[-1] if per_layer[-1] > 0 else math.nan)


def run(args: InitGradsConfig) -> int:
    data = load_mlm_data(args)
    depths = sorted(set(args.depths) | {args.num_layers})
    out = Path(args.out)
    settings = {**common.cell_settings(args, AXES), "vocab": len(data.tokenizer)}
    # Each cell is written as soon as it is measured: a killed run keeps its cells, a rerun reads them.
    raw = common.cell_results(out, settings, {
        f"{init}/{m.label}/{depth}": partial(measure_init_grads, args, data, init, m.placement, depth, m.norm_type,
                                             m.scheme)
        for init, m, depth in itertools.product(args.init_schemes, args.models.values(), depths)
    })  # fmt: skip
    header = (f"MLM on {args.data or 'python_docs'} (vocab {len(data.tokenizer)}), hidden {args.hidden_size}, FFN "
              f"{args.intermediate_size or 4 * args.hidden_size}, batch {args.batch_size} x {args.seq_len}, "
              f"mean over {args.seeds} seeds (+- standard error); dropout off")  # fmt: skip
    sections = [header, *(table for init in args.init_schemes for table in init_tables(args, raw, init))]
    results = {"args": to_dict(args), "vocab_size": len(data.tokenizer), "depths": depths, "raw": raw}
    common.write_outputs(out, "\n\n".join(sections), results)
    plot_init_grads(args, raw, out / "init_grads.png")
    return 0


def last_w2(raw: dict[str, Any], init_scheme: str, label: str, depth: int) -> list[float]:
    """The last layer's ||dL/dW2||_F of each seed in one cell."""
    return [g[-1] for g in raw[f"{init_scheme}/{label}/{depth}"]["w2"]]


def init_tables(args: InitGradsConfig, raw: dict[str, Any], init_scheme: str) -> list[str]:
    """One init scheme's tables: the per-layer norms at num_layers, their spread over the layers, and the last
    layer's W2 norm against depth."""
    labels, n = list(args.models), args.num_layers
    per_layer = {(label, w): common.mean_and_sem(torch.tensor(raw[f"{init_scheme}/{label}/{n}"][w]))[0]
                 for label in labels for w in ("w1", "w2")}  # fmt: skip
    profile = [[layer + 1, *(per_layer[label, w][layer] for label in labels for w in ("w1", "w2"))]
               for layer in range(n)]  # fmt: skip
    spread = [[label, *(f"{v:.3g}" for w in ("w1", "w2") for v in layer_spread(per_layer[label, w]))]
              for label in labels]  # fmt: skip
    last = partial(last_w2, raw, init_scheme)
    shallow, deep = min(args.depths), max(args.depths)
    by_depth = [[depth, *(common.mean_sem_text(last(label, depth)) for label in labels)] for depth in args.depths]
    ratios = [(common.mean_sem(last(label, shallow))[0], common.mean_sem(last(label, deep))[0]) for label in labels]
    # ReZero's FFN gradients are exactly 0 at init (its gates are 0): no ratio to give.
    by_depth.append([f"{shallow}/{deep}", *(f"{s / d:.3f}" if d else "n/a (0)" for s, d in ratios)])
    tables = [
        (f"||dL/dW||_F per layer, depth {n}", ["layer", *(f"{p} {w}" for p in labels for w in ("W1", "W2"))], profile),
        (f"spread of the per-layer gradient norms at depth {n} (of the seed means): CV = std / mean across layers "
         "(population std), L1/L = first layer over last", ["model", "W1 CV", "W1 L1/L", "W2 CV", "W2 L1/L"], spread),
        (f"last layer ||dL/dW2||_F vs depth (last row: ratio shallow/deep; Pre-LN theory sqrt({deep}/{shallow}) = "
         f"{math.sqrt(deep / shallow):.3f}, Post-LN theory 1)", ["depth", *labels], by_depth),
    ]  # fmt: skip
    return [common.titled_table(f"init {init_scheme}: {title}", headers, rows) for title, headers, rows in tables]


def plot_init_grads(args: InitGradsConfig, raw: dict[str, Any], path: Path) -> None:
    n_rows = len(args.init_schemes)
    fig, axes = pyplot().subplots(n_rows, 3, figsize=(15, 4.2 * n_rows), squeeze=False)
    layers = list(range(1, args.num_layers + 1))
    colors = common.model_colors((label, model.placement) for label, model in args.models.items())
    for (ax_w1, ax_w2, ax_depth), init_scheme in zip(axes, args.init_schemes, strict=True):
        for label in args.models:
            style = {"fmt": "o-", "color": colors[label], "label": label, "capsize": 2}
            for ax, key in ((ax_w1, "w1"), (ax_w2, "w2")):
                mean, sem = common.mean_and_sem(torch.tensor(raw[f"{init_scheme}/{label}/{args.num_layers}"][key]))
                ax.errorbar(layers, mean, yerr=sem, **style)
            mean, sem = zip(*(common.mean_sem(last_w2(raw, init_scheme, label, d)) for d in args.depths), strict=True)
            ax_depth.errorbar(args.depths, mean, yerr=sem, **style)
        for ax, w in ((ax_w1, "W1"), (ax_w2, "W2")):
            ax.set(title=f"{init_scheme} init: ||dL/d{w}||_F per layer, depth {args.num_layers}", xlabel="layer")
        ax_depth.set(title=f"{init_scheme} init: last layer ||dL/dW2||_F vs depth", xlabel="number of layers")
        for ax in (ax_w1, ax_w2, ax_depth):
            ax.set(yscale="log", ylabel="gradient norm")
            ax.legend(fontsize=6, ncol=2)
    print(f"wrote {save_figure(fig, path)}")
