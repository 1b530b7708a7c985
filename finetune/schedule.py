"""Fine-tune every complete snapshot of one or more pretraining runs, as they appear.

    python -m finetune.schedule --runs='[runs/post_ln, runs/pre_ln]' --data_dir=path/to/glue --mode=once
    python -m finetune.schedule --runs='[runs/post_ln, runs/pre_ln]' --data_dir=path/to/glue --mode=follow --workers=4
    python -m finetune.schedule --config=configs/finetune/bert_glue.yaml --runs='[...]' --backend=slurm --mode=follow
    python -m finetune.schedule status --results_dir=outputs/finetune/results.d   # the jobs, as the files say
    python -m finetune.schedule [run|status] --help

Every snapshot folder with its COMPLETE marker becomes task x lr x seed jobs, keyed by the run's id, the snapshot's
content hash and the recipe. The results folder (finetune/manifest.py) is the only record of the jobs; this process,
holding its lock, writes its manifests. Each pass records the tasks that ended (a job left without a result is
submitted again) and submits a manifest of the jobs still to run to the backend: ``local`` (N worker processes; 1
runs them in this process) or ``slurm`` (one ``sbatch`` job array per manifest).

``--mode=once`` runs the jobs of the snapshots that exist until each is done or failed ``max_attempts`` times;
``--mode=follow`` also picks up new snapshots until every run is finished, diverged, failed or dead (its heartbeat
older than ``dead_after_min``), or until ``--until``. The exit code is 1 when jobs failed every attempt, or for good
on a refused or deleted snapshot, or when a snapshot's jobs cannot be planned (its snapshot.json or manifest damaged,
a recipe.max_length beyond its position embeddings; the others run): all listed with their errors;
``--retry_failed=true`` queues failed jobs again. It is 2, with what to do, on bad input, a folder another scheduler
holds, a file of it that a task never writes, or jobs submitted MAX_REPEATS times without running; 3 when a job run
in this process (``--workers=1``) hung (no step for HUNG_FLOOR_S: its attempt is charged, and the same command goes
on). It prints one line per job as it ends, and the cost of the jobs before starting them (docs/finetuning.md).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import math
import os
import re
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

from finetune.backends import Backend, InProcess, LocalArray, SlurmArray, SlurmConfig, SlurmError
from finetune.config import GridOptions, ResultsOption, check_tasks
from finetune.glue import load_task
from finetune.manifest import (
    INTERRUPTED,
    NOT_STARTED,
    JobSpec,
    JobState,
    Manifest,
    ManifestJob,
    Results,
    ResultsBusy,
    ResultsFolder,
    Runtime,
    read_json,
    recipe_hash,
)
from finetune.worker import HUNG_FLOOR_S, SnapshotRefused, describe_model, files_stamp, job_specs, max_positions
from pretrain.common.cli import ConfigError, parse_command, require, run_cli
from pretrain.run_folder.identity import read_run_id
from pretrain.run_folder.layout import DEAD_AFTER_S, TERMINAL_STATUSES, is_dead, list_snapshots, read_status
from pretrain.tracking.wandb_logging import WandbSettings, check_wandb

BackendName = Literal["local", "slurm"]
Mode = Literal["once", "follow"]
# Training examples of the GLUE tasks on the Hub (nyu-mll/glue), for the cost estimate without --data_dir.
GLUE_TRAIN_SIZES = {"mrpc": 3668, "rte": 2490}
COLUMNS = ("queued", "submitted", "done", "failed", "retrying")
"""The status table's columns: failed jobs with attempts left are retrying; failed ones have none left."""


