"""Tiny pretraining runs in the layout of docs/run_layout.md, built without the pretraining loop.

``make_run`` writes RUN/run_id, RUN/status.json, RUN/metrics.jsonl (val/mlm_loss lines), RUN/tokenizer/ and
RUN/snapshots/step_*/ (save_pretrained weights + tokenizer + snapshot.json + COMPLETE), so fine-tuning,
the scheduler and the report are tested against the contract, not against pretrain/run.py.
"""

from __future__ import annotations

import datetime
import json
from functools import cache
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerFast

from finetune.backends import SlurmConfig
from finetune.config import FinetuneConfig
from finetune.glue import TASKS, read_tsv
from finetune.manifest import JobSpec, Results
from finetune.schedule import ScheduleConfig
from pretrain.common.atomic import write_json
from pretrain.data.tokenizer import train_wordpiece_tokenizer
from pretrain.modeling import LNBertConfig, LNBertForPreTraining
from pretrain.run_folder.identity import ensure_run_id, read_run_id
from pretrain.run_folder.layout import RUN_ID_FILE, SNAPSHOT_INFO, SNAPSHOT_MARKER, step_dirname
from pretrain.run_folder.manifest import write_manifest
from tests.conftest import TINY

FIXTURE_GLUE = Path(__file__).resolve().parent / "fixtures" / "glue"


@cache
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A WordPiece tokenizer (vocabulary at most 200) trained on the fixture GLUE sentences by the project's own
    trainer (pretrain/data/tokenizer.py: [PAD] = 0, as BERT)."""
    texts = []
    for task in TASKS.values():
        for split in ("train", "dev"):
            texts += [
                t for e in read_tsv(FIXTURE_GLUE / task.folder / f"{split}.tsv", task) for t in (e.text_a, e.text_b)
            ]
    return train_wordpiece_tokenizer(texts, vocab_size=200)


def tiny_config(placement: str, vocab_size: int, **options: Any) -> LNBertConfig:
    """The tests' tiny model (tests/conftest.py TINY) with the fixture tokenizer's vocabulary. 128 positions, not
    the preset's 64: fine-tuning truncates to recipe.max_length, 128 by default (finetune/train.py refuses fewer)."""
    return LNBertConfig(
        **{**TINY, "vocab_size": vocab_size, "max_position_embeddings": 128, **options}, norm_placement=placement,
        pad_token_id=0,
    )


def write_snapshot(
    run_dir: Path, run_name: str, placement: str, step: int, complete: bool = True, seed: int | None = None,
    **options: Any,
) -> Path:
    tokenizer = tiny_tokenizer()
    path = run_dir / "snapshots" / step_dirname(step)
    torch.manual_seed(step if seed is None else seed)
    LNBertForPreTraining(tiny_config(placement, len(tokenizer), **options)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    info = {
        "step": step,
        "tokens_seen": step * 1000,
        "run_name": run_name,
        "norm_placement": placement,
        "metrics": {"val/mlm_loss": 5.0},
        "pretrain_config": {},
        "run_id": read_run_id(run_dir) if (run_dir / RUN_ID_FILE).is_file() else None,
    }
    write_json(path / SNAPSHOT_INFO, info)
    if complete:
        write_manifest(path)
        (path / SNAPSHOT_MARKER).write_text("")
    return path


def make_run(
    root: Path,
    name: str,
    placement: str = "post",
    steps: tuple[int, ...] = (10, 20),
    incomplete_steps: tuple[int, ...] = (),
    val_losses: dict[int, float] | None = None,
    status: str = "finished",
) -> Path:
    """A pretraining run folder with complete snapshots at ``steps`` and marker-less ones at ``incomplete_steps``."""
    run_dir = root / name
    run_dir.mkdir(parents=True, exist_ok=True)
    ensure_run_id(run_dir)  # as pretrain/run.py does when a run starts
    tiny_tokenizer().save_pretrained(run_dir / "tokenizer")
    for step in steps:
        write_snapshot(run_dir, name, placement, step)
    for step in incomplete_steps:
        write_snapshot(run_dir, name, placement, step, complete=False)
    val_losses = val_losses or {s: 6.0 - s / 100 for s in (*steps, *incomplete_steps)}
    lines: list[dict[str, Any]] = []
    for step, loss in sorted(val_losses.items()):
        lines.append({"step": step, "tokens_seen": step * 1000, "train/loss": loss + 0.1})
        lines.append({"step": step, "tokens_seen": step * 1000, "val/mlm_loss": loss, "val/mlm_accuracy": 0.1})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    set_status(run_dir, name, placement, status, max(val_losses))
    return run_dir


def set_status(run_dir: Path, name: str, placement: str, status: str, step: int) -> None:
    write_json(
        run_dir / "status.json",
        {
            "status": status,
            "step": step,
            "run_name": name,
            "norm_placement": placement,
            "updated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "diverged_at_step": None,
            "message": "",
        },
    )


# A fine-tuning recipe small enough for a test: a few examples, one epoch, one thread.
QUICK = dict(batch_size=4, epochs=1, max_train_examples=8, max_eval_examples=8, torch_threads=1, progress=False)


def config_for(tmp_path: Path, runs: list[Path], **overrides: Any) -> ScheduleConfig:
    """A scheduler config over ``runs`` with the QUICK recipe on the fixture GLUE; ``overrides`` win."""
    values: dict[str, Any] = dict(
        runs=[str(r) for r in runs],
        results_dir=str(tmp_path / "results.d"),
        tasks=["mrpc"],
        data_dir=str(FIXTURE_GLUE),
        lrs=[1e-3],
        seeds=[0],
        poll_interval_s=0.1,
        recipe=dict(QUICK),
    )
    values.update(overrides)
    nested = {"recipe": FinetuneConfig(**values["recipe"])}
    if "slurm" in values:
        nested["slurm"] = SlurmConfig(**values["slurm"])
    return ScheduleConfig(**values | nested)


def job_spec(**overrides: Any) -> JobSpec:
    """A job's key fields with placeholder values (no files behind them); ``overrides`` win."""
    values: dict[str, Any] = dict(run_id="r-1", run_name="r", run_dir="/r", placement="post", pretrain_step=1,
                                  tokens_seen=None, model_path="/r/s", snapshot_hash="h", task="mrpc", lr=2e-5,
                                  seed=0, recipe={"epochs": 3})  # fmt: skip
    return JobSpec(**{**values, **overrides})


def results(**overrides: Any) -> Results:
    """A finished job's measurements with placeholder values; ``overrides`` win."""
    values: dict[str, Any] = dict(accuracy=0.5, dev_loss=0.7, train_loss=0.7, epochs=1, train_steps=2, wall_time_s=1.0,
                                  device="AMD EPYC (family 25, model 1), AVX2", majority_accuracy=0.5,
                                  top_class_share=0.6)  # fmt: skip
    return Results(**{**values, **overrides})
