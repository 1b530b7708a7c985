"""What the theory says to look at in a grid cell, measured from the run's files after it ends (never inside the
training loop): the unigram references of its data (for the outcome rules, outcomes.py), the per-layer gradient
norms of its first steps (already in RUN/metrics.jsonl) and the effect of its first updates on the output.

The output change is Liu et al. 2020's amplification measure ("Understanding the Difficulty of Training
Transformers"): ``||f(x; W_{t+1}) - f(x; W_t)|| / ||f(x; W_t)||`` for the encoder output ``f`` on one fixed
validation batch, dropout off, between consecutive early snapshots (RUN/snapshots/step_0000000t, written by
the run at train.snapshot_steps). Their finding: Post-LN's heavy dependence on its residual branches makes the
first updates change its output much more than Pre-LN's, more so with depth, which is why it needs warm-up.
"""

from __future__ import annotations

import itertools
import json
import math
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pretrain.analysis.provenance import CELL_FIX
from pretrain.common.atomic import write_json
from pretrain.run_folder.layout import list_snapshots, read_json_file, read_metrics, read_run_config

PROBE_FILE = "grid_probe.json"
"""Written into a finished or diverged run's folder by the grid, so a later pass reads it instead of measuring."""

_data_cache: dict[str, tuple[dict[str, float], dict[str, torch.Tensor]]] = {}
_data_lock = threading.Lock()  # the grid measures finished cells from several threads
# from_pretrained is not thread-safe: two threads loading at once made transformers re-initialise the tied MLM decoder.
_load_lock = threading.Lock()


def unigram_reference(train_ids: Iterable[Sequence[int]], val_ids: Iterable[Sequence[int]], special_ids: Iterable[int],
                      vocab_size: int) -> dict[str, float]:  # fmt: skip
    """The MLM loss of a model that ignores context, from the token counts of the data (special tokens are never
    MLM targets, so they are left out): ``train_unigram_entropy``, the entropy of the training tokens'
    distribution, and ``val_unigram_cross_entropy``, the mean loss on the validation tokens of predicting each
    from that distribution (add-one smoothed, so a token unseen in training costs a finite amount)."""
    special = np.asarray(sorted(set(special_ids)), dtype=np.int64)

    def counts(rows: Iterable[Sequence[int]]) -> np.ndarray:
        ids = np.concatenate([np.asarray(r, dtype=np.int64) for r in rows] or [np.zeros(0, dtype=np.int64)])
        return np.bincount(ids[~np.isin(ids, special)], minlength=vocab_size).astype(np.float64)

    train, val = counts(train_ids), counts(val_ids)
    if train.sum() == 0 or val.sum() == 0:
        raise ValueError("no non-special tokens in the training or validation instances")
    p = train / train.sum()
    entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())
    smoothed = (train + 1) / (train.sum() + vocab_size)
    smoothed[special] = 0  # never targets, so they take no probability mass
    smoothed /= smoothed.sum()
    cross_entropy = float(-(val * np.log(np.where(val > 0, smoothed, 1.0))).sum() / val.sum())
    return {"train_unigram_entropy": entropy, "val_unigram_cross_entropy": cross_entropy}


def relative_output_change(before: torch.Tensor, after: torch.Tensor, mask: torch.Tensor) -> float:
    """``||after - before||_F / ||before||_F`` over the positions where ``mask`` is 1; (B, T, H), (B, T, H), (B, T)."""
    keep = mask.bool()
    return float((after[keep] - before[keep]).norm() / before[keep].norm())


def _run_data(run_dir: Path, batch_size: int) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """(unigram references, fixed validation batch) of a run's data, rebuilt from RUN/run_config.json (a cache hit)."""
    from pretrain.data.collator import MaskingCollator
    from pretrain.data.config import DataConfig
    from pretrain.data.pipeline import build_pretraining_data  # slow imports: only here

    resolved = read_run_config(run_dir, CELL_FIX)
    seed = int(resolved["train"]["seed"])
    key = json.dumps([resolved["data"], seed, batch_size], sort_keys=True)
    with _data_lock:
        if key not in _data_cache:
            data = build_pretraining_data(DataConfig(**resolved["data"]), seed=seed)
            tokenizer = data.tokenizer
            reference = unigram_reference(data.train["input_ids"], data.validation["input_ids"],
                                          tokenizer.all_special_ids, len(tokenizer))  # fmt: skip
            rows = [data.validation[i] for i in range(min(batch_size, len(data.validation)))]
            batch = MaskingCollator(tokenizer, mlm_probability=resolved["data"]["mlm_probability"], seed=0)(rows)
            _data_cache[key] = (reference, batch)
        return _data_cache[key]


def _load(path: Path) -> Any:
    """A snapshot's model in eval mode (dropout off), loaded under ``_load_lock``."""
    from pretrain.modeling import LNBertForPreTraining

    with _load_lock:
        return LNBertForPreTraining.from_pretrained(path).eval()


