"""Where a manifest's tasks run: in this process, as local worker processes, or as a SLURM job array.

Every backend runs the same task code (finetune/worker.py) on the same manifest, and tells the scheduler which of
a submission's tasks are still alive: a task that ended without all its results is preempted, killed or timed-out
work, which the scheduler submits again.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from finetune.manifest import SCHEDULER_STOPPED, Manifest
from pretrain.common.cli import require
from pretrain.run_folder.status import EXIT_HUNG


@dataclass(kw_only=True)
class SlurmConfig:
    """How the slurm backend writes its job-array script."""

    dir: str = "outputs/finetune/slurm"
    """Folder for the sbatch scripts and the array tasks' logs (on the shared file system)."""
    partition: str | None = None
    """#SBATCH --partition (unset: the cluster's default)."""
    time: str = "04:00:00"
    """#SBATCH --time of each array task (a task runs its share of the manifest, then exits)."""
    cpus_per_task: int = 8
    """#SBATCH --cpus-per-task; also the torch threads of each array task."""
    gpus_per_task: int = 0
    """GPUs per array task (#SBATCH --gres=gpu:N); 0 trains on CPU."""
    mem: str | None = None
    """#SBATCH --mem (e.g. 16G; unset: the cluster's default)."""
    requeue: bool = True
    """#SBATCH --requeue: SLURM requeues a preempted task, which continues with the jobs that have no result yet."""
    extra: list[str] = field(default_factory=list)
    """Further sbatch options, one per entry, e.g. ['--account=abc']."""
    python: str = "python"
    """The interpreter an array task runs (an absolute path if the cluster nodes need one)."""

    def __post_init__(self) -> None:
        require(self.cpus_per_task >= 1, "slurm.cpus_per_task", f"must be >= 1; got {self.cpus_per_task}")
        require(self.gpus_per_task >= 0, "slurm.gpus_per_task", f"must be >= 0; got {self.gpus_per_task}")


class Backend(Protocol):
    name: str
    size: int
    """How many tasks one submission may have."""

    def start(self, manifest: Path, tasks: int, submission: int) -> str:
        """Start the tasks of a manifest; returns the handle that live_tasks is given later."""
        ...

    def live_tasks(self, manifest: Manifest) -> tuple[set[int], dict[int, str]]:
        """The task indices still queued or running, and for ended ones, why they ended (if known)."""
        ...

    def close(self) -> None:
        """Stop what this process started, where stopping it is this process's to do."""


class InProcess(Backend):
    """One task, run to its end inside the scheduler (``workers: 1``; what ``finetune.run`` uses); ``after_job`` is
    called after each of its jobs, so the scheduler prints the job's line then."""

    name, size = "inprocess", 1

    def __init__(self, after_job: Callable[[], object] = lambda: None) -> None:
        self.after_job = after_job

    def start(self, manifest: Path, tasks: int, submission: int) -> str:
        from finetune.worker import run_task  # imports torch and transformers: only where jobs run

        run_task(manifest, 0, on_job=lambda _: self.after_job())
        return ""

    def live_tasks(self, manifest: Manifest) -> tuple[set[int], dict[int, str]]:
        # Its jobs ran inside a scheduler that has returned (or was killed, when this is another one).
        return set(), dict.fromkeys(range(manifest.tasks), SCHEDULER_STOPPED)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class LocalArray(Backend):
    """A local "array": one worker process per task (``python -m finetune.worker MANIFEST --index=i``). The workers
    stop before their next job once this process is gone, so a killed scheduler leaves no worker running on."""

    name = "local"

    def __init__(self, size: int) -> None:
        self.size = size
        self.processes: dict[tuple[int, int], subprocess.Popen] = {}
        self.killed: dict[tuple[int, int], str] = {}  # (submission, task) -> why this scheduler killed its worker

    def kill(self, task: tuple[int, int], why: str) -> None:
        """Kill the worker of ``task`` (submission, index), a stopped one too; ``why`` becomes its task's end."""
        self.killed[task] = why
        self.processes[task].kill()

    def start(self, manifest: Path, tasks: int, submission: int) -> str:
        # --quiet: the scheduler prints each job's line as it reads the result; the workers share its terminal.
        command = [sys.executable, "-m", "finetune.worker", str(manifest), f"--parent_pid={os.getpid()}", "--quiet"]
        for index in range(tasks):
            self.processes[(submission, index)] = subprocess.Popen([*command, f"--index={index}"])
        pids = ",".join(str(self.processes[(submission, i)].pid) for i in range(tasks))
        return f"{socket.gethostname()}:{pids}"

    def live_tasks(self, manifest: Manifest) -> tuple[set[int], dict[int, str]]:
        live, reasons = set(), {}
        host, _, pids = (manifest.handle or "").partition(":")
        for index, pid in enumerate(int(p) for p in pids.split(",") if p):
            process = self.processes.get((manifest.submission, index))
            if process is not None:  # ours: poll, which also reaps it
                code = process.poll()
                if code is None:
                    live.add(index)
                elif (manifest.submission, index) in self.killed:
                    reasons[index] = self.killed[(manifest.submission, index)]
                else:
                    reasons[index] = f"exit code {code}" if code >= 0 else f"killed by {signal.Signals(-code).name}"
            elif host == socket.gethostname() and _pid_alive(pid):  # a worker of an earlier scheduler, finishing
                live.add(index)
            else:
                reasons[index] = "its worker process is gone"
        return live, reasons

    def close(self) -> None:
        """Stop the workers (an interrupted scheduler): their jobs without results are submitted next time."""
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            process.wait()