@dataclass(kw_only=True)
class ScheduleConfig(GridOptions):
    """Fine-tune every complete snapshot of the given pretraining runs (see the module docstring)."""

    runs: list[str]
    """Pretraining run folders (RUN/ of docs/run_layout.md) to watch."""
    tasks: list[str] = field(default_factory=lambda: ["mrpc", "rte"])
    """GLUE tasks to fine-tune every snapshot on."""
    mode: Mode = "once"
    """once: run the jobs of the snapshots that exist, then exit. follow: keep polling until all runs end."""
    poll_interval_s: float = 60.0
    """Seconds between passes (reading the results folder, looking for new snapshots and ended tasks)."""
    until: str | None = None
    """Stop following at an ISO date-time (2026-12-01T06:00, local unless it has an offset) or after a duration
    (90m, 8h, 45s). Submitted SLURM tasks run on; the next scheduler finds their results."""
    dead_after_min: float = DEAD_AFTER_S / 60
    """A running run whose status.json heartbeat is older than this many minutes is dead: follow mode stops waiting."""
    backend: BackendName = "local"
    """local: worker processes on this machine. slurm: one job array per submission, through sbatch."""
    workers: int = 1
    """Local worker processes, or the tasks of each slurm job array. 1 (local) runs jobs in this process."""
    total_threads: int = 0
    """CPU threads the local workers share (each gets total_threads // workers); 0: all cores."""
    max_attempts: int = 3
    """Attempts per job before it stays failed (what is charged: docs/finetune_files.md); a job whose snapshot is
    refused fails for good at its first attempt, until the snapshot's files change."""
    step_time_s: float | None = None
    """Seconds per fine-tuning step for the cost printed before the jobs start, an estimate used until a finished
    job of the recipe measures it; unset: the time follows once the first job finishes."""
    hung_after: float = 10.0
    """A local worker's job still running after this many times its expected time (its steps at the measured time
    per step; at least 10 minutes, HUNG_FLOOR_S) is taken for hung: its worker is killed, charging that attempt.
    0: never. A SLURM task ends at its array's time limit (slurm.time); with workers 1 the jobs run in this process."""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    """Settings of the slurm backend."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(bool(self.runs), "runs", "is empty; pass one or more pretraining run folders: --runs='[RUN1, RUN2]'")
        check_tasks("tasks", self.tasks)
        for key in ("workers", "max_attempts"):
            require(getattr(self, key) >= 1, key, f"must be >= 1; got {getattr(self, key)}")
        for key in ("poll_interval_s", "dead_after_min"):
            require(getattr(self, key) > 0, key, f"must be > 0; got {getattr(self, key)}")
        require(self.total_threads >= 0, "total_threads", f"must be >= 0 (0: all cores); got {self.total_threads}")
        require(self.hung_after >= 0, "hung_after", f"must be >= 0 (0: never); got {self.hung_after}")
        ok = self.step_time_s is None or self.step_time_s > 0
        require(ok, "step_time_s", f"must be > 0, or null to measure it; got {self.step_time_s}")
        if self.until is not None:
            parse_until(self.until)


@dataclass(kw_only=True)
class StatusConfig(ResultsOption):
    """The jobs of a results folder, as its files say: counts per run and task (queued, submitted, done, failed), then
    the failed jobs with their errors."""

    max_attempts: int = 3
    """Tries per job, as given to the scheduler (tells failed jobs from those still to be retried)."""

    def __post_init__(self) -> None:
        require(self.max_attempts >= 1, "max_attempts", f"must be >= 1; got {self.max_attempts}")


def parse_until(value: str, now: float | None = None) -> float:
    """``--until`` as a Unix time: a duration from now (90m, 8h, 45s) or an ISO date-time."""
    now = time.time() if now is None else now
    duration = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", value)
    if duration:
        return now + float(duration[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[duration[2]]
    try:
        return datetime.datetime.fromisoformat(value).timestamp()
    except ValueError:
        forms = "a duration (90m, 8h, 45s) nor an ISO date-time (2026-12-01T06:00)"
        raise ValueError(f"until={value!r} is neither {forms}") from None


# --- Discovering jobs, and the state of the pretraining runs ---------------------------------------


@dataclass(frozen=True)
class Discovered:
    """What ``discover`` finds: the jobs of every complete snapshot, and the snapshots (or whole runs) whose jobs
    cannot be planned ({folder: why}: a file their jobs are keyed by damaged since, another format version, a recipe
    that does not fit the model), while the others run."""

    specs: list[JobSpec]
    refused: dict[str, str]


def discover(config: ScheduleConfig) -> Discovered:
    """The jobs of every complete snapshot of every run (snapshots without the COMPLETE marker are skipped)."""
    specs, refused = [], {}
    for run in config.runs:
        run_dir = Path(run).resolve()
        if not run_dir.is_dir():
            continue  # follow mode: the run has not started yet
        try:
            read_run_id(run_dir)  # a folder without one is not a run folder: FileNotFoundError, the user's input
        except ValueError as err:  # damaged since: this run's jobs wait, the other runs' go on
            refused[str(run_dir)] = str(err)
            continue
        for snapshot in list_snapshots(run_dir):
            try:
                model = describe_model(snapshot.path)
                config.recipe.check_fits(max_positions(snapshot.path), str(snapshot.path))  # else every job fails alike
            except (SnapshotRefused, ConfigError) as err:
                refused[str(snapshot.path)] = str(err)
                continue
            for task in config.tasks:
                specs += job_specs(model, task, config.lrs, config.seeds, config.recipe)
    return Discovered(list({spec.key: spec for spec in specs}.values()), refused)  # a run given twice is one run


def told(refused: dict[str, str], before: dict[str, str]) -> dict[str, str]:
    """The snapshots ``refused`` ({folder: why}, Discovered.refused), after a line for each not so in ``before``."""
    for path, why in refused.items() - before.items():
        print(f"{path} is refused, its jobs are not planned: {why}", file=sys.stderr)
    return refused


def vanished(config: ScheduleConfig, jobs: dict[str, JobState], found: list[JobSpec]) -> list[JobSpec]:
    """The unfinished jobs of the runs and grid of ``config`` that the folder names but ``found`` (discover) lacks,
    as their model folder no longer exists: a snapshot deleted or moved after its jobs were planned. They stay
    wanted, so that their task fails them for good, saying so, and they run once it is back."""
    ids = set()
    for run in config.runs:
        with contextlib.suppress(FileNotFoundError, ValueError):  # not started yet; refused by discover
            ids.add(read_run_id(Path(run).resolve()))
    grid = {(task, float(lr), int(seed)) for task in config.tasks for lr in config.lrs for seed in config.seeds}
    recipe, keys, gone = config.recipe.result_key(), {spec.key for spec in found}, []
    for key, state in jobs.items():
        spec = state.spec
        ours = spec.run_id in ids and (spec.task, spec.lr, spec.seed) in grid and spec.recipe == recipe
        if ours and key not in keys and state.status != "done" and not Path(spec.model_path).exists():
            gone.append(spec)
    return gone


def run_state(run_dir: str | Path, dead_after_min: float, now: float | None = None) -> str:
    """The run's status.json status, or ``dead`` for a ``running`` run whose heartbeat stopped (layout.is_dead)."""
    status = read_status(run_dir)
    return "dead" if is_dead(status, now, after_s=60 * dead_after_min) else str(status.get("status"))


