"""Kill -9 trials: a tiny pretraining run is killed at random moments and at the dangerous moments of a save,
resumed with --train.resume=auto until it finishes, and compared with an uninterrupted run.

    python tests/faults/kill_trials.py --trials 30            # about 15 s per trial on one CPU thread
    python tests/faults/kill_trials.py --trials 200 --seed 7 --workdir /tmp/kills --keep
    python tests/faults/kill_trials.py --trials 0 --corrupt 27   # damaged checkpoints, start-up files, data
    python tests/faults/kill_trials.py --trials 0 --sigterm 15   # SIGTERM at any stage, start-up included
    python tests/faults/kill_trials.py --trials 0 --hang 5       # a process that hangs, stopped by its watchdog

Each trial starts the run, kills it (SIGKILL) once or twice, then runs the same command with
--train.resume=auto until it exits 0. It passes when the final weights are bit-identical to the
uninterrupted run's, every scheduled snapshot is complete with the same weights, the training losses of
every step are logged once and equal, no temp or incomplete folder is left, and status.json says finished.

Kill moments: ``random`` (uniformly within the training window, after run_config.json appears), and the
``LNBERT_KILL_AT=point:step`` hook of pretrain/run_folder/checkpointing.py: while a snapshot's files are written
(``snapshot_files``), while a checkpoint's files are written (``checkpoint_files``), between a checkpoint's
rename and the rotation of old ones (``checkpoint_renamed``), and after a step before the first checkpoint
(``step``). Exit status 0 when every trial passes.

Corruption trials (``--corrupt N``): the run stops at step 8 (``train.stop_at_step``), one file of its latest
checkpoint, of the run folder's start-up files (``RUN_FILES``) or a shard of its prepared instances
(``PREPARED_SHARD``) is deleted, cut to half its size or has bytes overwritten (cycling through ``CORRUPTIONS``), and
the same checks follow ``--train.resume=auto``: the damaged checkpoint must be skipped for the one before it, a
damaged start-up file restored from a snapshot, damaged instances made again.

SIGTERM trials (``--sigterm N``), cycling through four moments: the first line the run prints (torch imported, the
data not yet prepared); the appearance of run_config.json (the end of start-up); a random moment of start-up and
training, counted from the command's first line (when the process catches SIGTERM, read from /proc: Linux); and
while pretrain/run.py still imports its own modules (``sigterm_while_importing``). The run must exit 0 with status
preempted (or finished): what launch/slurm_pretrain.sbatch requeues on, never a death by the signal; then the same
checks follow the same command.

Hang trials (``--hang N``), at the hook points in a stride through them: the run hangs there (``LNBERT_HANG_AT=point:step``, a
sleep that never ends). Its watchdog must stop it within ``train.hang_timeout_s`` (HANG_TIMEOUT_S) with exit code 3
and status hung; then the same checks follow the same command (with the default timeout).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
TINY_MODEL_PRESET = ROOT / "configs" / "pretrain" / "tiny_model.yaml"  # the tests' tiny model

from pretrain.run_folder.checkpointing import latest_checkpoint  # noqa: E402
from pretrain.run_folder.layout import list_snapshots, read_metrics, read_status  # noqa: E402

MAX_STEPS = 12
CHECKPOINT_EVERY = 4
# Snapshots at 0, 3, 6, 9, 12 (interval), 4 and 8 (coinciding with checkpoints), and the final one.
SNAPSHOT_STEPS = [0, 3, 4, 6, 8, 9, 12]
HOOKS = (
    [f"snapshot_files:{s}" for s in SNAPSHOT_STEPS]
    + [f"checkpoint_files:{s}" for s in (4, 8, 12)]
    + [f"checkpoint_renamed:{s}" for s in (4, 8, 12)]
    + ["step:1", "step:3"]
)


# Damaged in the run folder itself, not in its latest checkpoint: restored from a snapshot (pretrain/run_folder/repair.py).
RUN_FILES = ("run_config.json", "run_id", "tokenizer/tokenizer.json")
# In the data cache's prepared instances (shared by the trials): set aside and made again, the same instances.
PREPARED_SHARD = "train/shard-00000.arrow"
CORRUPTIONS = [
    (file, how)
    for how in ("missing", "truncated", "overwritten")  # the files first: --corrupt 9 damages each one
    for file in ("train_state.json", "model.safetensors", "optimizer.bin", "random_states_0.pkl", "manifest.json",
                 *RUN_FILES, PREPARED_SHARD)
]


def damage(path: Path, how: str) -> None:
    if how == "missing":
        path.unlink()
        return
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:  # the same size, 16 bytes in the middle flipped
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes(b ^ 0xFF for b in data[middle : middle + 16]) + data[middle + 16 :])


def overwrite_tokens(shard: Path) -> None:
    """Every token id of a prepared shard changed to its neighbour (id ^ 1), in place: still in the vocabulary, so
    that only the shard's checksum tells (every later batch would hold other tokens, the losses other values)."""
    import datasets
    import numpy as np

    data = bytearray(shard.read_bytes())
    for chunk in datasets.Dataset.from_file(str(shard)).data.column("input_ids").chunks:
        values = np.asarray(chunk.values, dtype="<i4")
        at = data.find(values.tobytes())
        assert at >= 0, f"{shard}: the token ids were not found as one run of bytes"
        data[at : at + 4 * len(values)] = (values ^ 1).tobytes()
    shard.write_bytes(bytes(data))


