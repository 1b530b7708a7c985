"""Faults lose nothing and are never used silently: snapshots survive kills, damaged checkpoints are refused,
a run folder never gets stuck, status.json tells a dead run from a live one, files follow the umask.

Kills at chosen moments use the ``LNBERT_KILL_AT=point:step`` hook of pretrain/run_folder/checkpointing.py; the many
random kills are in tests/faults/kill_trials.py (a few of its trials run as a slow test here)."""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

import pretrain.run_folder.status as status_module
import pretrain.training as run_module
from pretrain.common.atomic import write_json
from pretrain.common.cli import ConfigError
from pretrain.common.formats import RUN_FORMAT, FormatVersionError, stamped
from pretrain.run import main
from pretrain.run_folder.checkpointing import latest_checkpoint, list_checkpoints
from pretrain.run_folder.identity import read_run_id
from pretrain.run_folder.layout import (
    DEAD_AFTER_S,
    MANIFEST_FILE,
    STATUS_FILE,
    is_dead,
    list_snapshots,
    read_metrics,
    read_status,
)
from pretrain.run_folder.status import StopRequest
from pretrain.training import TrainingFailed, collective_timeout, record_stop
from tests import pretrain_helpers
from tests.pretrain_helpers import RUN_PY, tiny_args

# The shared fixtures (tests/pretrain_helpers.py): one data cache per module, a clean Accelerate state per test,
# one thread.
data_cache = pretrain_helpers.data_cache
fresh_accelerate_state = pretrain_helpers.fresh_accelerate_state
one_thread = pretrain_helpers.one_thread

ROOT = Path(__file__).resolve().parents[1]


def run_killed_at(point: str, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "LNBERT_KILL_AT": point, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(RUN_PY), *argv], cwd=cwd, env=env, capture_output=True, text=True)


def snapshot_steps(run: Path) -> list[int]:
    return [s.step for s in list_snapshots(run)]


# --------------------------------------------------------------------------------------------------
# 1. Snapshots survive a kill at any moment
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("point", ["snapshot_files:3", "checkpoint_files:3", "checkpoint_renamed:6"])
def test_a_kill_around_a_save_loses_no_snapshot(tmp_path: Path, data_cache: Path, point: str) -> None:
    """Killed while writing the snapshot or the checkpoint of step 3 (a snapshot step), or after the final
    checkpoint: the resumed run ends with every scheduled snapshot complete."""
    run = tmp_path / "run"
    argv = tiny_args(run, data_cache, "--train.snapshot_steps=[3]")
    killed = run_killed_at(point, argv, tmp_path)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert main([*argv, "--train.resume=auto"]) == 0
    assert snapshot_steps(run) == [0, 3, 6]
    assert read_status(run)["status"] == "finished"


def test_resume_writes_the_missing_snapshot_of_the_checkpoint_step(tmp_path: Path, data_cache: Path) -> None:
    """A run whose snapshot at its checkpoint's step was damaged or removed: resuming from that checkpoint writes
    the snapshot again, with the same weights."""
    run = tmp_path / "run"
    argv = tiny_args(run, data_cache, "--train.snapshot_steps=[3]")
    assert main(argv) == 0
    final = run / "snapshots" / "step_00000006"
    weights = load_file(final / "model.safetensors")
    (final / "COMPLETE").unlink()
    (final / "model.safetensors").unlink()
    assert main([*argv, "--train.resume=auto"]) == 0
    assert snapshot_steps(run) == [0, 3, 6]
    again = load_file(final / "model.safetensors")
    assert all(bool((weights[k] == again[k]).all()) for k in weights)


# --------------------------------------------------------------------------------------------------
# 2. Damaged checkpoints are never used
# --------------------------------------------------------------------------------------------------


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "missing":
        path.unlink()
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:  # the same size, some bytes overwritten
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes(b ^ 0xFF for b in data[middle : middle + 16]) + data[middle + 16 :])


@pytest.mark.parametrize(("file", "how"), [("random_states_0.pkl", "missing"), ("random_states_0.pkl", "truncated"),
                                           ("model.safetensors", "overwritten"), ("train_state.json", "truncated")])  # fmt: skip
def test_a_damaged_latest_checkpoint_falls_back_with_a_warning(
    tmp_path: Path, data_cache: Path, capsys: pytest.CaptureFixture, file: str, how: str
) -> None:
    run = tmp_path / "run"
    argv = tiny_args(run, data_cache, "--train.snapshot_at_start=false", "--train.snapshot_at_end=false")
    assert main(argv) == 0
    final = latest_checkpoint(run)
    weights = (final / "model.safetensors").read_bytes()
    assert (final / MANIFEST_FILE).is_file()
    _damage(final / file, how)
    capsys.readouterr()
    assert main([*argv, "--train.resume=auto"]) == 0
    err = capsys.readouterr().err
    assert "step_00000006" in err and file in err, err
    # Resumed from step 3 and trained steps 4-6 again: the same bytes as before the damage.
    assert [step for step, _ in list_checkpoints(run)] == [3, 6]
    assert (latest_checkpoint(run) / "model.safetensors").read_bytes() == weights
    assert [r["step"] for r in read_metrics(run) if "train/loss" in r] == [1, 2, 3, 4, 5, 6]


