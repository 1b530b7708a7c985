"""Fine-tuning at cluster scale: array tasks that only see a manifest and write result files (fake SLURM),
exactly-once results under kills, requeues and duplicate runs, the jobs as the results folder says, run identity,
retrying failed jobs with corrected input, follow mode ending on a dead run, orphaned workers."""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import finetune.backends as backends
from finetune.backends import SlurmArray, SlurmConfig
from finetune.manifest import ManifestJob, ResultsFolder, charged
from finetune.report import ReportConfig, report
from finetune.schedule import Left, ScheduleConfig, main, parse_until, run_state, schedule, status_lines
from finetune.worker import hung_message
from pretrain.run_folder.manifest import write_manifest
from pretrain.run_folder.status import EXIT_HUNG
from tests.fake_slurm import FakeSlurm
from tests.finetune_fixtures import FIXTURE_GLUE, QUICK, config_for, job_spec, make_run, results

ROOT = Path(__file__).resolve().parents[1]


def rows(config: ScheduleConfig, status: str | None = None) -> list[dict[str, Any]]:
    states = ResultsFolder(config.results_dir).jobs().values()
    return [s.row() for s in states if status is None or s.status == status]


def folder(config: ScheduleConfig) -> ResultsFolder:
    return ResultsFolder(config.results_dir)


def done_files(config: ScheduleConfig) -> dict[str, dict[str, Any]]:
    """Result files by key, as written (one file per key: a job is never recorded twice)."""
    return {path.stem: json.loads(path.read_text()) for path in (Path(config.results_dir) / "done").glob("*.json")}


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    fake = FakeSlurm(tmp_path / "fake_slurm")
    fake.root.mkdir()
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    yield fake
    fake.stop_all()


def slurm_config(tmp_path: Path, runs: list[Path], **overrides: Any) -> ScheduleConfig:
    slurm = dict(dir=str(tmp_path / "slurm"), cpus_per_task=1, python=sys.executable, **overrides.pop("slurm", {}))
    return config_for(tmp_path, runs, backend="slurm", slurm=slurm, **overrides)


def in_thread(config: ScheduleConfig) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(schedule(config)), daemon=True)
    thread.start()
    return thread, out


# A task's closing line, wherever it starts: copies of a task share one log, and the other copy's progress bar
# ("\rLoading weights: 40%|...", no newline until it closes) can sit in front of it when the two interleave.
CLOSING_LINE = re.compile(r"task \d+ of \S+: (done \d+(?:, [a-z]+ \d+)*)")


def task_counts(log_dir: Path) -> list[dict[str, int]]:
    """The closing line of every task run in the array logs: {done, duplicate, skipped, failed, orphaned}."""
    counts = []
    for path in sorted(log_dir.glob("*.out")):
        for match in CLOSING_LINE.finditer(path.read_text()):
            counts.append({k: int(v) for k, v in (pair.split() for pair in match.group(1).split(", "))})
    return counts


# --------------------------------------------------------------------------------------------------
# SLURM (fake): preemption with and without requeue, duplicate copies, a task run twice
# --------------------------------------------------------------------------------------------------


