"""The scheduler: snapshot discovery, skipping done work, cost, crash recovery, one scheduler per results folder,
retries.

SLURM, result files and run identity: tests/test_finetune_cluster.py."""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import finetune.schedule
from finetune.backends import InProcess, LocalArray, SlurmArray, SlurmConfig
from finetune.manifest import (
    INTERRUPTED,
    LOCK,
    SCHEDULER_STOPPED,
    Manifest,
    ManifestJob,
    ResultsBusy,
    ResultsFolder,
    load_manifest,
)
from finetune.schedule import (
    Left,
    ScheduleConfig,
    collect,
    discover,
    free_slots,
    main,
    runnable,
    runtime_settings,
    schedule,
    submit,
)
from finetune.schedule import cli as schedule_cli
from pretrain.run_folder.layout import SNAPSHOT_MARKER
from pretrain.run_folder.manifest import write_manifest
from tests.finetune_fixtures import FIXTURE_GLUE, QUICK, config_for, make_run, results, set_status

ROOT = Path(__file__).resolve().parents[1]


def cli_args(config: ScheduleConfig) -> list[str]:
    """The command line that gives ``config`` (for schedulers started as separate processes)."""
    args = [f"--runs={json.dumps(config.runs)}", "--results_dir", config.results_dir]
    args += [f"--tasks={json.dumps(config.tasks)}"]
    args += ["--data_dir", str(config.data_dir), f"--lrs={json.dumps(config.lrs)}"]
    args += [f"--seeds={json.dumps(config.seeds)}", f"--max_attempts={config.max_attempts}"]
    recipe = config.recipe
    for key in ("batch_size", "epochs", "max_train_examples", "max_eval_examples", "torch_threads", "progress"):
        args += [f"--recipe.{key}={json.dumps(getattr(recipe, key))}"]
    return args


def start_scheduler(config: ScheduleConfig, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "finetune.schedule", *cli_args(config), "--mode=once", *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, so the test can kill exactly it
    )


def folder(config: ScheduleConfig) -> ResultsFolder:
    return ResultsFolder(config.results_dir)


def manifests(config: ScheduleConfig) -> list[Manifest]:
    return folder(config).manifests()


def submitted(config: ScheduleConfig) -> list[tuple[int, int]]:
    """(seed, attempt) of every job of every submission, in order: the scheduler's history."""
    return [(job.spec.seed, job.attempt) for m in manifests(config) for job in m.jobs]


def done_rows(config: ScheduleConfig) -> list[dict[str, Any]]:
    return [state.row() for state in folder(config).done().values()]


def pass_with(config: ScheduleConfig, backend: Any) -> int:
    """One pass of a scheduler on ``backend``: ended tasks recorded, then the runnable jobs submitted."""
    collect(folder(config), InProcess())
    todo = runnable(folder(config).jobs(), discover(config).specs, config.max_attempts)
    return submit(folder(config), backend, runtime_settings(config), todo)


def test_once_runs_complete_snapshots_and_skips_done_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10, 30), incomplete_steps=(20,))
    config = config_for(tmp_path, [run_dir], tasks=["mrpc", "rte"])
    schedule(config)
    rows = done_rows(config)
    # The folder without COMPLETE (step 20) is being written: no jobs for it.
    assert sorted((r["pretrain_step"], r["task"]) for r in rows) == [
        (10, "mrpc"),
        (10, "rte"),
        (30, "mrpc"),
        (30, "rte"),
    ]
    assert len(submitted(config)) == 4
    # The cost comes before the work: jobs x steps (8 examples, batch 4, 1 epoch: 2 steps a job); on a first run
    # its time follows from the first job to finish.
    out = capsys.readouterr().out
    assert "4 jobs to run: 8 fine-tuning steps (the time they take follows once the first job finishes" in out
    assert re.search(r"\n3 jobs left: 6 fine-tuning steps x [\d.e-]+ s/step \(measured on the first finished job\) "
                     r"= about 1 min with 1 worker\(s\)\n", out)  # fmt: skip
    assert len(re.findall(r"^done (mrpc|rte) lr=0\.001 seed=0 step=(10|30) \(post_ln\) acc [\d.]+ in \d+ s$", out, re.M)) == 4
    # One line per pass says where the jobs are; the end shows the results (accuracy beside the majority class).
    assert re.search(r"\] jobs: 0/4 done, 0 running, 4 queued, 0 failed\n", out)
    assert re.search(r"\] jobs: 4/4 done, 0 running, 0 queued, 0 failed", out)
    assert re.search(r"results \(finished jobs.*\n.*accuracy +majority +dev loss\n(post_ln +10 mrpc .*%.*\n)", out)
    assert schedule(config) == Left([], {})  # a second pass finds everything done
    assert "jobs to run" not in capsys.readouterr().out
    assert len(submitted(config)) == 4
    assert main(["status", "--results_dir", config.results_dir]) == 0
    table = capsys.readouterr().out
    assert "post_ln" in table and "rte" in table and table.splitlines()[-1].split()[1:] == ["0", "0", "4", "0", "0"]
    # More seeds: the estimate now uses the time per step measured on the jobs already done.
    schedule(config_for(tmp_path, [run_dir], tasks=["mrpc", "rte"], seeds=[0, 1]))
    assert re.search(
        r"4 jobs to run: 8 fine-tuning steps x [\d.e-]+ s/step \(measured on 4 finished jobs\)", capsys.readouterr().out
    )
    # A given step time is an estimate, until a finished job of the recipe measures it (compare's rule).
    schedule(config_for(tmp_path, [run_dir], seeds=[2], step_time_s=900.0))
    assert re.search(r"2 jobs to run: 4 fine-tuning steps x [\d.e-]+ s/step \(measured on 8 finished jobs\)",
                     capsys.readouterr().out)  # fmt: skip
    fresh = config_for(tmp_path, [run_dir], seeds=[2], step_time_s=900.0, results_dir=str(tmp_path / "fresh.d"))
    schedule(fresh)
    out = capsys.readouterr().out
    assert (f"2 jobs to run: 4 fine-tuning steps x 900 s/step (an estimate, --step_time_s: no job of this recipe in "
            f"{fresh.results_dir} has ended) = 1.00 worker-hours") in out  # fmt: skip
    assert "] jobs: 0/2 done, 0 running, 2 queued, 0 failed; ETA about 60 min" in out
    assert re.search(r"\n1 jobs left: 2 fine-tuning steps x [\d.e-]+ s/step \(measured on the first finished job\)", out)
    schedule(config_for(tmp_path, [run_dir], seeds=[2], step_time_s=1.0, results_dir=str(tmp_path / "short.d")))
    assert "] jobs: 0/2 done, 0 running, 2 queued, 0 failed; ETA about 1 min" in capsys.readouterr().out  # not 0 min


