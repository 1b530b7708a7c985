"""Fine-tune every complete snapshot of one or more pretraining runs, as they appear.

    python -m finetune.schedule --runs='[runs/post_ln, runs/pre_ln]' --data_dir=path/to/glue --mode=once
    python -m finetune.schedule --runs='[runs/post_ln, runs/pre_ln]' --data_dir=path/to/glue --mode=follow --workers=4
    python -m finetune.schedule --config=configs/finetune/bert_glue.yaml --runs='[...]' --backend=slurm --mode=follow
    python -m finetune.schedule status --results_dir=outputs/finetune/results.d   # the jobs, as the files say
    python -m finetune.schedule [run|status] --help

Every snapshot folder with its COMPLETE marker becomes task x lr x seed jobs, keyed by the run's id (RUN/run_id),
the snapshot's content hash and the recipe. The results folder (finetune/manifest.py) is the only record of the
jobs, and this process the only one that writes its manifests (it holds the folder's lock). On each pass it reads
the folder, records in their manifests the tasks that ended (preempted, killed, out of time: a job such a task
left without a result is submitted again), and writes a manifest of the jobs still to run, whose tasks run on the
backend: ``local`` (N worker processes here; 1 runs the jobs in this process) or ``slurm`` (one ``sbatch`` job
array per manifest). Tasks read only the manifest and write only result files (finetune/worker.py).

``--mode=once`` runs the jobs of the snapshots that exist until each is done or failed ``max_attempts`` times;
``--mode=follow`` also picks up new snapshots until every run is finished, diverged, failed or dead (status.json
``running`` but its heartbeat older than ``dead_after_min``), or until ``--until``. The exit code is 1 when jobs failed
every attempt (they are listed with their errors); ``--retry_failed=true`` queues them again. A job whose snapshot
is refused (incomplete, damaged, of another format version or of mixed placements) fails for good at once: it is
not tried again, by this command or a later one, until the snapshot's files change (restored from a copy).

It prints one line per job as it learns of its end (``done mrpc lr=3e-05 seed=2 step=1200 (RUN) acc 0.684 in
41 s``, or ``failed ...`` with the reason), and the cost of the jobs before starting them: at ``--step_time_s``,
or else at the time per step of the first job that finishes, printed then.
"""

from __future__ import annotations

import datetime
import math
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

from finetune.backends import Backend, InProcess, LocalArray, SlurmArray, SlurmConfig, SlurmError
from finetune.config import DEFAULT_LRS, DEFAULT_SEEDS, FinetuneConfig, ResultsOption, check_tasks, validate_grid
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
    recipe_hash,
)
from finetune.tracking import WandbSettings, check_wandb
from finetune.worker import describe_model, files_stamp, job_specs
from pretrain.common.cli import ConfigError, parse_command, require, run_cli
from pretrain.run_folder.identity import read_run_id
from pretrain.run_folder.layout import DEAD_AFTER_S, TERMINAL_STATUSES, is_dead, list_snapshots, read_status

BackendName = Literal["local", "slurm"]
Mode = Literal["once", "follow"]
# Training examples of the GLUE tasks on the Hub (nyu-mll/glue), for the cost estimate without --data_dir.
GLUE_TRAIN_SIZES = {"mrpc": 3668, "rte": 2490}
COLUMNS = ("queued", "submitted", "done", "failed", "retrying")
"""The status table's columns: failed jobs with attempts left are retrying; failed ones have none left."""

__all__ = ["ScheduleConfig", "SlurmConfig", "main", "schedule"]