@pytest.mark.slow  # array tasks are processes that import torch: ~30 s on 2 busy cores
def test_preempted_task_is_requeued_by_slurm_and_every_job_is_done_once(tmp_path: Path, slurm: FakeSlurm) -> None:
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    # Three jobs of a second or so per task, so that the preemption lands while task 0 still has work.
    slurm_options = {"partition": "cpu", "extra": ["--account=abc"]}
    config = slurm_config(
        tmp_path, [run_dir], seeds=[0, 1, 2, 3, 4, 5], workers=2, recipe={**QUICK, "epochs": 100}, slurm=slurm_options
    )
    thread, out = in_thread(config)
    slurm.wait_until(lambda: any(f["worker"].get("slurm_array_task_id") == "0" for f in done_files(config).values()))
    slurm.preempt("1000_0")
    thread.join(timeout=300)
    assert out == [Left([], {})]  # no job failed for good
    assert slurm.tasks()["1000_0"]["runs"] == 2 and slurm.tasks()["1000_0"]["state"] == "COMPLETED"
    assert len(slurm.calls()) == 1  # SLURM requeued the task: the scheduler submitted nothing again
    done = rows(config, "done")
    assert len(done) == 6 and sorted(done_files(config)) == sorted(r["key"] for r in done)
    assert all(r["attempts"] == 1 for r in done)
    # The requeued run skipped the job its first run had finished.
    assert sum(c["skipped"] for c in task_counts(tmp_path / "slurm")) >= 1
    script = next((tmp_path / "slurm").glob("*.sbatch")).read_text().splitlines()
    for line in ("--array=0-1", "--requeue", "--partition=cpu", "--account=abc", "--cpus-per-task=1"):
        assert f"#SBATCH {line}" in script
    assert script[-1].split()[2:5] == ["-m", "finetune.worker", str(folder(config).manifest_path(1))]


@pytest.mark.slow  # two submissions of array-task processes: ~30 s on 2 busy cores
def test_task_preempted_without_requeue_is_found_and_resubmitted(tmp_path: Path, slurm: FakeSlurm) -> None:
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    config = slurm_config(tmp_path, [run_dir], seeds=[0, 1], slurm={"requeue": False})
    thread, out = in_thread(config)
    slurm.wait_until(lambda: slurm.tasks().get("1000_0", {}).get("state") == "RUNNING")
    slurm.preempt("1000_0")  # before the task wrote any result
    thread.join(timeout=300)
    assert out == [Left([], {})]
    assert [c["job"] for c in slurm.calls()] == [1000, 1001]  # the missing results were submitted again
    done = rows(config, "done")
    # Only a job the preempted task had started is charged the attempt; one it never reached is not.
    started = {r["key"]: folder(config).started_path(r["key"], 1).is_file() for r in done}
    assert len(done) == 2 and all(r["attempts"] == 1 + started[r["key"]] for r in done)
    first, second = folder(config).manifests()
    assert first.ended == {0: "sacct: PREEMPTED"} and second.ended == {0: "sacct: COMPLETED"}
    manifest = json.loads(folder(config).manifest_path(2).read_text())
    assert {j["key"]: j["attempt"] for j in manifest["jobs"]} == {k: 1 + s for k, s in started.items()}