def run_args(run_dir: Path, cache: Path) -> list[str]:
    return [
        "--config", str(TINY_MODEL_PRESET),
        "--data.max_seq_length=32", "--data.vocab_size=300", "--data.max_documents=30",
        "--data.validation_documents=2", f"--data.cache_dir={cache}",
        f"--train.output_dir={run_dir}", "--train.per_device_batch_size=8", f"--train.max_steps={MAX_STEPS}",
        "--train.log_every=1", "--train.eval_every=4", "--train.eval_batches=2",
        f"--train.checkpoint_every={CHECKPOINT_EVERY}", "--train.snapshot_every=3", "--train.snapshot_steps=[4,8]",
    ]  # fmt: skip


def environment(kill_at: str = "", hang_at: str = "") -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline",
           "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    for key, value in (("LNBERT_KILL_AT", kill_at), ("LNBERT_HANG_AT", hang_at)):  # an inherited hook is not wanted
        env.pop(key, None)
        if value:
            env[key] = value
    return env


def start(args: list[str], kill_at: str = "", hang_at: str = "") -> subprocess.Popen:
    command = [sys.executable, str(ROOT / "pretrain" / "run.py"), *args]
    return subprocess.Popen(command, env=environment(kill_at, hang_at), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip


# The first module pretrain/run.py imports after its stop handler (jsonargparse and the configs follow).
IMPORT_MARK = "pretrain/common/cli.py"


def sigterm_while_importing(command: list[str], env: dict[str, str], limit_s: float = 600) -> tuple[int, str]:
    """Run ``command`` (a pretrain/run.py) and send it SIGTERM while it imports its modules, a moment found without
    timing: Python's verbose import log (PYTHONVERBOSE) goes through a pipe of one page, so the process is at most a
    page of log past the line that names IMPORT_MARK when it is signalled. Returns the exit code and the output
    without the log; a hang guard kills the process after ``limit_s``."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    process = subprocess.Popen(command, env={**env, "PYTHONVERBOSE": "1"}, stdout=write_end, stderr=write_end)
    os.close(write_end)
    guard = threading.Timer(limit_s, process.kill)
    guard.daemon = True
    guard.start()
    lines, signalled = [], False
    with os.fdopen(read_end, errors="replace") as log:
        for line in log:
            if IMPORT_MARK in line and not signalled and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                signalled = True
            elif not line.startswith(("# ", "import '")):
                lines.append(line)
    guard.cancel()
    if not signalled:
        lines.append(f"[never signalled: {IMPORT_MARK} was not imported]\n")
    return process.wait(), "".join(lines)


def weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


@dataclass
class Reference:
    final: dict
    snapshots: dict[int, dict]
    losses: dict[int, float]
    training_window_s: float
    startup_s: float
    """From the command's first line (SIGTERM caught) to run_config.json: importing torch, preparing the data."""


@dataclass
class Trial:
    index: int
    kills: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def train_losses(run_dir: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["train/loss"]) for r in read_metrics(run_dir) if "train/loss" in r]


def catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (its SigCgt mask): pretrain/run.py's first line has run."""
    with contextlib.suppress(FileNotFoundError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


def reference_run(workdir: Path, cache: Path) -> Reference:
    run_dir = workdir / "reference"
    process = start(run_args(run_dir, cache))
    while not catches_sigterm(process.pid) and process.poll() is None:
        time.sleep(0.01)
    first_line = time.monotonic()
    while not (run_dir / "run_config.json").exists() and process.poll() is None:
        time.sleep(0.05)
    started = time.monotonic()
    while read_status(run_dir).get("status") != "finished" and process.poll() is None:
        time.sleep(0.02)
    window = time.monotonic() - started  # from run_config.json to status finished: training and saves
    output, _ = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"the uninterrupted run failed:\n{output[-3000:]}")
    return Reference(
        final=weights(latest_checkpoint(run_dir)),
        snapshots={s.step: weights(s.path) for s in list_snapshots(run_dir)},
        losses=dict(train_losses(run_dir)),
        training_window_s=window,
        startup_s=started - first_line,
    )