@dataclass(kw_only=True)
class ScheduleConfig(ResultsOption):
    """Fine-tune every complete snapshot of the given pretraining runs (see the module docstring)."""

    runs: list[str]
    """Pretraining run folders (RUN/ of docs/run_layout.md) to watch."""
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
    """Seconds between passes (reading the results folder, looking for new snapshots and ended tasks)."""
    until: str | None = None
    """Stop following at this time: an ISO date-time (2026-12-01T06:00, local time unless it has an offset) or a
    duration from now (90m, 8h, 45s). Submitted SLURM tasks run on; the next scheduler finds their results."""
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
    --workers=1, the job that died with its scheduler. A job whose snapshot is refused fails for good at its first
    attempt: no retry changes that until the snapshot's files change."""
    retry_failed: bool = False
    """Queue the jobs that failed for good again (every attempt, or at once on a refused snapshot), after fixing
    the cause (e.g. a missing --data_dir)."""
    step_time_s: float | None = None
    """Seconds per fine-tuning step for the cost estimate; unset: measured on the finished jobs of the recipe
    (on a first run, the estimate follows when the first job finishes)."""
    recipe: FinetuneConfig = field(default_factory=FinetuneConfig)
    """The fine-tuning recipe of every job."""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    """Settings of the slurm backend."""
    wandb: bool = False
    """Log one W&B run per job (job_type finetune; WANDB_MODE=offline logs locally, beside the results folder)."""
    wandb_project: str | None = None
    """W&B project of the job runs; unset: the pretraining run's tracking.project (else lnbert)."""

    def __post_init__(self) -> None:
        super().__post_init__()
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
class StatusConfig(ResultsOption):
    """The jobs of a results folder, as its files say: counts per run and task (queued, submitted, done, failed)."""

    max_attempts: int = 3
    """Tries per job, as given to the scheduler (tells failed jobs from those still to be retried)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.max_attempts >= 1, "max_attempts", f"must be >= 1; got {self.max_attempts}")


@dataclass(kw_only=True)
class IngestConfig(StatusConfig):
    """Gone: there is no store to rebuild; ``status`` reads the results folder as it is."""


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


# --------------------------------------------------------------------------------------------------
# Discovering jobs, and the state of the pretraining runs
# --------------------------------------------------------------------------------------------------


def discover(config: ScheduleConfig) -> list[JobSpec]:
    """The jobs of every complete snapshot of every run (snapshots without the COMPLETE marker are skipped)."""
    specs = []
    for run in config.runs:
        run_dir = Path(run).resolve()
        if not run_dir.is_dir():
            continue  # follow mode: the run has not started yet
        read_run_id(run_dir)  # a folder without an identity is refused here, with the reason
        for snapshot in list_snapshots(run_dir):
            model = describe_model(snapshot.path)
            for task in config.tasks:
                specs += job_specs(model, task, config.lrs, config.seeds, config.recipe)
    return list({spec.key: spec for spec in specs}.values())  # a run given twice is one run


def run_state(run_dir: str | Path, dead_after_min: float, now: float | None = None) -> str:
    """The run's status.json status, or ``dead`` for a ``running`` run whose heartbeat stopped (layout.is_dead)."""
    status = read_status(run_dir)
    return "dead" if is_dead(status, now, after_s=60 * dead_after_min) else str(status.get("status"))


def runs_ended(config: ScheduleConfig) -> dict[str, str]:
    """``{run: state}`` if every run is finished, diverged, failed or dead; else an empty dict."""
    states = {run: run_state(run, config.dead_after_min) for run in config.runs}
    return states if all(s in (*TERMINAL_STATUSES, "dead") for s in states.values()) else {}


# --------------------------------------------------------------------------------------------------
# The jobs to run, from what the results folder says
# --------------------------------------------------------------------------------------------------


def column(state: JobState, max_attempts: int) -> str:
    """The status table's column of a job (COLUMNS): a job failed for good (``permanent``) is failed at once."""
    if state.status == "failed" and not state.permanent and state.attempts < max_attempts:
        return "retrying"
    return state.status


def runnable(jobs: dict[str, JobState], wanted: list[JobSpec], max_attempts: int) -> list[tuple[JobSpec, int]]:
    """The wanted jobs to submit now (new, queued, or failed with attempts left), with the attempts they had; the
    spec is the one found now (where the run folder is now)."""
    out = []
    for spec in sorted(wanted, key=lambda s: (s.run_id, s.pretrain_step, s.task, s.lr, s.seed)):
        state = jobs.get(spec.key)
        if state is None or state.status == "queued" or column(state, max_attempts) == "retrying":
            out.append((spec, state.attempts if state else 0))
    return out


