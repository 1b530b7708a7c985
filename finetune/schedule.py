"""Fine-tune every complete snapshot of one or more pretraining runs, as they appear.

    python -m finetune.schedule --runs='[runs/post_ln, runs/pre_ln]' --data_dir=path/to/glue --mode=once
    python -m finetune.schedule --runs='[runs/post_ln, runs/pre_ln]' --data_dir=path/to/glue --mode=follow --workers=4
    python -m finetune.schedule --config=configs/finetune/bert_glue.yaml --runs='[...]' --backend=slurm --mode=follow
    python -m finetune.schedule status --store=outputs/finetune/results.sqlite
    python -m finetune.schedule ingest --store=outputs/finetune/results.sqlite   # rebuild from result files
    python -m finetune.schedule [run|status|ingest] --help

Every snapshot folder with its COMPLETE marker becomes task x lr x seed jobs, keyed by the run's id (RUN/run_id),
the snapshot's content hash and the recipe. This process is the only writer of the results store. On each pass
it takes in the result files the tasks wrote, finds tasks that ended without writing all of theirs (preempted,
killed, out of time) and writes a manifest of the jobs still to run, whose tasks run on the backend:
``local`` (N worker processes here; 1 runs the jobs in this process) or ``slurm`` (one ``sbatch`` job array
per manifest). Tasks read only the manifest and write only result files (finetune/manifest.py, worker.py).

``--mode=once`` runs the jobs of the snapshots that exist until each is done or failed ``max_attempts`` times;
``--mode=follow`` also picks up new snapshots until every run is finished, diverged, failed or dead (status.json
``running`` but its heartbeat older than ``dead_after_min``), or until ``--until``. The exit code is 1 when jobs failed
every attempt (they are listed with their errors); ``--retry_failed=true`` queues them again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from finetune.backends import Backend, InProcess, LocalArray, SlurmArray, SlurmConfig, SlurmError
from finetune.config import DEFAULT_LRS, DEFAULT_SEEDS, FinetuneConfig, check_tasks, validate_grid
from finetune.glue import load_task
from finetune.manifest import JobSpec, Manifest, ManifestJob, ResultsFolder, recipe_hash
from finetune.store import ResultStore, StoreBusy, StoreVersionError, store_lock
from finetune.tracking import WandbSettings, check_wandb
from finetune.worker import RUNTIME_FIELDS, describe_model, job_specs
from pretrain.common.cli import parse_command, require, run_cli
from pretrain.run_folder.identity import read_run_id
from pretrain.run_folder.layout import DEAD_AFTER_S, TERMINAL_STATUSES, is_dead, list_snapshots, read_status

BackendName = Literal["local", "slurm"]
Mode = Literal["once", "follow"]
# Training examples of the GLUE tasks on the Hub (nyu-mll/glue), for the cost estimate without --data_dir.
GLUE_TRAIN_SIZES = {"mrpc": 3668, "rte": 2490}

__all__ = ["ScheduleConfig", "SlurmConfig", "main", "schedule"]


@dataclass(kw_only=True)
class ScheduleConfig:
    """Fine-tune every complete snapshot of the given pretraining runs (see the module docstring)."""

    runs: list[str]
    """Pretraining run folders (RUN/ of docs/run_layout.md) to watch."""
    store: str = "outputs/finetune/results.sqlite"
    """Results store (SQLite), written only by this scheduler: keep it on a local disk."""
    results_dir: str | None = None
    """Folder of manifests and result files, read and written by the tasks (on a cluster: on the shared file
    system). Unset: beside the store, STORE_STEM.d/ (outputs/finetune/results.d/ for the default store)."""
    tasks: list[str] = field(default_factory=lambda: ["mrpc", "rte"])
    """GLUE tasks to fine-tune every snapshot on."""
    data_dir: str | None = None
    """GLUE folder in the original layout (MRPC/train.tsv, ...); unset: nyu-mll/glue from the Hub."""
    lrs: list[float] = field(default_factory=lambda: list(DEFAULT_LRS))
    """Peak learning rates (the report picks the best per snapshot by mean dev accuracy)."""
    seeds: list[int] = field(default_factory=lambda: list(DEFAULT_SEEDS))
    """Random seeds per (snapshot, task, lr); the paper uses 6."""
    mode: Mode = "once"
    """once: run the jobs of the snapshots that exist, then exit. follow: keep polling until all runs end."""
    poll_interval_s: float = 60.0
    """Seconds between passes (taking in results, looking for new snapshots and ended tasks)."""
    until: str | None = None
    """Stop following at this time: an ISO date-time (2026-12-01T06:00, local time unless it has an offset) or a
    duration from now (90m, 8h, 45s). Submitted SLURM tasks run on; the next scheduler takes in their results."""
    dead_after_min: float = DEAD_AFTER_S / 60
    """A run whose status.json says running but whose heartbeat ("updated", refreshed every few seconds while it
    trains) is older than this many minutes is dead (it crashed without saying so): follow mode stops waiting."""
    backend: BackendName = "local"
    """local: worker processes on this machine. slurm: one job array per submission, through sbatch."""
    workers: int = 1
    """Local worker processes, or the tasks of each slurm job array. 1 (local) runs jobs in this process."""
    total_threads: int = 0
    """CPU threads the local workers share (each gets total_threads // workers); 0: all cores."""
    max_attempts: int = 3
    """Attempts per job before it stays failed. An attempt counts once its task started the job (failed, or its
    worker killed or preempted in it); a job that a killed scheduler or task never reached is not charged, nor, with
    --workers=1, the job that died with its scheduler."""
    retry_failed: bool = False
    """Queue the jobs that failed every attempt again (after fixing the cause, e.g. a missing --data_dir)."""
    step_time_s: float | None = None
    """Seconds per fine-tuning step for the cost estimate; unset: measured from the store's finished jobs."""
    recipe: FinetuneConfig = field(default_factory=FinetuneConfig)
    """The fine-tuning recipe of every job."""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    """Settings of the slurm backend."""
    wandb: bool = False
    """Log one W&B run per job (job_type finetune; WANDB_MODE=offline logs locally, beside the store)."""
    wandb_project: str | None = None
    """W&B project of the job runs; unset: the pretraining run's tracking.project (else lnbert)."""

    def __post_init__(self) -> None:
        require(bool(self.runs), "runs", "is empty; pass one or more pretraining run folders: --runs='[RUN1, RUN2]'")
        check_tasks("tasks", self.tasks)
        validate_grid(self.lrs, self.seeds)
        for key in ("workers", "max_attempts"):
            require(getattr(self, key) >= 1, key, f"must be >= 1; got {getattr(self, key)}")
        for key in ("poll_interval_s", "dead_after_min"):
            require(getattr(self, key) > 0, key, f"must be > 0; got {getattr(self, key)}")
        require(self.total_threads >= 0, "total_threads", f"must be >= 0 (0: all cores); got {self.total_threads}")
        ok = self.step_time_s is None or self.step_time_s > 0
        require(ok, "step_time_s", f"must be > 0, or null to measure it; got {self.step_time_s}")
        if self.until is not None:
            parse_until(self.until)


@dataclass(kw_only=True)
class StatusConfig:
    """Job counts per run and task in a results store (queued, submitted, done, failed)."""

    store: str = "outputs/finetune/results.sqlite"
    """Results store (SQLite) to read."""
    max_attempts: int = 3
    """Tries per job, as given to the scheduler (tells failed jobs from those still to be retried)."""

    def __post_init__(self) -> None:
        require(self.max_attempts >= 1, "max_attempts", f"must be >= 1; got {self.max_attempts}")


@dataclass(kw_only=True)
class IngestConfig(StatusConfig):
    """Take the result files into a store (a deleted store comes back with the same rows), then show its counts."""

    results_dir: str | None = None
    """Folder of manifests and result files; unset: beside the store, STORE_STEM.d/."""


def parse_until(value: str, now: float | None = None) -> float:
    """``--until`` as a Unix time: a duration from now (90m, 8h, 45s) or an ISO date-time."""
    now = time.time() if now is None else now
    duration = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", value)
    if duration:
        return now + float(duration[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[duration[2]]
    try:
        return datetime.datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise ValueError(
            f"until={value!r} is neither a duration (90m, 8h, 45s) nor an ISO date-time (2026-12-01T06:00)"
        ) from None


def results_dir(store: str | Path, configured: str | None) -> Path:
    """The shared folder of manifests and result files: configured, or STORE_STEM.d/ beside the store."""
    return Path(configured) if configured else Path(store).with_suffix(".d")


# --------------------------------------------------------------------------------------------------
# Discovering jobs, and the state of the pretraining runs
# --------------------------------------------------------------------------------------------------


def discover(config: ScheduleConfig, store: ResultStore) -> list[JobSpec]:
    """The jobs of every complete snapshot of every run (snapshots without the COMPLETE marker are skipped)."""
    specs = []
    for run in config.runs:
        run_dir = Path(run).resolve()
        if not run_dir.is_dir():
            continue  # follow mode: the run has not started yet
        read_run_id(run_dir)  # a folder without an identity is refused here, with the reason
        for snapshot in list_snapshots(run_dir):
            description = describe_model(snapshot.path, store)
            for task in config.tasks:
                specs += job_specs(description, task, config.lrs, config.seeds, config.recipe)
    return specs


def run_state(run_dir: str | Path, dead_after_min: float, now: float | None = None) -> str:
    """The run's status.json status, or ``dead`` for a ``running`` run whose heartbeat stopped (layout.is_dead)."""
    status = read_status(run_dir)
    return "dead" if is_dead(status, now, after_s=60 * dead_after_min) else str(status.get("status"))


def runs_ended(config: ScheduleConfig) -> dict[str, str]:
    """``{run: state}`` if every run is finished, diverged, failed or dead; else an empty dict."""
    states = {run: run_state(run, config.dead_after_min) for run in config.runs}
    return states if all(s in (*TERMINAL_STATUSES, "dead") for s in states.values()) else {}


# --------------------------------------------------------------------------------------------------
# What the scheduler prints
# --------------------------------------------------------------------------------------------------


def status_lines(store: ResultStore, max_attempts: int) -> list[str]:
    """A table of job counts per (run, task), and a total line."""
    keys = ("queued", "submitted", "done", "failed", "retrying")
    header = f"{'run':<24} {'run id':<26} {'task':<6}" + "".join(f" {k:>9}" for k in keys)
    lines, total = [header], dict.fromkeys(keys, 0)
    for (name, run_id, task), c in store.counts(max_attempts).items():
        lines.append(f"{name:<24} {run_id:<26} {task:<6}" + "".join(f" {c[k]:>9}" for k in keys))
        for key in keys:
            total[key] += c[key]
    lines.append(f"{'total':<24} {'':<26} {'':<6}" + "".join(f" {total[k]:>9}" for k in keys))
    return lines


def progress_line(config: ScheduleConfig, store: ResultStore, added: int, done: int, failed: int) -> str:
    """One line per pass: where the jobs are, what this pass changed, and an ETA once a step time is known."""
    counts = store.counts(config.max_attempts).values()
    total = {key: sum(c[key] for c in counts) for key in ("queued", "submitted", "done", "failed", "retrying")}
    jobs = sum(total.values())
    line = (
        f"[{time.strftime('%H:%M:%S')}] jobs: {total['done']}/{jobs} done, {total['submitted']} running, "
        f"{total['queued'] + total['retrying']} queued, {total['failed']} failed"
        f"  (this pass: {added} new, {done} finished, {failed} failed attempts)"
    )
    step_time = config.step_time_s or store.step_time_s(recipe_hash(config.recipe.result_key()))
    left = [r for r in store.rows() if r["status"] in ("queued", "submitted") or (
        r["status"] == "failed" and r["attempts"] < config.max_attempts)]  # fmt: skip
    if step_time is None or not left:
        return line
    per_job = {task: train_steps(config, task) for task in {r["task"] for r in left}}  # reads each task once
    steps = sum(per_job[r["task"]] for r in left)
    parallel = min(config.workers, len(left))
    return line + f"; ETA about {steps * step_time / parallel / 60:.0f} min"


def results_lines(store: ResultStore) -> list[str]:
    """The finished jobs' dev accuracy: mean over seeds per run, step, task and lr, beside the dev set's majority
    class (a mean at the majority class is a model that answers one class)."""
    groups: dict[tuple[str, int, str, float], list[dict[str, Any]]] = {}
    for r in store.rows("done"):
        groups.setdefault((r["run_name"], r["pretrain_step"], r["task"], r["lr"]), []).append(r)
    if not groups:
        return []
    lines = [
        f"{'run':<24} {'step':>8} {'task':<5} {'lr':>8} {'seeds':>5} {'accuracy':>9} {'majority':>9} {'dev loss':>9}"
    ]
    for (name, step, task, lr), rows in sorted(groups.items()):
        majority = [r["majority_accuracy"] for r in rows if r.get("majority_accuracy") is not None]
        lines.append(
            f"{name:<24} {step:>8} {task:<5} {lr:>8g} {len(rows):>5} "
            f"{100 * sum(r['accuracy'] for r in rows) / len(rows):>8.2f}% "
            f"{(f'{100 * majority[0]:.2f}%' if majority else '-'):>9} "
            f"{sum(r['dev_loss'] for r in rows) / len(rows):>9.4f}"
        )
    return lines


def train_steps(config: ScheduleConfig, task: str) -> int:
    """Optimizer steps of one job of ``task`` under the recipe."""
    recipe = config.recipe
    examples = len(load_task(task, config.data_dir)["train"]) if config.data_dir else GLUE_TRAIN_SIZES[task]
    if recipe.max_train_examples is not None:
        examples = min(examples, recipe.max_train_examples)
    return math.ceil(examples / recipe.batch_size) * recipe.epochs


def cost_line(config: ScheduleConfig, store: ResultStore, specs: list[JobSpec]) -> str:
    """How many jobs, optimizer steps, and (with a per-step time) hours of work are about to start."""
    steps = sum(train_steps(config, spec.task) for spec in specs)
    line = f"{len(specs)} jobs to run: {steps:,} fine-tuning steps"
    step_time, source = config.step_time_s, "configured step_time_s"
    if step_time is None:
        step_time, source = store.step_time_s(recipe_hash(config.recipe.result_key())), "measured on finished jobs"
    if step_time is None:
        return line + " (time per step not known yet: pass --step_time_s=S for an estimate; BENCHMARKS.md has some)"
    hours = steps * step_time / 3600
    parallel = config.workers if config.backend == "slurm" or config.workers > 1 else 1
    return line + (
        f" x {step_time:.3g} s/step ({source}) = {hours:.2f} worker-hours, "
        f"about {hours / min(parallel, len(specs)):.2f} h with {parallel} worker(s)"
    )


def print_failures(failures: list[dict[str, Any]]) -> None:
    print(f"{len(failures)} job(s) failed every attempt:", file=sys.stderr)
    for r in failures:
        print(
            f"  {r['run_name']} [{r['run_id']}] step {r['pretrain_step']} {r['task']} lr={r['lr']:g} seed={r['seed']}"
            f" ({r['attempts']} attempts): {r['error']}",
            file=sys.stderr,
        )
    print("fix the cause and queue them again with --retry_failed=true", file=sys.stderr)


# --------------------------------------------------------------------------------------------------
# One pass of the scheduler
# --------------------------------------------------------------------------------------------------


def runtime_settings(config: ScheduleConfig) -> dict[str, Any]:
    """Inputs that do not change a job's numbers, taken from this command (not from the store) each time."""
    recipe = config.recipe
    if config.backend == "slurm":
        threads, progress = config.slurm.cpus_per_task, False
    else:
        threads = max(1, (config.total_threads or os.cpu_count() or 1) // config.workers)
        progress = recipe.progress and config.workers == 1  # several bars would interleave
    values = {k: getattr(recipe, k) for k in RUNTIME_FIELDS}
    values.update(torch_threads=recipe.torch_threads or threads, progress=progress)
    data_dir = str(Path(config.data_dir).resolve()) if config.data_dir else None
    wandb = wandb_settings(config)
    return {"data_dir": data_dir, "recipe": values, "wandb": dataclasses.asdict(wandb) if wandb else None}


def wandb_settings(config: ScheduleConfig) -> WandbSettings | None:
    """One W&B run per job when --wandb (finetune/tracking.py); offline runs go beside the store."""
    return WandbSettings(project=config.wandb_project, dir=str(Path(config.store).parent)) if config.wandb else None


def submit(
    store: ResultStore,
    folder: ResultsFolder,
    backend: Backend,
    runtime: dict[str, Any],
    max_attempts: int,
    only: set[str] | None = None,
    slots: int | None = None,
) -> int:
    """Write a manifest of the runnable jobs (of the keys in ``only``), record it, start its tasks; how many jobs.

    ``slots``: the tasks that may start now (default: the backend's size; none: nothing is submitted). A manifest's
    jobs are dealt to its tasks when it is written, so with fewer slots than the backend's size only those slots'
    share of the jobs goes in it: the rest wait for the next free worker instead of queueing behind these."""
    rows = [(spec, n) for spec, n in store.runnable(max_attempts) if only is None or spec.key in only]
    tasks = min(backend.size if slots is None else slots, len(rows))
    if tasks <= 0:
        return 0
    rows = rows[: math.ceil(len(rows) * tasks / max(tasks, backend.size))]
    submission = store.new_submission(backend.name, tasks)
    jobs = [ManifestJob(spec=spec, attempt=attempts + 1) for spec, attempts in rows]
    manifest = Manifest(submission=submission, tasks=tasks, runtime=runtime, jobs=jobs)
    path = folder.write_manifest(manifest)
    store.mark_submitted(
        submission, str(path), [(job.spec.key, job.attempt, manifest.task_of(i)) for i, job in enumerate(jobs)]
    )
    try:
        store.set_handle(submission, backend.start(path, tasks, submission))
    except (SlurmError, FileNotFoundError) as err:  # nothing started: this attempt failed, with the reason
        store.tasks_ended(submission, range(tasks), dict.fromkeys(range(tasks), f"not started: {err}"))
        store.end_submission(submission)
        raise
    return len(jobs)


def collect(
    store: ResultStore, folder: ResultsFolder, backend: Backend, slurm: SlurmConfig | None = None
) -> tuple[int, int, int]:
    """Take in result files and ended tasks. Returns (jobs done, attempts failed, tasks still live)."""
    # A submission is asked about by the kind of backend that started it (a restart may use another one).
    others: dict[str, Backend] = {"inprocess": InProcess(), "local": LocalArray(1)}
    others["slurm"] = SlurmArray(1, slurm or SlurmConfig())
    by_name = {**others, backend.name: backend}
    # Which tasks live is asked before the files are read: a task that writes its last result and exits in
    # between is then still live here, rather than ended without that result.
    submissions = store.open_submissions()
    liveness = {s["id"]: by_name[s["backend"]].live_tasks(s) for s in submissions}
    done, failed = store.ingest(folder)
    live = 0
    for s in submissions:
        alive, reasons = liveness[s["id"]]
        ended = store.submitted_tasks(s["id"]) - alive
        failed += store.tasks_ended(s["id"], sorted(ended), reasons, folder)
        if not alive:
            store.end_submission(s["id"])
        live += len(alive)
    return done, failed, live


def free_slots(backend: Backend, live: int) -> int:
    """Tasks the next submission may start. Local workers share this machine's cores with the ``live`` tasks of
    earlier submissions: jobs found while they run (follow mode: a new snapshot) wait for a free worker, so no
    more than --workers run at once, each with total_threads // workers threads. SLURM queues each array itself."""
    return max(0, backend.size - live) if isinstance(backend, LocalArray) else backend.size


def make_backend(config: ScheduleConfig) -> Backend:
    if config.backend == "slurm":
        return SlurmArray(config.workers, config.slurm)
    return InProcess() if config.workers == 1 else LocalArray(config.workers)


def check_inputs(config: ScheduleConfig) -> None:
    """Fail on the user's input before any job does: run folders and (local) GLUE files must exist."""
    missing = [r for r in config.runs if not Path(r).is_dir()]
    if missing and config.mode == "once":
        raise FileNotFoundError(f"run folder(s) not found: {', '.join(missing)}; pass pretraining run folders (RUN/)")
    if config.data_dir is not None:
        for task in config.tasks:
            load_task(task, config.data_dir)
    check_wandb(wandb_settings(config))


class Interrupted(Exception):
    """The scheduler was stopped by Ctrl-C; ``args[0]``: how many jobs were queued again."""


def requeue_after_interrupt(config: ScheduleConfig, folder: ResultsFolder, backend: Backend) -> int:
    """Take in what finished, then queue again the jobs the stopped local workers left without a result (their
    attempt not counted). SLURM tasks keep running: the next pass takes in their results."""
    with ResultStore(config.store) as store:
        store.ingest(folder)
        return 0 if isinstance(backend, SlurmArray) else store.requeue_interrupted()


def schedule(config: ScheduleConfig) -> list[dict[str, Any]]:
    """Run the jobs of complete snapshots, once or until the runs end; returns the jobs that failed for good.
    One scheduler per store: a second one stops with StoreBusy, naming the first."""
    check_inputs(config)
    with store_lock(config.store):
        return _schedule(config)


def _schedule(config: ScheduleConfig) -> list[dict[str, Any]]:
    folder = ResultsFolder(results_dir(config.store, config.results_dir))
    backend = make_backend(config)
    runtime = runtime_settings(config)
    deadline = parse_until(config.until) if config.until else None
    first = True
    try:
        while True:
            # Whether the runs ended is read before looking for snapshots, so none written before the end is missed.
            ended = runs_ended(config) if config.mode == "follow" else {}
            with ResultStore(config.store) as store:
                done, failed, live = collect(store, folder, backend, config.slurm)
                added = store.enqueue(discover(config, store))
                if config.retry_failed and first:
                    print(f"queued {store.retry_failed()} failed job(s) again (--retry_failed)", flush=True)
                runnable = [spec for spec, _ in store.runnable(config.max_attempts)]
                if runnable and (first or added):
                    print(cost_line(config, store, runnable), flush=True)
                first = False
                if added or done or failed or runnable:
                    print(progress_line(config, store, added, done, failed), flush=True)
                submitted = submit(
                    store, folder, backend, runtime, config.max_attempts, slots=free_slots(backend, live)
                )
            if isinstance(backend, InProcess) and submitted:
                continue  # the jobs ran in this pass: take their results in at once
            if not live and not submitted:
                if config.mode == "once":
                    break
                if ended:
                    print("every run ended: " + ", ".join(f"{r} {s}" for r, s in ended.items()), flush=True)
                    break
            if deadline is not None and time.time() >= deadline:
                print(f"stopping at --until {config.until}; submitted tasks keep running", flush=True)
                break
            time.sleep(config.poll_interval_s)
    except KeyboardInterrupt:
        backend.close()  # this machine's workers stop before their jobs are queued again
        raise Interrupted(requeue_after_interrupt(config, folder, backend)) from None
    finally:
        backend.close()
    with ResultStore(config.store) as store:
        print("\n".join(status_lines(store, config.max_attempts)), flush=True)
        results = results_lines(store)
        if results:
            print("\nresults (finished jobs; python -m finetune.report draws Figure 5 from them):", flush=True)
            print("\n".join(results), flush=True)
        return store.failures(config.max_attempts)


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    commands = {"run": ScheduleConfig, "status": StatusConfig, "ingest": IngestConfig}
    command, config = parse_command(
        commands, argv, prog="python -m finetune.schedule", description=__doc__, default="run"
    )
    if command == "run":
        try:
            failures = schedule(config)
        except SlurmError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except Interrupted as stopped:
            kept = "; submitted SLURM tasks keep running" if config.backend == "slurm" else ""
            print(
                f"\ninterrupted: {stopped.args[0]} unfinished job(s) queued again (not counted as failed attempts)"
                f"{kept}. Run the same command to continue.",
                file=sys.stderr,
            )
            return 130
        if failures:
            print_failures(failures)
            return 1
        return 0
    if command == "status" and not Path(config.store).is_file():
        raise FileNotFoundError(f"results store {config.store} does not exist; pass --store=PATH")
    with contextlib.ExitStack() as stack:
        if command == "ingest":  # a writer: not while a scheduler holds the store
            stack.enter_context(store_lock(config.store))
        store = stack.enter_context(ResultStore(config.store))
        if command == "ingest":
            folder = ResultsFolder(results_dir(config.store, config.results_dir))
            if not folder.root.is_dir():
                raise FileNotFoundError(f"results folder {folder.root} does not exist; pass --results_dir=PATH")
            done, failed = store.ingest(folder)
            print(f"took in {done} results and {failed} failed attempts from {folder.root}")
        print("\n".join(status_lines(store, config.max_attempts)))
    return 0


def cli() -> int:
    """``main`` for the command line: bad input ends with its message and exit code 2, not a traceback."""
    return run_cli(main, errors=(StoreVersionError, StoreBusy))


if __name__ == "__main__":
    raise SystemExit(cli())
