"""A fake SLURM for the tests: ``sbatch``, ``squeue``, ``sacct`` and ``scontrol`` on PATH (tests/fake_slurm_bin/).

Each array task runs as a separate process, as on a cluster node: the batch script under bash with
SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID, SLURM_JOB_ID and SLURM_RESTART_COUNT set, its output appended to the
script's ``--output`` file. State lives in ``$FAKE_SLURM_DIR`` (one JSON file per task, guarded by a lock).
The tests can also

- preempt a task (``python tests/fake_slurm.py preempt JOB_TASK``): kill -9 its process group; with
  ``--requeue`` SLURM puts it back in the queue and runs it again, without it the task ends PREEMPTED;
- requeue a task (``scontrol requeue JOB_TASK``): kill it if it runs, and run it again;
- run every task twice at once (``FAKE_SLURM_COPIES=2`` when sbatch is called), as when a node that was
  thought lost comes back while the requeued copy runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LIVE = ("PENDING", "RUNNING", "PREEMPTING", "REQUEUING")


def state_dir() -> Path:
    return Path(os.environ["FAKE_SLURM_DIR"])


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    path = state_dir() / "locks" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def write(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def task_path(job: str, index: int) -> Path:
    return state_dir() / "tasks" / f"{job}_{index}.json"


def sbatch(args: list[str]) -> int:
    script = Path(args[-1]).resolve()
    options = [
        line[len("#SBATCH ") :].strip() for line in script.read_text().splitlines() if line.startswith("#SBATCH ")
    ]
    options += [a for a in args[:-1] if a.startswith("--")]
    settings: dict[str, Any] = {"array": "0", "requeue": False, "output": "slurm-%A_%a.out", "name": script.name}
    for option in options:
        key, _, value = option.partition("=")
        if key == "--array":
            settings["array"] = value
        elif key in ("--requeue", "--no-requeue"):
            settings["requeue"] = key == "--requeue"
        elif key == "--output":
            settings["output"] = value
        elif key == "--job-name":
            settings["name"] = value
    first, last = re.fullmatch(r"(\d+)-(\d+)(?:%\d+)?", settings["array"]).groups()  # type: ignore[union-attr]
    with locked("counter"):
        counter = state_dir() / "next_job_id"
        job = int(counter.read_text()) if counter.exists() else 1000
        counter.write_text(str(job + 1))
    job_info = {
        **settings,
        "script": str(script),
        "indices": list(range(int(first), int(last) + 1)),
        "copies": int(os.environ.get("FAKE_SLURM_COPIES", "1")),
        "cwd": os.getcwd(),
    }
    (state_dir() / "jobs").mkdir(parents=True, exist_ok=True)
    (state_dir() / "tasks").mkdir(parents=True, exist_ok=True)
    write(state_dir() / "jobs" / f"{job}.json", job_info)
    with open(state_dir() / "calls.log", "a") as log:
        log.write(json.dumps({"job": job, "args": args}) + "\n")
    for index in job_info["indices"]:
        write(task_path(str(job), index), {"state": "PENDING", "runs": 0, "pids": [], "exit": None})
        start_wrapper(str(job), index)
    print(f"{job};fake" if "--parsable" in args else f"Submitted batch job {job}")
    return 0


def start_wrapper(job: str, index: int) -> None:
    wrapper = subprocess.Popen(
        [sys.executable, __file__, "_task", job, str(index)],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with open(state_dir() / "wrappers", "a") as f:
        f.write(f"{wrapper.pid}\n")


def run_task(job: str, index: int) -> int:
    """The node side of one array task: run the script (again after a requeue) and record how it ended."""
    info = read(state_dir() / "jobs" / f"{job}.json")
    path = task_path(job, index)
    while True:
        with locked(f"{job}_{index}"):
            state = read(path)
            if state["state"] not in ("PENDING",):
                return 0
            env = {
                **os.environ,
                "SLURM_ARRAY_JOB_ID": job,
                "SLURM_ARRAY_TASK_ID": str(index),
                "SLURM_JOB_ID": str(int(job) * 1000 + index),
                "SLURM_RESTART_COUNT": str(state["runs"]),
            }
            output = info["output"].replace("%A", job).replace("%a", str(index)).replace("%x", info["name"])
            with open(output, "a") as log:
                processes = [
                    subprocess.Popen(
                        ["bash", info["script"]],
                        env=env,
                        cwd=info["cwd"],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # its own process group: preemption kills all of it
                    )
                    for _ in range(info["copies"])
                ]
            write(path, {**state, "state": "RUNNING", "runs": state["runs"] + 1, "pids": [p.pid for p in processes]})
        codes = [p.wait() for p in processes]
        with locked(f"{job}_{index}"):
            state = read(path)
            if state["state"] == "REQUEUING" or (state["state"] == "PREEMPTING" and info["requeue"]):
                write(path, {**state, "state": "PENDING", "pids": []})
                continue
            final = "PREEMPTED" if state["state"] == "PREEMPTING" else ("COMPLETED" if max(codes) == 0 else "FAILED")
            write(path, {**state, "state": final, "pids": [], "exit": max(codes)})
            return 0


def interrupt(target: str, new_state: str) -> int:
    """Kill a task's processes and mark why (PREEMPTING or REQUEUING); a task that ended is run again."""
    job, _, index = target.partition("_")
    path = task_path(job, int(index))
    with locked(target):
        state = read(path)
        if state["state"] == "RUNNING":
            write(path, {**state, "state": new_state})
            for pid in state["pids"]:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        elif new_state == "REQUEUING" and state["state"] not in LIVE:  # an ended task: run it a second time
            write(path, {**state, "state": "PENDING"})
            start_wrapper(job, int(index))
    return 0


