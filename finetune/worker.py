"""The worker side of fine-tuning: what a model's jobs are, and one task of a manifest that runs them.

    python -m finetune.worker RESULTS/manifests/000007.json              # under SLURM: SLURM_ARRAY_TASK_ID
    python -m finetune.worker RESULTS/manifests/000007.json --index=2    # elsewhere

A SLURM array task and a local worker process run this same code. A task reads only its manifest and writes
only result files beside it (finetune/manifest.py). A job whose result file exists is skipped, so a requeued or
repeated task continues where the first copy stopped.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finetune.config import FinetuneConfig
from finetune.manifest import JobSpec, JobState, Manifest, ManifestJob, Model, ResultsFolder, load_manifest
from pretrain.common.cli import run_cli
from pretrain.common.formats import RUN_FORMAT, FormatVersionError, check_format
from pretrain.run_folder.identity import read_run_id
from pretrain.run_folder.layout import (
    MANIFEST_FILE,
    RUN_ID_FILE,
    SNAPSHOT_INFO,
    SNAPSHOT_MARKER,
    SNAPSHOTS,
    TOKENIZER_FILES,
    list_snapshots,
    read_json_file,
    run_folder_of,
)
from pretrain.run_folder.manifest import SNAPSHOT_FIX, ManifestError, sha256_file, verify_manifest
from pretrain.run_folder.status import Heartbeat, watchdog
from pretrain.tracking.wandb_logging import WandbSettings, job_run

if TYPE_CHECKING:
    from finetune.train import DataCache


# --- Jobs: what a model's jobs are, and their key -------------------------------------------------


def _placement(info: dict[str, Any], config: dict[str, Any]) -> str:
    """The norm placement from the snapshot info, else the model config; Hugging Face BERT is Post-LN."""
    default = "post" if config.get("model_type") == "bert" else "unknown"
    return str(info.get("norm_placement") or config.get("norm_placement") or default)


class SnapshotRefused(ValueError):
    """A model folder refused as it is (gone, incomplete, damaged, of another format version): no retry changes that
    while its files stay as they are, its jobs fail for good (so do those of a folder whose weights are not of its
    config.json, which the model's own ``from_pretrained`` refuses: ``CheckpointMismatch``)."""


def files_stamp(path: Path) -> str | None:
    """The names, sizes and modification times of a model folder's files, hashed (no file is read): it changes
    whenever a file is written, replaced, added or removed. None when there is no such folder (a Hub model)."""
    if not path.is_dir():
        return None
    entries = []
    for file in sorted(path.rglob("*")):
        try:
            stat = file.stat()
        except FileNotFoundError:  # removed while listed: the stamp of what is there
            continue
        if file.is_file():
            entries.append((file.relative_to(path).as_posix(), stat.st_size, stat.st_mtime_ns))
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()[:16]


_verified: dict[Path, str | None] = {}  # snapshot folder -> its files_stamp when it last verified


def check_snapshot(path: Path) -> None:
    """A pretraining snapshot (a folder with snapshot.json) is used only when complete (COMPLETE marker) and when
    its files match its manifest. Checked on finetune.run's --model and by every job before it loads the weights;
    loading then checks the weights against the config (``from_pretrained``). Raises SnapshotRefused."""
    if not (path / SNAPSHOT_INFO).is_file():
        return
    if not (path / SNAPSHOT_MARKER).is_file():
        raise SnapshotRefused(
            f"{str(path)!r} is a snapshot without its {SNAPSHOT_MARKER} marker: it is still being written, "
            "or its run was killed while writing it (the resumed run writes it again). Use a complete snapshot."
        )
    # Hashing reads every byte (440 MB for BERT-base) and a task runs many jobs on one snapshot: verify it again
    # only when a file's size or modification time changed since it last verified in this process.
    stamp = files_stamp(path)
    if _verified.get(path.resolve()) == stamp:
        return
    try:
        verify_manifest(path)
    except ManifestError as err:
        raise SnapshotRefused(
            f"{str(path)!r} is a damaged snapshot: {err}. It is not fine-tuned: restore it from a copy, or use another."
        ) from None
    except FormatVersionError as err:  # its message says what to do
        raise SnapshotRefused(str(err)) from None
    _verified[path.resolve()] = stamp


def check_not_a_run_folder(path: Path) -> None:
    """A run folder given as a model: name its snapshots and the command that fine-tunes them all."""
    if (path / "config.json").is_file() or not (path / SNAPSHOTS).is_dir():
        return
    snapshots = [str(s.path) for s in list_snapshots(path)]
    listed = f"its complete snapshots: {', '.join(snapshots[:4])}{', ...' if len(snapshots) > 4 else ''}"
    raise ValueError(
        f"--model {str(path)!r} is a pretraining run folder, not a model; "
        f"{listed if snapshots else 'it has no complete snapshot yet'}. Fine-tune one with "
        f"--model={path}/snapshots/step_NNNNNNNN, or every snapshot of the run with python -m finetune.schedule "
        f"--runs='[{path}]'"
    )


def snapshot_hash(model_dir: Path) -> str:
    """The content hash of a model folder, for its jobs' key: of a snapshot, the hash of its manifest's file listing
    (sizes and checksums written by pretraining); of a plain save_pretrained folder, of its config, weights and
    tokenizer files (another tokenizer reads the task into other ids: other numbers)."""
    manifest = model_dir / MANIFEST_FILE
    if manifest.is_file():
        payload = read_json_file(manifest)
        check_format(payload, manifest, RUN_FORMAT, SNAPSHOT_FIX)
        files = payload["files"]
    else:
        weights = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("*.bin"))
        if not weights or not (model_dir / "config.json").is_file():
            raise FileNotFoundError(
                f"{model_dir} is not a model folder: expected config.json and model.safetensors (save_pretrained)"
            )
        tokenizer = [path for name in TOKENIZER_FILES if (path := model_dir / name).is_file()]
        files = {p.name: sha256_file(p) for p in (model_dir / "config.json", *weights, *tokenizer)}
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]