def retried(jobs: dict[str, JobState], wanted: list[JobSpec]) -> dict[str, JobState]:
    """``jobs`` with the wanted failed ones queued again with a fresh count of attempts (--retry_failed). Kept for
    the command's lifetime; the manifest that submits one records its new first attempt."""
    keys = {spec.key for spec in wanted}
    return {
        key: replace(state, status="queued", attempts=0, error=None)
        for key, state in jobs.items()
        if key in keys and state.status == "failed"
    }


def lifted(jobs: dict[str, JobState], wanted: list[JobSpec]) -> dict[str, JobState]:
    """The wanted jobs failed for good whose model folder's files changed since (restored from a copy, saved
    again: ``files_stamp``), queued again with a fresh count of attempts. Asked on every pass: the failure is no
    longer the latest state once a submission records the new attempt."""
    stamps: dict[str, str | None] = {}  # by folder: each is looked at once a pass
    out = {}
    for spec in wanted:
        state = jobs.get(spec.key)
        if state is None or state.status != "failed" or not state.permanent:
            continue
        if spec.model_path not in stamps:  # where the snapshot is now
            stamps[spec.model_path] = files_stamp(Path(spec.model_path))
        if stamps[spec.model_path] != state.snapshot_stamp:
            out[spec.key] = replace(state, status="queued", attempts=0, error=None, permanent=False)
    return out


def unfinished(jobs: dict[str, JobState], wanted: list[JobSpec], max_attempts: int) -> list[JobSpec]:
    """The wanted jobs still to run: new, queued, submitted, or failed with attempts left."""
    return [spec for spec in wanted if spec.key not in jobs or column(jobs[spec.key], max_attempts) in (
        "queued", "submitted", "retrying")]  # fmt: skip


# --------------------------------------------------------------------------------------------------
# What the scheduler prints
# --------------------------------------------------------------------------------------------------


def status_lines(jobs: dict[str, JobState], max_attempts: int) -> list[str]:
    """A table of job counts per (run, task), and a total line."""
    counts: dict[tuple[str, str, str], dict[str, int]] = {}
    for state in jobs.values():
        spec = state.spec
        entry = counts.setdefault((spec.run_name, spec.run_id, spec.task), dict.fromkeys(COLUMNS, 0))
        entry[column(state, max_attempts)] += 1
    header = f"{'run':<24} {'run id':<26} {'task':<6}" + "".join(f" {k:>9}" for k in COLUMNS)
    lines, total = [header], dict.fromkeys(COLUMNS, 0)
    for (name, run_id, task), c in sorted(counts.items()):
        lines.append(f"{name:<24} {run_id:<26} {task:<6}" + "".join(f" {c[k]:>9}" for k in COLUMNS))
        for key in COLUMNS:
            total[key] += c[key]
    lines.append(f"{'total':<24} {'':<26} {'':<6}" + "".join(f" {total[k]:>9}" for k in COLUMNS))
    return lines


def measured(config: ScheduleConfig, jobs: dict[str, JobState]) -> list[Results]:
    """The results of the finished jobs of this recipe: their steps and seconds give the time per step."""
    recipe = recipe_hash(config.recipe.result_key())
    return [s.results for s in jobs.values() if s.results is not None and s.spec.recipe_hash == recipe]


def step_time(config: ScheduleConfig, jobs: dict[str, JobState]) -> float | None:
    """Seconds per optimizer step: configured, or measured on the finished jobs of this recipe (training and
    evaluation); None before one has finished."""
    if config.step_time_s is not None:
        return config.step_time_s
    done = measured(config, jobs)
    steps = sum(r.train_steps for r in done)
    return sum(r.wall_time_s for r in done) / steps if steps else None


def progress_line(config: ScheduleConfig, jobs: dict[str, JobState], wanted: list[JobSpec]) -> str:
    """Where the wanted jobs are, and an ETA once a step time is known."""
    states = [jobs.get(spec.key) for spec in wanted]
    total = dict.fromkeys(COLUMNS, 0)
    for state in states:
        total[column(state, config.max_attempts) if state else "queued"] += 1
    line = (
        f"jobs: {total['done']}/{len(wanted)} done, {total['submitted']} running, "
        f"{total['queued'] + total['retrying']} queued, {total['failed']} failed"
    )
    left = unfinished(jobs, wanted, config.max_attempts)
    seconds = step_time(config, jobs)
    if seconds is None or not left:
        return line
    per_job = {task: train_steps(config, task) for task in {spec.task for spec in left}}  # reads each task once
    steps = sum(per_job[spec.task] for spec in left)
    return line + f"; ETA about {steps * seconds / min(config.workers, len(left)) / 60:.0f} min"


