"""Fine-tune one model on one GLUE task (MRPC or RTE) over a grid of learning rates and seeds.

    python -m finetune.run --model=runs/pre_ln/snapshots/step_00010000 --task=mrpc --data_dir=path/to/glue
    python -m finetune.run --model=bert-base-uncased --task=rte            # a Hub model, GLUE from the Hub
    python -m finetune.run --config=configs/finetune/bert_glue.yaml --model=... --lrs='[2e-5]' --seeds='[0, 1]'
    python -m finetune.run --help                                          # every key, its type, default and doc

The model is any folder written by pretraining (``snapshots/step_*``) or any BERT-like model that
``AutoModelForSequenceClassification`` opens. Each (lr, seed) is one job, run in this process through a manifest and
a result file in the results folder (``--results_dir``), as the scheduler runs them (finetune/schedule.py): a job
already done is skipped, so the command can be re-run after an interruption. The recipe is original BERT's
(finetune/train.py), evaluated on dev.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import pickle
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from finetune.backends import InProcess
from finetune.config import GridOptions, check_tasks
from finetune.glue import Example, load_task
from finetune.manifest import ResultsBusy, ResultsFolder, Runtime
from finetune.schedule import NoProgress, collect, job_lines, lifted, retried, runnable, submit, wandb_settings
from finetune.worker import check_model_name, check_snapshot, describe_model, job_specs
from pretrain.common.atomic import is_damage
from pretrain.common.cli import ConfigError, parse, require, run_cli
from pretrain.run_folder.layout import SNAPSHOTS, TRAIN_STATE_FILE, list_snapshots, run_folder_of
from pretrain.tracking.wandb_logging import check_wandb


@dataclass(kw_only=True)
class RunConfig(GridOptions):
    """Fine-tune one model on one GLUE task over a grid of learning rates and seeds; results go to the folder."""

    model: str
    """A snapshot folder written by pretraining (RUN/snapshots/step_*) or a model name on the Hugging Face Hub."""
    task: str = "mrpc"
    """GLUE task: mrpc or rte."""
    max_attempts: int = 2
    """Tries per job before it stays failed."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_tasks("task", [self.task])
        require(self.max_attempts >= 1, "max_attempts", f"must be >= 1; got {self.max_attempts}")
        check_model_name(self.model)
        check_not_a_checkpoint(Path(self.model))


def check_not_a_checkpoint(model: Path) -> None:
    """A training checkpoint (RUN/checkpoints/step_N: optimizer state, no config.json) is not a model folder: name
    the run's snapshots, which are, before transformers' import and its "Unrecognized model"."""
    if not (model / TRAIN_STATE_FILE).is_file():
        return
    snapshots = [s.path.name for s in list_snapshots(run_folder_of(model))]
    where = run_folder_of(model) / SNAPSHOTS
    found = f"{where} holds {', '.join(snapshots)}" if snapshots else f"{where} holds no complete snapshot yet"
    raise ConfigError(f"model={str(model)!r} is a training checkpoint (for resuming the run), not a model folder; "
                      f"fine-tune a snapshot of the run, RUN/{SNAPSHOTS}/step_N: {found}")


def check_loads(model: str, dev: list[Example] | None) -> None:
    """A model folder whose weights are not of its config.json (a file replaced, or copied from another run), cannot
    be read (cut short by a copy), or whose tokenizer is not the model's (on the task's ``dev`` examples, when read
    already) fails every job alike: refused here, before any job, by loading it as they do."""
    from finetune.train import load_classifier, load_tokenizer
    from pretrain.modeling import CheckpointMismatch

    if not Path(model).is_dir():  # a Hub model: its jobs download it
        return
    checks = [("tokenizer", lambda: load_tokenizer(model, dev), is_damage)] if dev is not None else []
    checks.append(("weights", lambda: load_classifier(model), unreadable_weights))
    for part, load, unreadable in checks:
        try:
            load()
        except CheckpointMismatch as err:
            raise ConfigError(f"--model {model!r} cannot be fine-tuned: {err} Or pass another --model.") from None
        except Exception as err:  # a tokenizer.json cut short: a JSON error, or the tokenizers library's bare Exception
            if not unreadable(err):  # the file system refused the read, or another error: its own
                raise
            raise ConfigError(f"--model {model!r}: its {part} cannot be read ({err}): the files are damaged or "
                              "incomplete; copy them again, or pass another --model") from None  # fmt: skip


