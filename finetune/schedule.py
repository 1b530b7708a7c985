"""Fine-tune every complete snapshot of one or more pretraining runs, as they appear.

    python -m finetune.schedule --runs='[runs/post_ln, runs/pre_ln]' --data_dir=path/to/glue --mode=once
    python -m finetune.schedule --runs='[runs/post_ln, runs/pre_ln]' --data_dir=path/to/glue --mode=follow --workers=4
    python -m finetune.schedule --config=configs/finetune/bert_glue.yaml --runs='[...]' --backend=slurm
    python -m finetune.schedule status --store=outputs/finetune/results.sqlite
    python -m finetune.schedule [run|worker|status] --help

Every snapshot folder with its COMPLETE marker becomes task x lr x seed jobs in the results store (folders
without the marker are still being written and are ignored). ``--mode=once`` runs what exists and exits;
``--mode=follow`` polls until every run's status.json says finished/diverged/failed and no work is left.

Backends: ``local`` runs N worker processes here (CPU threads split between them); ``slurm`` writes a
job-array script and submits it with ``sbatch``; each array task is a worker
(``python -m finetune.schedule worker --config RESOLVED.yaml``). Workers claim jobs from the store with a
lease, so several schedulers, restarts and killed workers neither lose nor repeat work (finetune/store.py).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import yaml

from finetune.config import DEFAULT_LRS, DEFAULT_SEEDS, FinetuneConfig, check_tasks, validate_grid
from finetune.glue import load_task
from finetune.store import JobSpec, ResultStore, StoreVersionError
from finetune.worker import RUNTIME_FIELDS, WorkerSettings, describe_model, job_specs, work
from pretrain.cli import parse_command, require, run_cli, to_dict
from pretrain.layout import TERMINAL_STATUSES, list_snapshots, read_status

Backend = Literal["local", "slurm"]
Mode = Literal["once", "follow"]


@dataclass(kw_only=True)
class SlurmConfig:
    """How the slurm backend writes its job-array script."""

    dir: str = "outputs/finetune/slurm"
    """Folder for the sbatch scripts, their resolved configs and the array tasks' logs."""
    partition: str | None = None
    """#SBATCH --partition (unset: the cluster's default)."""
    time: str = "04:00:00"
    """#SBATCH --time of each array task (a task drains the queue, then exits)."""
    cpus_per_task: int = 8
    """#SBATCH --cpus-per-task; also the torch threads of each array task."""
    gpus_per_task: int = 0
    """GPUs per array task (#SBATCH --gres=gpu:N); 0 trains on CPU."""
    mem: str | None = None
    """#SBATCH --mem (e.g. 16G; unset: the cluster's default)."""
    extra: list[str] = field(default_factory=list)
    """Further sbatch options, one per entry, e.g. ['--account=abc']."""
    python: str = "python"
    """The interpreter an array task runs (an absolute path if the cluster nodes need one)."""

    def __post_init__(self) -> None:
        require(self.cpus_per_task >= 1, "slurm.cpus_per_task", f"must be >= 1; got {self.cpus_per_task}")
        require(self.gpus_per_task >= 0, "slurm.gpus_per_task", f"must be >= 0; got {self.gpus_per_task}")


@dataclass(kw_only=True)
class ScheduleConfig:
    """Fine-tune every complete snapshot of the given pretraining runs (see the module docstring)."""

    runs: list[str]
    """Pretraining run folders (RUN/ of docs/run_layout.md) to watch."""
    store: str = "outputs/finetune/results.sqlite"
    """Results store (SQLite): the job queue and the results the report reads."""
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
    """Seconds between looks for new snapshots in follow mode."""
    backend: Backend = "local"
    """local: worker processes on this machine. slurm: a job array through sbatch."""
    workers: int = 1
    """Local worker processes, or the size of each slurm job array. 1 runs jobs in this process."""
    total_threads: int = 0
    """CPU threads the local workers share (each gets total_threads // workers); 0: all cores."""
    max_attempts: int = 3
    """Tries per job before it stays failed (a killed worker's attempt counts)."""
    lease_s: float = 300.0
    """Seconds a claim stays valid without a heartbeat (workers beat every lease_s / 4)."""
    recipe: FinetuneConfig = field(default_factory=FinetuneConfig)
    """The fine-tuning recipe of every job."""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    """Settings of the slurm backend."""

    def __post_init__(self) -> None:
        require(bool(self.runs), "runs", "is empty; pass one or more pretraining run folders: --runs='[RUN1, RUN2]'")
        check_tasks("tasks", self.tasks)
        validate_grid(self.lrs, self.seeds)
        for key in ("workers", "max_attempts"):
            require(getattr(self, key) >= 1, key, f"must be >= 1; got {getattr(self, key)}")
        for key in ("lease_s", "poll_interval_s"):
            require(getattr(self, key) > 0, key, f"must be > 0; got {getattr(self, key)}")
        require(self.total_threads >= 0, "total_threads", f"must be >= 0 (0: all cores); got {self.total_threads}")


@dataclass(kw_only=True)
class WorkerConfig(ScheduleConfig):
    """One worker: claim jobs from the store and run them until none is left (what a slurm array task runs)."""