def results_lines(jobs: dict[str, JobState]) -> list[str]:
    """The finished jobs' dev accuracy: mean over seeds per run, step, task and lr, beside the dev set's majority
    class (a mean at the majority class is a model that answers one class)."""
    groups: dict[tuple[str, int, str, float], list[JobState]] = {}
    for state in jobs.values():
        if state.results is not None:
            spec = state.spec
            groups.setdefault((spec.run_name, spec.pretrain_step, spec.task, spec.lr), []).append(state)
    if not groups:
        return []
    lines = [
        f"{'run':<24} {'step':>8} {'task':<5} {'lr':>8} {'seeds':>5} {'accuracy':>9} {'majority':>9} {'dev loss':>9}"
    ]
    for (name, step, task, lr), states in sorted(groups.items()):
        results = [s.results for s in states if s.results is not None]
        lines.append(
            f"{name:<24} {step:>8} {task:<5} {lr:>8g} {len(results):>5} "
            f"{100 * sum(r.accuracy for r in results) / len(results):>8.2f}% "
            f"{f'{100 * results[0].majority_accuracy:.2f}%':>9} "
            f"{sum(r.dev_loss for r in results) / len(results):>9.4f}"
        )
    return lines


def train_steps(config: ScheduleConfig, task: str) -> int:
    """Optimizer steps of one job of ``task`` under the recipe."""
    recipe = config.recipe
    examples = len(load_task(task, config.data_dir)["train"]) if config.data_dir else GLUE_TRAIN_SIZES[task]
    if recipe.max_train_examples is not None:
        examples = min(examples, recipe.max_train_examples)
    return math.ceil(examples / recipe.batch_size) * recipe.epochs


def cost_line(config: ScheduleConfig, jobs: dict[str, JobState], specs: list[JobSpec], what: str = "to run") -> str:
    """How many jobs, optimizer steps, and (with a per-step time) hours of work are about to start (or are left)."""
    per_job = {task: train_steps(config, task) for task in {spec.task for spec in specs}}  # reads each task once
    steps = sum(per_job[spec.task] for spec in specs)
    line = f"{len(specs)} jobs {what}: {steps:,} fine-tuning steps"
    seconds = step_time(config, jobs)
    if seconds is None:
        return line + " (the time they take follows once the first job finishes; --step_time_s=S gives it now)"
    done = len(measured(config, jobs))
    source = ("configured step_time_s" if config.step_time_s is not None
              else "measured on the first finished job" if done == 1 else f"measured on {done} finished jobs")  # fmt: skip
    work = steps * seconds
    parallel = config.workers if config.backend == "slurm" or config.workers > 1 else 1
    wall = work / min(parallel, len(specs))
    if work >= 3600:
        return line + (
            f" x {seconds:.3g} s/step ({source}) = {work / 3600:.2f} worker-hours, about {wall / 3600:.2f} h with "
            f"{parallel} worker(s)"
        )
    return line + f" x {seconds:.3g} s/step ({source}) = about {max(1, round(wall / 60))} min with {parallel} worker(s)"


def print_failures(failures: list[JobState]) -> None:
    """The jobs that failed for good, with their errors: those that used every attempt, then those whose snapshot
    was refused (tried once: no retry changes that while its files stay as they are)."""
    exhausted, refused = [s for s in failures if not s.permanent], [s for s in failures if s.permanent]
    for states, title in ((exhausted, "failed every attempt"),
                          (refused, "failed for good: their snapshot was refused (not tried again until its files "
                                    "change, e.g. restored from a copy)")):  # fmt: skip
        if states:
            print(f"{len(states)} job(s) {title}:", file=sys.stderr)
        for state in states:
            spec = state.spec
            print(
                f"  {spec.run_name} [{spec.run_id}] step {spec.pretrain_step} {spec.task} lr={spec.lr:g} "
                f"seed={spec.seed} ({state.attempts} attempt{'s' * (state.attempts != 1)}): {state.error}",
                file=sys.stderr,
            )
    print("fix the cause and queue them again with --retry_failed=true", file=sys.stderr)