@pytest.mark.slow  # a scheduler subprocess imports torch and transformers: ~15 s on 2 busy cores
def test_killed_scheduler_loses_no_job_and_repeats_none(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    # Enough optimizer steps that the job is still running when the scheduler is killed.
    config = config_for(tmp_path, [run_dir], recipe={**QUICK, "epochs": 300, "batch_size": 8})
    process = start_scheduler(config)
    started = Path(config.results_dir) / "started"
    deadline = time.time() + 120
    while not (started.is_dir() and any(started.iterdir())):  # killed inside the job
        assert process.poll() is None and time.time() < deadline, process.communicate()[0]
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    (state,) = folder(config).jobs().values()
    assert (state.status, state.attempts) == ("submitted", 1)
    assert schedule(config) == Left([], {})  # the restart finds the dead scheduler's job without a result and runs it
    (row,) = done_rows(config)
    assert row["attempts"] == 1  # in-process, the job died with its scheduler: that attempt is not counted
    assert submitted(config) == [(0, 1), (0, 1)]
    assert [m.ended for m in manifests(config)] == [{0: SCHEDULER_STOPPED}] * 2


@pytest.mark.slow  # two scheduler subprocesses: ~20 s on 2 busy cores
def test_two_schedulers_started_at_once_one_runs_the_other_names_it(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "pre_ln", "pre", steps=(10, 20))
    # Started together: whichever takes the lock first runs; the other either finds it held (exit 2, naming the
    # first) or, on a fast machine, starts after the first finished and finds nothing to do (exit 0). Which one
    # happens depends on timing; what must hold either way is that no job is computed twice.
    config = config_for(tmp_path, [run_dir], seeds=[0, 1], recipe={**QUICK, "epochs": 20})
    processes = [start_scheduler(config) for _ in range(2)]
    outputs = [process.communicate(timeout=300)[0] for process in processes]
    codes = [process.returncode for process in processes]
    assert sorted(codes) in ([0, 2], [0, 0]), outputs
    if sorted(codes) == [0, 2]:
        winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
        assert f"is in use by another scheduler (pid {processes[winner].pid} on " in outputs[loser], outputs[loser]
    assert all("Traceback" not in output for output in outputs)
    assert len(done_rows(config)) == 4
    assert len(submitted(config)) == 4  # no job computed twice


def test_a_scheduler_refused_the_instant_the_holder_took_the_lock_names_it(tmp_path: Path) -> None:
    # The holder has the flock but writes its name a moment later: the refused one waits for the name.
    results = ResultsFolder(tmp_path / "results")
    results.root.mkdir()
    with open(results.root / LOCK, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        name = json.dumps({"host": "node7", "pid": 4242, "since": "now"})
        writer = threading.Timer(0.3, lambda: (held.write(name), held.flush()))
        writer.start()
        try:
            with pytest.raises(ResultsBusy, match="pid 4242 on node7"), results.lock():
                pass
        finally:
            writer.join()  # the name is written before the file closes, whatever the outcome


def test_a_second_scheduler_stops_naming_the_first_and_runs_once_it_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    config = config_for(tmp_path, [run_dir])
    argv = [*cli_args(config), "--mode=once"]
    monkeypatch.setattr(sys, "argv", ["python -m finetune.schedule", *argv])
    with folder(config).lock():  # the first scheduler, running
        assert schedule_cli() == 2
        err = capsys.readouterr().err
        assert f"is in use by another scheduler (pid {os.getpid()} on {socket.gethostname()}, running since " in err
        assert "--results_dir=FOLDER" in err and f"kill {os.getpid()}" in err
        assert os.listdir(config.results_dir) == [LOCK]  # the refused one touched nothing
    assert main(argv) == 0  # one after the other: the lock went with the first
    assert len(done_rows(config)) == 1 and (Path(config.results_dir) / LOCK).read_text() == ""


class NeverRuns:
    """An in-process backend whose scheduler is killed before its task starts any job."""

    name, size = "inprocess", 1

    def start(self, manifest: Path, tasks: int, submission: int) -> str:
        return ""


def test_scheduler_kills_charge_no_attempt_to_queued_jobs_or_the_job_in_hand(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    config = config_for(tmp_path, [run_dir], seeds=[0, 1, 2], max_attempts=2)
    for _ in range(5):  # five schedulers killed in a row, more than max_attempts
        assert pass_with(config, NeverRuns()) == 3
        manifest = manifests(config)[-1]
        folder(config).write_started(manifest.jobs[0], manifest.submission)  # each killed inside its first job
    assert schedule(config) == Left([], {})  # the same command again finishes every job
    rows = sorted(done_rows(config), key=lambda r: r["seed"])
    assert [(r["seed"], r["attempts"]) for r in rows] == [(0, 1), (1, 1), (2, 1)]
    assert submitted(config) == [(0, 1), (1, 1), (2, 1)] * 6  # every submission was the first attempt
    assert [m.ended for m in manifests(config)] == [{0: SCHEDULER_STOPPED}] * 6


@pytest.mark.parametrize(
    ("reason", "charged"),
    [("exit code 1", "both"), ("sacct: FAILED", "both"), ("sacct: CANCELLED by 1000", "both"),
     ("not started: sbatch --parsable x failed (1): invalid partition", "both"),
     ("exit code 0", "started"), ("killed by SIGKILL", "started"), ("sacct: PREEMPTED", "started"),
     ("sacct: TIMEOUT", "started"), ("its worker process is gone", "started"),
     (SCHEDULER_STOPPED, "neither"), (INTERRUPTED, "neither")],
)  # fmt: skip
def test_which_jobs_an_ended_task_is_charged_for(tmp_path: Path, reason: str, charged: str) -> None:
    """A broken task (a node without the package, a bad interpreter) would fail again: every job it left is
    charged, so they stop after max_attempts. A task stopped from outside is charged for the job it had started
    (a job that kills its worker stops too), except in-process, where the job dies with its scheduler."""
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    config = config_for(tmp_path, [run_dir], seeds=[0, 1])
    pass_with(config, NeverRuns())
    (manifest,) = manifests(config)
    folder(config).write_started(manifest.jobs[0], 1)
    folder(config).write_manifest(replace(manifest, ended={0: reason}))
    status = {s.spec.seed: (s.status, s.attempts) for s in folder(config).jobs().values()}
    failed, queued = ("failed", 1), ("queued", 0)
    assert status[0] == (queued if charged == "neither" else failed)
    assert status[1] == (failed if charged == "both" else queued)


def test_failing_job_is_recorded_and_retried_up_to_max_attempts(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    snapshot = run_dir / "snapshots" / "step_00000010"
    (snapshot / "model.safetensors").write_bytes(b"not a safetensors file")
    write_manifest(snapshot)  # written so by its run: the snapshot is not refused, its weights fail to load
    config = config_for(tmp_path, [run_dir], max_attempts=2)
    (failure,) = schedule(config).failures
    (state,) = folder(config).jobs().values()
    assert state == failure and (state.status, state.attempts, state.permanent) == ("failed", 2, False)
    assert "Error" in state.error and len(state.error) > 10
    assert len(schedule(config).failures) == 1  # attempts used up: not tried again
    assert submitted(config) == [(0, 1), (0, 2)]
    assert len(os.listdir(Path(config.results_dir) / "failed")) == 2  # one failure file per attempt


def damage(path: Path) -> bytes:
    """Flip the low bits of the last weights in place (the same size, still a loadable safetensors file: not what
    was trained); returns the bytes it had."""
    original = path.read_bytes()
    data = bytearray(original)
    data[-8:] = bytes(b ^ 0x01 for b in data[-8:])
    path.write_bytes(bytes(data))
    return original


def test_a_damaged_snapshot_fails_its_jobs_once_for_good_until_it_is_restored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A snapshot damaged after it was found: each job checks it against its manifest before loading it and fails
    with the reason, once. No retry changes a damaged snapshot, so a rerun, even with more attempts, submits
    nothing while its files are as they were; restored from a copy (the same content: the same keys), its jobs
    run."""
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    original = damage(run_dir / "snapshots" / "step_00000010" / "model.safetensors")
    config = config_for(tmp_path, [run_dir], seeds=[0, 1], max_attempts=3)
    failures = schedule(config).failures
    assert [(f.status, f.attempts, f.permanent) for f in failures] == [("failed", 1, True)] * 2
    assert "damaged snapshot" in failures[0].error and "model.safetensors does not match its checksum" in failures[0].error
    assert submitted(config) == [(0, 1), (1, 1)]
    assert "failed mrpc lr=0.001 seed=1 step=10 (post_ln), attempt 1, for good (not tried again until the " \
           "snapshot's files change): SnapshotRefused: " in capsys.readouterr().out  # fmt: skip
    # Rerun with more attempts: nothing is submitted, and the status table says failed, not retrying.
    assert main([*cli_args(config_for(tmp_path, [run_dir], seeds=[0, 1], max_attempts=5)), "--mode=once"]) == 1
    assert "2 job(s) failed for good: their snapshot was refused" in capsys.readouterr().err
    assert submitted(config) == [(0, 1), (1, 1)] and len(os.listdir(Path(config.results_dir) / "failed")) == 2
    assert main(["status", f"--results_dir={config.results_dir}", "--max_attempts=5"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].split()[1:] == ["0", "0", "0", "2", "0"]
    # --retry_failed still tries them (the user says the cause is fixed): once each, for good again.
    assert len(schedule(config_for(tmp_path, [run_dir], seeds=[0, 1], retry_failed=True)).failures) == 2
    assert submitted(config) == [(0, 1), (1, 1)] * 2
    # Restored from a copy: its files changed, so the same command runs its jobs, from a fresh count.
    (run_dir / "snapshots" / "step_00000010" / "model.safetensors").write_bytes(original)
    assert schedule(config) == Left([], {})
    assert sorted((r["seed"], r["attempts"]) for r in done_rows(config)) == [(0, 1), (1, 1)]
    assert submitted(config) == [(0, 1), (1, 1)] * 3
    assert "2 job(s) that failed for good run again: their snapshot's files changed" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["snapshot.json", "manifest.json"])
def test_a_snapshot_whose_key_files_were_damaged_waits_and_the_others_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """snapshot.json and manifest.json give a snapshot's jobs their keys: damaged since the snapshot was complete, its
    jobs cannot be planned. That snapshot is named, the other's jobs run and the exit code is 1; restored from a copy,
    the same command runs its jobs."""
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10, 30))
    damaged = run_dir / "snapshots" / "step_00000030" / name
    original = damaged.read_bytes()
    damaged.write_bytes(original[: len(original) // 2])
    config = config_for(tmp_path, [run_dir])
    assert main([*cli_args(config), "--mode=once"]) == 1
    err = capsys.readouterr().err
    assert f"{damaged.parent} is refused, its jobs are not planned: " in err
    assert f"1 snapshot or run folder(s) refused, their jobs not planned:\n  {damaged.parent}: " in err
    assert f"{damaged} is damaged (" in err and "; restore it from a copy" in err
    assert [(r["pretrain_step"], r["status"]) for r in done_rows(config)] == [(10, "done")]
    damaged.write_bytes(original)
    assert schedule(config) == Left([], {})
    assert sorted(r["pretrain_step"] for r in done_rows(config)) == [10, 30]


def test_a_run_whose_id_was_damaged_waits_and_the_other_runs_are_fine_tuned(tmp_path: Path) -> None:
    """RUN/run_id keys every job of its run: damaged since, that run is named and planned no job; the other run's
    jobs run. Restored, the same command fine-tunes it."""
    post, pre = make_run(tmp_path, "post_ln", "post", steps=(10,)), make_run(tmp_path, "pre_ln", "pre", steps=(10,))
    run_id = (pre / "run_id").read_text()
    (pre / "run_id").write_text("")
    config = config_for(tmp_path, [post, pre])
    left = schedule(config)
    assert left.failures == [] and list(left.refused) == [str(pre.resolve())]
    assert "run_id is damaged" in left.refused[str(pre.resolve())]
    assert {r["run_name"] for r in done_rows(config)} == {"post_ln"}
    (pre / "run_id").write_text(run_id)
    assert schedule(config) == Left([], {})
    assert sorted(r["run_name"] for r in done_rows(config)) == ["post_ln", "pre_ln"]


def test_each_job_has_its_line_as_it_ends_beside_the_progress_bar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one worker the jobs run in the scheduler's process: each job's line comes as soon as it ended (not once
    its submission has run), on a line of its own after the job's progress bar, and the first finished job gives
    the time per step that the cost line could not."""
    from finetune import train

    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    config = config_for(tmp_path, [run_dir], seeds=[0, 1, 2], recipe={**QUICK, "progress": True})
    terminal = io.StringIO()  # stdout and the bar's stderr in one stream, as a terminal shows them
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    real = train.finetune

    def finetune(*args: Any, **kwargs: Any) -> Any:
        print(f"<job seed={args[4]} starts>", flush=True)
        return real(*args, **kwargs)

    monkeypatch.setattr(train, "finetune", finetune)
    assert schedule(config) == Left([], {})
    monkeypatch.undo()
    pieces = re.split(r"[\r\n]", terminal.getvalue())
    assert any(p.startswith("mrpc lr=0.001 seed=1:") and "|" in p for p in pieces)  # the bar was drawn
    assert all(p.startswith("done ") for p in pieces if "done mrpc" in p)  # and no line was written into it
    events = [p.split(" in ")[0] for p in pieces if re.match(r"<job|done |\d+ jobs", p)]
    label = "mrpc lr=0.001 seed={} step=10 (post_ln)"
    assert [re.sub(r"acc [\d.]+|x [\d.e-]+ s/step.*", "", e).strip() for e in events] == [
        "3 jobs to run: 6 fine-tuning steps (the time they take follows once the first job finishes; --step_time_s=S "
        "gives it now)",
        "<job seed=0 starts>", "done " + label.format(0), "2 jobs left: 4 fine-tuning steps",
        "<job seed=1 starts>", "done " + label.format(1),
        "<job seed=2 starts>", "done " + label.format(2),
    ]  # fmt: skip


def test_a_snapshot_is_hashed_once_per_process_until_its_files_change(tmp_path: Path, monkeypatch) -> None:
    from finetune import worker

    snapshot = make_run(tmp_path, "post_ln", "post", steps=(10,)) / "snapshots" / "step_00000010"
    calls = []
    real = worker.verify_manifest
    monkeypatch.setattr(worker, "verify_manifest", lambda path: calls.append(path) or real(path))
    worker.check_snapshot(snapshot)
    worker.check_snapshot(snapshot)
    assert len(calls) == 1  # the second job on the same snapshot does not hash it again
    weights = snapshot / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))  # a write changes the modification time: verified again, and refused
    with pytest.raises(worker.SnapshotRefused, match="damaged snapshot"):  # its jobs fail for good
        worker.check_snapshot(snapshot)
    assert len(calls) == 2


class StartsNothing(LocalArray):
    """Local workers that are recorded, not started: every task stays live until the test ends it."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.started: list[int] = []

    def start(self, manifest: Path, tasks: int, submission: int) -> str:
        self.started.append(tasks)
        return ""


def test_jobs_found_while_local_workers_run_wait_for_a_free_worker(tmp_path: Path) -> None:
    """Follow mode with --workers=2: a snapshot found while the first submission's two workers run adds no third
    worker (the cores are theirs). Once one worker is free it gets its share of the new jobs (2 of 3), not all of
    them: the last one waits for the other worker rather than queue behind them on one."""
    run_dir = make_run(tmp_path, "pre_ln", "pre", steps=(10,), incomplete_steps=(20,), status="running")
    config = config_for(tmp_path, [run_dir], seeds=[0, 1, 2], mode="follow", workers=2)
    backend, runtime = StartsNothing(2), runtime_settings(config)

    def todo() -> list[tuple[Any, int]]:
        return runnable(folder(config).jobs(), discover(config).specs, 3)

    assert submit(folder(config), backend, runtime, todo(), slots=free_slots(backend, live=0)) == 3
    snapshot = run_dir / "snapshots" / "step_00000020"
    write_manifest(snapshot)
    (snapshot / SNAPSHOT_MARKER).write_text("")
    assert [spec.pretrain_step for spec, _ in todo()] == [20, 20, 20]
    assert free_slots(backend, live=2) == 0
    assert submit(folder(config), backend, runtime, todo(), slots=free_slots(backend, live=2)) == 0
    assert submit(folder(config), backend, runtime, todo(), slots=free_slots(backend, live=1)) == 2
    assert len(todo()) == 1
    assert submit(folder(config), backend, runtime, todo(), slots=free_slots(backend, live=1)) == 1
    assert backend.started == [2, 1, 1]
    assert free_slots(SlurmArray(2, SlurmConfig()), live=5) == 2  # SLURM queues each array itself


def test_follow_picks_up_new_snapshots_until_the_run_ends(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "pre_ln", "pre", steps=(10,), incomplete_steps=(20,), status="running")
    config = config_for(tmp_path, [run_dir], mode="follow")
    follower = threading.Thread(target=schedule, args=(config,), daemon=True)
    follower.start()
    deadline = time.time() + 120
    while not done_rows(config):
        assert follower.is_alive() and time.time() < deadline
        time.sleep(0.1)
    assert follower.is_alive()  # the run is still going: keep following
    snapshot = run_dir / "snapshots" / "step_00000020"
    write_manifest(snapshot)  # the run finishes the snapshot as pretrain/run.py does: manifest, then the marker
    (snapshot / SNAPSHOT_MARKER).write_text("")
    set_status(run_dir, "pre_ln", "pre", "finished", 20)
    follower.join(timeout=120)
    assert not follower.is_alive()
    assert sorted(r["pretrain_step"] for r in done_rows(config)) == [10, 20]


def test_schedule_cli_errors(tmp_path: Path) -> None:
    runs = f"--runs=[{tmp_path}]"
    with pytest.raises(ValueError, match="backend must be one of local, slurm; got 'pbs'"):
        main([runs, "--backend", "pbs"])
    with pytest.raises(ValueError, match="valid tasks: mrpc, rte"):
        main([runs, "--tasks=[mrpc, qnli]"])
    with pytest.raises(ValueError, match=r"unknown key 'once'.*mode"):  # the old spelling: the valid keys are named
        main([runs, "--once"])
    with pytest.raises(FileNotFoundError, match=r"run folder.*nowhere"):
        main([f"--runs=[{tmp_path / 'nowhere'}]", "--mode=once"])
    with pytest.raises(FileNotFoundError, match=r"RTE/train\.tsv"):
        main([runs, "--data_dir", str(tmp_path), "--tasks=[rte]", "--mode=once"])
    with pytest.raises(ValueError, match=r"until='soon' is neither a duration"):
        main([runs, "--until=soon"])
    with pytest.raises(FileNotFoundError, match=r"results folder .*nothing\.d does not exist"):
        main(["status", f"--results_dir={tmp_path / 'nothing.d'}"])


def test_ctrl_c_requeues_the_interrupted_jobs_without_counting_an_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Ctrl-C must not print a raw KeyboardInterrupt, nor the rerun count the interrupted jobs as failed.
    from finetune.backends import InProcess

    run_dir = make_run(tmp_path, "post_ln", steps=(10,))
    argv = [f"--runs=[{run_dir}]", f"--results_dir={tmp_path / 'results.d'}", f"--data_dir={FIXTURE_GLUE}",
            "--tasks=[mrpc]", "--lrs=[1e-3]", "--seeds=[0, 1]", "--max_attempts=1",
            *(f"--recipe.{k}={v}" for k, v in QUICK.items())]  # fmt: skip

    def interrupted(self: InProcess, manifest: Path, tasks: int, submission: int) -> str:
        raise KeyboardInterrupt  # Ctrl-C while the first job runs in this process

    monkeypatch.setattr(InProcess, "start", interrupted)
    assert main(argv) == 130
    assert "interrupted: 2 unfinished job(s) queued again (not counted as failed attempts)" in capsys.readouterr().err
    results = ResultsFolder(tmp_path / "results.d")
    assert [(s.status, s.attempts) for s in results.jobs().values()] == [("queued", 0), ("queued", 0)]
    monkeypatch.undo()
    assert main(argv) == 0  # one attempt allowed, and it was not used up by the interruption
    assert [(s.status, s.attempts) for s in results.jobs().values()] == [("done", 1), ("done", 1)]


def test_ctrl_c_stops_a_scheduler_started_in_the_background_of_a_script(tmp_path: Path) -> None:
    """Bash starts a script's background jobs with SIGINT ignored (launch/reproduce_cpu.sh starts the scheduler
    so); Ctrl-C, which reaches every process of the script, still stops the scheduler, with the message that says
    how to continue."""
    run_dir = make_run(tmp_path, "pre_ln", "pre", steps=(10,), incomplete_steps=(20,), status="running")
    config = config_for(tmp_path, [run_dir], mode="follow")
    proc = subprocess.Popen(
        [sys.executable, "-m", "finetune.schedule", *cli_args(config), "--mode=follow", "--poll_interval_s=0.2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as bash does for `command &`
    )
    try:
        deadline = time.time() + 120
        while not (Path(config.results_dir) / "manifests").is_dir():  # the scheduler is in its loop
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "Run the same command to continue" in err


def test_the_comparison_script_ends_with_the_commands_that_fine_tune_its_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """launch/compare_placements.sh, its pretraining runs stood in for, ends with the scheduler and report commands
    on the two runs it made; both parse, from the checkout the script names."""
    from finetune.report import ReportConfig
    from pretrain.common.cli import parse

    fake = tmp_path / "fake_run"
    fake.write_text(
        "out=$(printf '%s\\n' \"$@\" | sed -n 's/^--train.output_dir=//p')\nmkdir -p \"$out\"\n"
        "printf '{\"status\": \"finished\"}' > \"$out/status.json\"\n"
        "echo '{\"step\": 2, \"val/mlm_loss\": 7.5}' > \"$out/metrics.jsonl\"\n"
    )
    out = tmp_path / "compare"
    result = subprocess.run(["bash", str(ROOT / "launch" / "compare_placements.sh"), "small"], cwd=tmp_path,
                            env={**os.environ, "LAUNCH": f"bash {fake}", "OUT": str(out)}, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"next (from {ROOT}): fine-tune every snapshot of both runs" in result.stdout
    commands = [shlex.split(line) for line in result.stdout.splitlines() if line.startswith("  python -m finetune.")]
    assert [c[:3] for c in commands] == [["python", "-m", "finetune.schedule"], ["python", "-m", "finetune.report"]]
    monkeypatch.chdir(ROOT)
    runs = [str(out / "post"), str(out / "pre")]
    assert parse(ScheduleConfig, commands[0][3:], prog="schedule").runs == runs
    assert parse(ReportConfig, commands[1][3:], prog="report").runs == runs


# --- Results that would make the scheduler loop, a deleted snapshot, a replaced lock -------------


def bounded_starts(monkeypatch: pytest.MonkeyPatch, limit: int = 4) -> list[int]:
    """In-process submissions run as usual, but a scheduler that submits more than ``limit`` times fails the test
    (a loop, bounded) instead of running on."""
    starts, real = [], InProcess.start

    def start(self: InProcess, manifest: Path, tasks: int, submission: int) -> str:
        starts.append(submission)
        assert len(starts) <= limit, f"submitted {len(starts)} times: the scheduler loops"
        return real(self, manifest, tasks, submission)

    monkeypatch.setattr(InProcess, "start", start)
    return starts


def spoil(path: Path, kind: str, other: Path) -> None:
    """Give a result file content a task never writes there."""
    payload = json.loads(path.read_text())
    if kind == "another job's":
        payload = json.loads(other.read_text())  # cp done/OTHER.json done/THIS.json
    elif kind == "a list":
        payload = []
    elif kind == "no results":
        del payload["results"]
    elif kind == "accuracy 2.0":
        payload["results"]["accuracy"] = 2.0
    elif kind == "a null loss":
        payload["results"]["dev_loss"] = None
    path.write_text(json.dumps(payload))


@pytest.mark.parametrize("kind", ["another job's", "a list", "no results", "accuracy 2.0", "a null loss"])
def test_a_damaged_result_file_is_set_aside_and_its_job_runs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """Result files are written atomically, so one a task never writes was damaged since: another job's result
    under this job's name (every task would skip the job while the folder counts the other), a list, a result
    without its results, an accuracy outside [0, 1], a loss of null. Status, the report and the scheduler each move it to damaged/
    (kept, never read again) and say so; its job counts as not done, and the same scheduler command runs it again to
    the same numbers, then runs nothing. (In-process tasks charge no attempt anyway; tests/test_finetune.py has the
    attempt a task that ended by itself is not charged.)"""
    from finetune.report import cli as report_cli

    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    config = config_for(tmp_path, [run_dir], seeds=[0, 1])
    starts = bounded_starts(monkeypatch)
    assert schedule(config) == Left([], {}) and starts == [1]
    other, spoiled = sorted((Path(config.results_dir) / "done").glob("*.json"))
    good = spoiled.read_text()
    report_args = [f"--runs=[{run_dir}]", f"--results_dir={config.results_dir}", "--tasks=[mrpc]", f"--out={tmp_path}"]
    commands = {
        "status": (schedule_cli, ["status", f"--results_dir={config.results_dir}"]),
        "report": (report_cli, report_args),
        "scheduler": (schedule_cli, [*cli_args(config), "--mode=once"]),
    }
    for count, (name, (cli, argv)) in enumerate(commands.items(), start=1):
        spoiled.write_text(good)
        spoil(spoiled, kind, other)
        monkeypatch.setattr(sys, "argv", ["prog", *argv])
        assert cli() == 0, name
        err = capsys.readouterr().err
        assert f"warning: {spoiled} " in err and "moved to" in err and "its job runs again" in err, (name, err)
        assert len(list((Path(config.results_dir) / "damaged").iterdir())) == count, name
    rerun, before = (json.loads(text)["results"] for text in (spoiled.read_text(), good))
    assert starts == [1, 2] and rerun | {"wall_time_s": 0} == before | {"wall_time_s": 0}  # the same numbers
    assert {state.status for state in folder(config).jobs().values()} == {"done"}
    assert schedule(config) == Left([], {}) and starts == [1, 2]


def test_a_result_file_that_cannot_be_read_is_named_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A result file that cannot be read at all (a folder here; for a non-root user, one without read permission)
    is not damage this code can set aside: status and the scheduler name it with the fix and exit code 2."""
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    config = config_for(tmp_path, [run_dir], seeds=[0])
    (spec,) = discover(config).specs
    folder(config).write_done(ManifestJob(spec, 1), 1, results())
    (spoiled,) = (Path(config.results_dir) / "done").glob("*.json")
    spoiled.unlink()
    spoiled.mkdir()
    for argv in (["status", f"--results_dir={config.results_dir}"], [*cli_args(config), "--mode=once"]):
        monkeypatch.setattr(sys, "argv", ["prog", *argv])
        assert schedule_cli() == 2, argv
        err = capsys.readouterr().err
        assert f"error: {spoiled} cannot be read" in err and "move it aside and run the command again" in err, err


def test_a_damaged_manifest_is_named_by_status_and_scheduler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A manifest edited by hand or cut to another shape (a field missing) is named with what to do and exit code 2,
    not a traceback."""
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    config = config_for(tmp_path, [run_dir], seeds=[0])
    assert schedule(config) == Left([], {})
    manifest = next((Path(config.results_dir) / "manifests").glob("*.json"))
    payload = json.loads(manifest.read_text())
    del payload["jobs"]
    manifest.write_text(json.dumps(payload))
    for argv in ([*cli_args(config), "--mode=once"], ["status", f"--results_dir={config.results_dir}"]):
        monkeypatch.setattr(sys, "argv", ["prog", *argv])
        assert schedule_cli() == 2, argv
        err = capsys.readouterr().err
        assert f"error: {manifest} is not a manifest the scheduler writes (no field 'jobs')" in err, err


def test_a_scheduler_whose_submissions_make_no_progress_stops_instead_of_submitting_them_for_ever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Whatever makes the tasks end without finishing, failing or being charged for a job (here: tasks that do
    nothing), the same jobs with the same attempts are not submitted for ever: under SLURM an sbatch every pass."""
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    config = config_for(tmp_path, [run_dir], seeds=[0, 1])
    starts: list[int] = []

    def start(self: InProcess, manifest: Path, tasks: int, submission: int) -> str:
        starts.append(submission)
        assert len(starts) <= 6, "submitted again and again: the scheduler loops"
        return ""  # the task skipped every job

    monkeypatch.setattr(InProcess, "start", start)
    monkeypatch.setattr(sys, "argv", ["prog", *cli_args(config), "--mode=once"])
    assert schedule_cli() == 2
    err = capsys.readouterr().err
    assert "error: 2 job(s) (mrpc lr=0.001 seed=0 step=10 (post_ln), ...) were submitted 3 times as they were" in err
    assert starts == [1, 2, 3]  # a task preempted before it reached its jobs is not cause enough to stop
    # finetune.run submits its grid the same way, and stops the same way.
    from finetune.run import cli as run_cli

    snapshot = run_dir / "snapshots" / "step_00000010"
    argv = [f"--model={snapshot}", "--task=mrpc", f"--results_dir={config.results_dir}", f"--data_dir={FIXTURE_GLUE}",
            "--lrs=[1e-3]", "--seeds=[5]", *(f"--recipe.{k}={v}" for k, v in QUICK.items())]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["prog", *argv])
    assert run_cli() == 2
    assert "error: 1 job(s) (mrpc lr=0.001 seed=5 step=10 (post_ln)) were submitted 3 times" in capsys.readouterr().err
    assert starts == [1, 2, 3, 4, 5, 6]
    monkeypatch.undo()
    monkeypatch.setattr(sys, "argv", ["prog", *cli_args(config), "--mode=once"])
    assert schedule_cli() == 0  # tasks that run their jobs: the same command continues
    assert len(done_rows(config)) == 2