def runs_ended(config: ScheduleConfig) -> dict[str, str]:
    """``{run: state}`` if every run is finished, diverged, failed or dead; else an empty dict."""
    states = {run: run_state(run, config.dead_after_min) for run in config.runs}
    return states if all(s in (*TERMINAL_STATUSES, "dead") for s in states.values()) else {}


# --- The jobs to run, from what the results folder says -------------------------------------------


def column(state: JobState | None, max_attempts: int) -> str:
    """The status table's column of a job (None: not in the folder yet); a job failed for good is failed at once."""
    if state is None:
        return "queued"
    if state.status == "failed" and not state.permanent and state.attempts < max_attempts:
        return "retrying"
    return state.status


def counts(states: Iterable[JobState | None], max_attempts: int) -> dict[str, int]:
    """How many of ``states`` are in each column of the status table."""
    total = dict.fromkeys(COLUMNS, 0)
    for state in states:
        total[column(state, max_attempts)] += 1
    return total


def runnable(jobs: dict[str, JobState], wanted: list[JobSpec], max_attempts: int) -> list[tuple[JobSpec, int]]:
    """The wanted jobs to submit now (new, queued, or failed with attempts left), with the attempts they had."""
    wanted = sorted(wanted, key=lambda s: (s.run_id, s.pretrain_step, s.task, s.lr, s.seed))
    todo = [spec for spec in wanted if column(jobs.get(spec.key), max_attempts) in ("queued", "retrying")]
    return [(spec, jobs[spec.key].attempts if spec.key in jobs else 0) for spec in todo]


def _queued_again(state: JobState) -> JobState:
    return replace(state, status="queued", attempts=0, error=None, permanent=False)


def retried(jobs: dict[str, JobState], wanted: list[JobSpec]) -> dict[str, JobState]:
    """The wanted failed jobs queued again with a fresh count of attempts (--retry_failed)."""
    keys = {spec.key for spec in wanted}
    return {key: _queued_again(state) for key, state in jobs.items() if key in keys and state.status == "failed"}


def lifted(jobs: dict[str, JobState], wanted: list[JobSpec]) -> dict[str, JobState]:
    """The wanted jobs failed for good whose model folder's files changed since (``files_stamp``), queued again
    with a fresh count of attempts. Asked on every pass: a submission records the new attempt."""
    stamp = functools.cache(lambda folder: files_stamp(Path(folder)))  # each folder looked at once a pass
    out = {}
    for spec in wanted:  # where the snapshot is now
        state = jobs.get(spec.key)
        if state and state.status == "failed" and state.permanent and stamp(spec.model_path) != state.snapshot_stamp:
            out[spec.key] = _queued_again(state)
    return out


