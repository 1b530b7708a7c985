"""Scheduler kill trials: ``finetune.schedule --workers=1`` (jobs in its own process) is killed with SIGKILL at
random moments, then the same command is run once more and must finish every job, each recorded once.

    python tests/faults/scheduler_kills.py --trials 3 --kills 4        # about a minute per trial on 2 busy cores
    python tests/faults/scheduler_kills.py --root /path/to/other/checkout   # the scheduler of another checkout

Each trial makes a tiny pretraining run (tests/finetune_fixtures.py: two snapshots) with ``--jobs`` fine-tuning
jobs, starts the scheduler, and kills it ``--kills`` times, each a random 0.5-4 s after the kill's scheduler
wrote its manifest (so kills land while jobs run, and while later ones wait). It passes when the last run of the
same command exits 0, every job is done with one result file, and no job was charged an attempt by a kill (each
result is its job's first attempt, and no job was ever submitted as a later one). Exit status 0 when every trial
passes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(HERE))

from finetune.manifest import ResultsFolder  # noqa: E402
from tests.finetune_fixtures import FIXTURE_GLUE, QUICK, make_run  # noqa: E402


def command(run_dir: Path, results: Path, jobs: int) -> list[str]:
    seeds = list(range(jobs // 2))  # two snapshots
    args = [f"--runs=[{run_dir}]", f"--results_dir={results}", "--tasks=[mrpc]", "--lrs=[0.001]", f"--seeds={seeds}"]
    args += [f"--data_dir={FIXTURE_GLUE}", "--mode=once", "--workers=1", "--max_attempts=3"]
    args += [f"--recipe.{k}={json.dumps(v)}" for k, v in QUICK.items()]
    return [sys.executable, "-m", "finetune.schedule", *args]


def submissions(results: Path) -> int:
    folder = results / "manifests"
    return len(list(folder.glob("*.json"))) if folder.is_dir() else 0


def kill_once(cmd: list[str], root: Path, results: Path, rng: random.Random) -> str:
    """Start the scheduler, wait for its submission, kill it a random moment later; what happened."""
    before = submissions(results)
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}  # fmt: skip
    process = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)  # fmt: skip
    deadline = time.time() + 180
    while submissions(results) <= before:
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


def check(results: Path, jobs: int) -> list[str]:
    problems = []
    statuses: dict[str, int] = {}
    for state in ResultsFolder(results).jobs().values():
        statuses[state.status] = statuses.get(state.status, 0) + 1
    if statuses != {"done": jobs}:
        problems.append(f"jobs by status {statuses}, not all {jobs} done")
    files = [json.loads(p.read_text()) for p in (results / "done").glob("*.json")]
    if len(files) != jobs:
        problems.append(f"{len(files)} result files for {jobs} jobs")
    attempts = {j.attempt for m in ResultsFolder(results).manifests() for j in m.jobs} | {f["attempt"] for f in files}
    if attempts != {1}:
        problems.append(f"a kill was charged as an attempt (attempts {sorted(attempts)})")
    return problems


def run_trial(index: int, workdir: Path, root: Path, jobs: int, kills: int, rng: random.Random) -> tuple[list, list]:
    trial = workdir / f"trial_{index:03d}"
    run_dir = make_run(trial, "post_ln", "post", steps=(10, 20))
    results = trial / "results.d"
    cmd = command(run_dir, results, jobs)
    events = [kill_once(cmd, root, results, rng) for _ in range(kills)]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}  # fmt: skip
    final = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    problems = [] if final.returncode == 0 else [f"the same command again exited {final.returncode}: "
                                                 f"{final.stderr.strip().splitlines()[:2]}"]  # fmt: skip
    return events, problems + check(results, jobs)


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