def test_a_damaged_checkpoint_named_explicitly_is_refused(tmp_path: Path, data_cache: Path) -> None:
    run = tmp_path / "run"
    assert main(tiny_args(run, data_cache, "--train.stop_at_step=3")) == 0
    checkpoint = latest_checkpoint(run)
    _damage(checkpoint / "model.safetensors", "overwritten")
    result = subprocess.run(
        [sys.executable, str(RUN_PY), *tiny_args(tmp_path / "new", data_cache, f"--train.resume={checkpoint}")],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "step_00000003" in result.stderr and "model.safetensors does not match its checksum" in result.stderr
    assert "Traceback" not in result.stderr


def test_no_checkpoint_that_verifies_is_an_error_not_a_fresh_start(tmp_path: Path, data_cache: Path) -> None:
    run = tmp_path / "run"
    assert main(tiny_args(run, data_cache, "--train.stop_at_step=3", "--train.checkpoint_every=0")) == 0
    _damage(latest_checkpoint(run) / "optimizer.bin", "truncated")
    with pytest.raises(ValueError, match=r"no checkpoint under .* matches its manifest"):
        main(tiny_args(run, data_cache, "--train.resume=auto"))



def test_a_checkpoint_whose_optimizer_groups_another_code_made_is_refused(
    tmp_path: Path, data_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run saved before the weight-decay groups changed (a parameter moved between them) is named, not torch's
    size mismatch."""
    import pretrain.optim as optim_module

    run = tmp_path / "run"
    argv = tiny_args(run, data_cache, "--train.stop_at_step=3")
    assert main(argv) == 0
    grouped = optim_module.weight_decay_groups

    def one_moved(model: torch.nn.Module, weight_decay: float) -> list[dict[str, object]]:
        decay, no_decay = grouped(model, weight_decay)
        return [{**decay, "params": decay["params"][1:]}, {**no_decay, "params": [decay["params"][0], *no_decay["params"]]}]

    monkeypatch.setattr(optim_module, "weight_decay_groups", one_moved)
    with pytest.raises(ValueError, match=r"step_00000003: its optimizer state groups the parameters otherwise"):
        main([*argv, "--train.resume=auto"])

# --------------------------------------------------------------------------------------------------
# 6. A run folder never gets stuck; the same command twice works
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("resume", [[], ["--train.resume=auto"]])
def test_a_run_killed_before_its_first_checkpoint_starts_again(tmp_path: Path, data_cache: Path, resume: list[str]) -> None:
    run = tmp_path / "run"
    argv = tiny_args(run, data_cache)
    killed = run_killed_at("step:2", argv, tmp_path)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (run / "run_config.json").is_file() and not list_checkpoints(run)
    assert main([*argv, *resume]) == 0
    assert read_status(run)["status"] == "finished"
    rows = read_metrics(run)
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3, 4, 5, 6]  # no line of the first try kept
    assert [r["step"] for r in rows if "val/mlm_loss" in r] == [0, 3, 6]


def test_the_same_command_twice_reports_the_finished_run(tmp_path: Path, data_cache: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    argv = tiny_args(run, data_cache)
    assert main(argv) == 0
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "already finished" in out and str(run / "snapshots") in out
    assert read_status(run)["status"] == "finished" and len([r for r in read_metrics(run) if "train/loss" in r]) == 6


def test_sigterm_during_start_up_ends_the_run_preempted(tmp_path: Path, data_cache: Path) -> None:
    """From the command's first line SIGTERM is a stop request, whatever the stage: sent once torch is imported and
    before the data is prepared, the run ends preempted with exit code 0 (what the SLURM script requeues on), not
    killed by the signal (exit 143, no status.json); the same command then continues."""
    run = tmp_path / "run"
    argv = tiny_args(run, data_cache)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, str(RUN_PY), *argv], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        first = proc.stdout.readline()  # "1 CPU thread(s) per process": printed after torch's import
        proc.send_signal(signal.SIGTERM)
        output = first + proc.communicate(timeout=300)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-3000:]
    status = read_status(run)
    assert (status["status"], status["step"]) == ("preempted", 0) and "SIGTERM" in status["message"], status
    assert not list_checkpoints(run)
    assert main(argv) == 0 and read_status(run)["status"] == "finished"


def test_the_same_command_after_a_preemption_continues_the_run(tmp_path: Path, data_cache: Path) -> None:
    run = tmp_path / "run"
    killed = run_killed_at("step:5", tiny_args(run, data_cache), tmp_path)
    assert killed.returncode == -9
    assert main(tiny_args(run, data_cache)) == 0
    assert read_status(run)["status"] == "finished"
    assert [r["step"] for r in read_metrics(run) if "train/loss" in r] == [1, 2, 3, 4, 5, 6]


# --------------------------------------------------------------------------------------------------
# 7. status.json: heartbeat, a step that advances, failed whenever it can be written
# --------------------------------------------------------------------------------------------------


def test_status_heartbeat_advances_while_training(tmp_path: Path, data_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(status_module, "HEARTBEAT_EVERY_S", 0)
    seen = []
    real = status_module.write_status
    monkeypatch.setattr(run_module, "write_status", lambda cfg, status, step, *a, **k: (seen.append((status, step)), real(cfg, status, step, *a, **k)))
    assert main(tiny_args(tmp_path / "run", data_cache)) == 0
    assert [step for status, step in seen if status == "running"] == [0, 1, 2, 3, 4, 5, 6]
    assert seen[-1] == ("finished", 6)


def test_a_stale_running_status_reads_as_dead() -> None:
    now = datetime.datetime.now(datetime.timezone.utc)
    fresh = {"status": "running", "updated": now.isoformat(timespec="seconds")}
    stale = {"status": "running", "updated": (now - datetime.timedelta(seconds=DEAD_AFTER_S + 60)).isoformat()}
    assert not is_dead(fresh) and is_dead(stale)
    assert not is_dead({**stale, "status": "finished"})


def test_damaged_run_files_are_named_not_read_as_json_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """status.json damaged from outside (its writes are atomic) reads as unknown with the reason, so a scheduler that
    waits for the run is not stopped (the run rewrites it); a damaged snapshot.json, and a damaged run_config.json
    (the command that would continue the run: exit 2), are refused naming the file."""
    (tmp_path / "status.json").write_text('{"status": "runn')
    status = read_status(tmp_path)
    assert status["status"] == "unknown" and f"{tmp_path / 'status.json'} is damaged" in status["message"]
    (tmp_path / "status.json").write_text("[1, 2]")
    assert read_status(tmp_path)["status"] == "unknown"
    snapshot = tmp_path / "snapshots" / "step_00000005"  # complete, its snapshot.json damaged since
    snapshot.mkdir(parents=True)
    (snapshot / "COMPLETE").touch()
    (snapshot / "snapshot.json").write_text('{"step": 5, "run')
    (listed,) = list_snapshots(tmp_path)  # by the folder's name: a damaged file is named where it is read
    assert listed.step == 5
    with pytest.raises(ValueError, match=r"step_00000005/snapshot\.json is damaged \(Unterminated string"):
        listed.info  # noqa: B018
    def denied(*_: object, **__: object) -> str:
        raise PermissionError(errno.EACCES, "Permission denied")

    with monkeypatch.context() as patch:  # a colleague's file without read permission (chmod does not stop root)
        patch.setattr(Path, "read_text", denied)
        with pytest.raises(ValueError, match=r"snapshot\.json cannot be read \(Permission denied\): its owner"):
            listed.info  # noqa: B018
    (tmp_path / "run_id").write_text("\n")  # written once, atomically: emptied since
    with pytest.raises(ValueError, match=r"run_id is damaged \(it holds '', not a run id .*restore it from a copy"):
        read_run_id(tmp_path)
    (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 1}\n\xff\xfe garbage\n5\n{"step": 2, "val/mlm_loss": 3.0}\n{"st')
    assert read_metrics(tmp_path) == [{"step": 1}, {"step": 2, "val/mlm_loss": 3.0}]
    (tmp_path / "run_config.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(ValueError, match=r"run_config\.json is damaged .*restore it from a copy"):
        main(["--train.max_steps=2", f"--train.output_dir={tmp_path}"])


def test_damaged_start_up_files_are_restored_from_the_latest_intact_snapshot(
    tmp_path: Path, data_cache: Path, capsys: pytest.CaptureFixture
) -> None:
    """run_config.json, run_id and the run's tokenizer, missing or damaged since, are restored from the newest snapshot
    that matches its manifest (here step 0's: step 3's is damaged too), the damaged files kept under RUN/damaged/, and
    the same command continues the run; damaged lines of metrics.jsonl are left out with a warning, the file kept."""
    run = tmp_path / "run"
    argv = tiny_args(run, data_cache, "--train.snapshot_steps=[3]")
    assert main([*argv, "--train.stop_at_step=3"]) == 0
    names = ("run_id", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json")
    originals = {name: (run / name).read_bytes() for name in names}
    model_config = json.loads((run / "run_config.json").read_text())["model"]
    _damage(run / "run_config.json", "overwritten")
    (run / "run_id").unlink()
    _damage(run / "tokenizer" / "tokenizer.json", "truncated")
    _damage(run / "tokenizer" / "tokenizer_config.json", "overwritten")
    _damage(run / "snapshots" / "step_00000003" / "model.safetensors", "overwritten")
    lines = (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    damaged_metrics = b"".join([*lines[:2], b"\xff garbage\n", *lines[3:]])
    (run / "metrics.jsonl").write_bytes(damaged_metrics)
    capsys.readouterr()
    assert main([*argv, "--train.resume=auto"]) == 0
    err = capsys.readouterr().err
    source = run / "snapshots" / "step_00000000"
    for name, problem in [("run_config.json", "damaged"), ("run_id", "missing"), ("tokenizer/tokenizer.json", "damaged"),
                          ("tokenizer/tokenizer_config.json", "damaged")]:  # fmt: skip
        assert f"{run / name} is {problem}: restored from the snapshot {source}" in err, err
    assert all((run / name).read_bytes() == data for name, data in originals.items())
    assert json.loads((run / "run_config.json").read_text())["model"] == model_config
    kept = {p.relative_to(run / "damaged").parts[1:] for p in (run / "damaged").rglob("*") if p.is_file()}
    assert kept == {("run_config.json",), ("tokenizer", "tokenizer.json"), ("tokenizer", "tokenizer_config.json"),
                    ("metrics.jsonl",)}  # fmt: skip
    assert f"1 line(s) of {run / 'metrics.jsonl'} cannot be read (damaged since): left out" in err
    logged = f"holds {len(lines) - 1} of the {len(lines)} lines the run logged up to step 3 (cut short, damaged or"
    assert f"{run / 'metrics.jsonl'} {logged}" in err, err
    assert next((run / "damaged").rglob("metrics.jsonl")).read_bytes() == damaged_metrics
    assert [r["step"] for r in read_metrics(run) if "train/loss" in r][-3:] == [4, 5, 6]
    assert read_status(run)["status"] == "finished"
    capsys.readouterr()
    assert main([*argv, "--train.resume=auto"]) == 0  # nothing left to restore
    assert "restored" not in capsys.readouterr().err


def test_metrics_lines_lost_since_the_checkpoint_are_counted_on_resume(
    tmp_path: Path, data_cache: Path, capsys: pytest.CaptureFixture
) -> None:
    """metrics.jsonl cut short at a line's end (no damaged line to see): the resume counts the lines against the
    checkpoint's count and says how many are missing; the next resume, from a checkpoint that counted what was kept,
    says nothing. A run resumed intact says nothing either."""
    run = tmp_path / "run"
    argv = tiny_args(run, data_cache, "--train.max_steps=9")
    assert main([*argv, "--train.stop_at_step=3"]) == 0
    assert main([*argv, "--train.stop_at_step=6", "--train.resume=auto"]) == 0
    assert "lines the run logged" not in capsys.readouterr().err
    lines = (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    (run / "metrics.jsonl").write_bytes(b"".join(lines[:3]))  # cut after step 2's line: those of steps 3 to 6 gone
    assert main([*argv, "--train.stop_at_step=7", "--train.resume=auto"]) == 0
    err = capsys.readouterr().err
    assert (f"{run / 'metrics.jsonl'} holds 3 of the {len(lines)} lines the run logged up to step 6 (cut short, "
            "damaged or removed since): its curves have a gap there") in err, err  # fmt: skip
    assert [r["step"] for r in read_metrics(run) if "train/loss" in r] == [1, 2, 7]
    assert main([*argv, "--train.resume=auto"]) == 0
    assert "lines the run logged" not in capsys.readouterr().err
    assert [r["step"] for r in read_metrics(run) if "train/loss" in r] == [1, 2, 7, 8, 9]


def test_the_run_tokenizer_is_compared_with_the_snapshots_up_to_the_newest_checkpoint(tmp_path: Path) -> None:
    """RUN/tokenizer is compared with the newest snapshot no later than the newest checkpoint: step 20's, after it, is of
    an attempt that started again with another tokenizer. Other bytes for the same tokenizer (another library version)
    are left as they are; another tokenizer is restored from that snapshot. Without a checkpoint nothing is compared:
    the run starts from step 0 and saves its tokenizer again."""
    from pretrain.run_folder.manifest import write_manifest
    from pretrain.run_folder.repair import restore_from_snapshots
    from tests.finetune_fixtures import make_run

    run = make_run(tmp_path, "r", steps=(10, 20))
    write_json(run / "run_config.json", stamped({}, RUN_FORMAT))  # as the snapshots' (pretrain/run.py writes one)
    own = run / "tokenizer" / "tokenizer.json"
    original = own.read_bytes()
    other = json.loads(original)
    other["model"]["vocab"]["zzzz"] = len(other["model"]["vocab"])
    (run / "snapshots" / "step_00000020" / "tokenizer.json").write_text(json.dumps(other))
    write_manifest(run / "snapshots" / "step_00000020")
    warnings: list[str] = []
    own.write_text(json.dumps(other))
    restore_from_snapshots(run, warnings.append)
    assert warnings == [] and own.read_text() == json.dumps(other)  # no checkpoint yet
    (run / "checkpoints" / "step_00000010").mkdir(parents=True)
    own.write_text(json.dumps(json.loads(original), indent=4))
    restore_from_snapshots(run, warnings.append)
    assert warnings == []  # the same tokenizer
    own.write_text(json.dumps(other))
    restore_from_snapshots(run, warnings.append)
    (warning,) = warnings
    source = run / "snapshots" / "step_00000010"  # not step 20's, after the newest checkpoint
    assert warning.startswith(f"{own} holds another tokenizer than the run's snapshots: restored from the snapshot "
                              f"{source}; the damaged file is kept as {run / 'damaged'}")  # fmt: skip
    assert own.read_bytes() == original
    assert next((run / "damaged").rglob("tokenizer.json")).read_text() == json.dumps(other)


def test_a_damaged_wandb_run_file_is_restored_from_the_snapshots_a_missing_one_is_not(tmp_path: Path) -> None:
    """RUN/wandb_run.json damaged: restored from the newest snapshot no later than the newest checkpoint (step 20's,
    after it, is of an attempt that started again and logged to a new W&B run), so the resumed run continues its W&B
    run. Removed: left so, as its error message offers (the run logs to a new W&B run)."""
    from pretrain.run_folder.manifest import write_manifest
    from pretrain.run_folder.repair import restore_from_snapshots
    from tests.finetune_fixtures import make_run

    run = make_run(tmp_path, "r", steps=(10, 20))
    write_json(run / "run_config.json", stamped({}, RUN_FORMAT))
    (run / "checkpoints" / "step_00000010").mkdir(parents=True)
    identities = {10: {"id": "0123456789ab", "group": "g", "project": "p"}, 20: {"id": "ba9876543210"}}
    for step, identity in identities.items():
        snapshot = run / "snapshots" / f"step_{step:08d}"
        write_json(snapshot / "snapshot.json", {**json.loads((snapshot / "snapshot.json").read_text()),
                                                "wandb_run": identity})  # fmt: skip
        write_manifest(snapshot)
    own = run / "wandb_run.json"
    # Cut short; an object with no id (which would have logged the run to a new W&B run); an id W&B refuses.
    for damaged in ('{"id": "0123', "{}", '{"id": "01/23", "group": "g"}'):
        own.write_text(damaged)
        warnings: list[str] = []
        restore_from_snapshots(run, warnings.append)
        (warning,) = warnings
        assert warning.startswith(f"{own} is damaged: restored from the snapshot {run / 'snapshots' / 'step_00000010'}")
        assert json.loads(own.read_text()) == identities[10]
        kept = max((run / "damaged").rglob("wandb_run.json"), key=lambda path: int(path.parent.name))  # RUN/damaged/NS
        assert kept.read_text() == damaged
    own.unlink()
    restore_from_snapshots(run, warnings.append)
    assert not own.exists() and len(warnings) == 1


def test_a_prepared_instance_damaged_since_is_named_not_fed_to_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bytes of a prepared instance changed since it was made, unseen by the load's check (the shard's time kept, as
    a flipped bit on disk keeps it; here the tokens of the validation split's first instance, to id -1): the run
    stops at the first batch that holds it, its status naming the instance, the cache folder and the fix, where the
    model would have failed indexing its embeddings (on a GPU: a device-side assert that names nothing)."""
    import datasets
    import numpy as np

    cache = tmp_path / "cache"
    argv = tiny_args(tmp_path / "run", cache)
    assert main([*argv, "--train.stop_at_step=3"]) == 0
    (folder,) = cache.glob("instances-*/")
    shard = next((folder / "validation").glob("*.arrow"))
    tokens = np.asarray(datasets.Dataset.from_file(str(shard))[0]["input_ids"], dtype="<i4").tobytes()
    data = shard.read_bytes()
    at = data.index(tokens)
    made = shard.stat()
    shard.write_bytes(data[:at] + b"\xff" * len(tokens) + data[at + len(tokens):])
    os.utime(shard, ns=(made.st_atime_ns, made.st_mtime_ns))
    # Under torchrun, the error is also written where the launcher reads it (its summary names the failed process).
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))
    with pytest.raises(TrainingFailed):
        main([*argv, "--train.resume=auto"])
    status = read_status(tmp_path / "run")
    assert status["status"] == "failed", status
    error = json.loads((tmp_path / "error.json").read_text())["message"]
    assert "DamagedInstance" in error["message"] and "Traceback" in error["extraInfo"]["py_callstack"], error
    assert re.search(rf"instance \d+ holds token ids outside the tokenizer's vocabulary \(0-\d+\): \[-1, -1, -1, -1\]: "
                     rf"the prepared instances in {re.escape(str(folder))} were damaged since they were made. Remove "
                     "that folder", status["message"]), status  # fmt: skip