@torch.no_grad()
def output_changes(run_dir: Path, batch: dict[str, torch.Tensor], max_step: int) -> list[dict[str, float]]:
    """The relative change of the encoder output on ``batch`` between consecutive complete snapshots up to
    ``max_step`` (fp32, eval mode: dropout off): ``[{"from": t0, "to": t1, "change": ...}, ...]``."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one "Loading weights" bar per snapshot would bury the grid's own lines
    outputs = []
    for snap in [s for s in list_snapshots(run_dir) if s.step <= max_step]:
        hidden = _load(snap.path).bert(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        outputs.append((snap.step, hidden.last_hidden_state.float()))
    return [{"from": s0, "to": s1, "change": relative_output_change(h0, h1, batch["attention_mask"])}
            for (s0, h0), (s1, h1) in itertools.pairwise(outputs)]


@torch.no_grad()
def sublayer_io(run_dir: Path, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """What the sub-layers (in order: attention, FFN, next attention, ...) read and write in the last snapshot, on
    ``batch``, averaged over real tokens: ``input_similarity``, the cosine similarity of consecutive sub-layers'
    inputs as each receives them (HC's claim: more streams, less alike inputs); ``output_norm``, the L2 norm of each
    sub-layer's output projection (AttnRes's claim: bounded where Pre-LN's grow with depth). Empty without snapshots."""
    snapshots = list_snapshots(run_dir)
    if not snapshots:
        return {}
    model = _load(snapshots[-1].path)
    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []

    def read(_module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        inputs.append((args[0] if args else kwargs["hidden_states"]).float())

    def write(_module: torch.nn.Module, _args: tuple, output: torch.Tensor) -> None:
        outputs.append(output.float())

    for layer in model.bert.encoder.layer:  # the model is this function's own: its hooks go with it
        layer.attention.self.register_forward_pre_hook(read, with_kwargs=True)
        layer.attention.output.dense.register_forward_hook(write)
        layer.intermediate.register_forward_pre_hook(read, with_kwargs=True)
        layer.output.dense.register_forward_hook(write)
    model.bert(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    real = batch["attention_mask"].bool()
    similarity = [float(torch.nn.functional.cosine_similarity(a[real], b[real], dim=-1).mean())
                  for a, b in itertools.pairwise(inputs)]  # fmt: skip
    return {
        "step": snapshots[-1].step,
        "input_similarity": similarity,
        "output_norm": [float(torch.linalg.vector_norm(out[real], dim=-1).mean()) for out in outputs],
    }


def first_grad_norms(metrics: list[dict[str, Any]], max_step: int) -> dict[str, dict[str, list[float]]]:
    """Per-layer raw gradient norms (``grad_norm/layer_NN/attn|ffn`` of RUN/metrics.jsonl) of the logged steps
    up to ``max_step``: ``{"1": {"attn": [layer 0, layer 1, ...], "ffn": [...]}, ...}``."""
    found: dict[str, dict[str, list[float]]] = {}
    for row in metrics:
        if "train/loss" in row and row["step"] <= max_step:
            per_kind: dict[str, list[float]] = {}
            for key in sorted((k for k in row if k.startswith("grad_norm/layer_")), key=by_layer):
                per_kind.setdefault(key.rsplit("/", 1)[1], []).append(row[key])
            found[str(row["step"])] = per_kind  # a step logged twice (resumed run): the later line
    return found


def by_layer(key: str) -> tuple[int, str]:
    """Sort key of ``grad_norm/layer_NN/...`` metrics: by layer number (text order fails from layer 100), then name."""
    return int(key.split("/")[1].removeprefix("layer_")), key


SCALAR_KINDS = {
    "rezero_gate.weight": "ReZero gate", ".alpha": "DyT alpha", "residual_scale.weight": "residual scale",
    "head_scale.weight": "head scale", ".dynamic_alpha_scale": "HC s_alpha", ".dynamic_beta_scale": "HC s_beta",
    ".alpha_pre": "mHC alpha_pre", ".alpha_post": "mHC alpha_post", ".alpha_res": "mHC alpha_res",
}  # fmt: skip
"""The learned scalars and scales a placement, norm type or residual scheme adds, by the end of their parameter
names, and what the report calls them (residual scale: Admin's omega, NormFormer's optional one)."""


def learned_scalars(run_dir: Path) -> dict[str, Any]:
    """The learned scalars (SCALAR_KINDS) of a run over its complete snapshots, a vector by its mean, read from their
    model.safetensors: ``{"steps": [0, 1, ...], "values": {parameter name: [its mean at each step]}}``."""
    from safetensors.torch import load_file

    steps: list[int] = []
    values: dict[str, list[float]] = {}
    for snap in list_snapshots(run_dir):
        weights = snap.path / "model.safetensors"
        if not weights.is_file():
            continue
        state = load_file(str(weights))
        steps.append(snap.step)
        for name in sorted(k for k in state if k.endswith(tuple(SCALAR_KINDS))):
            values.setdefault(name.removeprefix("bert."), []).append(float(state[name].float().mean()))
    return {"steps": steps, "values": values}


def probe_cell(run_dir: Path, *, max_step: int, batch_size: int = 16) -> dict[str, Any]:
    """Unigram references, early gradient norms and output changes, learned scalars and ``sublayer_io`` of one ended
    run; stored in RUN/grid_probe.json and read from there next time (the run's files no longer change)."""
    path = run_dir / PROBE_FILE
    try:
        if stored := read_json_file(path):
            return stored
    except ValueError as err:  # a record of measurements: measured again
        print(f"{err}: measuring the cell's probe again", flush=True)
    reference, batch = _run_data(run_dir, batch_size)
    probe = {
        **reference,
        "first_grad_norms": first_grad_norms(read_metrics(run_dir), max_step),
        "output_changes": output_changes(run_dir, batch, max_step),
        "learned_scalars": learned_scalars(run_dir),
        "sublayers": sublayer_io(run_dir, batch),
    }
    write_json(path, probe)
    return probe


def ratio_last_to_first(norms: Sequence[float]) -> float:
    """Last layer's gradient norm over the first layer's (inf when the first layer's is 0)."""
    return norms[-1] / norms[0] if norms[0] > 0 else math.inf