class SlurmArray(Backend):
    """A SLURM job array per submission: ``sbatch`` a script whose tasks run ``python -m finetune.worker``. Closing
    it leaves the array tasks running: the next pass, or the next scheduler, finds their result files."""

    name = "slurm"

    def __init__(self, size: int, config: SlurmConfig) -> None:
        self.size, self.config = size, config

    def script(self, manifest: Path, tasks: int, submission: int) -> Path:
        slurm = self.config
        folder = Path(slurm.dir).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        options = [f"--job-name=lnbert-finetune-{submission}", f"--array=0-{tasks - 1}",
                   f"--cpus-per-task={slurm.cpus_per_task}", f"--time={slurm.time}", f"--output={folder}/%x_%A_%a.out",
                   "--requeue" if slurm.requeue else "--no-requeue"]  # fmt: skip
        unless_unset = {"--partition=": slurm.partition, "--gres=gpu:": slurm.gpus_per_task, "--mem=": slurm.mem}
        options += [f"{option}{value}" for option, value in unless_unset.items() if value] + slurm.extra
        path = folder / f"finetune_{submission:06d}.sbatch"
        lines = ["#!/bin/bash", *(f"#SBATCH {option}" for option in options),
                 "# Task $SLURM_ARRAY_TASK_ID runs its share of the manifest's jobs and writes one result file per job",
                 "# beside it (finetune/worker.py).", f"cd {shlex.quote(os.getcwd())}",
                 f"exec {shlex.quote(slurm.python)} -m finetune.worker {shlex.quote(str(manifest))}"]  # fmt: skip
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self, manifest: Path, tasks: int, submission: int) -> str:
        script = self.script(manifest, tasks, submission)
        output = _slurm(["sbatch", "--parsable", str(script)])
        job_id = output.strip().split(";")[0]
        print(f"submitted {script} as SLURM job {job_id} ({tasks} array tasks)", flush=True)
        return job_id

    def live_tasks(self, manifest: Manifest) -> tuple[set[int], dict[int, str]]:
        job_id = manifest.handle
        if not job_id:
            return set(), {}
        # --array lists pending tasks one per line (not as a range); %K is the array task index.
        command = ["squeue", "--noheader", "--array", f"--jobs={job_id}", "--format=%K %T"]
        try:
            output = _slurm(command)
        except (SlurmError, FileNotFoundError) as err:
            if "Invalid job id" not in str(err):  # a busy controller, or no SLURM here: ask again next pass
                print(f"warning: {err}; taking every task of SLURM job {job_id} as still running", flush=True)
                return set(range(manifest.tasks)), {}
            output = ""  # the controller forgets finished jobs: none is live
        live = {int(line.split()[0]) for line in output.splitlines() if line.strip()}
        return live, self.states(job_id) if len(live) < manifest.tasks else {}

    def states(self, job_id: str) -> dict[int, str]:
        """The final state of each ended task from sacct (PREEMPTED, TIMEOUT, ...), or a task's exit code where its
        watchdog stopped it (EXIT_HUNG, as a local worker's); empty if sacct fails."""
        command = ["sacct", "--noheader", "--parsable2", "--allocations", f"--jobs={job_id}",
                   "--format=JobID,State,ExitCode"]  # fmt: skip
        try:
            output = _slurm(command)
        except (SlurmError, FileNotFoundError):
            return {}
        states = {}
        for line in output.splitlines():
            job, state, exit_code = [*line.split("|"), "", ""][:3]
            code = exit_code.partition(":")[0]  # CODE:SIGNAL
            if (task := job.rpartition("_")[2]) != job and task.isdigit():
                hung = state == "FAILED" and code == str(EXIT_HUNG)
                states[int(task)] = f"exit code {code}" if hung else f"sacct: {state}"
        return states


class SlurmError(RuntimeError):
    """A SLURM command failed (the message has the command, its exit code and its error output)."""


def _slurm(command: list[str]) -> str:
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"{command[0]} is not on PATH: run the slurm backend on a SLURM login node") from None
    except subprocess.CalledProcessError as err:
        raise SlurmError(f"{shlex.join(command)} failed ({err.returncode}): {err.stderr.strip()}") from None
    return result.stdout