def squeue(args: list[str]) -> int:
    job = next(a.split("=", 1)[1] for a in args if a.startswith("--jobs="))
    tasks = sorted((state_dir() / "tasks").glob(f"{job}_*.json"))
    states = {int(p.stem.split("_")[1]): read(p)["state"] for p in tasks}
    live = {i: s for i, s in states.items() if s in LIVE}
    if not live:  # as a real controller that has purged a finished job
        print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
        return 1
    for index, state in sorted(live.items()):
        print(f"{index} {'RUNNING' if state != 'PENDING' else 'PENDING'}")
    return 0


def sacct(args: list[str]) -> int:
    job = next(a.split("=", 1)[1] for a in args if a.startswith("--jobs="))
    for path in sorted((state_dir() / "tasks").glob(f"{job}_*.json")):
        task = read(path)
        print(f"{path.stem}|{task['state']}|{task.get('exit', 0)}:0")  # --format=JobID,State,ExitCode
    return 0


def main(argv: list[str]) -> int:
    command, args = argv[0], argv[1:]
    if command == "sbatch":
        return sbatch(args)
    if command == "squeue":
        return squeue(args)
    if command == "sacct":
        return sacct(args)
    if command == "scontrol" and args[:1] == ["requeue"]:
        return interrupt(args[1], "REQUEUING")
    if command == "preempt":
        return interrupt(args[0], "PREEMPTING")
    if command == "_task":
        return run_task(args[0], int(args[1]))
    print(f"fake slurm: {command} {' '.join(args)} is not supported", file=sys.stderr)
    return 2


# --------------------------------------------------------------------------------------------------
# For the tests
# --------------------------------------------------------------------------------------------------


class FakeSlurm:
    """The test side: PATH and state folder set up, and ways to look at and disturb the tasks."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = Path(__file__).resolve().parent / "fake_slurm_bin"

    def env(self) -> dict[str, str]:
        return {
            "FAKE_SLURM_DIR": str(self.root),
            "FAKE_SLURM_PYTHON": sys.executable,
            "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
        }

    def calls(self) -> list[dict[str, Any]]:
        log = self.root / "calls.log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def tasks(self) -> dict[str, dict[str, Any]]:
        folder = self.root / "tasks"
        return {p.stem: read(p) for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}

    def preempt(self, target: str) -> None:
        """As ``python tests/fake_slurm.py preempt JOB_TASK``, without starting a process (no delay)."""
        interrupt(target, "PREEMPTING")

    def wait_until(self, condition: Any, timeout_s: float = 900) -> None:
        """Poll ``condition`` until it holds; the timeout only guards against a hang (tasks are processes that
        import torch: minutes on a loaded 2-core machine), it is no expectation of speed."""
        deadline = time.time() + timeout_s
        while not condition():
            assert time.time() < deadline, f"timed out; tasks: {self.tasks()}"
            time.sleep(0.1)

    def stop_all(self) -> None:
        """Kill whatever still runs (a failed test must not leave task processes behind)."""
        wrappers = self.root / "wrappers"
        for pid in wrappers.read_text().split() if wrappers.exists() else []:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(pid), signal.SIGKILL)
        for state in self.tasks().values():
            for pid in state.get("pids", []):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)


if __name__ == "__main__":
    os.environ.setdefault("FAKE_SLURM_DIR", str(Path.cwd() / ".fake_slurm"))
    raise SystemExit(main(sys.argv[1:]))