def test_a_flipped_offset_or_a_removed_summary_in_prepared_instances_is_damage_made_again(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """An offset of a shard's token lists pointing past the file (one flipped bit, the shard's time kept, so its
    checksum is not read) had the memory-mapped reads leave the file: a segfault, status left running, the same
    command crashing again. Arrow's own validation finds it at load: the instances are set aside and made again."""
    import datasets
    import numpy as np

    cache = tmp_path / "cache"
    argv = tiny_args(tmp_path / "run", cache)
    assert main([*argv, "--train.stop_at_step=3"]) == 0
    (folder,) = cache.glob("instances-*/")
    shard = next((folder / "validation").glob("*.arrow"))
    lengths = [len(ids) for ids in datasets.Dataset.from_file(str(shard))[:3]["input_ids"]]
    offsets = np.cumsum([0, *lengths], dtype="<i4").tobytes()
    data, made = shard.read_bytes(), shard.stat()
    at = data.index(offsets) + 4  # the end of the first instance
    shard.write_bytes(data[:at] + np.array([1 << 27], dtype="<i4").tobytes() + data[at + 4 :])
    os.utime(shard, ns=(made.st_atime_ns, made.st_mtime_ns))
    capsys.readouterr()
    assert main([*argv, "--train.resume=auto"]) == 0
    out = capsys.readouterr().out
    assert f"warning: the prepared instances in {folder} cannot be read (ArrowInvalid: " in out, out
    assert "the instances are made again from the corpus" in out and read_status(tmp_path / "run")["status"] == "finished"
    # Its summary.json removed: published whole with it, so the folder was damaged; had stopped every run for good.
    (folder / "summary.json").unlink()
    assert main([*tiny_args(tmp_path / "run2", cache), "--train.max_steps=1"]) == 0
    assert f"{folder} cannot be read (FileNotFoundError: no summary.json): moved to " in capsys.readouterr().out


HOLD_THE_LOCK = """
import sys, time
from pretrain.run_folder.lock import run_folder_lock
with run_folder_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_second_command_in_a_busy_run_folder_is_refused_naming_the_holder(
    tmp_path: Path, data_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A job submitted twice: the second resumed from the first one's checkpoints while it wrote more, and its
    clean-up removed the first one's save in progress (which failed). Now it waits WAIT_S, then exits 2 naming the
    holder; once the holder is gone (killed: the lock goes with its process) the folder is free at once."""
    import pretrain.run_folder.lock as lock

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, str(run_dir)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        monkeypatch.setattr(lock, "WAIT_S", 1.0)
        with pytest.raises(ConfigError, match=rf"is in use by another command \(pid {holder.pid} on .*touch .*STOP"):
            main(tiny_args(run_dir, data_cache))
        assert f"{run_dir} is in use (pid {holder.pid}" in capsys.readouterr().err
        assert not (run_dir / "status.json").exists()  # nothing of the holder's run was touched
        # SIGTERM while waiting (a job cancelled): a stop request, answered at once with exit 0, nothing done
        monkeypatch.setattr(lock, "WAIT_S", 600.0)
        stop = StopRequest()
        stop.signal_name = "SIGTERM"
        assert main(tiny_args(run_dir, data_cache), stop=stop) == 0
        assert f"stopped (SIGTERM) while waiting for {run_dir / 'lock'}: nothing was done" in capsys.readouterr().err
        assert not (run_dir / "status.json").exists()
    finally:
        holder.kill()
        holder.wait()
    with lock.run_folder_lock(run_dir):
        assert json.loads((run_dir / "lock").read_text())["pid"] == os.getpid()
    assert (run_dir / "lock").read_text() == ""  # a released lock names nobody


HOLD_ON_ANOTHER_NODE = """
import datetime, json, sys, time
from pretrain.common.atomic import write_json
from pretrain.run_folder.lock import run_folder_lock
with run_folder_lock(sys.argv[1]):
    with open(sys.argv[1] + "/lock", "r+") as f:  # as a process of another node names itself
        f.truncate(0)
        f.write(json.dumps({"host": "node-7", "pid": 4242, "since": "2026-12-07T00:00:00+00:00"}))
    print("held", flush=True)
    end = time.monotonic() + float(sys.argv[2])  # lost: until the NFS server ends its lease
    while time.monotonic() < end:
        if sys.argv[3] == "alive":  # a run that trains: its heartbeat
            now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            write_json(sys.argv[1] + "/status.json", {"status": "running", "step": 3, "updated": now})
        time.sleep(0.2)
"""


@pytest.mark.parametrize("alive", [False, True])
def test_a_lock_held_from_a_host_without_sign_of_life_is_waited_for_longer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, alive: bool
) -> None:
    """A lock another host holds while its run shows no sign of life (a node lost, its NFS lease not yet ended) is
    waited for up to LEASE_WAIT_S, and taken once the lease ends; one whose run is running with a fresh heartbeat is
    refused after WAIT_S, as before."""
    import pretrain.run_folder.lock as lock

    args = [str(tmp_path), "30" if alive else "4", "alive" if alive else "lost"]
    holder = subprocess.Popen([sys.executable, "-c", HOLD_ON_ANOTHER_NODE, *args], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        monkeypatch.setattr(lock, "WAIT_S", 3.0)  # longer than the heartbeat's age (whole seconds, every 0.2 s)
        monkeypatch.setattr(lock, "LEASE_WAIT_S", 120.0)
        if alive:
            with pytest.raises(ConfigError, match=r"in use by another command \(pid 4242 on node-7"):  # noqa: SIM117
                with lock.run_folder_lock(tmp_path):
                    pass
        else:
            with lock.run_folder_lock(tmp_path):
                assert json.loads((tmp_path / "lock").read_text())["pid"] == os.getpid()
            assert "its holder (pid 4242 on node-7, running since" in (err := capsys.readouterr().err)
            assert "shows no sign of life; waiting up to 120 s in all" in err
    finally:
        holder.kill()
        holder.wait()


def test_a_file_system_without_flock_warns_and_trains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture) -> None:  # fmt: skip
    import fcntl

    import pretrain.run_folder.lock as lock

    def no_flock(*_: object) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with lock.run_folder_lock(tmp_path):
        pass
    assert f"warning: cannot lock {tmp_path / 'lock'} (No locks available)" in capsys.readouterr().err