@dataclass(kw_only=True)
class StatusConfig:
    """Job counts per run and task in a results store (queued, running, done, failed)."""

    store: str = "outputs/finetune/results.sqlite"
    """Results store (SQLite) to read."""
    max_attempts: int = 3
    """Tries per job, as given to the scheduler (tells failed jobs from those still to be retried)."""

    def __post_init__(self) -> None:
        require(self.max_attempts >= 1, "max_attempts", f"must be >= 1; got {self.max_attempts}")


# --------------------------------------------------------------------------------------------------
# Discovering jobs
# --------------------------------------------------------------------------------------------------


def discover(config: ScheduleConfig, store: ResultStore) -> list[JobSpec]:
    """The jobs of every complete snapshot of every run (snapshots without the COMPLETE marker are skipped)."""
    data_dir = str(Path(config.data_dir).resolve()) if config.data_dir else None
    specs = []
    for run in config.runs:
        run_dir = Path(run).resolve()
        for snapshot in list_snapshots(run_dir):
            description = describe_model(snapshot.path, store)
            for task in config.tasks:
                specs += job_specs(description, task, config.lrs, config.seeds, config.recipe, data_dir)
    return specs


def runs_ended(config: ScheduleConfig) -> bool:
    return all(read_status(run).get("status") in TERMINAL_STATUSES for run in config.runs)


def status_lines(store: ResultStore, max_attempts: int) -> list[str]:
    """A table of job counts per (run, task), and a total line."""
    counts = store.counts(max_attempts)
    header = f"{'run':<24} {'task':<6} {'queued':>7} {'running':>8} {'done':>6} {'failed':>7} {'retrying':>9}"
    lines, total = [header], dict.fromkeys(("queued", "running", "done", "failed", "retrying"), 0)
    for (run, task), c in counts.items():
        lines.append(
            f"{run:<24} {task:<6} {c['queued']:>7} {c['running']:>8} {c['done']:>6} {c['failed']:>7} {c['retrying']:>9}"
        )
        for key in total:
            total[key] += c[key]
    lines.append(
        f"{'total':<24} {'':<6} {total['queued']:>7} {total['running']:>8} {total['done']:>6} {total['failed']:>7} {total['retrying']:>9}"
    )
    return lines


def _totals(store: ResultStore, max_attempts: int) -> str:
    counts = store.counts(max_attempts).values()
    keys = ("queued", "running", "done", "failed", "retrying")
    return ", ".join(f"{key} {sum(c[key] for c in counts)}" for key in keys)


# --------------------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------------------


def worker_settings(config: ScheduleConfig, threads: int, exit_with_parent: bool) -> WorkerSettings:
    recipe = replace(config.recipe, torch_threads=config.recipe.torch_threads or threads)
    # Progress bars of several workers would interleave: the scheduler prints counts instead.
    recipe = replace(recipe, progress=recipe.progress and config.workers == 1)
    return WorkerSettings(
        store=config.store,
        lease_s=config.lease_s,
        max_attempts=config.max_attempts,
        runtime={k: getattr(recipe, k) for k in RUNTIME_FIELDS},
        exit_with_parent=exit_with_parent,
    )