class JobLines:
    """Prints one line per job that ended (done, or failed with its reason and what happens next) since it last
    looked at the results folder: what a researcher follows, whatever backend runs the jobs. Called on every pass,
    and in-process after every job. Jobs that had ended before it was made are not printed."""

    def __init__(self, folder: ResultsFolder, max_attempts: int) -> None:
        self.folder, self.max_attempts = folder, max_attempts
        self.seen = {key: self._end(state) for key, state in folder.jobs().items()}

    @staticmethod
    def _end(state: JobState) -> tuple[str, int] | None:
        """Which end of a job this is (an attempt of a later submission ends again), or None: not ended."""
        return (state.status, state.submission) if state.status in ("done", "failed") else None

    def outcome(self, state: JobState) -> str:
        if state.permanent:
            return ", for good (not tried again until the snapshot's files change)"
        left = state.attempts < self.max_attempts
        return f" of {self.max_attempts}, " + ("to be tried again" if left else "none left")

    def __call__(self) -> dict[str, JobState]:
        """The jobs as the folder says now, after printing the line of each that ended since the last call."""
        jobs = self.folder.jobs()
        for key, state in jobs.items():
            end = self._end(state)
            if end is not None and self.seen.get(key) != end:
                print(state.line(self.outcome(state) if state.status == "failed" else ""), flush=True)
            self.seen[key] = end
        return jobs


# --------------------------------------------------------------------------------------------------
# One pass of the scheduler
# --------------------------------------------------------------------------------------------------


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


def wandb_settings(config: ScheduleConfig) -> WandbSettings | None:
    """One W&B run per job when --wandb (finetune/tracking.py); offline runs go beside the results folder."""
    directory = str(Path(config.results_dir).resolve().parent)
    return WandbSettings(project=config.wandb_project, dir=directory) if config.wandb else None


def submit(
    folder: ResultsFolder,
    backend: Backend,
    runtime: Runtime,
    jobs: list[tuple[JobSpec, int]],
    slots: int | None = None,
) -> int:
    """Write a manifest of ``jobs`` (spec, attempts so far) and start its tasks; returns how many jobs it holds.

    ``slots``: the tasks that may start now (default: the backend's size; none: nothing is submitted). A manifest's
    jobs are dealt to its tasks when it is written, so with fewer slots than the backend's size only those slots'
    share of the jobs goes in it: the rest wait for the next free worker instead of queueing behind these."""
    tasks = min(backend.size if slots is None else slots, len(jobs))
    if tasks <= 0:
        return 0
    jobs = jobs[: math.ceil(len(jobs) * tasks / max(tasks, backend.size))]
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
    """Record in their manifests the tasks of open submissions that ended, with why; returns the tasks still live."""
    # A submission is asked about by the kind of backend that started it (a restart may use another one).
    kinds: dict[str, Backend] = {"inprocess": InProcess(), "local": LocalArray(1)}
    kinds["slurm"] = SlurmArray(1, slurm or SlurmConfig())
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


def free_slots(backend: Backend, live: int) -> int:
    """Tasks the next submission may start. Local workers share this machine's cores with the ``live`` tasks of
    earlier submissions: jobs found while they run (follow mode: a new snapshot) wait for a free worker, so no
    more than --workers run at once, each with total_threads // workers threads. SLURM queues each array itself."""
    return max(0, backend.size - live) if isinstance(backend, LocalArray) else backend.size


def make_backend(config: ScheduleConfig, after_job: Callable[[], object]) -> Backend:
    """The backend of the command; ``after_job``: what the in-process one calls after each job."""
    if config.backend == "slurm":
        return SlurmArray(config.workers, config.slurm)
    return InProcess(after_job) if config.workers == 1 else LocalArray(config.workers)


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