def unfinished(jobs: dict[str, JobState], wanted: list[JobSpec], max_attempts: int) -> list[JobSpec]:
    """The wanted jobs still to run: new, queued, submitted, or failed with attempts left."""
    return [spec for spec in wanted if column(jobs.get(spec.key), max_attempts) in ("queued", "submitted", "retrying")]


# --- What the scheduler prints --------------------------------------------------------------------


def status_lines(jobs: dict[str, JobState], max_attempts: int) -> list[str]:
    """A table of job counts per (run, task), and a total line."""
    groups: dict[tuple[str, str, str], list[JobState]] = {}
    for state in jobs.values():
        groups.setdefault((state.spec.run_name, state.spec.run_id, state.spec.task), []).append(state)
    rows = [("run", "run id", "task", *COLUMNS)]
    rows += [(*group, *counts(states, max_attempts).values()) for group, states in sorted(groups.items())]
    rows.append(("total", "", "", *counts(jobs.values(), max_attempts).values()))
    return [f"{name:<24} {run_id:<26} {task:<6}" + "".join(f" {n:>9}" for n in c) for name, run_id, task, *c in rows]


def step_time(config: ScheduleConfig, jobs: dict[str, JobState], estimate: bool = True) -> tuple[float | None, str]:
    """Seconds per optimizer step, measured on the finished jobs of this recipe, else (``estimate``) step_time_s as a
    stated estimate, else None; and where that figure comes from (``pretrain.analysis compare``'s rule)."""
    recipe = recipe_hash(config.recipe.result_key())
    done = [s.results for s in jobs.values() if s.results is not None and s.spec.recipe_hash == recipe]
    if steps := sum(r.train_steps for r in done):
        source = "measured on the first finished job" if len(done) == 1 else f"measured on {len(done)} finished jobs"
        return sum(r.wall_time_s for r in done) / steps, source
    if not estimate or config.step_time_s is None:
        return None, ""
    return config.step_time_s, f"an estimate, --step_time_s: no job of this recipe in {config.results_dir} has ended"


@functools.cache  # asked on every pass (the ETA, hung jobs); GLUE's files do not change under a scheduler
def train_examples(task: str, data_dir: str | None) -> int:
    return len(load_task(task, data_dir)["train"]) if data_dir else GLUE_TRAIN_SIZES[task]


def train_steps(config: ScheduleConfig, specs: list[JobSpec]) -> int:
    """Optimizer steps of the jobs ``specs`` under the recipe."""
    recipe, per_job = config.recipe, {}
    for task in {spec.task for spec in specs}:
        examples = train_examples(task, config.data_dir)
        examples = min(examples, recipe.max_train_examples or examples)
        per_job[task] = math.ceil(examples / recipe.batch_size) * recipe.epochs
    return sum(per_job[spec.task] for spec in specs)


def progress_line(config: ScheduleConfig, jobs: dict[str, JobState], wanted: list[JobSpec]) -> str:
    """Where the wanted jobs are, and an ETA once a step time is known."""
    total = counts((jobs.get(spec.key) for spec in wanted), config.max_attempts)
    line = (
        f"jobs: {total['done']}/{len(wanted)} done, {total['submitted']} running, "
        f"{total['queued'] + total['retrying']} queued, {total['failed']} failed"
    )
    left = unfinished(jobs, wanted, config.max_attempts)
    seconds, _ = step_time(config, jobs)
    if seconds is None or not left:
        return line
    minutes = train_steps(config, left) * seconds / min(config.workers, len(left)) / 60
    return line + f"; ETA about {max(1, round(minutes))} min"  # not "0 min" while jobs are left


def results_lines(jobs: dict[str, JobState]) -> list[str]:
    """The finished jobs' dev accuracy: mean over seeds per run, step, task and lr, beside the dev set's majority
    class (a mean there is a model that answers one class)."""
    groups: dict[tuple[str, int, str, float], list[Results]] = {}
    for state in jobs.values():
        if state.results is not None:
            spec = state.spec
            groups.setdefault((spec.run_name, spec.pretrain_step, spec.task, spec.lr), []).append(state.results)
    if not groups:
        return []
    header = ("run", "step", "task", "lr", "seeds", "accuracy", "majority", "dev loss")
    lines = ["{:<24} {:>8} {:<5} {:>8} {:>5} {:>9} {:>9} {:>9}".format(*header)]
    for (name, step, task, lr), results in sorted(groups.items()):
        accuracy, majority = 100 * sum(r.accuracy for r in results) / len(results), 100 * results[0].majority_accuracy
        dev_loss = sum(r.dev_loss for r in results) / len(results)
        lines.append(f"{name:<24} {step:>8} {task:<5} {lr:>8g} {len(results):>5} {accuracy:>8.2f}% "
                     f"{f'{majority:.2f}%':>9} {dev_loss:>9.4f}")  # fmt: skip
    return lines


