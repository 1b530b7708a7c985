"""Scheduler kill trials: ``finetune.schedule --workers=1`` (jobs in its own process) is killed with SIGKILL at
random moments, then the same command is run once more and must finish every job, each recorded once.

    python tests/faults/scheduler_kills.py --trials 3 --kills 4        # about a minute per trial on 2 busy cores
    python tests/faults/scheduler_kills.py --root /path/to/other/checkout   # the scheduler of another checkout

Each trial makes a tiny pretraining run (tests/finetune_fixtures.py: two snapshots) with ``--jobs`` fine-tuning
jobs, starts the scheduler, and kills it ``--kills`` times, each a random 0.5-4 s after the kill's scheduler
opened its submission (so kills land while jobs run, and while later ones wait). It passes when the last run of
the same command exits 0, every job is done, and each has one result file and one ``done`` event. Exit status 0
when every trial passes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(HERE))

from tests.finetune_fixtures import FIXTURE_GLUE, QUICK, make_run  # noqa: E402


def command(run_dir: Path, store: Path, jobs: int) -> list[str]:
    seeds = list(range(jobs // 2))  # two snapshots
    args = [f"--runs=[{run_dir}]", f"--store={store}", "--tasks=[mrpc]", "--lrs=[0.001]", f"--seeds={seeds}"]
    args += [f"--data_dir={FIXTURE_GLUE}", "--mode=once", "--workers=1", "--max_attempts=3"]
    args += [f"--recipe.{k}={json.dumps(v)}" for k, v in QUICK.items()]
    return [sys.executable, "-m", "finetune.schedule", *args]


def submissions(store: Path) -> int:
    if not store.exists():
        return 0
    try:
        with sqlite3.connect(store, timeout=30) as db:
            return db.execute("SELECT COUNT(*) FROM submissions").fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0


def kill_once(cmd: list[str], root: Path, store: Path, rng: random.Random) -> str:
    """Start the scheduler, wait for its submission, kill it a random moment later; what happened."""
    before = submissions(store)
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}  # fmt: skip
    process = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)  # fmt: skip
    deadline = time.time() + 180
    while submissions(store) <= before:
        if process.poll() is not None:
            return f"ended by itself (exit {process.returncode}) before submitting"
        if time.time() > deadline:
            break
        time.sleep(0.05)
    delay = rng.uniform(0.5, 4.0)
    time.sleep(delay)
    if process.poll() is not None:
        return f"ended by itself (exit {process.returncode})"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    return f"killed {delay:.1f} s after submitting"


def check(store: Path, jobs: int) -> list[str]:
    problems = []
    with sqlite3.connect(store) as db:
        statuses = dict(db.execute("SELECT status, COUNT(*) FROM jobs GROUP BY status").fetchall())
        done_events = [r[0] for r in db.execute("SELECT key FROM events WHERE event = 'done'")]
    if statuses != {"done": jobs}:
        problems.append(f"jobs by status {statuses}, not all {jobs} done")
    if len(done_events) != len(set(done_events)):
        problems.append("a job recorded done twice")
    files = list((store.with_suffix(".d") / "done").glob("*.json"))
    if len(files) != jobs:
        problems.append(f"{len(files)} result files for {jobs} jobs")
    return problems


def run_trial(index: int, workdir: Path, root: Path, jobs: int, kills: int, rng: random.Random) -> tuple[list, list]:
    trial = workdir / f"trial_{index:03d}"
    run_dir = make_run(trial, "post_ln", "post", steps=(10, 20))
    store = trial / "results.sqlite"
    cmd = command(run_dir, store, jobs)
    events = [kill_once(cmd, root, store, rng) for _ in range(kills)]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}  # fmt: skip
    final = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    problems = [] if final.returncode == 0 else [f"the same command again exited {final.returncode}: "
                                                 f"{final.stderr.strip().splitlines()[:2]}"]  # fmt: skip
    return events, problems + check(store, jobs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--kills", type=int, default=4, help="kill -9s of the scheduler per trial (default 4)")
    parser.add_argument("--jobs", type=int, default=24, help="fine-tuning jobs per trial, even (default 24)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random kill moments")
    parser.add_argument("--root", type=Path, default=HERE, help="checkout whose scheduler runs (default: this one)")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="scheduler-kills-"))
    rng = random.Random(args.seed)
    began, failed = time.monotonic(), 0
    for index in range(args.trials):
        events, problems = run_trial(index, workdir, args.root.resolve(), args.jobs, args.kills, rng)
        failed += bool(problems)
        verdict = "ok" if not problems else "FAILED: " + "; ".join(problems)
        print(f"trial {index}: {'; '.join(events)} -> {verdict}", flush=True)
        if not problems:
            shutil.rmtree(workdir / f"trial_{index:03d}", ignore_errors=True)
    summary = {"trials": args.trials, "kills_per_trial": args.kills, "jobs": args.jobs, "passed": args.trials - failed,
               "failed": failed, "seconds": round(time.monotonic() - began)}  # fmt: skip
    print(json.dumps(summary))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