class LocalPool:
    """N worker processes that each drain the queue; restarted when new work appears (follow mode)."""

    def __init__(self, config: ScheduleConfig) -> None:
        self.config = config
        total = config.total_threads or os.cpu_count() or 1
        self.threads = max(1, total // config.workers)
        self.processes: list[mp.process.BaseProcess] = []
        # spawn, not fork: forking a process that already holds torch threads and sqlite handles is unsafe.
        self.context = mp.get_context("spawn")

    def alive(self) -> int:
        self.processes = [p for p in self.processes if p.is_alive()]
        return len(self.processes)

    def fill(self, claimable: int) -> None:
        """Start workers up to the pool size (no more than there are jobs to claim)."""
        if self.config.workers == 1:
            work(worker_settings(self.config, self.threads, exit_with_parent=False))  # in this process
            return
        settings = worker_settings(self.config, self.threads, exit_with_parent=True)
        for _ in range(min(claimable, self.config.workers - self.alive())):
            process = self.context.Process(target=work, args=(settings,), daemon=False)
            process.start()
            self.processes.append(process)

    def join(self) -> None:
        for process in self.processes:
            process.join()
        self.processes = []


def write_slurm_script(config: ScheduleConfig, n_tasks: int) -> Path:
    """The job-array script and the resolved config its tasks read (absolute paths: tasks run elsewhere)."""
    folder = Path(config.slurm.dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d_%H%M%S")
    resolved = replace(
        config,
        runs=[str(Path(r).resolve()) for r in config.runs],
        store=str(Path(config.store).resolve()),
        data_dir=str(Path(config.data_dir).resolve()) if config.data_dir else None,
        recipe=replace(config.recipe, torch_threads=config.slurm.cpus_per_task, progress=False),
    )
    config_path = folder / f"finetune_{stamp}.yaml"
    config_path.write_text(yaml.safe_dump(to_dict(resolved), sort_keys=False))
    slurm = config.slurm
    options = [
        "--job-name=lnbert-finetune",
        f"--array=0-{n_tasks - 1}",
        f"--cpus-per-task={slurm.cpus_per_task}",
        f"--time={slurm.time}",
        f"--output={folder}/%x_%A_%a.out",
    ]
    options += [f"--partition={slurm.partition}"] if slurm.partition else []
    options += [f"--gres=gpu:{slurm.gpus_per_task}"] if slurm.gpus_per_task else []
    options += [f"--mem={slurm.mem}"] if slurm.mem else []
    options += slurm.extra
    command = f"{shlex.quote(slurm.python)} -m finetune.schedule worker --config {shlex.quote(str(config_path))}"
    script = folder / f"finetune_{stamp}.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        + "".join(f"#SBATCH {option}\n" for option in options)
        + "# Each array task claims jobs from the results store until none is left (finetune/store.py).\n"
        + f"cd {shlex.quote(os.getcwd())}\n"
        + f"exec {command}\n"
    )
    return script


def submit_slurm(config: ScheduleConfig, n_tasks: int) -> str:
    """Write the script and submit it; returns the SLURM job id."""
    script = write_slurm_script(config, n_tasks)
    command = ["sbatch", "--parsable", f"--array=0-{n_tasks - 1}", str(script)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=True)
    except FileNotFoundError:
        raise FileNotFoundError("sbatch is not on PATH: run the slurm backend on a SLURM login node") from None
    except subprocess.CalledProcessError as err:
        raise RuntimeError(f"{shlex.join(command)} failed ({err.returncode}): {err.stderr.strip()}") from None
    job_id = result.stdout.strip().split(";")[0]
    print(f"submitted {script} as SLURM job {job_id} ({n_tasks} array tasks)", flush=True)
    return job_id


# --------------------------------------------------------------------------------------------------
# The scheduling loop
# --------------------------------------------------------------------------------------------------


def print_progress(config: ScheduleConfig) -> None:
    with ResultStore(config.store) as store:
        print(f"[{time.strftime('%H:%M:%S')}] {_totals(store, config.max_attempts)}", flush=True)


def check_inputs(config: ScheduleConfig) -> None:
    """Fail on the user's input before any job does: run folders and (local) GLUE files must exist."""
    missing = [r for r in config.runs if not Path(r).is_dir()]
    if missing and config.mode == "once":
        raise FileNotFoundError(f"run folder(s) not found: {', '.join(missing)}; pass pretraining run folders (RUN/)")
    if config.data_dir is not None:
        for task in config.tasks:
            load_task(task, config.data_dir)


def schedule(config: ScheduleConfig) -> None:
    """Enqueue the jobs of complete snapshots and run them, once or until the runs end."""
    check_inputs(config)
    pool = LocalPool(config) if config.backend == "local" else None
    while True:
        with ResultStore(config.store) as store:
            _, added = store.enqueue(discover(config, store))
            claimable = store.claimable(config.max_attempts)
            print(f"[{time.strftime('%H:%M:%S')}] {added} new jobs; {_totals(store, config.max_attempts)}", flush=True)
        if pool is not None and claimable:
            pool.fill(claimable)
            if config.mode == "once":
                last = time.monotonic()
                while pool.alive():  # a progress line every poll interval until the workers are done
                    time.sleep(0.5)
                    if time.monotonic() - last >= config.poll_interval_s and pool.alive():
                        print_progress(config)
                        last = time.monotonic()
                pool.join()
        elif pool is None and added:
            submit_slurm(config, min(config.workers, claimable))
        if config.mode == "once":
            break
        with ResultStore(config.store) as store:
            pending = store.pending(config.max_attempts)
        # With slurm the remaining jobs run on the cluster; with local workers we wait for them.
        if runs_ended(config) and (pool is None or (pending == 0 and pool.alive() == 0)):
            # One last look: a snapshot written just before the run ended must not be missed.
            with ResultStore(config.store) as store:
                _, added = store.enqueue(discover(config, store))
            if not added:
                break
            continue
        time.sleep(config.poll_interval_s)
    with ResultStore(config.store) as store:
        print("\n".join(status_lines(store, config.max_attempts)), flush=True)


def main(argv: list[str] | None = None) -> int:
    commands = {"run": ScheduleConfig, "worker": WorkerConfig, "status": StatusConfig}
    command, config = parse_command(
        commands, argv, prog="python -m finetune.schedule", description=__doc__, default="run"
    )
    if command == "status":
        if not Path(config.store).is_file():
            raise FileNotFoundError(f"results store {config.store} does not exist; pass --store=PATH")
        with ResultStore(config.store) as store:
            print("\n".join(status_lines(store, config.max_attempts)))
        return 0
    if command == "worker":  # a slurm array task: drain the queue with this node's threads
        work(worker_settings(config, config.recipe.torch_threads or (os.cpu_count() or 1), exit_with_parent=False))
        return 0
    schedule(config)
    return 0


def cli() -> int:
    """``main`` for the command line: bad input ends with its message and exit code 2, not a traceback."""
    return run_cli(main, errors=(StoreVersionError,))


if __name__ == "__main__":
    raise SystemExit(cli())
