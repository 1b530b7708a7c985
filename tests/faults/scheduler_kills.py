"""Scheduler kill trials: ``finetune.schedule --workers=1`` (jobs in its own process) is killed with SIGKILL at
random moments, then the same command is run once more and must finish every job, each recorded once.

    python tests/faults/scheduler_kills.py --trials 3 --kills 4        # about a minute per trial on 2 busy cores
    python tests/faults/scheduler_kills.py --root /path/to/other/checkout   # the scheduler of another checkout
    python tests/faults/scheduler_kills.py --done_faults               # result files a task never writes, instead
    python tests/faults/scheduler_kills.py --lock_faults --trials 3    # the lock file deleted under a live one

Each trial makes a tiny pretraining run (tests/finetune_fixtures.py: two snapshots) with ``--jobs`` fine-tuning
jobs, starts the scheduler, and kills it ``--kills`` times, each a random 0.5-4 s after the kill's scheduler
wrote its manifest (so kills land while jobs run, and while later ones wait). It passes when the last run of the
same command exits 0, every job is done with one result file, and no job was charged an attempt by a kill (each
result is its job's first attempt, and no job was ever submitted as a later one). Exit status 0 when every trial
passes.

``--done_faults`` finishes such a grid once, then, for each kind of result file a task never writes (another job's
under this job's name, a list, no results, an accuracy of 2.0, cut short, empty), spoils one result file of a copy
of the folder and runs the same command. Within ``--limit_s`` (another job's result once made it submit the job for
ever) it must exit 0, with a warning naming the file, which it moved to ``damaged/``; the file's job must have run
again in one submission, and every job be done once, none charged an attempt.

``--lock_faults`` deletes ``RESULTS/lock`` under a live scheduler once its first result is written, and starts the
same command beside it: the first must stop with exit code 2 before its next job (at most the result under way
follows), the second must exit 0 with every job done once; the jobs both started are counted.
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
from collections import Counter
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


def environment(root: Path) -> dict[str, str]:
    """The scheduler's environment: the checkout ``root``'s code, offline, one thread."""
    return {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}  # fmt: skip


def submissions(results: Path) -> int:
    folder = results / "manifests"
    return len(list(folder.glob("*.json"))) if folder.is_dir() else 0


def kill_once(cmd: list[str], root: Path, results: Path, rng: random.Random) -> str:
    """Start the scheduler, wait for its submission, kill it a random moment later; what happened."""
    before = submissions(results)
    process = subprocess.Popen(cmd, cwd=root, env=environment(root), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
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
    final = subprocess.run(cmd, cwd=root, env=environment(root), capture_output=True, text=True)
    problems = [] if final.returncode == 0 else [f"the same command again exited {final.returncode}: "
                                                 f"{final.stderr.strip().splitlines()[:2]}"]  # fmt: skip
    return events, problems + check(results, jobs)


def spoil(path: Path, kind: str, other: Path) -> None:
    """Give a result file content a task never writes (``other``: another job's result file)."""
    payload = json.loads(path.read_text())
    payload["results"]["accuracy"] = 2.0
    texts = {"another job's": other.read_text(), "a list": "[]", "cut short": path.read_text()[:100], "empty": "",
             "no results": json.dumps({k: v for k, v in payload.items() if k != "results"}),
             "accuracy 2.0": json.dumps(payload)}  # fmt: skip
    path.write_text(texts[kind])


DONE_FAULTS = ("another job's", "a list", "no results", "accuracy 2.0", "cut short", "empty")


def run_bounded(cmd: list[str], root: Path, limit_s: float) -> tuple[int | None, str]:
    """Run ``cmd`` for at most ``limit_s``; its exit code (None: it was still running) and its error output."""
    with tempfile.TemporaryFile("w+") as err:  # not a pipe: a looping command could fill it and block
        process = subprocess.Popen(cmd, cwd=root, env=environment(root), stdout=subprocess.DEVNULL, stderr=err,
                                   start_new_session=True)  # fmt: skip
        try:
            code = process.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = None
        err.seek(0)
        return code, err.read()


def done_fault_trial(base: Path, kind: str, cmd: list[str], root: Path, jobs: int, limit_s: float) -> list[str]:
    """One kind of spoiled result file in a copy of the finished folder ``base/results.d``; what went wrong."""
    results = base / f"results_{DONE_FAULTS.index(kind)}.d"
    shutil.copytree(base / "results.d", results)
    cmd = [arg.replace(str(base / "results.d"), str(results)) for arg in cmd]
    files = sorted((results / "done").glob("*.json"))
    spoiled, before = files[min(3, len(files) - 1)], submissions(results)
    spoil(spoiled, kind, files[0])
    code, err = run_bounded(cmd, root, limit_s)
    problems = []
    if code is None:
        problems.append(f"still running after {limit_s:.0f} s ({submissions(results) - before} submissions)")
    elif code != 0 or f"warning: {spoiled} " not in err or "moved to" not in err:
        problems.append(f"exit {code}, not 0 with a warning naming the file: {err.strip().splitlines()[-1:]}")
    if submissions(results) != before + 1:
        problems.append(f"{submissions(results) - before} submissions, not the one that runs its job again")
    if len(list((results / "damaged").glob("done.*"))) != 1:
        problems.append("the spoiled file is not kept in damaged/")
    return problems + check(results, jobs)


def done_fault_trials(workdir: Path, root: Path, jobs: int, limit_s: float) -> int:
    """Every kind of spoiled result file (DONE_FAULTS) once; how many kinds failed."""
    base = workdir / "done_faults"
    cmd = command(make_run(base, "post_ln", "post", steps=(10, 20)), base / "results.d", jobs)
    code, err = run_bounded(cmd, root, 10 * limit_s)
    if code != 0:
        raise SystemExit(f"the grid did not finish (exit {code}): {err.strip().splitlines()[-2:]}")
    failed = 0
    for kind in DONE_FAULTS:
        problems = done_fault_trial(base, kind, cmd, root, jobs, limit_s)
        failed += bool(problems)
        print(f"{kind}: {'ok' if not problems else 'FAILED: ' + '; '.join(problems)}", flush=True)
    return failed


def lock_fault_trial(index: int, workdir: Path, root: Path, jobs: int, limit_s: float) -> tuple[str, list[str]]:
    """``RESULTS/lock`` deleted under a scheduler running its jobs in its own process once its first result is
    written, then the same command started beside it. The first must stop (exit 2, naming the lock file) before its
    next job, the second finish the folder with every job done once; how many jobs both started is counted (each a
    job computed twice). What happened, and what went wrong."""
    trial = workdir / f"lock_{index:03d}"
    results = trial / "results.d"
    cmd = command(make_run(trial, "post_ln", "post", steps=(10, 20)), results, jobs)
    with tempfile.TemporaryFile("w+") as err:
        first = subprocess.Popen(cmd, cwd=root, env=environment(root), stdout=subprocess.DEVNULL, stderr=err,
                                 start_new_session=True)  # fmt: skip
        deadline = time.time() + limit_s
        while not list(results.glob("done/*.json")) and first.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        before = len(list(results.glob("done/*.json")))
        (results / "lock").unlink(missing_ok=True)
        code, second = run_bounded(cmd, root, limit_s)
        try:
            first.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
        err.seek(0)
        first_err = err.read()
    by_first = sum(json.loads(p.read_text())["worker"]["pid"] == first.pid for p in results.glob("done/*.json"))
    twice = sum(n > 1 for n in Counter(p.name.split(".")[0] for p in results.glob("started/*.json")).values())
    event = (f"lock deleted after {before} result(s); the first scheduler exit {first.returncode}, {by_first - before} "
             f"result(s) after; the second exit {code}; {twice} job(s) started by both")  # fmt: skip
    problems = []
    if first.returncode != 2 or "deleted or replaced" not in first_err:
        problems.append(f"the first exited {first.returncode}: {first_err.strip().splitlines()[-1:]}")
    if by_first - before > 1:
        problems.append(f"the first wrote {by_first - before} results after its lock file was deleted (1 at most)")
    if code != 0:
        problems.append(f"the second exited {code}: {second.strip().splitlines()[-1:]}")
    return event, problems + check(results, jobs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--kills", type=int, default=4, help="kill -9s of the scheduler per trial (default 4)")
    parser.add_argument("--jobs", type=int, default=24, help="fine-tuning jobs per trial, even (default 24)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random kill moments")
    parser.add_argument("--root", type=Path, default=HERE, help="checkout whose scheduler runs (default: this one)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--done_faults", action="store_true", help="spoiled result files instead of kills")
    parser.add_argument("--lock_faults", action="store_true", help="the lock file deleted under a live scheduler")
    parser.add_argument("--limit_s", type=float, default=300, help="--*_faults: seconds a command may take")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="scheduler-kills-"))
    rng = random.Random(args.seed)
    began, failed = time.monotonic(), 0
    if args.done_faults:
        failed = done_fault_trials(workdir, args.root.resolve(), args.jobs, args.limit_s)
        print(json.dumps({"kinds": len(DONE_FAULTS), "jobs": args.jobs, "passed": len(DONE_FAULTS) - failed,
                          "failed": failed, "seconds": round(time.monotonic() - began)}))  # fmt: skip
        if not failed:
            shutil.rmtree(workdir / "done_faults", ignore_errors=True)
        return 1 if failed else 0
    for index in range(args.trials):
        if args.lock_faults:
            event, problems = lock_fault_trial(index, workdir, args.root.resolve(), args.jobs, args.limit_s)
            events = [event]
        else:
            events, problems = run_trial(index, workdir, args.root.resolve(), args.jobs, args.kills, rng)
        failed += bool(problems)
        verdict = "ok" if not problems else "FAILED: " + "; ".join(problems)
        print(f"trial {index}: {'; '.join(events)} -> {verdict}", flush=True)
        if not problems:
            shutil.rmtree(workdir / f"{'lock' if args.lock_faults else 'trial'}_{index:03d}", ignore_errors=True)
    summary = {"trials": args.trials, "kills_per_trial": 0 if args.lock_faults else args.kills, "jobs": args.jobs,
               "passed": args.trials - failed, "failed": failed,
               "seconds": round(time.monotonic() - began)}  # fmt: skip
    print(json.dumps(summary))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