def cost_line(config: ScheduleConfig, jobs: dict[str, JobState], specs: list[JobSpec], what: str = "to run") -> str:
    """How many jobs, optimizer steps, and (with a per-step time) hours of work are about to start (or are left)."""
    steps = train_steps(config, specs)
    line = f"{len(specs)} jobs {what}: {steps:,} fine-tuning steps"
    seconds, source = step_time(config, jobs)
    if seconds is None:
        return line + " (the time they take follows once the first job finishes; --step_time_s=S gives it now)"
    work = steps * seconds
    wall, workers = work / min(config.workers, len(specs)), f"{config.workers} worker(s)"
    line += f" x {seconds:.3g} s/step ({source}) = "
    if work >= 3600:
        return line + f"{work / 3600:.2f} worker-hours, about {wall / 3600:.2f} h with {workers}"
    return line + f"about {max(1, round(wall / 60))} min with {workers}"


def print_failures(failures: list[JobState], snapshots: dict[str, str] | None = None) -> None:
    """The jobs that failed for good, with their errors: those out of attempts, then those of a snapshot refused or
    gone; then the ``snapshots`` refused before their jobs were planned ({folder: why})."""
    refused = ("failed for good: their snapshot was refused or is gone (not tried again until its files change, e.g. "
               "restored from a copy)")  # fmt: skip
    for permanent, title in ((False, "failed every attempt"), (True, refused)):
        states = [s for s in failures if s.permanent == permanent]
        if states:
            print(f"{len(states)} job(s) {title}:", file=sys.stderr)
        for state in states:
            spec, tries = state.spec, f"{state.attempts} attempt{'s' * (state.attempts != 1)}"
            print(f"  {spec.run_name} [{spec.run_id}] step {spec.pretrain_step} {spec.task} lr={spec.lr:g} "
                  f"seed={spec.seed} ({tries}): {state.error}", file=sys.stderr)  # fmt: skip
    if snapshots:
        print(f"{len(snapshots)} snapshot or run folder(s) refused, their jobs not planned:", file=sys.stderr)
    for path, why in sorted((snapshots or {}).items()):
        print(f"  {path}: {why}", file=sys.stderr)
    print("fix the cause and queue them again with --retry_failed=true", file=sys.stderr)


def outcome(state: JobState, max_attempts: int) -> str:
    """What happens next to a job that failed, for its line."""
    if state.permanent:
        return ", for good (not tried again until the snapshot's files change)"
    return f" of {max_attempts}, " + ("to be tried again" if state.attempts < max_attempts else "none left")


def job_lines(folder: ResultsFolder, max_attempts: int) -> Callable[[], dict[str, JobState]]:
    """A function returning the jobs as the folder says now, after a line for each job that ended since its last
    call (done, or failed with what happens next), whatever the backend. Called after each job run in this process,
    it raises ResultsBusy there once the lock file held was deleted or replaced: a second scheduler may have come
    in and be running the same jobs, so this one stops before its next job."""

    def end(state: JobState) -> tuple[str, int] | None:  # an attempt of a later submission ends again
        return (state.status, state.submission) if state.status in ("done", "failed") else None

    seen = {key: end(state) for key, state in folder.jobs().items()}

    def lines() -> dict[str, JobState]:
        folder.check_lock()
        jobs = folder.jobs()
        for key, state in jobs.items():
            if end(state) is not None and seen.get(key) != end(state):
                print(state.line(outcome(state, max_attempts) if state.status == "failed" else ""), flush=True)
            seen[key] = end(state)
        return jobs

    return lines


# --- One pass of the scheduler --------------------------------------------------------------------