def test_a_snapshot_deleted_after_its_jobs_were_planned_fails_them_for_good_until_it_is_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from finetune.report import ReportConfig, report

    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10, 20))
    config = config_for(tmp_path, [run_dir], seeds=[0, 1])
    assert pass_with(config, NeverRuns()) == 4  # planned and submitted; its scheduler killed before they ran
    snapshot, aside = run_dir / "snapshots" / "step_00000020", tmp_path / "aside"
    snapshot.rename(aside)
    failures = schedule(config).failures
    assert [(f.spec.pretrain_step, f.status, f.permanent) for f in failures] == [(20, "failed", True)] * 2
    assert f"snapshot {snapshot} no longer exists" in failures[0].error
    assert len(done_rows(config)) == 2
    # Skipped while it is gone: a rerun submits nothing and says why; status counts them failed, not retrying.
    before = submitted(config)
    assert main([*cli_args(config), "--mode=once"]) == 1
    assert "2 job(s) failed for good: their snapshot was refused" in capsys.readouterr().err
    assert submitted(config) == before
    assert main(["status", f"--results_dir={config.results_dir}"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1].split()[1:] == ["0", "0", "2", "2", "0"]
    assert err.count("step 20 mrpc lr=0.001 seed=") == 2 and err.count(f"snapshot {snapshot} no longer exists") == 2
    # The report names the points that lack them, and why.
    result = report(ReportConfig(runs=[str(run_dir)], results_dir=config.results_dir, tasks=["mrpc"],
                                 out=str(tmp_path / "fig")))  # fmt: skip
    (missing,) = [w for w in result["warnings"] if "Failed for good" in w]
    assert "post_ln (post) step 20 (MRPC: 2 jobs)" in missing and f"snapshot {snapshot} no longer exists" in missing
    # Back where it was: its jobs run.
    aside.rename(snapshot)
    assert schedule(config) == Left([], {})
    assert len(done_rows(config)) == 4


class ReplacesTheLock(InProcess):
    """A task that fails its jobs, during which someone deletes the lock file and a second scheduler makes a new
    one."""

    def start(self, manifest: Path, tasks: int, submission: int) -> str:
        lock = manifest.parent.parent / LOCK
        lock.unlink()
        lock.write_text("")
        for job in load_manifest(manifest).jobs:  # failed with attempts left: to be submitted again
            ResultsFolder(lock.parent).write_failed(job, submission, "RuntimeError: out of memory")
        return ""


def test_a_scheduler_whose_lock_file_was_replaced_stops_before_its_next_submission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    config = config_for(tmp_path, [run_dir], seeds=[0, 1], max_attempts=3)
    monkeypatch.setattr(finetune.schedule, "InProcess", ReplacesTheLock)
    with pytest.raises(ResultsBusy, match=r"lock file .*lock was deleted or replaced while this scheduler held it"):
        schedule(config)
    assert len(manifests(config)) == 1  # the failed jobs were not submitted again


def test_a_scheduler_running_its_jobs_itself_stops_before_its_next_job_once_its_lock_file_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one worker, every job is in the scheduler's one submission: were the lock checked at submissions only,
    it would run them all beside the second scheduler that the new lock file let in. The same command continues,
    charging no attempt."""
    from finetune import train

    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    config = config_for(tmp_path, [run_dir], seeds=[0, 1, 2])
    ran = []

    def finetune(*args: Any, **kwargs: Any) -> Any:
        ran.append(args[4])  # the seed
        if len(ran) == 1:
            lock = Path(config.results_dir) / LOCK
            lock.unlink()
            lock.write_text("")  # a second scheduler's, beside the one held
        return results()

    monkeypatch.setattr(train, "finetune", finetune)
    with pytest.raises(ResultsBusy, match=r"lock file .*lock was deleted or replaced"):
        schedule(config)
    assert ran == [0] and len(done_rows(config)) == 1
    assert schedule(config) == Left([], {}) and ran == [0, 1, 2]
    assert submitted(config) == [(0, 1), (1, 1), (2, 1), (1, 1), (2, 1)]


def test_the_lock_file_says_it_is_safe_to_leave(tmp_path: Path) -> None:
    """A killed scheduler's lock file still names it; what it says must not invite its deletion."""
    folder = ResultsFolder(tmp_path / "results")
    with folder.lock():
        note = json.loads((folder.root / LOCK).read_text())["note"]
    assert "a dead holder's lock is free: leave this file in place" in note


def test_a_killed_schedulers_temporary_manifest_is_removed_by_the_next(tmp_path: Path) -> None:
    folder = ResultsFolder(tmp_path / "results")
    (folder.root / "manifests").mkdir(parents=True)
    left = folder.root / "manifests" / ".000001.json.k2j4h5.tmp"  # killed while writing submission 1
    left.write_text('{"format_ver')
    with folder.lock():
        assert not left.exists()
    assert folder.manifests() == []