def check_model_name(name: str) -> None:
    """A model that is no folder is a Hub name (NAME or ORG/NAME): a path to nothing is named, before torch."""
    if not Path(name).is_dir() and (Path(name).exists() or name.startswith((".", "/", "~")) or name.count("/") > 1):
        raise FileNotFoundError(f"--model {name!r}: no such model folder (a Hub name is NAME or ORG/NAME)")


def hub_model(name: str) -> Model:
    """A model on the Hugging Face Hub: step -1, hashed by name."""
    check_model_name(name)
    from transformers import AutoConfig

    import pretrain.modeling  # noqa: F401  (a Hub model can be an lnbert one)

    try:
        config = AutoConfig.from_pretrained(name).to_dict()
    except (OSError, ValueError) as err:  # offline, unknown name, or a name the Hub rejects
        raise FileNotFoundError(
            f"--model {name!r} is neither a model folder nor a model found on the Hugging Face Hub: "
            f"{str(err).splitlines()[0]}"
        ) from None
    return Model(run_id=f"hub-{name}", run_name=name, run_dir=name, placement=_placement({}, config),
                 pretrain_step=-1, tokens_seen=None, model_path=name, snapshot_hash=f"hub:{name}")  # fmt: skip


def describe_model(model: str | Path) -> Model:
    """The model of a job: a snapshot (with snapshot.json) belongs to its run; any other folder (or a snapshot copied
    out of its run) is a run of its own, named by its content; a name that is not a folder is a Hub model. A snapshot
    whose snapshot.json or manifest was damaged since it was written, or of another format version: SnapshotRefused."""
    path = Path(model)
    if not path.is_dir():
        return hub_model(str(model))
    check_not_a_run_folder(path)
    try:
        info, config = read_json_file(path / SNAPSHOT_INFO), read_json_file(path / "config.json")
        content = snapshot_hash(path)
    except FormatVersionError as err:  # its message says what to do
        raise SnapshotRefused(str(err)) from None
    except (ValueError, KeyError, TypeError) as err:  # its files are written whole: damaged since
        raise SnapshotRefused(f"{str(path)!r} cannot be fine-tuned: {err}; restore it from a copy") from None
    snapshot = (path / SNAPSHOT_INFO).is_file()
    run_dir = run_folder_of(path) if snapshot else path.resolve()
    run_id = f"model-{content}"
    if snapshot and (run_dir / RUN_ID_FILE).is_file():  # else a snapshot copied out of its run folder
        run_id = read_run_id(run_dir, recorded=info.get("run_id"))
    return Model(run_id=run_id, run_name=str(info.get("run_name", run_dir.name)), run_dir=str(run_dir),
                 placement=_placement(info, config), pretrain_step=int(info.get("step", -1)),
                 tokens_seen=info.get("tokens_seen"), model_path=str(path.resolve()), snapshot_hash=content)  # fmt: skip


def max_positions(model_dir: str | Path) -> int | None:
    """The position embeddings of a model folder's config.json (None: it names none)."""
    return read_json_file(Path(model_dir) / "config.json").get("max_position_embeddings")


def job_specs(
    model: Model, task: str, lrs: Sequence[float], seeds: Sequence[int], recipe: FinetuneConfig
) -> list[JobSpec]:
    """One job per (lr, seed) for a model and a task."""
    fields, key = dataclasses.asdict(model), recipe.result_key()
    return [JobSpec(**fields, task=task, lr=float(lr), seed=int(seed), recipe=key) for lr in lrs for seed in seeds]


# --- One task of a manifest: run its jobs, one result file each -----------------------------------


HUNG_FLOOR_S = 600.0
"""No job is taken for hung before this long: the scheduler's limit on a local worker's job is at least this, and a
job whose steps stopped for this long stops its own process (exit code 3), its attempt charged."""


def hung_message(step: int) -> str:
    return (f"Hung: no step finished for {HUNG_FLOOR_S:g} s after step {step}; its process was stopped (exit code 3), "
            "this attempt charged")  # fmt: skip