def runtime_settings(config: ScheduleConfig) -> Runtime:
    """Inputs that do not change a job's numbers, taken from this command each time it submits."""
    recipe = config.recipe
    if config.backend == "slurm":
        threads, progress = config.slurm.cpus_per_task, False
    else:
        threads = max(1, (config.total_threads or os.cpu_count() or 1) // config.workers)
        progress = recipe.progress and config.workers == 1  # several bars would interleave
    values = {**recipe.runtime(), "torch_threads": recipe.torch_threads or threads, "progress": progress}
    data_dir = str(Path(config.data_dir).resolve()) if config.data_dir else None
    wandb = wandb_settings(config)
    return Runtime(data_dir=data_dir, recipe=values, wandb=asdict(wandb) if wandb else None)


def wandb_settings(config: GridOptions) -> WandbSettings | None:
    """One W&B run per job when --wandb (pretrain/tracking/wandb_logging.py); offline runs beside the results folder."""
    directory = str(Path(config.results_dir).resolve().parent)
    return WandbSettings(project=config.wandb_project, dir=directory) if config.wandb else None


class NoProgress(RuntimeError):
    """Jobs were submitted again and again as they were: their tasks ended without running them."""


MAX_REPEATS = 3
"""How often one scheduler submits a job with the same attempts so far (its tasks ended without finishing, failing
or being charged for it: preempted before they reached it, or skipped it) before it stops rather than loop."""


def check_progress(history: Counter[tuple[str, int]], todo: list[tuple[JobSpec, int]]) -> None:
    """Raise NoProgress when a job of ``todo`` (spec, attempts) was submitted MAX_REPEATS times with those attempts
    (``history``: this process's submissions): submitting it again would end the same way, for ever (under SLURM,
    an sbatch a pass)."""
    if stuck := [spec for spec, attempts in todo if history[spec.key, attempts] >= MAX_REPEATS]:
        raise NoProgress(
            f"{len(stuck)} job(s) ({stuck[0].label}{', ...' * (len(stuck) > 1)}) were submitted {MAX_REPEATS} times "
            "as they were: their tasks ended without finishing, failing or being charged for them, and would again. "
            "A task skips a job whose result file (done/KEY.json) exists, and stops early when it cannot start: look "
            "at those files and the tasks' output, then run the same command again"
        )


def submit(folder: ResultsFolder, backend: Backend, runtime: Runtime, jobs: list[tuple[JobSpec, int]],
           slots: int | None = None, history: Counter[tuple[str, int]] | None = None) -> int:  # fmt: skip
    """Write a manifest of ``jobs`` (spec, attempts so far) and start its tasks; returns how many jobs it holds.
    With fewer ``slots`` (tasks that may start now) than the backend's size, only those slots' share of the jobs
    goes in: the rest wait for the next free worker instead of queueing behind these. With ``history`` (this
    process's submissions, updated), a job already submitted MAX_REPEATS times as it is raises NoProgress."""
    tasks = min(backend.size if slots is None else slots, len(jobs))
    if tasks <= 0:
        return 0
    jobs = jobs[: math.ceil(len(jobs) * tasks / max(tasks, backend.size))]
    if history is not None:
        check_progress(history, jobs)
        history.update((spec.key, attempts) for spec, attempts in jobs)
    lines = [ManifestJob(spec=spec, attempt=attempts + 1) for spec, attempts in jobs]
    manifest = Manifest(folder.next_submission(), backend.name, tasks, runtime, lines)
    path = folder.write_manifest(manifest)  # the jobs are under way from here: a restart asks the backend
    try:
        handle = backend.start(path, tasks, manifest.submission)
    except (SlurmError, FileNotFoundError) as err:  # nothing started: this attempt failed, with the reason
        folder.write_manifest(replace(manifest, ended=dict.fromkeys(range(tasks), f"{NOT_STARTED}{err}")))
        raise
    folder.write_manifest(replace(manifest, handle=handle))
    return len(lines)


def collect(folder: ResultsFolder, backend: Backend, slurm: SlurmConfig | None = None) -> int:
    """Record in their manifests the tasks of open submissions that ended, with why; returns the tasks still live.
    A submission is asked about by the kind of backend that started it (a restart may use another one)."""
    kinds = {"inprocess": InProcess(), "local": LocalArray(1), "slurm": SlurmArray(1, slurm or SlurmConfig())}
    kinds[backend.name] = backend
    live = 0
    for manifest in folder.manifests():
        if not manifest.is_open:
            continue
        alive, reasons = kinds[manifest.backend].live_tasks(manifest)
        ended = {t: reasons.get(t, "?") for t in range(manifest.tasks) if t not in alive and t not in manifest.ended}
        if ended:
            folder.write_manifest(replace(manifest, ended={**manifest.ended, **ended}))
        live += len(alive)
    return live


def kill_hung(folder: ResultsFolder, backend: Backend, config: ScheduleConfig, jobs: dict[str, JobState]) -> None:
    """Kill the local workers of ``backend`` (this scheduler's own processes: no other pid is ever signalled) whose
    job has run longer than ``hung_after`` times its expected time; their task then ends, charging that attempt."""
    seconds, _ = step_time(config, jobs, estimate=False)
    if not isinstance(backend, LocalArray) or not config.hung_after or seconds is None:
        return
    workers = {process.pid: key for key, process in backend.processes.items() if process.poll() is None}
    for state in jobs.values():
        path = folder.started_path(state.spec.key, state.submission)
        if state.status != "submitted" or not path.is_file():
            continue
        started = read_json(path)
        pid, expected = started["worker"]["pid"], train_steps(config, [state.spec]) * seconds
        ran, limit = time.time() - started["started"], max(HUNG_FLOOR_S, config.hung_after * expected)
        if started["worker"]["host"] == socket.gethostname() and pid in workers and ran > limit:
            why = (f"taken for hung after {ran / 60:.1f} min, {config.hung_after:g} x its expected "
                   f"{expected / 60:.1f} min")  # fmt: skip
            print(f"job {state.spec.label}: {why}; its worker (pid {pid}) is killed", file=sys.stderr, flush=True)
            backend.kill(workers[pid], f"its worker was {why}")


def free_slots(backend: Backend, live: int) -> int:
    """Tasks the next submission may start. Local workers share this machine's cores with the ``live`` tasks of
    earlier submissions, so no more than --workers run at once; SLURM queues each array itself."""
    return max(0, backend.size - live) if isinstance(backend, LocalArray) else backend.size


class Interrupted(Exception):
    """The scheduler was stopped by Ctrl-C; ``args[0]``: how many jobs were queued again."""


def requeue_after_interrupt(folder: ResultsFolder) -> int:
    """Record the tasks of this machine's workers, stopped by Ctrl-C, as ended by the interrupt (no attempt charged);
    returns how many jobs are queued again. SLURM tasks run on."""
    stopped = set()
    for manifest in folder.manifests():
        if manifest.is_open and manifest.backend != "slurm":
            ended = {**dict.fromkeys(range(manifest.tasks), INTERRUPTED), **manifest.ended}
            folder.write_manifest(replace(manifest, ended=ended))
            stopped.add(manifest.submission)
    return sum(s.status == "queued" and s.submission in stopped for s in folder.jobs().values())


@dataclass(frozen=True)
class Left:
    """What a scheduler leaves undone when it stops."""

    failures: list[JobState]
    """The wanted jobs that failed for good or every attempt."""
    refused: dict[str, str]
    """The snapshots refused at its last pass ({folder: why}), whose jobs it did not plan."""


def schedule(config: ScheduleConfig) -> Left:
    """Run the jobs of complete snapshots, once or until the runs end; returns what it leaves undone.
    One scheduler per results folder: a second one stops with ResultsBusy, naming the first."""
    # The user's input fails here rather than in every job: run folders and (local) GLUE files must exist.
    missing = [r for r in config.runs if not Path(r).is_dir()]
    if missing and config.mode == "once":
        raise FileNotFoundError(f"run folder(s) not found: {', '.join(missing)}; pass pretraining run folders (RUN/)")
    if config.data_dir is not None:
        for task in config.tasks:
            load_task(task, config.data_dir)
    check_wandb(wandb_settings(config))
    folder = ResultsFolder(config.results_dir)
    with folder.lock():
        return _schedule(config, folder)


def _schedule(config: ScheduleConfig, folder: ResultsFolder) -> Left:
    lines = job_lines(folder, config.max_attempts)
    wanted: list[JobSpec] = []
    unmeasured = False  # a cost line went out without a measured time per step: the first finished job gives it

    def follow() -> dict[str, JobState]:
        """The jobs now, after their lines and, once a step time is measured, the estimate the cost line lacked."""
        nonlocal unmeasured
        jobs = lines()
        if unmeasured and step_time(config, jobs, estimate=False)[0] is not None:
            unmeasured = False
            if left := unfinished(jobs, wanted, config.max_attempts):
                print(cost_line(config, jobs, left, "left"), flush=True)
        return jobs

    if config.backend == "slurm":
        backend: Backend = SlurmArray(config.workers, config.slurm)
    else:
        backend = InProcess(follow) if config.workers == 1 else LocalArray(config.workers)
    runtime = runtime_settings(config)
    deadline = parse_until(config.until) if config.until else None
    resets: dict[str, JobState] = {}
    found, printed, first, rerun, history, refused = set(), "", True, set(), Counter(), {}
    try:
        while True:
            # Whether the runs ended is read before looking for snapshots, so none written before the end is missed.
            ended = runs_ended(config) if config.mode == "follow" else {}
            live = collect(folder, backend, config.slurm)
            discovered = discover(config)
            wanted, refused = discovered.specs, told(discovered.refused, refused)
            jobs = follow()
            wanted += vanished(config, jobs, wanted)
            if config.retry_failed and first:
                resets = retried(jobs, wanted)
                print(f"queued {len(resets)} failed job(s) again (--retry_failed)", flush=True)
            # A retried job counts afresh until a submission records its new attempts.
            jobs |= {key: reset for key, reset in resets.items() if jobs[key].submission <= reset.submission}
            changed = lifted(jobs, wanted)
            if changed.keys() - rerun:
                print(f"{len(changed)} job(s) that failed for good run again: their snapshot's files changed", flush=True)
            jobs, rerun = jobs | changed, rerun | changed.keys()
            todo = runnable(jobs, wanted, config.max_attempts)
            if todo and {spec.key for spec in wanted} - found:  # the first pass, or new snapshots
                print(cost_line(config, jobs, [spec for spec, _ in todo]), flush=True)
                unmeasured = step_time(config, jobs, estimate=False)[0] is None
            line = progress_line(config, jobs, wanted)
            if todo or line != printed:
                print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)
            found, printed, first = found | {spec.key for spec in wanted}, line, False
            kill_hung(folder, backend, config, jobs)
            submitted = submit(folder, backend, runtime, todo, slots=free_slots(backend, live), history=history)
            if isinstance(backend, InProcess) and submitted:
                continue  # the jobs ran in this pass: look at their results at once
            if not live and not submitted and (config.mode == "once" or ended):
                if ended:
                    print("every run ended: " + ", ".join(f"{r} {s}" for r, s in ended.items()), flush=True)
                break
            if deadline is not None and time.time() >= deadline:
                print(f"stopping at --until {config.until}; submitted tasks keep running", flush=True)
                break
            time.sleep(config.poll_interval_s)
    except KeyboardInterrupt:
        backend.close()  # this machine's workers stop before their jobs are queued again
        raise Interrupted(0 if isinstance(backend, SlurmArray) else requeue_after_interrupt(folder)) from None
    finally:
        backend.close()
    # The last lines: local workers' and SLURM tasks' results since the last pass.
    return closing(config, lines(), wanted, refused)


