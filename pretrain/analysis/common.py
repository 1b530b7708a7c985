"""What the analysis subcommands share: the output folder, results files, tables, model sizes, mean and error."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from pretrain.analysis.options import ModelSize
from pretrain.common.atomic import write_json, write_text
from pretrain.common.cli import to_dict
from pretrain.common.reporting import format_table
from pretrain.config import STANDARD_LABEL, residual_scheme_fields
from pretrain.modeling import NORM_PLACEMENTS, LNBertConfig


def write_outputs(out_dir: Path, table: str, results: dict[str, Any]) -> None:
    """Print the table and store it with the raw numbers, so a figure can be redrawn without rerunning."""
    out_dir.mkdir(parents=True, exist_ok=True)
    print(table)
    # Atomic: a measurement killed while writing never leaves half a results.json (grid --report_only, ranking).
    write_text(out_dir / "table.txt", table + "\n")
    write_json(out_dir / "results.json", results)


def titled_table(title: str, headers: list[str], rows: list[list[Any]]) -> str:
    """A table (``format_table``) under its one-line title."""
    return f"{title}\n" + format_table(headers, rows)


CELLS_DIR = "cells"
"""Under a measurement's --out: one JSON file per finished cell (cell_result), so a killed measurement keeps them."""


def cell_settings(args: Any, axes: Iterable[str]) -> dict[str, Any]:
    """What a cell's numbers depend on besides its own key: the measurement's options without its axes (the lists
    the cells are drawn from) and without --out; a stored cell made with other settings is measured again."""
    return {k: v for k, v in to_dict(args).items() if k not in {*axes, "out"}}


def cell_results(out_dir: Path, settings: dict[str, Any], measures: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """``cell_result`` of each cell of ``measures`` (key -> measure), in their order, each reported when done."""
    found = {}
    for key, measure in measures.items():
        found[key] = cell_result(out_dir, key, settings, measure)
        print(f"measured {key}", flush=True)
    return found


def cell_result(out_dir: Path, key: str, settings: dict[str, Any], measure: Callable[[], Any]) -> Any:
    """The JSON-able result of one cell (``key`` such as ``xavier/pre/12``): read from OUT/cells/<key>.json when an
    earlier run with the same ``settings`` finished it, else ``measure()``d and written there at once, so a killed
    measurement continues where it stopped."""
    path = out_dir / CELLS_DIR / (key.replace("/", "__") + ".json")
    if path.is_file():
        try:
            stored = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):  # damaged by hand or by another tool: never used
            stored = {}
            print(f"{path} is not readable JSON: measuring {key} again", flush=True)
        if stored.get("key") == key and stored.get("settings") == settings:
            print(f"read {key} from {path}", flush=True)
            return stored["result"]
        if stored:
            print(f"{path} was measured with other settings: measuring {key} again", flush=True)
    result = measure()
    write_json(path, {"key": key, "settings": settings, "result": result})
    return result


def mean_and_sem(samples: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per-column mean and standard error of the mean over the rows (independent draws), shape (n, L)."""
    samples = samples.double()
    n = samples.shape[0]
    sem = samples.std(dim=0) / math.sqrt(n) if n > 1 else torch.zeros(samples.shape[1], dtype=torch.float64)
    return samples.mean(dim=0).tolist(), sem.tolist()


def mean_sem(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean of independent draws of one number."""
    (mean,), (sem,) = mean_and_sem(torch.tensor(values).unsqueeze(1))
    return mean, sem


def mean_sem_text(values: Sequence[float]) -> str:
    """``mean +- sem`` of independent draws, as the tables give it."""
    mean, sem = mean_sem(values)
    return f"{mean:.4g} +- {sem:.2g}"


def placement_color(placement: str) -> Any:
    """One colour per placement, the same in every figure (tab20 holds all of them)."""
    from matplotlib import colormaps

    return colormaps["tab20"](NORM_PLACEMENTS.index(placement) % 20)


def model_colors(models: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """Colours for one figure, by model name, from (name, placement) pairs: a placement's own model (its name is the
    placement's) keeps its placement's colour (``placement_color``, the same in every figure); every other model (a
    norm type, a residual scheme, an option) takes the next of Dark2's eight in the order given, so that no two share
    one within the figure (a placement's colour would make them look alike)."""
    from matplotlib import colormaps

    colors, others = {}, 0
    for name, placement in models:
        if name == placement:
            colors[name] = placement_color(placement)
        else:
            colors[name], others = colormaps["Dark2"](others % 8), others + 1
    return colors


def model_config(size: ModelSize, placement: str, init_scheme: str, num_layers: int, vocab_size: int,
                 pad_token_id: int = 0, norm_type: str = "layernorm", scheme: str = STANDARD_LABEL) -> LNBertConfig:
    """A model config of ``size``, dropout off (measurements at initialisation); ``scheme``: a residual scheme label."""
    return LNBertConfig(
        **residual_scheme_fields(scheme), norm_type=norm_type, norm_placement=placement, init_scheme=init_scheme,
        vocab_size=vocab_size, pad_token_id=pad_token_id, hidden_size=size.hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=size.num_heads, intermediate_size=size.intermediate_size or 4 * size.hidden_size,
        max_position_embeddings=max(512, size.seq_len), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