def test_a_full_disk_leaves_the_lock_held_naming_nobody(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder's name is for the next command's message: a full disk there must not stop the run before its own
    handling of a full disk (a clean stop, exit 0) can answer."""
    import pretrain.run_folder.lock as lock

    def full(*_: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(lock.os, "write", full)
    with lock.run_folder_lock(tmp_path), open(tmp_path / "lock") as f:
        assert f.read() == "" and lock.holder(f, wait_s=0) is None


def test_a_tracker_that_fails_to_start_leaves_status_failed(tmp_path: Path, data_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Accelerate's own W&B tracker, whose wandb.init fails: the run ends failed with that error, not with one the
    failure's handling meets on the tracker left without a run."""
    import wandb

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("wandb: network unreachable")

    monkeypatch.setattr(wandb, "init", broken)
    run = tmp_path / "run"
    with pytest.raises(TrainingFailed, match="training failed at step 0: RuntimeError: wandb: network unreachable"):
        main(tiny_args(run, data_cache, "--tracking.backend=wandb"))
    assert read_status(run)["status"] == "failed"


def test_a_full_disk_while_recording_failure_keeps_the_original_error(
    tmp_path: Path, data_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def disk_full(*args: object) -> str:  # an error of its own (a full disk in training is a preempted stop)
        raise RuntimeError("the training step broke")

    real = run_module.write_status

    def status_fails_when_failed(cfg, status, *args, **kwargs):
        if status == "failed":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(cfg, status, *args, **kwargs)

    monkeypatch.setattr(run_module, "train", disk_full)
    monkeypatch.setattr(run_module, "write_status", status_fails_when_failed)
    run = tmp_path / "run"
    with pytest.raises(TrainingFailed, match="the training step broke"):
        main(tiny_args(run, data_cache))
    assert f"could not record status failed in {run / 'status.json'}" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------
# Leftover temp folders of any step are removed; files follow the umask
# --------------------------------------------------------------------------------------------------


def test_leftover_temp_folders_of_any_step_are_removed(tmp_path: Path, data_cache: Path) -> None:
    run = tmp_path / "run"
    assert main(tiny_args(run, data_cache, "--train.stop_at_step=3")) == 0
    for name in (".step_00000001.tmp", ".step_00000004.tmp", ".step_00000002.old"):
        (run / "checkpoints" / name).mkdir()
        (run / "checkpoints" / name / "model.safetensors").write_bytes(b"torn")
    assert main(tiny_args(run, data_cache, "--train.resume=auto")) == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000003", "step_00000006"]


def test_written_files_follow_the_umask(tmp_path: Path, data_cache: Path) -> None:
    previous = os.umask(0o022)
    try:
        write_json(tmp_path / "x.json", {"a": 1})
        assert (tmp_path / "x.json").stat().st_mode & 0o777 == 0o644
        run = tmp_path / "run"
        assert main(tiny_args(run, data_cache, "--train.max_steps=1")) == 0
        snapshot = list_snapshots(run)[-1].path
        written = [run / "status.json", run / "run_config.json", *(run / "tokenizer").iterdir(), *snapshot.iterdir(),
                   *latest_checkpoint(run).iterdir()]  # fmt: skip
        for path in written:
            assert path.stat().st_mode & 0o777 == 0o644, path
    finally:
        os.umask(previous)


def test_the_manifest_lists_every_file(tmp_path: Path, data_cache: Path) -> None:
    run = tmp_path / "run"
    assert main(tiny_args(run, data_cache, "--train.max_steps=1")) == 0
    for folder in (latest_checkpoint(run), list_snapshots(run)[-1].path):
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
        on_disk = {p.name for p in folder.iterdir()} - {MANIFEST_FILE, "COMPLETE"}
        assert manifest["format_version"] == RUN_FORMAT and set(manifest["files"]) == on_disk
        assert all(len(e["sha256"]) == 64 for e in manifest["files"].values())
    assert json.loads((run / "run_config.json").read_text())["format_version"] == RUN_FORMAT


# --------------------------------------------------------------------------------------------------
# 10. Files of another format version are refused with what to do, before any other comparison
# --------------------------------------------------------------------------------------------------


def _restamp(path: Path, version: int | None) -> None:
    """Rewrite ``path`` as another format version wrote it (None: before versions existed)."""
    payload = {k: v for k, v in json.loads(path.read_text()).items() if k != "format_version"}
    path.write_text(json.dumps(payload if version is None else {"format_version": version, **payload}))


def test_a_run_folder_of_another_format_version_is_refused(tmp_path: Path, data_cache: Path) -> None:
    from pretrain.common.cli import to_dict
    from pretrain.config import parse_args
    from pretrain.run_folder.checkpointing import resolve_resume
    from pretrain.run_folder.manifest import write_manifest

    run = tmp_path / "run"
    argv = tiny_args(run, data_cache, "--train.stop_at_step=3")
    # The files a resume reads, as this version writes them (no training: the refusals come before any).
    write_json(run / "run_config.json", stamped(to_dict(parse_args(argv)), RUN_FORMAT))
    checkpoint = run / "checkpoints" / "step_00000003"
    write_json(checkpoint / "train_state.json", {"step": 3})
    write_manifest(checkpoint)
    assert resolve_resume(run, to_dict(parse_args(argv)), "auto") == checkpoint
    _restamp(checkpoint / MANIFEST_FILE, RUN_FORMAT + 1)
    resume_fix = "finish the run with the checkout that started it, or start a new run in another --train.output_dir"
    newer = rf"manifest.json has format_version {RUN_FORMAT + 1}; this code reads format_version {RUN_FORMAT}: "
    with pytest.raises(FormatVersionError, match=newer + re.escape(resume_fix)):  # named, continued in a new folder
        main(tiny_args(tmp_path / "new", data_cache, f"--train.resume={checkpoint}"))
    with pytest.raises(FormatVersionError, match=r"step_00000003/" + newer):  # refused, not skipped as damaged
        main([*argv, "--train.resume=auto"])
    _restamp(run / "run_config.json", None)
    before = r"run_config.json has no format_version \(written before versions existed\); .*" + re.escape(resume_fix)
    for resume in ([], ["--train.resume=auto"]):  # this message, not "holds a different run: model.norm_placement"
        with pytest.raises(FormatVersionError, match=before):
            main([*argv, "--model.norm_placement=pre", *resume])


@pytest.mark.parametrize("version", [None, RUN_FORMAT + 1], ids=["unversioned", "newer"])
def test_a_snapshot_of_another_format_version_is_refused_by_finetuning_and_export(
    tmp_path: Path, capsys: pytest.CaptureFixture, version: int | None
) -> None:
    from pretrain import export
    from tests.finetune_fixtures import write_snapshot

    snapshot = write_snapshot(tmp_path / "run", "post_ln", "post", 10)
    _restamp(snapshot / MANIFEST_FILE, version)
    code, err = _finetune(tmp_path, str(snapshot), capsys)
    assert code == 2 and "manifest.json has" in err and "re-save its weights with this one" in err, err
    with pytest.raises(FormatVersionError, match=r"manifest.json has .*use it with the checkout that wrote it"):
        export.main([f"--model={snapshot}", f"--out={tmp_path / 'exported'}"])
    assert not (tmp_path / "exported").exists()


def test_a_folder_without_a_run_id_is_named_with_what_to_pass(tmp_path: Path) -> None:
    from pretrain.run_folder.identity import ensure_run_id, read_run_id

    (tmp_path / "run_config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"has no run_id: it is not a pretraining run folder of this version"):
        read_run_id(tmp_path)
    run_id = ensure_run_id(tmp_path)  # written once, read back (run_config.json no longer stands in for it)
    assert read_run_id(tmp_path) == run_id == ensure_run_id(tmp_path)


# --------------------------------------------------------------------------------------------------
# 4. Fine-tuning refuses incomplete or damaged snapshots; clear errors for a missing model and empty data
# --------------------------------------------------------------------------------------------------


def _finetune(tmp_path: Path, model: str, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """finetune.run on ``model`` through its command-line wrapper: (exit code, stderr)."""
    from finetune.config import FinetuneConfig
    from finetune.run import RunConfig, run
    from pretrain.common.cli import run_cli
    from tests.finetune_fixtures import FIXTURE_GLUE

    def main() -> int:  # the config too: a model that is no folder and no Hub name is refused as it is read
        config = RunConfig(model=model, task="mrpc", data_dir=str(FIXTURE_GLUE), lrs=[1e-3], seeds=[0],
                           results_dir=str(tmp_path / "results.d"), recipe=FinetuneConfig(max_train_examples=8))  # fmt: skip
        return bool(run(config)) and 0

    capsys.readouterr()
    code = run_cli(main)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("damage", ["no COMPLETE", "overwritten"])
def test_finetune_refuses_an_incomplete_or_damaged_snapshot(tmp_path: Path, damage: str, capsys: pytest.CaptureFixture) -> None:
    from tests.finetune_fixtures import write_snapshot

    snapshot = write_snapshot(tmp_path / "run", "post_ln", "post", 10)
    if damage == "no COMPLETE":
        (snapshot / "COMPLETE").unlink()
    else:
        _damage(snapshot / "model.safetensors", "overwritten")
    code, err = _finetune(tmp_path, str(snapshot), capsys)
    expected = "without its COMPLETE marker" if damage == "no COMPLETE" else "model.safetensors does not match its checksum"
    assert code == 2 and expected in err, err


@pytest.mark.parametrize("complete", [True, False], ids=["snapshot", "plain folder"])
def test_finetune_refuses_a_snapshot_whose_weights_do_not_match_its_config(
    tmp_path: Path, capsys: pytest.CaptureFixture, complete: bool
) -> None:
    from pretrain.run_folder.manifest import write_manifest
    from tests.finetune_fixtures import write_snapshot

    snapshot = write_snapshot(tmp_path / "run", "pre_ln", "pre", 10)  # Pre-LN weights (a final LayerNorm)
    config = json.loads((snapshot / "config.json").read_text())
    (snapshot / "config.json").write_text(json.dumps({**config, "norm_placement": "post"}))
    write_manifest(snapshot)  # written so by its run: the manifest check passes, the placements still differ
    if not complete:
        (snapshot / "snapshot.json").unlink()
    code, err = _finetune(tmp_path, str(snapshot), capsys)
    assert code == 2, err
    assert f"--model {str(snapshot)!r} cannot be fine-tuned" in err and "does not match norm_placement='post'" in err
    assert "unexpected encoder weights ['bert.encoder.final_layer_norm" in err and "pass another --model" in err
    assert "Traceback" not in err and not (tmp_path / "results.d" / "jobs").exists()


def test_finetune_refuses_a_plain_model_folder_whose_weights_were_cut_short(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """No manifest to check it against (a folder save_pretrained wrote, copied by hand): loading it is the check, and
    names the folder and the fix instead of a safetensors traceback."""
    from tests.finetune_fixtures import write_snapshot

    folder = write_snapshot(tmp_path / "run", "pre_ln", "pre", 10)
    (folder / "snapshot.json").unlink()
    _damage(folder / "model.safetensors", "truncated")
    code, err = _finetune(tmp_path, str(folder), capsys)
    assert code == 2, err
    assert f"--model {str(folder)!r}: its weights cannot be read" in err and "copy them again" in err
    assert "Traceback" not in err and not (tmp_path / "results.d" / "jobs").exists()


@pytest.mark.parametrize("model", ["runs/pre_ln/snapshots/step_00000010", "/nowhere/snapshot", "no-such-model-xyz"])
def test_finetune_names_a_model_that_does_not_exist(tmp_path: Path, model: str, capsys: pytest.CaptureFixture) -> None:
    code, err = _finetune(tmp_path, model, capsys)
    assert code == 2 and f"--model {model!r}" in err, err


def test_a_header_only_glue_file_is_a_clear_error(tmp_path: Path) -> None:
    from finetune.glue import load_task
    from tests.finetune_fixtures import FIXTURE_GLUE

    glue = tmp_path / "glue"
    (glue / "MRPC").mkdir(parents=True)
    (glue / "MRPC" / "dev.tsv").write_text((FIXTURE_GLUE / "MRPC" / "dev.tsv").read_text())
    header = (FIXTURE_GLUE / "MRPC" / "train.tsv").read_text().splitlines()[0]
    (glue / "MRPC" / "train.tsv").write_text(header + "\n")
    with pytest.raises(ValueError, match=r"train.tsv has its header line but no examples"):
        load_task("mrpc", glue)


# --------------------------------------------------------------------------------------------------
# Corpus lines: invalid JSON named by file and line; records without a string text counted, all-bad refused
# --------------------------------------------------------------------------------------------------


def _json_corpus(tmp_path: Path, lines: list[str]) -> str:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return f'--data.sources=[{{"kind": "json", "path": "{path}"}}]'


def test_a_corpus_line_that_is_not_json_is_named(tmp_path: Path, data_cache: Path) -> None:
    source = _json_corpus(tmp_path, ['{"text": "fine"}', '{"text": "torn', '{"text": "fine"}'])
    with pytest.raises(ValueError, match=r"corpus.jsonl line 2 is not valid JSON"):
        main(tiny_args(tmp_path / "r", data_cache, source))


def test_corpus_lines_without_text_are_counted_text_of_another_type_refused(
    tmp_path: Path, data_cache: Path, capsys: pytest.CaptureFixture
) -> None:
    from pretrain.data.config import check_json_lines

    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "a document"}\n{"body": "no text"}\n{"text": null}\n')
    check_json_lines(path, "text", "data.sources[0]")
    assert "2 of 3 lines have no string 'text' field (first: line 2)" in capsys.readouterr().err
    path.write_text('{"body": "no text"}\n{"text": null}\n')
    with pytest.raises(ValueError, match=r"text column 'text' not found; columns are \['body'\] \(none of the 2 lines"):
        check_json_lines(path, "text", "data.sources[0]")
    # Text that is not text: datasets would convert it ("12345") and train on it; a line that is no object: a crash.
    for line, what in (('{"text": 12345}', r"'text' is a JSON number \(12345\), not text"),
                       ('{"text": {"a": 1}}', r"'text' is a JSON object \(\{\"a\": 1\}\), not text"),
                       ('"a document"', r" is a JSON string, not an object"),
                       ("null", r" is a JSON null, not an object")):  # fmt: skip
        path.write_text(f'{{"text": "a document"}}\n{line}\n')
        with pytest.raises(ValueError, match=rf"data.sources\[0\]: {re.escape(str(path))} line 2.*{what}"):
            check_json_lines(path, "text", "data.sources[0]")
    # JSON that Arrow refuses as text (datasets' traceback), and a file of blank lines ("corresponds to no data").
    path.write_text('{"text": "a document"}\n{"text": "half a pair \\ud800"}\n')
    with pytest.raises(ValueError, match=r"line 2: 'text' holds a lone surrogate escape"):
        check_json_lines(path, "text", "data.sources[0]")
    path.write_text("\n  \n\n")
    with pytest.raises(ValueError, match=r"c.jsonl holds no JSON line \(blank lines only\)"):
        check_json_lines(path, "text", "data.sources[0]")


def test_a_gzipped_corpus_is_checked_as_a_plain_one(tmp_path: Path) -> None:
    """A .jsonl.gz had skipped every check: a bad line or byte reached datasets' traceback (exit 1), a file that is
    not gzip a BadGzipFile."""
    import gzip

    from pretrain.data.config import check_json_lines
    from pretrain.data.corpus import check_utf8

    path = tmp_path / "c.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"text": "fine"}\n{"text": "torn\n'))
    with pytest.raises(ValueError, match=r"c.jsonl.gz line 2 is not valid JSON"):
        check_json_lines(path, "text", "data.sources[0]")
    path.write_bytes(gzip.compress(b'{"text": "caf\xe9"}\n'))
    with pytest.raises(ValueError, match=r"c.jsonl.gz: invalid UTF-8 at byte offset 13 \(line 1\)"):
        check_utf8(path)
    for damaged in (b'{"text": "not compressed"}\n', gzip.compress(b'{"text": "fine"}\n' * 50)[:30]):
        path.write_bytes(damaged)
        with pytest.raises(ValueError, match=r"c.jsonl.gz is not a whole gzip file \(.*\): copy it again"):
            check_utf8(path)


# --------------------------------------------------------------------------------------------------
# 9. A full disk stops the run cleanly before a save, previous checkpoints intact
# --------------------------------------------------------------------------------------------------


def _disk_full_from_check(monkeypatch: pytest.MonkeyPatch, first_full: int) -> list[object]:
    """Make the free-space checks see 10 kB free from the ``first_full``-th check on (1: the tokenizer's, before
    data preparation; 2: the step-0 snapshot's; 3: the first checkpoint's)."""
    import shutil

    real = shutil.disk_usage
    checks: list[object] = []

    def disk_usage(path: object) -> object:
        checks.append(path)
        usage = real(path)
        return usage._replace(free=10_000) if len(checks) >= first_full else usage

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    return checks


def test_a_full_disk_stops_before_the_save_with_a_message(
    tmp_path: Path, data_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    real = shutil.disk_usage
    _disk_full_from_check(monkeypatch, 4)  # full after the saves of step 3

    run = tmp_path / "run"
    argv = tiny_args(run, data_cache)
    assert main(argv) == 0
    status = read_status(run)
    assert status["status"] == "preempted" and status["step"] == 6
    assert "disk full" in status["message"] and str(run) in status["message"]
    assert [step for step, _ in list_checkpoints(run)] == [3]
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    monkeypatch.setattr(shutil, "disk_usage", real)
    assert main([*argv, "--train.resume=auto"]) == 0
    assert read_status(run)["status"] == "finished" and snapshot_steps(run) == [0, 6]


@pytest.mark.parametrize(("first_full", "stopped"), [(1, "before data preparation"), (2, "at the step-0 snapshot")])
def test_a_full_disk_before_the_first_save_is_a_clean_stop(
    tmp_path: Path, data_cache: Path, monkeypatch: pytest.MonkeyPatch, first_full: int, stopped: str
) -> None:
    import shutil

    real = shutil.disk_usage
    _disk_full_from_check(monkeypatch, first_full)
    run = tmp_path / "run"
    argv = tiny_args(run, data_cache)
    assert main(argv) == 0, stopped
    status = read_status(run)
    assert (status["status"], status["step"]) == ("preempted", 0)
    assert "disk full" in status["message"] and str(run) in status["message"] and "--train.resume=auto" in status["message"]
    assert not list_snapshots(run) and not list_checkpoints(run)
    assert (run / "run_config.json").is_file() == (first_full == 2)
    monkeypatch.setattr(shutil, "disk_usage", real)
    assert main([*argv, "--train.resume=auto"]) == 0
    assert read_status(run)["status"] == "finished" and snapshot_steps(run) == [0, 6]


@pytest.mark.parametrize(
    ("writer", "error", "named"),
    [("save_pretrained", RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                                      'message: "No space left on device" })'), "snapshots/step_00000000"),
     ("save_state", OSError(errno.ENOSPC, "No space left on device", "optimizer.bin"), "optimizer.bin")],
)  # fmt: skip
def test_a_full_disk_inside_a_save_ends_preempted_naming_the_path(
    tmp_path: Path, data_cache: Path, monkeypatch: pytest.MonkeyPatch, writer: str, error: Exception, named: str
) -> None:
    """The disk filled between the free-space check and the write (safetensors' own error names no file)."""
    from accelerate import Accelerator

    from pretrain.modeling import LNBertForPreTraining

    def full(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(LNBertForPreTraining if writer == "save_pretrained" else Accelerator, writer, full)
    run = tmp_path / "run"
    assert main(tiny_args(run, data_cache)) == 0
    status = read_status(run)
    assert status["status"] == "preempted" and named in status["message"] and "--train.resume=auto" in status["message"]
    assert status["step"] == (0 if writer == "save_pretrained" else 3)


def _full_on_one_process(rank: int, port: int, argv: list[str], out: Path, full: str) -> None:
    """One of two gloo processes of a tiny run, where one process alone meets ENOSPC: process 1 for its own file of
    the checkpoint (its RNG state, which every process writes), or process 0 for its metrics lines from step 2 on, or
    for the run's tokenizer, which it saves while the other waits for the data to be prepared."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1")  # fmt: skip
    torch.set_num_threads(1)
    from transformers import PreTrainedTokenizerBase

    real_save, real_log, real_tokenizer_save = torch.save, run_module.log_metrics, PreTrainedTokenizerBase.save_pretrained

    def save(obj: object, f: object, *args: object, **kwargs: object) -> None:
        if full == "checkpoint" and rank == 1 and "random_states_1" in str(f):
            raise OSError(errno.ENOSPC, "No space left on device", str(f))
        real_save(obj, f, *args, **kwargs)

    def log_metrics(accelerator: object, run_dir: Path, metrics: dict, step: int, **kwargs: object) -> None:
        if full == "metrics" and rank == 0 and step >= 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(Path(run_dir) / "metrics.jsonl"))
        real_log(accelerator, run_dir, metrics, step, **kwargs)

    def save_tokenizer(self: PreTrainedTokenizerBase, folder: str | Path, *args: object, **kwargs: object) -> object:
        if full == "tokenizer" and rank == 0 and Path(folder).name == "tokenizer":
            raise OSError(errno.ENOSPC, "No space left on device", str(folder))
        return real_tokenizer_save(self, folder, *args, **kwargs)

    torch.save, run_module.log_metrics, PreTrainedTokenizerBase.save_pretrained = save, log_metrics, save_tokenizer
    (out / f"rank{rank}").write_text(str(main(argv)))


@pytest.mark.slow  # two processes that import the project
@pytest.mark.parametrize(("full", "step", "named"), [
    ("checkpoint", 3, "random_states_1.pkl"), ("metrics", 2, "metrics.jsonl"), ("tokenizer", 0, "run/tokenizer"),
])  # fmt: skip
def test_a_full_disk_on_one_process_stops_every_process(
    tmp_path: Path, data_cache: Path, full: str, step: int, named: str
) -> None:
    """The processes agree on how a save went (one collective), a full disk in a write of the main process alone
    (a metrics line) is told to all by the next step's all-reduce, and the main process's data preparation (its
    tokenizer saved in the run folder) ends with one collective on how it went: both stop, preempted, the status
    naming the file of the process that met the full disk, instead of the other waiting train.collective_timeout_s
    for it (at a barrier, or at its next collective)."""
    import socket

    import torch.multiprocessing as mp

    run = tmp_path / "run"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = tiny_args(run, data_cache, "--train.collective_timeout_s=120", "--train.snapshot_at_start=false")
    context = mp.start_processes(_full_on_one_process, args=(port, argv, tmp_path, full), nprocs=2, join=False,
                                 start_method="spawn")  # fmt: skip
    while not context.join(timeout=600):
        pass
    assert [(tmp_path / f"rank{rank}").read_text() for rank in (0, 1)] == ["0", "0"]
    status = read_status(run)
    assert (status["status"], status["step"]) == ("preempted", step), status
    assert "disk full" in status["message"] and named in status["message"], status
    assert not list_checkpoints(run)


def test_the_free_space_check_counts_what_a_save_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot holds fp32 weights; a first checkpoint the module's weights and fp32 AdamW moments, and under
    DeepSpeed its fp32 master copy too: 14 bytes a parameter when the engine holds a bf16 module. (Meta tensors: a
    billion parameters without memory.)"""
    import shutil

    from pretrain.run_folder.checkpointing import free_space_problem

    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=1))
    fp32 = torch.nn.Linear(10**5, 10**4, bias=False, device="meta")  # 1e9 parameters
    bf16 = torch.nn.Linear(10**5, 10**4, bias=False, device="meta", dtype=torch.bfloat16)
    needs = {(model.weight.dtype, kind, deepspeed): free_space_problem(tmp_path, model, kind == "checkpoint",
                                                                      kind == "snapshot", deepspeed)
             for model in (fp32, bf16) for kind in ("checkpoint", "snapshot") for deepspeed in (False, True)}  # fmt: skip
    gb = {key: float(re.search(r"needs about ([\d.]+) GB", message).group(1)) for key, message in needs.items()}
    assert gb[torch.float32, "checkpoint", False] == 12.0  # weights 4 + moments 8
    assert gb[torch.bfloat16, "checkpoint", True] == 14.0  # bf16 module 2 + fp32 masters 4 + moments 8
    assert gb[torch.float32, "checkpoint", True] == 16.0
    assert {gb[torch.float32, "snapshot", ds] for ds in (False, True)} == {4.0}
    assert {gb[torch.bfloat16, "snapshot", ds] for ds in (False, True)} == {4.0}  # DeepSpeed's fp32 masters


# --------------------------------------------------------------------------------------------------
# 8. A frozen process fails the run within train.collective_timeout_s, with a message naming it (slow)
# --------------------------------------------------------------------------------------------------


def _worker_of_rank(launcher: int, rank: int) -> int | None:
    for child in psutil.Process(launcher).children(recursive=True):
        try:
            if "run.py" in " ".join(child.cmdline()) and child.environ().get("RANK") == str(rank):
                return child.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def test_only_an_error_of_a_collective_is_read_as_another_process_gone_or_frozen() -> None:
    """The remarks of a failed status: for gloo's and NCCL's errors with several processes, not for a tracker's lost
    connection or timeout, nor with one process."""
    from types import SimpleNamespace

    from pretrain.config import PretrainConfig
    from pretrain.training import failure_message

    cfg, two, one = PretrainConfig(), SimpleNamespace(num_processes=2), SimpleNamespace(num_processes=1)
    gloo = "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [::1]:1"
    gone = "another process of the run ended first"
    assert gone in failure_message(RuntimeError(gloo), two, cfg)
    assert gone in failure_message(torch.distributed.DistBackendError("NCCL: remote process exited"), two, cfg)
    assert "train.collective_timeout_s" in failure_message(torch.distributed.DistStoreError("timed out"), two, cfg)
    for err, accelerator in ((RuntimeError(gloo), one), (ConnectionResetError("Connection reset by peer"), two),
                             (TimeoutError("read timed out"), two)):  # fmt: skip
        assert failure_message(err, accelerator, cfg) == f"{type(err).__name__}: {err}"
    # Only a collective's timeout may be the main process's own freeze: every process records it.
    timed_out = torch.distributed.DistStoreError("timed out")
    assert collective_timeout(timed_out, two) and not collective_timeout(timed_out, one)
    assert not collective_timeout(RuntimeError(gloo), two) and not collective_timeout(TimeoutError("timed out"), two)


def test_a_stop_the_main_process_may_not_record_is_written_by_every_process(tmp_path: Path) -> None:
    """A process other than the main one writes status.json only for such a stop (a hang, a collective's timeout),
    over a status of running, never over an end the main process recorded."""
    from types import SimpleNamespace

    from pretrain.config import PretrainConfig

    cfg = PretrainConfig()
    cfg.train.output_dir = str(tmp_path)
    other = SimpleNamespace(is_main_process=False, num_processes=2)
    write_json(tmp_path / STATUS_FILE, {"status": "running", "step": 7})
    record_stop(other, cfg, "failed", 7, "ValueError: its own error")  # the main process's to record
    assert read_status(tmp_path)["status"] == "running"
    record_stop(other, cfg, "hung", 7, "no step finished", every_process=True)
    assert (read_status(tmp_path)["status"], read_status(tmp_path)["message"]) == ("hung", "no step finished")
    write_json(tmp_path / STATUS_FILE, {"status": "preempted", "step": 7})  # an end the main process recorded
    record_stop(other, cfg, "hung", 7, "no step finished", every_process=True)
    assert read_status(tmp_path)["status"] == "preempted"


@pytest.mark.slow
@pytest.mark.parametrize(("limit", "ended", "rank"), [("collective_timeout_s=20", "failed", 1),
                                                      ("hang_timeout_s=10", "hung", 0)])  # fmt: skip
def test_a_frozen_process_stops_the_run_with_a_message_naming_the_timeout(tmp_path: Path, data_cache: Path,
                                                                           limit: str, ended: str, rank: int) -> None:  # fmt: skip
    """One process is frozen (SIGSTOP) mid-run: the other fails at its collective's timeout, or, with the watchdog's
    timeout the shorter (as by default), is stopped as hung; either way status.json names the key. When the frozen
    process is the main one (rank 0), which writes status.json, the other process writes it."""
    run = tmp_path / "frozen"
    argv = tiny_args(run, data_cache, "--train.max_steps=100000", "--train.checkpoint_every=0", "--train.eval_every=0",
                     "--train.collective_timeout_s=60", f"--train.{limit}")  # fmt: skip
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--main_process_port", "29531", str(RUN_PY), *argv]  # fmt: skip
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    frozen = None
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not any(r.get("step", 0) >= 2 for r in read_metrics(run)):
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            time.sleep(0.5)
        frozen, live = _worker_of_rank(proc.pid, rank), _worker_of_rank(proc.pid, 1 - rank)
        assert frozen is not None and live is not None
        os.kill(frozen, signal.SIGSTOP)
        started = time.time()
        # The live process ends by itself; the launcher then waits 30 s for the frozen one to answer its SIGTERM
        # (torchrun's own teardown, not ours to test) before it kills it: the test kills it at once instead.
        psutil.Process(live).wait(timeout=200)  # not its exit code: it is not this process's child
        waited = time.time() - started
    finally:
        if frozen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(frozen, signal.SIGKILL)
        proc.kill()
        output, _ = proc.communicate()
    status = read_status(run)
    assert status["status"] == ended, (status, output[-3000:])
    assert f"train.{limit.split('=')[0]}" in status["message"], (status, output[-3000:])
    assert waited < 200


# --------------------------------------------------------------------------------------------------
# 10. A hung process is stopped by its watchdog (status hung, exit 3); the same command continues
# --------------------------------------------------------------------------------------------------


def test_a_hung_run_is_stopped_by_its_watchdog_and_the_same_command_continues(tmp_path: Path, data_cache: Path) -> None:
    """The run hangs after step 4 (``LNBERT_HANG_AT``: a sleep that never ends, as a stuck read would): its watchdog
    prints every thread's stack, status.json says hung at the last step it finished, exit 3; the same command then
    finishes the run from the step-3 checkpoint, each step logged once."""
    run = tmp_path / "run"
    argv = tiny_args(run, data_cache)
    env = {**os.environ, "LNBERT_HANG_AT": "step:4", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    hung = subprocess.run([sys.executable, str(RUN_PY), *argv, "--train.hang_timeout_s=8"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert hung.returncode == status_module.EXIT_HUNG, hung.stderr[-3000:]
    assert "no step finished for 8 s after step 3 (train.hang_timeout_s): stopped as hung" in hung.stderr
    assert "in fault_point" in hung.stderr  # the stuck thread's stack
    status = read_status(run)
    assert (status["status"], status["step"]) == ("hung", 3)
    assert main(argv) == 0
    assert read_status(run)["status"] == "finished"
    assert [row["step"] for row in read_metrics(run) if "train/loss" in row] == [1, 2, 3, 4, 5, 6]


WATCHED = """
import os, sys, time
from pretrain.run_folder.status import Heartbeat, watchdog
heartbeat = Heartbeat()
with watchdog(heartbeat, float(sys.argv[1]), lambda step: f"no beat after step {step}",
              lambda message: print("recorded:", message, flush=True)):
    print("ready", flush=True)
    end, step = time.monotonic() + float(sys.argv[2]), 0
    while time.monotonic() < end:  # a step every 0.05 s
        step += 1
        heartbeat.beat(step)
        time.sleep(0.05)
    print(f"last step {step}", flush=True)
    time.sleep(float(sys.argv[3]))  # no more beats
print("done", flush=True)
"""


def _watched(*args: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WATCHED, *map(str, args)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def test_the_watchdog_stops_a_process_whose_heartbeat_stopped_and_not_one_that_was_suspended() -> None:
    """No beat for the timeout: the stacks, ``on_hang``'s record and exit 3. A process suspended (SIGSTOP, as SLURM's
    suspend does) for longer than the timeout while it beats goes on: suspended time is not a hang."""
    quiet = _watched(2, 0.5, 600)
    out, err = quiet.communicate(timeout=300)
    assert quiet.returncode == status_module.EXIT_HUNG, err
    last = re.search(r"last step (\d+)", out).group(1)
    assert f"recorded: no beat after step {last}" in out and f"no beat after step {last}" in err and "Thread" in err
    suspended = _watched(3, 12, 0)
    assert suspended.stdout.readline() == "ready\n"
    suspended.send_signal(signal.SIGSTOP)
    time.sleep(5)
    suspended.send_signal(signal.SIGCONT)
    out, err = suspended.communicate(timeout=300)
    assert suspended.returncode == 0 and out.endswith("done\n") and "recorded" not in out, err


@pytest.mark.slow
def test_kill_trials_script(tmp_path: Path) -> None:
    """One trial of tests/faults/kill_trials.py: a kill at a random moment, killed again while resuming, then
    compared with an uninterrupted run. Its other kinds each have their own test here: the kills at a save's
    dangerous moments, a damaged checkpoint or start-up file, SIGTERM during start-up, a hang."""
    script = ROOT / "tests" / "faults" / "kill_trials.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["--trials", "1", "--workdir", str(tmp_path)]
    result = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(next(line for line in reversed(result.stdout.splitlines()) if line.startswith("{")))
    assert summary["passed"] == 1 and summary["kills"] == 2, summary


def test_a_failed_json_write_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills half-way through the temporary file: it is removed, and the error names the target."""
    write = Path.write_bytes

    def disk_full(self: Path, data: bytes) -> int:
        write(self, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", disk_full)
    with pytest.raises(OSError, match=r"No space left on device: '.*status\.json'"):
        write_json(tmp_path / "status.json", {"status": "failed"})
    assert list(tmp_path.iterdir()) == []