def closing(config: ScheduleConfig, jobs: dict[str, JobState], wanted: list[JobSpec], refused: dict[str, str]) -> Left:
    """What a stopping scheduler leaves undone, after the status table and the finished jobs' results."""
    print("\n".join(status_lines(jobs, config.max_attempts)), flush=True)
    if results := results_lines(jobs):
        print("\nresults (finished jobs; python -m finetune.report draws Figure 5 from them):", flush=True)
        print("\n".join(results), flush=True)
    failed = [jobs.get(spec.key) for spec in wanted]
    return Left([s for s in failed if s is not None and column(s, config.max_attempts) == "failed"], refused)


# --- Command line ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    commands = {"run": ScheduleConfig, "status": StatusConfig}
    prog = "python -m finetune.schedule"
    command, config = parse_command(commands, argv, prog=prog, description=__doc__, default="run")
    if command == "status":
        folder = ResultsFolder(config.results_dir)
        if not folder.root.is_dir():
            raise FileNotFoundError(f"results folder {folder.root} does not exist; pass --results_dir=FOLDER")
        jobs = folder.jobs()
        print("\n".join(status_lines(jobs, config.max_attempts)))
        if failures := [state for state in jobs.values() if column(state, config.max_attempts) == "failed"]:
            print_failures(sorted(failures, key=lambda s: (s.spec.run_name, s.spec.pretrain_step, s.spec.label)))
        return 0
    try:
        left = schedule(config)
    except SlurmError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Interrupted as stopped:
        kept = "; submitted SLURM tasks keep running" if config.backend == "slurm" else ""
        print(f"\ninterrupted: {stopped.args[0]} unfinished job(s) queued again (not counted as failed attempts)"
              f"{kept}. Run the same command to continue.", file=sys.stderr)  # fmt: skip
        return 130
    if left.failures or left.refused:
        print_failures(left.failures, left.refused)
        return 1
    return 0


# Bad input, a busy folder, a pass without progress: its message and exit code 2, not a traceback.
cli = functools.partial(run_cli, main, errors=(ResultsBusy, NoProgress))


if __name__ == "__main__":
    raise SystemExit(cli())