@pytest.mark.slow  # three array-task processes: ~30 s on 2 busy cores
def test_duplicate_copies_and_a_task_run_twice_record_each_job_once(
    tmp_path: Path, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = make_run(tmp_path, "pre_ln", "pre", steps=(10,))
    config = slurm_config(tmp_path, [run_dir], seeds=[0, 1])
    monkeypatch.setenv("FAKE_SLURM_COPIES", "2")  # the task runs twice at once, on "two nodes"
    assert schedule(config) == Left([], {})
    # The scheduler prints each job's line once, as it reads its result file; the task's log has them too.
    lines = re.findall(r"^done mrpc lr=0\.001 seed=(\d) step=10 \(pre_ln\) acc [\d.]+ in \d+ s$", capsys.readouterr().out,
                       re.M)  # fmt: skip
    assert sorted(lines) == ["0", "1"]
    logs = "".join(path.read_text() for path in (tmp_path / "slurm").glob("*.out"))
    assert len(re.findall(r"^done mrpc lr=0\.001 seed=\d step=10 \(pre_ln\)", logs, re.M)) == 2
    counts = task_counts(tmp_path / "slurm")
    assert len(counts) == 2 and sum(c["done"] for c in counts) == 2  # each result written exactly once
    assert sum(c["done"] + c["duplicate"] + c["skipped"] for c in counts) == 4
    files = done_files(config)
    before = {key: folder(config).done_path(key).read_bytes() for key in files}
    assert sorted(files) == sorted(r["key"] for r in rows(config, "done"))
    # Run the finished task once more (a requeue after it had ended): nothing is computed or changed.
    monkeypatch.setenv("FAKE_SLURM_COPIES", "1")
    done_rows = rows(config, "done")
    subprocess.run(["scontrol", "requeue", "1000_0"], check=True)
    slurm.wait_until(lambda: slurm.tasks()["1000_0"]["state"] == "COMPLETED" and slurm.tasks()["1000_0"]["runs"] == 2)
    assert task_counts(tmp_path / "slurm")[-1]["skipped"] == 2
    assert {key: folder(config).done_path(key).read_bytes() for key in files} == before
    assert rows(config, "done") == done_rows


# --------------------------------------------------------------------------------------------------
# The results folder alone: a new scheduler continues from it; results keyed by run identity
# --------------------------------------------------------------------------------------------------


def test_a_scheduler_started_again_has_nothing_to_redo(tmp_path: Path) -> None:
    good = make_run(tmp_path, "pre_ln", "pre", steps=(10, 20))
    bad = make_run(tmp_path, "post_ln", "post", steps=(10,))
    (bad / "snapshots" / "step_00000010" / "model.safetensors").write_bytes(b"not a safetensors file")
    write_manifest(bad / "snapshots" / "step_00000010")  # as its run wrote it: retried, not refused for good
    config = config_for(tmp_path, [good, bad], seeds=[0, 1], max_attempts=2)
    failures = schedule(config).failures
    assert len(failures) == 2 and all(f.attempts == 2 and "Error" in f.error for f in failures)
    before = rows(config)
    assert sorted(r["status"] for r in before) == ["done"] * 4 + ["failed"] * 2
    submissions = len(folder(config).manifests())
    assert len(schedule(config).failures) == 2  # the same command again: the files say what is done and what failed
    assert len(folder(config).manifests()) == submissions and rows(config) == before


def test_two_runs_of_one_name_stay_apart_and_a_moved_run_keeps_its_results(tmp_path: Path) -> None:
    # Same name, same placement, same initial weights (the fixture seeds by step): only the run id differs.
    a = make_run(tmp_path / "a", "post_ln", "post", steps=(10,))
    b = make_run(tmp_path / "b", "post_ln", "post", steps=(10,))
    c = make_run(tmp_path / "c", "post_ln", "post", steps=(10,))  # never fine-tuned
    config = config_for(tmp_path, [a, b], seeds=[0, 1])
    assert schedule(config) == Left([], {})
    done = rows(config, "done")
    assert len(done) == 4 and len({r["run_id"] for r in done}) == 2
    assert len(status_lines(folder(config).jobs(), 3)) == 4  # two lines in the status table, not one
    result = report(ReportConfig(runs=[str(a), str(b), str(c)], results_dir=config.results_dir,
                                 out=str(tmp_path / "fig")))  # fmt: skip
    points = {p["run"]: p for p in result["points"]}
    ids = [(run / "run_id").read_text().strip() for run in (a, b)]
    assert sorted(points) == sorted(f"post_ln (post) [{i}]" for i in ids)  # and c borrows nobody's rows
    assert all(p["seeds"] == 2 for p in points.values())
    # A run folder moved elsewhere is the same run: no new jobs, and the report still finds its results.
    moved = shutil.move(str(a), str(tmp_path / "elsewhere"))
    assert schedule(config_for(tmp_path, [Path(moved)], seeds=[0, 1])) == Left([], {})
    assert len(rows(config)) == 4
    result = report(ReportConfig(runs=[moved], results_dir=config.results_dir, out=str(tmp_path / "fig2")))
    assert [p["seeds"] for p in result["points"]] == [2]


def test_report_refuses_one_run_given_twice(tmp_path: Path) -> None:
    a = make_run(tmp_path, "post_ln", "post", steps=(10,))
    with pytest.raises(ValueError, match="names one run twice"):
        report(ReportConfig(runs=[str(a), str(a)], results_dir=str(tmp_path / "s.d"), out=str(tmp_path / "f")))


def test_result_files_follow_the_umask_and_the_first_copy_wins(tmp_path: Path) -> None:
    spec = job_spec(run_id="r1", run_dir="/x", model_path="/x/m", pretrain_step=10, lr=1e-3, recipe={"epochs": 1})
    done = ResultsFolder(tmp_path / "results")
    old = os.umask(0o022)
    try:
        assert done.write_done(ManifestJob(spec, 1), 1, results(accuracy=0.5))
        assert not done.write_done(ManifestJob(spec, 2), 2, results(accuracy=0.9))  # a second copy is dropped
    finally:
        os.umask(old)
    path = done.done_path(spec.key)
    assert path.stat().st_mode & 0o777 == 0o644
    assert json.loads(path.read_text())["results"]["accuracy"] == 0.5
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind
    # The key ignores where the run is and what it is called, not which run it is.
    moved = replace(spec, run_dir="/y", model_path="/y/m", run_name="renamed", placement="?", tokens_seen=5)
    assert moved.key == spec.key and replace(spec, run_id="r2").key != spec.key


# --------------------------------------------------------------------------------------------------
# Failed jobs, exit codes, follow mode, local workers and their scheduler
# --------------------------------------------------------------------------------------------------


def cli_args(config: ScheduleConfig) -> list[str]:
    args = [f"--runs={json.dumps(config.runs)}", f"--results_dir={config.results_dir}", "--tasks=[mrpc]"]
    args += ["--lrs=[1e-3]", "--seeds=[0]", "--poll_interval_s=0.2", "--mode=once"]
    args += [f"--recipe.{k}={json.dumps(v)}" for k, v in QUICK.items()]
    return args


def test_failed_jobs_exit_nonzero_and_a_corrected_data_dir_retries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    config = config_for(tmp_path, [run_dir], data_dir=None, max_attempts=1)
    # No --data_dir: the job tries the Hub, which is offline here.
    assert main([*cli_args(config), "--max_attempts=1"]) == 1
    err = capsys.readouterr().err
    assert "1 job(s) failed every attempt" in err and "Hub" in err and "--retry_failed=true" in err
    fixed = [*cli_args(config), "--max_attempts=1", f"--data_dir={FIXTURE_GLUE}"]
    assert main(fixed) == 1  # fixing the input alone does not retry what failed for good
    assert main([*fixed, "--retry_failed=true"]) == 0  # the corrected data_dir comes from this command
    (row,) = rows(config)
    assert (row["status"], row["attempts"], row["error"]) == ("done", 1, None)


def test_follow_ends_on_a_dead_run_and_at_until(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = make_run(tmp_path, "pre_ln", "pre", steps=(10,), status="running")
    config = config_for(tmp_path, [run_dir], mode="follow", dead_after_min=1)
    assert run_state(run_dir, 1) == "running"
    assert schedule(config_for(tmp_path, [run_dir], mode="follow", until="1s")) == Left([], {})  # alive: --until ends it
    assert "stopping at --until" in capsys.readouterr().out
    # It crashed without saying so: status.json still says running, but its heartbeat is 2 minutes old.
    status = json.loads((run_dir / "status.json").read_text())
    stale = datetime.datetime.fromtimestamp(time.time() - 120, datetime.timezone.utc).isoformat()
    (run_dir / "status.json").write_text(json.dumps({**status, "updated": stale}))
    assert run_state(run_dir, 1) == "dead" and run_state(run_dir, 3) == "running"
    assert schedule(config) == Left([], {})
    assert f"every run ended: {run_dir} dead" in capsys.readouterr().out
    assert len(rows(config, "done")) == 1


def test_until_accepts_durations_and_dates() -> None:
    assert parse_until("90m", now=1000.0) == 1000.0 + 5400
    assert parse_until("2h", now=0.0) == 7200
    assert parse_until("2026-12-01T06:00:00+00:00") == 1796104800.0
    with pytest.raises(ValueError, match="neither a duration"):
        parse_until("tomorrow")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"  # a zombie has stopped; only its parent's reaping is left


@pytest.mark.slow  # a scheduler and two worker processes import torch: ~30 s on 2 busy cores
def test_killed_scheduler_stops_its_workers_and_a_restart_records_each_job_once(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    config = config_for(tmp_path, [run_dir], seeds=[0, 1, 2, 3, 4, 5], workers=2, recipe={**QUICK, "epochs": 30})
    args = [a for a in cli_args(config) if not a.startswith("--seeds")] + ["--seeds=[0, 1, 2, 3, 4, 5]", "--workers=2"]
    args += ["--recipe.epochs=30", f"--data_dir={FIXTURE_GLUE}"]
    process = subprocess.Popen(
        [sys.executable, "-m", "finetune.schedule", *args], cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL
    )
    deadline = time.time() + 240
    while not done_files(config):
        assert process.poll() is None and time.time() < deadline
        time.sleep(0.1)
    (manifest,) = folder(config).manifests()
    workers = [int(p) for p in manifest.handle.split(":")[1].split(",")]
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    killed_at = len(done_files(config))
    deadline = time.time() + 60
    while any(_alive(pid) for pid in workers):  # each finishes the job it holds, then stops
        assert time.time() < deadline, "workers kept running after their scheduler was killed"
        time.sleep(0.1)
    assert len(done_files(config)) <= killed_at + 2 < 6
    # The worker processes (not the scheduler) wrote them: the local "array" runs the same task code as SLURM.
    # (A worker still importing torch when the scheduler died runs no job at all.)
    assert {f["worker"]["pid"] for f in done_files(config).values()} <= set(workers) and len(workers) == 2
    assert schedule(config) == Left([], {})  # the restart, with two local workers again, finishes the rest
    assert len(done_files(config)) == 6 and len(rows(config, "done")) == 6


def test_a_refused_sbatch_is_an_error_and_a_failed_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: invalid partition specified: gpu' >&2\nexit 1\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    config = slurm_config(tmp_path, [run_dir])
    args = [*cli_args(config), "--backend=slurm", f"--slurm.dir={tmp_path / 'slurm'}", "--slurm.partition=gpu"]
    assert main(args) == 2
    assert "invalid partition specified: gpu" in capsys.readouterr().err
    (row,) = rows(config)
    assert (row["status"], row["attempts"]) == ("failed", 1) and "not started: sbatch" in row["error"]


def _stop_a_worker_inside_a_job(config: ScheduleConfig, deadline: float) -> tuple[str, int]:
    """SIGSTOP a local worker while it runs a job, once a job has finished (a step time is measured): (key, pid)."""
    started = Path(config.results_dir) / "started"
    while time.time() < deadline:
        done = done_files(config)
        for path in started.glob("*.json") if done else []:
            key, pid = path.name.split(".")[0], json.loads(path.read_text())["worker"]["pid"]
            if key in done or not _alive(pid):
                continue
            os.kill(pid, signal.SIGSTOP)
            if key not in done_files(config):  # stopped inside the job, not just after it
                return key, pid
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.02)
    raise AssertionError("no job was caught running")


HUNG_SCHEDULER = """
import sys
from pathlib import Path
import finetune.worker as worker
from finetune.schedule import schedule
from tests.finetune_fixtures import config_for
worker.HUNG_FLOOR_S = 5.0
schedule(config_for(Path(sys.argv[1]), [Path(sys.argv[2])], seeds=[0, 1]))
"""


def test_a_job_whose_steps_stop_stops_its_process_is_charged_and_runs_again(tmp_path: Path) -> None:
    """In the scheduler's own process (workers 1, where nothing outside could kill it): the first job hangs after its
    first step (``LNBERT_HANG_AT``, a sleep that never ends); its watchdog stops the process after HUNG_FLOOR_S (5 s
    here) with exit code 3 and every thread's stack, the attempt recorded as failed with the reason. The same
    command then runs it again (attempt 2) and the other job, and ends."""
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LNBERT_HANG_AT": "finetune_step:2", "OMP_NUM_THREADS": "1"}
    hung = subprocess.run([sys.executable, "-c", HUNG_SCHEDULER, str(tmp_path), str(run_dir)], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert hung.returncode == EXIT_HUNG, hung.stderr[-3000:]
    assert "Hung: no step finished for 5 s after step 1" in hung.stderr and "in fault_point" in hung.stderr
    config = config_for(tmp_path, [run_dir], seeds=[0, 1])
    failed = {path.name.split(".")[0]: json.loads(path.read_text())  # KEY.SUBMISSION.WORKER.json
              for path in (Path(config.results_dir) / "failed").glob("*.json")}  # fmt: skip
    assert [(f["attempt"], f["error"]) for f in failed.values()] == [(1, hung_message(1).replace("600", "5"))]
    assert schedule(config) == Left([], {})
    done = done_files(config)
    assert len(done) == 2 and [done[key]["attempt"] for key in failed] == [2]


def test_a_task_stopped_by_its_watchdog_charges_only_the_job_it_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exit code 3 (EXIT_HUNG): the hung job recorded its own failure; the task's jobs not started go again free. A
    SLURM task's exit code comes from sacct's ExitCode (CODE:SIGNAL), read as a local worker's."""
    assert not charged(f"exit code {EXIT_HUNG}", started=False)
    assert charged(f"exit code {EXIT_HUNG}", started=True)  # where its record could not be written
    assert charged("exit code 1", started=False)  # a task that failed by itself: every job
    sacct = "7_0|FAILED|3:0\n7_1|FAILED|1:0\n7_2|TIMEOUT|0:15\n7_3|COMPLETED|0:0\n7.batch|FAILED|3:0\n"
    monkeypatch.setattr(backends, "_slurm", lambda command: sacct)
    states = SlurmArray(4, SlurmConfig()).states("7")
    assert states == {0: "exit code 3", 1: "sacct: FAILED", 2: "sacct: TIMEOUT", 3: "sacct: COMPLETED"}
    assert [charged(states[t], started=False) for t in range(4)] == [False, True, False, False]


@pytest.mark.slow  # two worker processes import torch
def test_a_hung_local_worker_is_killed_and_its_job_charged_and_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A worker stopped inside a job (SIGSTOP: as hung as a process gets) is killed once the job has run hung_after
    times its expected time, the attempt is charged with the reason, and the job runs again: the scheduler ends."""
    import finetune.schedule as schedule_module

    monkeypatch.setattr(schedule_module, "HUNG_FLOOR_S", 8.0)  # a job here takes about 1 s, more on a busy machine
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    config = config_for(tmp_path, [run_dir], seeds=[0, 1, 2, 3], workers=2, poll_interval_s=0.2, hung_after=3.0)
    thread, out = in_thread(config)
    key, pid = _stop_a_worker_inside_a_job(config, time.time() + 240)
    thread.join(timeout=240)
    assert not thread.is_alive() and out == [Left([], {})]
    assert not _alive(pid) and len(done_files(config)) == 4
    assert done_files(config)[key]["attempt"] == 2
    err = capsys.readouterr().err
    assert re.search(r"job mrpc lr=\S+ seed=\d step=10 \(post_ln\): taken for hung after [\d.]+ min, 3 x its expected "
                     rf"[\d.]+ min; its worker \(pid {pid}\) is killed", err)  # fmt: skip