def kill_randomly(args: list[str], run_dir: Path, window_s: float, rng: random.Random) -> str:
    """Start the run and SIGKILL it at a uniformly random moment of its training window."""
    process = start(args)
    while not (run_dir / "run_config.json").exists() and process.poll() is None:
        time.sleep(0.02)
    time.sleep(rng.uniform(0, window_s))
    if process.poll() is not None:
        process.communicate()
        return "random (too late: the run had finished)"
    process.send_signal(signal.SIGKILL)
    process.communicate()
    logged = train_losses(run_dir)
    return f"random after step {logged[-1][0] if logged else 0}"


def kill_at_hook(args: list[str], hook: str) -> str:
    process = start(args, kill_at=hook)
    output, _ = process.communicate()
    if process.returncode != -signal.SIGKILL:
        raise RuntimeError(f"the run was not killed at {hook} (exit {process.returncode}):\n{output[-3000:]}")
    return hook


def check(run_dir: Path, reference: Reference, trial: Trial) -> None:
    problems = trial.problems
    status = read_status(run_dir)
    if (status.get("status"), status.get("step")) != ("finished", MAX_STEPS):
        problems.append(f"status {status.get('status')} at step {status.get('step')}")
    if not same_weights(weights(latest_checkpoint(run_dir)), reference.final):
        problems.append("final weights differ from the uninterrupted run")
    snapshots = {s.step: s.path for s in list_snapshots(run_dir)}
    if sorted(snapshots) != sorted(reference.snapshots):
        problems.append(f"snapshots {sorted(snapshots)} instead of {sorted(reference.snapshots)}")
    for step, path in snapshots.items():
        if step in reference.snapshots and not same_weights(weights(path), reference.snapshots[step]):
            problems.append(f"snapshot {step} weights differ")
    if dict(train_losses(run_dir)) != reference.losses or len(train_losses(run_dir)) != MAX_STEPS:
        problems.append("training losses differ or a step is logged twice/missing")
    leftovers = [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]
    leftovers += [p.name for p in (run_dir / "snapshots").iterdir() if not (p / "COMPLETE").is_file()]
    if leftovers:
        problems.append(f"left behind: {leftovers}")


def resume_to_the_end(args: list[str], trial: Trial) -> None:
    for _ in range(3):  # resume until the run exits 0
        process = start([*args, "--train.resume=auto"])
        output, _ = process.communicate()
        if process.returncode == 0:
            return
        trial.problems.append(f"resume exited {process.returncode}: {output.strip().splitlines()[-1:]}")


def sigterm_trial(index: int, workdir: Path, cache: Path, reference: Reference, rng: random.Random) -> Trial:
    trial = Trial(index)
    run_dir = workdir / f"sigterm_{index:03d}"
    args = run_args(run_dir, cache)
    if index % 4 == 3:
        command = [sys.executable, str(ROOT / "pretrain" / "run.py"), *args]
        returncode, output = sigterm_while_importing(command, environment())
        moment = "while importing"
    else:
        process = start(args)
        output = ""
        if index % 4 == 0:
            output = process.stdout.readline()
            moment = "at the first output"
        elif index % 4 == 1:
            while not (run_dir / "run_config.json").exists() and process.poll() is None:
                time.sleep(0.01)
            moment = "at run_config.json"
        else:
            while not catches_sigterm(process.pid) and process.poll() is None:
                time.sleep(0.005)
            delay = rng.uniform(0, reference.startup_s + reference.training_window_s)
            time.sleep(delay)
            moment = f"{delay:.1f} s after the first line"
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        output += process.communicate()[0]
        returncode = process.returncode
    status = read_status(run_dir)
    trial.kills.append(f"sigterm {moment}: {status.get('status')} at step {status.get('step')}")
    if returncode != 0 or status.get("status") not in ("preempted", "finished"):
        trial.problems.append(f"exit {returncode}, status {status.get('status')}: {output[-500:]!r}")
    resume_to_the_end(args, trial)
    check(run_dir, reference, trial)
    return trial


