"""Fine-tune one model on one GLUE task (MRPC or RTE) over a grid of learning rates and seeds.

    python -m finetune.run --model=runs/pre_ln/snapshots/step_00010000 --task=mrpc --data_dir=path/to/glue
    python -m finetune.run --model=bert-base-uncased --task=rte            # a Hub model, GLUE from the Hub
    python -m finetune.run --config=configs/finetune/bert_glue.yaml --model=... --lrs='[2e-5]' --seeds='[0, 1]'
    python -m finetune.run --help                                          # every key, its type, default and doc

The model is any folder written by pretraining (``snapshots/step_*``; ``import pretrain`` registers the
``lnbert`` Auto classes) or any BERT-like model that ``AutoModelForSequenceClassification`` opens. Each
(lr, seed) is one job in the results store (``--store``): a job already done is skipped, so the command can
be re-run after an interruption. The recipe is original BERT's (batch 32, 3 epochs, 10% linear warm-up then
linear decay, max length 128, AdamW with weight decay 0.01 except on biases and norms), evaluated on dev.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from finetune.config import DEFAULT_LRS, DEFAULT_SEEDS, FinetuneConfig, check_tasks, validate_grid
from finetune.glue import load_task
from finetune.store import ResultStore, StoreVersionError
from finetune.worker import RUNTIME_FIELDS, WorkerSettings, describe_model, job_specs, work
from pretrain.cli import parse, require, run_cli
from pretrain.layout import SNAPSHOT_INFO, SNAPSHOT_MARKER
from pretrain.manifest import ManifestError, verify_manifest


@dataclass(kw_only=True)
class RunConfig:
    """Fine-tune one model on one GLUE task over a grid of learning rates and seeds; results go to the store."""

    model: str
    """A snapshot folder written by pretraining (RUN/snapshots/step_*) or a model name on the Hugging Face Hub."""
    task: str = "mrpc"
    """GLUE task: mrpc or rte."""
    data_dir: str | None = None
    """Folder in the original GLUE layout (MRPC/train.tsv, RTE/dev.tsv, ...); unset: nyu-mll/glue from the Hub."""
    lrs: list[float] = field(default_factory=lambda: list(DEFAULT_LRS))
    """Peak learning rates to try (one job each per seed)."""
    seeds: list[int] = field(default_factory=lambda: list(DEFAULT_SEEDS))
    """Random seeds (classifier init, dropout, data order); the paper uses 6 per point."""
    store: str = "outputs/finetune/results.sqlite"
    """Results store (SQLite file), shared with the scheduler and read by the report."""
    max_attempts: int = 2
    """Tries per job before it stays failed."""
    lease_s: float = 300.0
    """Seconds a claim stays valid without a heartbeat (a dead worker's job is retried after this)."""
    recipe: FinetuneConfig = field(default_factory=FinetuneConfig)
    """The fine-tuning recipe."""

    def __post_init__(self) -> None:
        check_tasks("task", [self.task])
        validate_grid(self.lrs, self.seeds)
        require(self.max_attempts >= 1, "max_attempts", f"must be >= 1; got {self.max_attempts}")
        require(self.lease_s > 0, "lease_s", f"must be > 0; got {self.lease_s}")


def check_snapshot(path: Path) -> None:
    """A pretraining snapshot (a folder with snapshot.json; a plain Hugging Face folder has none) is used only
    when complete (COMPLETE marker) and when its files match its manifest."""
    if not (path / SNAPSHOT_INFO).is_file():
        return
    if not (path / SNAPSHOT_MARKER).is_file():
        raise ValueError(
            f"--model {str(path)!r} is a snapshot without its {SNAPSHOT_MARKER} marker: it is still being written, "
            "or its run was killed while writing it (the resumed run writes it again). Use a complete snapshot."
        )
    try:
        verify_manifest(path)
    except ManifestError as err:
        raise ValueError(f"--model {str(path)!r} is a damaged snapshot: {err}") from None


def run(config: RunConfig) -> list[dict[str, Any]]:
    """Enqueue the grid for one model and task, run what is not done, and return the grid's rows."""
    check_snapshot(Path(config.model))
    data_dir = str(Path(config.data_dir).resolve()) if config.data_dir else None
    if data_dir is not None:
        load_task(config.task, data_dir)  # fail now, on the user's input, rather than inside every job
    with ResultStore(config.store) as store:
        specs = job_specs(
            describe_model(config.model, store), config.task, config.lrs, config.seeds, config.recipe, data_dir
        )
        ids, added = store.enqueue(specs)
    print(
        f"{len(ids)} jobs for {config.model} on {config.task}: {added} new, {len(ids) - added} already in {config.store}"
    )
    runtime = {k: getattr(config.recipe, k) for k in RUNTIME_FIELDS}
    work(
        WorkerSettings(store=config.store, lease_s=config.lease_s, max_attempts=config.max_attempts, runtime=runtime),
        ids,
    )
    with ResultStore(config.store) as store:
        rows = [r for r in store.rows() if r["id"] in set(ids)]
    return rows


def summarize(rows: list[dict[str, Any]]) -> str:
    """Mean and standard deviation over seeds, per learning rate."""
    lines = ["lr        seeds  accuracy        f1              status"]
    for lr in sorted({r["lr"] for r in rows}):
        group = [r for r in rows if r["lr"] == lr]
        done = [r for r in group if r["status"] == "done"]
        stats = []
        for key in ("accuracy", "f1"):
            values = [r[key] for r in done if r[key] is not None]
            stats.append(f"{np.mean(values):.4f}±{np.std(values):.4f}" if values else "-")
        statuses = ", ".join(
            f"{s} {sum(r['status'] == s for r in group)}" for s in sorted({r["status"] for r in group})
        )
        lines.append(f"{lr:<9g} {len(done):<6d} {stats[0]:<15} {stats[1]:<15} {statuses}")
    errors = {r["error"] for r in rows if r["status"] == "failed"}
    lines += [f"error: {e}" for e in sorted(errors)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    config = parse(RunConfig, argv, prog="python -m finetune.run", description=__doc__)
    rows = run(config)
    print(summarize(rows))
    return 0 if all(r["status"] == "done" for r in rows) else 1


def cli() -> int:
    """``main`` for the command line: bad input ends with its message and exit code 2, not a traceback."""
    return run_cli(main, errors=(StoreVersionError,))


if __name__ == "__main__":
    raise SystemExit(cli())