def unreadable_weights(err: BaseException) -> bool:
    """How safetensors and torch.load say that a weights file was cut short or overwritten; not a file system that
    refused the read (EIO, ESTALE, EACCES: its own error), nor another error."""
    from safetensors import SafetensorError

    if isinstance(err, RuntimeError):
        return "PytorchStreamReader" in str(err)  # pytorch_model.bin: torch's zip reader found no archive
    if isinstance(err, OSError):
        return is_damage(err) or err.errno == errno.EINVAL  # EINVAL: that reader seeking past a cut file's end
    return isinstance(err, SafetensorError | pickle.UnpicklingError)


def run(config: RunConfig) -> list[dict[str, Any]]:
    """Run what is not done of the grid for one model and task in this process, the scheduler's way (a manifest,
    result files, this process holding the lock); returns the grid's rows."""
    # torch and transformers once the options are read (a typo answers before their seconds of import)
    from transformers import AutoConfig

    from finetune.train import warn_emulated_bf16
    from pretrain.common.device import pick_device

    check_snapshot(Path(config.model))
    warn_emulated_bf16(pick_device(config.recipe.device, flag="recipe.device"), config.recipe.mixed_precision)
    data_dir = str(Path(config.data_dir).resolve()) if config.data_dir else None
    # fail now, on the user's input, rather than inside every job
    dev = load_task(config.task, data_dir)["dev"] if data_dir is not None else None
    folder = ResultsFolder(config.results_dir)
    tracking = wandb_settings(config)
    check_wandb(tracking)
    runtime = Runtime(data_dir, config.recipe.runtime(), dataclasses.asdict(tracking) if tracking else None)
    specs = job_specs(describe_model(config.model), config.task, config.lrs, config.seeds, config.recipe)
    positions = getattr(AutoConfig.from_pretrained(config.model), "max_position_embeddings", None)
    config.recipe.check_fits(positions, config.model)
    check_loads(config.model, dev)
    with folder.lock():
        backend = InProcess()
        collect(folder, backend)  # the jobs of an earlier run that was killed in them are queued again
        backend.after_job = job_lines(folder, config.max_attempts)  # one line per job, as it ends
        jobs = folder.jobs()
        resets = retried(jobs, specs) if config.retry_failed else {}
        new = sum(spec.key not in jobs for spec in specs)
        print(f"{len(specs)} jobs for {config.model} on {config.task}: {new} new, in {folder.root}", flush=True)
        # The folder may hold other work (a scheduler's): this command runs only its own grid.
        jobs |= resets
        history: Counter[tuple[str, int]] = Counter()  # submit's: it stops jobs submitted again and again as they are
        while submit(folder, backend, runtime, runnable(jobs | lifted(jobs, specs), specs, config.max_attempts),
                     history=history):  # fmt: skip
            collect(folder, backend)
            jobs = folder.jobs()
        return [jobs[spec.key].row() for spec in specs]


def summarize(rows: list[dict[str, Any]]) -> str:
    """Mean and standard deviation over seeds, per learning rate."""
    lines = ["lr        seeds  accuracy        f1              status"]
    for lr in sorted({r["lr"] for r in rows}):
        group = [r for r in rows if r["lr"] == lr]
        done = [r for r in group if r["status"] == "done"]
        stats = []
        for key in ("accuracy", "f1"):
            values = [r[key] for r in done if r[key] is not None]
            # One seed has no spread: print no "± 0" that reads as a measured zero.
            spread = f"±{np.std(values):.4f}" if len(values) > 1 else ""
            stats.append(f"{np.mean(values):.4f}{spread}" if values else "-")
        statuses = ", ".join(f"{s} {n}" for s, n in sorted(Counter(r["status"] for r in group).items()))
        lines.append(f"{lr:<9g} {len(done):<6d} {stats[0]:<15} {stats[1]:<15} {statuses}")
    errors = {r["error"] for r in rows if r["status"] == "failed"}
    lines += [f"error: {e}" for e in sorted(errors)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    config = parse(RunConfig, argv, prog="python -m finetune.run", description=__doc__)
    rows = run(config)
    print(summarize(rows))
    failed = [r for r in rows if r["status"] == "failed" and r["attempts"] >= config.max_attempts]
    if failed and not config.retry_failed:
        # Jobs that failed every attempt are not run again: the errors above may be from an earlier command.
        print(f"{len(failed)} job(s) failed every attempt ({config.max_attempts}); such jobs are not run again, so "
              "their errors may be an earlier command's. After fixing the cause (e.g. a missing --data_dir), run the "
              "same command with --retry_failed=true", file=sys.stderr)  # fmt: skip
    return 0 if all(r["status"] == "done" for r in rows) else 1


# Bad input, a busy folder, a pass without progress: its message and exit code 2, not a traceback.
cli = functools.partial(run_cli, main, errors=(ResultsBusy, NoProgress))


if __name__ == "__main__":
    raise SystemExit(cli())