def run_job(job: ManifestJob, manifest: Manifest, folder: ResultsFolder, cache: DataCache) -> JobState | None:
    """Run one job and write its result file (or its failure file); returns how it ended (done or failed), or
    None when another copy of it finished first (this result is dropped)."""
    from finetune.train import finetune  # torch and transformers: the scheduler, importing this module, never needs
    from pretrain.modeling import CheckpointMismatch

    spec, runtime, submission = job.spec, manifest.runtime, manifest.submission
    try:
        folder.write_started(job, submission)  # from here on, this attempt counts (finetune/manifest.py)
        model = Path(spec.model_path)
        if model.is_absolute() and not model.is_dir():  # a model folder (a Hub model's path is its name)
            raise SnapshotRefused(f"snapshot {model} no longer exists (deleted or moved after its jobs were planned): "
                                  "they run once it is back")  # fmt: skip
        check_snapshot(model)
        recipe = FinetuneConfig(**spec.recipe, **runtime.recipe)
        data = cache.get(spec.model_path, spec.task, runtime.data_dir, recipe)
        heartbeat, hung = Heartbeat(), lambda error: folder.write_failed(job, submission, error)
        with (job_run(spec, WandbSettings(**runtime.wandb) if runtime.wandb else None) as tracked,
              watchdog(heartbeat, HUNG_FLOOR_S, hung_message, hung)):

            def on_step(step: int, loss: float, lr: float) -> None:
                heartbeat.beat(step)
                if tracked:
                    tracked.log_step(step, loss, lr)

            results = finetune(spec.model_path, spec.task, data, spec.lr, spec.seed, recipe, on_step)
            if tracked:
                tracked.finish(results)
    except Exception as err:  # recorded for the scheduler, which retries it; go on with the next job
        # A refused snapshot fails for good: no retry changes it while the snapshot's files stay as they are.
        permanent, error = isinstance(err, SnapshotRefused | CheckpointMismatch), f"{type(err).__name__}: {err}"
        stamp = files_stamp(Path(spec.model_path))
        folder.write_failed(job, submission, error, permanent=permanent, snapshot_stamp=stamp)
        return JobState(spec, "failed", job.attempt, submission, error, permanent=permanent, snapshot_stamp=stamp)
    if not folder.write_done(job, submission, results):
        print(f"job {spec.key} was finished first by another copy of this task: this result is dropped", flush=True)
        return None
    return JobState(spec, "done", job.attempt, submission, results=results)


def print_line(state: JobState) -> None:
    """A job's line in the task's log (the scheduler adds what happens next to a failed one)."""
    print(state.line(", for good" if state.permanent else ""), flush=True)


def run_task(manifest_path: str | Path, index: int, parent_pid: int | None = None,
             on_job: Callable[[JobState], object] = print_line) -> dict[str, int]:  # fmt: skip
    """Run task ``index`` of a manifest; returns how many of its jobs ended done, duplicate, skipped, failed,
    orphaned. With ``parent_pid`` (a local worker), the task stops before its next job once that process is gone,
    so a killed scheduler leaves no worker running on. ``on_job`` is called with each job that ended."""
    from finetune.train import DataCache

    manifest_path = Path(manifest_path).resolve()
    manifest = load_manifest(manifest_path)
    folder = ResultsFolder(manifest_path.parent.parent)
    cache = DataCache()
    counts = dict.fromkeys(("done", "duplicate", "skipped", "failed", "orphaned"), 0)
    for job in manifest.jobs_of_task(index):
        if parent_pid is not None and os.getppid() != parent_pid:
            counts["orphaned"] += 1
        elif folder.done_path(job.spec.key).is_file():
            counts["skipped"] += 1
        elif (state := run_job(job, manifest, folder, cache)) is None:
            counts["duplicate"] += 1
        else:
            counts[state.status] += 1
            on_job(state)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m finetune.worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("manifest", help="a manifest written by finetune.schedule (RESULTS/manifests/N.json)")
    parser.add_argument("--index", type=int, default=None, help="task index (default: $SLURM_ARRAY_TASK_ID)")
    parser.add_argument("--parent_pid", type=int, default=None, help="stop before the next job once it is gone")
    parser.add_argument("--quiet", action="store_true", help="no line per job (its scheduler prints them)")
    args = parser.parse_args(argv)
    if args.index is None and "SLURM_ARRAY_TASK_ID" not in os.environ:
        parser.error("no --index and no SLURM_ARRAY_TASK_ID: pass --index=N outside a SLURM array")
    index = int(os.environ["SLURM_ARRAY_TASK_ID"]) if args.index is None else args.index
    counts = run_task(args.manifest, index, args.parent_pid, on_job=(lambda _: None) if args.quiet else print_line)
    if not args.quiet:
        print(f"task {index} of {args.manifest}: " + ", ".join(f"{k} {v}" for k, v in counts.items()), flush=True)
    # A failed job is the scheduler's to retry (it reads the failure file); the task itself did its work.
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))  # a bad manifest or a full disk: its message and exit code 2