def run_trial(index: int, workdir: Path, cache: Path, reference: Reference, rng: random.Random) -> Trial:
    trial = Trial(index)
    run_dir = workdir / f"trial_{index:03d}"
    args = run_args(run_dir, cache)
    # Odd trials hit a dangerous moment (cycling through them), even ones a random moment; a third of the
    # trials are killed a second time (at a random moment) while resuming.
    if index % 2:
        trial.kills.append(kill_at_hook(args, HOOKS[(index // 2) % len(HOOKS)]))
    else:
        trial.kills.append(kill_randomly(args, run_dir, reference.training_window_s, rng))
    if index % 3 == 0:
        resume = [*args, "--train.resume=auto"]
        trial.kills.append("then " + kill_randomly(resume, run_dir, reference.training_window_s, rng))
    resume_to_the_end(args, trial)
    check(run_dir, reference, trial)
    return trial


def corruption_trial(index: int, workdir: Path, cache: Path, reference: Reference) -> Trial:
    file, how = CORRUPTIONS[index % len(CORRUPTIONS)]
    trial = Trial(index, kills=[f"corrupt:{file}:{how}"])
    run_dir = workdir / f"corrupt_{index:03d}"
    args = run_args(run_dir, cache)
    first = start([*args, "--train.stop_at_step=8"])
    output, _ = first.communicate()
    if first.returncode != 0:
        trial.problems.append(f"the run to step 8 exited {first.returncode}: {output.strip().splitlines()[-1:]}")
        return trial
    path = damaged_folder(file, run_dir, cache) / file
    overwrite_tokens(path) if (file, how) == (PREPARED_SHARD, "overwritten") else damage(path, how)
    resume_to_the_end(args, trial)
    if not trial.problems:
        check(run_dir, reference, trial)
    return trial


def damaged_folder(file: str, run_dir: Path, cache: Path) -> Path:
    if file == PREPARED_SHARD:  # the folder in use: not one set aside (instances-KEY.damaged-NS)
        (folder,) = (p for p in cache.glob("instances-*") if p.is_dir() and "." not in p.name)
        return folder
    return run_dir if file in RUN_FILES else latest_checkpoint(run_dir)


HANG_TIMEOUT_S = 5  # a tiny step takes milliseconds; start-up, the first evaluation and saves well under this


def hang_trial(index: int, workdir: Path, cache: Path, reference: Reference) -> Trial:
    hook = HOOKS[7 * index % len(HOOKS)]  # a snapshot's files, a checkpoint's, a step boundary, ...
    trial = Trial(index, kills=[f"hang:{hook}"])
    run_dir = workdir / f"hang_{index:03d}"
    args = run_args(run_dir, cache)
    process = start([*args, f"--train.hang_timeout_s={HANG_TIMEOUT_S}"], hang_at=hook)
    output, _ = process.communicate(timeout=600)
    status = read_status(run_dir)
    if process.returncode != 3 or status.get("status") != "hung" or "Thread" not in output:
        trial.problems.append(f"exit {process.returncode}, status {status.get('status')}: {output[-500:]!r}")
    resume_to_the_end(args, trial)
    check(run_dir, reference, trial)
    return trial


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=30, help="number of trials (default 30)")
    parser.add_argument("--corrupt", type=int, default=0, help="damaged-checkpoint trials after them (default 0)")
    parser.add_argument("--sigterm", type=int, default=0, help="SIGTERM trials after those (default 0)")
    parser.add_argument("--hang", type=int, default=0, help="hang trials after those (default 0)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random kill moments")
    parser.add_argument("--workdir", type=Path, default=None, help="where runs are written (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the trial folders")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kill-trials-"))
    workdir.mkdir(parents=True, exist_ok=True)
    cache = workdir / "data-cache"
    rng = random.Random(args.seed)
    began = time.monotonic()
    reference = reference_run(workdir, cache)
    print(f"uninterrupted run: training window {reference.training_window_s:.1f} s; snapshots {sorted(reference.snapshots)}")
    failed, kills, by_kind = 0, 0, {}
    trials = [("kill", i) for i in range(args.trials)] + [("corrupt", i) for i in range(args.corrupt)]
    trials += [("sigterm", i) for i in range(args.sigterm)] + [("hang", i) for i in range(args.hang)]
    folders = {"kill": "trial", "corrupt": "corrupt", "sigterm": "sigterm", "hang": "hang"}
    for kind, index in trials:
        if kind == "kill":
            trial = run_trial(index, workdir, cache, reference, rng)
        elif kind == "corrupt":
            trial = corruption_trial(index, workdir, cache, reference)
        elif kind == "sigterm":
            trial = sigterm_trial(index, workdir, cache, reference, rng)
        else:
            trial = hang_trial(index, workdir, cache, reference)
        failed += bool(trial.problems)
        kills += len(trial.kills)
        for kill in trial.kills:
            what = kill.removeprefix("then ").split(" ")[0].split(":")[0]
            by_kind[what] = by_kind.get(what, 0) + 1
        verdict = "ok" if not trial.problems else "FAILED: " + "; ".join(trial.problems)
        print(f"{kind} {index:3d}  {', '.join(trial.kills):<55} {verdict}", flush=True)
        if not args.keep and not trial.problems:
            shutil.rmtree(workdir / f"{folders[kind]}_{index:03d}", ignore_errors=True)
    summary = {"trials": len(trials), "kills": kills, "by_kind": by_kind, "passed": len(trials) - failed,
               "failed": failed, "seconds": round(time.monotonic() - began)}  # fmt: skip
    print(json.dumps(summary))
    if args.keep or failed:
        print(f"trial folders in {workdir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