def requeue_after_interrupt(folder: ResultsFolder) -> int:
    """After a Ctrl-C that stopped this machine's workers: their tasks are recorded as ended by the interrupt, which
    charges no attempt, so their jobs without a result are queued again; returns how many. SLURM tasks keep
    running: a later pass finds their results."""
    stopped = set()
    for manifest in folder.manifests():
        if manifest.is_open and manifest.backend != "slurm":
            folder.write_manifest(replace(manifest, ended={**dict.fromkeys(range(manifest.tasks), INTERRUPTED),
                                                           **manifest.ended}))  # fmt: skip
            stopped.add(manifest.submission)
    return sum(s.status == "queued" and s.submission in stopped for s in folder.jobs().values())


def schedule(config: ScheduleConfig) -> list[JobState]:
    """Run the jobs of complete snapshots, once or until the runs end; returns the jobs that failed for good.
    One scheduler per results folder: a second one stops with ResultsBusy, naming the first."""
    check_inputs(config)
    folder = ResultsFolder(config.results_dir)
    with folder.lock():
        return _schedule(config, folder)


def _schedule(config: ScheduleConfig, folder: ResultsFolder) -> list[JobState]:
    lines = JobLines(folder, config.max_attempts)
    wanted: list[JobSpec] = []
    unmeasured = False  # a cost line went out without a time per step: the first finished job gives it

    def follow() -> dict[str, JobState]:
        """The jobs as the folder says now, after their lines, and once the first job measured the time per step,
        the estimate the cost line could not give (in-process: right after that job, not after its submission)."""
        nonlocal unmeasured
        jobs = lines()
        if unmeasured and step_time(config, jobs) is not None:
            unmeasured = False
            if left := unfinished(jobs, wanted, config.max_attempts):
                print(cost_line(config, jobs, left, "left"), flush=True)
        return jobs

    backend = make_backend(config, after_job=follow)
    runtime = runtime_settings(config)
    deadline = parse_until(config.until) if config.until else None
    resets: dict[str, JobState] = {}
    found, printed, first, rerun = set(), "", True, set()
    try:
        while True:
            # Whether the runs ended is read before looking for snapshots, so none written before the end is missed.
            ended = runs_ended(config) if config.mode == "follow" else {}
            live = collect(folder, backend, config.slurm)
            wanted = discover(config)
            jobs = follow()
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
                unmeasured = step_time(config, jobs) is None
            line = progress_line(config, jobs, wanted)
            if todo or line != printed:
                print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)
            found, printed, first = found | {spec.key for spec in wanted}, line, False
            submitted = submit(folder, backend, runtime, todo, slots=free_slots(backend, live))
            if isinstance(backend, InProcess) and submitted:
                continue  # the jobs ran in this pass: look at their results at once
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
        raise Interrupted(0 if isinstance(backend, SlurmArray) else requeue_after_interrupt(folder)) from None
    finally:
        backend.close()
    jobs = lines()  # the last lines: local workers' and SLURM tasks' results since the last pass
    print("\n".join(status_lines(jobs, config.max_attempts)), flush=True)
    results = results_lines(jobs)
    if results:
        print("\nresults (finished jobs; python -m finetune.report draws Figure 5 from them):", flush=True)
        print("\n".join(results), flush=True)
    failed = [jobs.get(spec.key) for spec in wanted]
    return [s for s in failed if s is not None and column(s, config.max_attempts) == "failed"]


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    commands = {"run": ScheduleConfig, "status": StatusConfig, "ingest": IngestConfig}
    command, config = parse_command(
        commands, argv, prog="python -m finetune.schedule", description=__doc__, default="run"
    )
    if command == "ingest":
        raise ConfigError(
            "ingest is gone: there is no results store to rebuild, the results folder is the only record. "
            f"python -m finetune.schedule status --results_dir={config.results_dir} lists its jobs as they are"
        )
    if command == "status":
        folder = ResultsFolder(config.results_dir)
        if not folder.root.is_dir():
            raise FileNotFoundError(f"results folder {folder.root} does not exist; pass --results_dir=FOLDER")
        print("\n".join(status_lines(folder.jobs(), config.max_attempts)))
        return 0
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


def cli() -> int:
    """``main`` for the command line: bad input ends with its message and exit code 2, not a traceback."""
    return run_cli(main, errors=(ResultsBusy,))


if __name__ == "__main__":
    raise SystemExit(cli())
