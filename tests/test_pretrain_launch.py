"""launch/: the SLURM script builds the right per-node `accelerate launch` line; the comparison script runs both
placements with the same seed and data."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from pretrain.config import parse_args
from pretrain.run_folder.layout import read_metrics, read_status
from tests.conftest import TINY_MODEL_ARGS

ROOT = Path(__file__).resolve().parents[1]


def _fake(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_slurm_script_launches_one_accelerate_per_node(tmp_path: Path) -> None:
    """srun, scontrol and accelerate are stand-ins that record what they were asked to do (2 nodes)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    _fake(bin_dir, "scontrol", 'printf "gpu-node-07\\ngpu-node-08\\n"\n')
    # srun runs the task once per node with that node's SLURM_NODEID, as SLURM does; its options are recorded.
    srun = f'while [[ $1 == -* ]]; do echo "srun $1" >> {log}; shift; done\nfor id in 0 1; do SLURM_NODEID=$id "$@"; done\n'
    _fake(bin_dir, "srun", srun)
    _fake(bin_dir, "accelerate", f'echo "accelerate $*" >> {log}\n')
    run_dir = tmp_path / "out"
    (run_dir / "checkpoints" / "step_00000010").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_00000010" / "train_state.json").write_text("{}")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "gpu-node-[07-08]",
        "SLURM_NNODES": "2",
        "SLURM_CPUS_PER_TASK": "32",
        "PRESET": "configs/pretrain/small_pre_ln.yaml",
    }
    result = subprocess.run(
        ["bash", str(ROOT / "launch" / "slurm_pretrain.sbatch"), f"--train.output_dir={run_dir}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    lines = log.read_text().splitlines()
    # SLURM 22.05 on: srun does not take sbatch's --cpus-per-task, and the node's processes would share one core.
    assert "srun --cpus-per-task=32" in lines
    calls = [line for line in lines if line.startswith("accelerate ")]
    assert len(calls) == 2
    for rank, call in enumerate(calls):
        assert f"--machine_rank {rank} " in call
        assert "--num_machines 2 --num_processes 16" in call
        assert "--main_process_ip gpu-node-07 --main_process_port 29500" in call
        assert call.endswith(
            f"pretrain/run.py --config configs/pretrain/small_pre_ln.yaml --train.resume=auto --train.output_dir={run_dir}"
        )


@pytest.mark.slow
def test_compare_placements_runs_both_with_the_same_seed(tmp_path: Path) -> None:
    out = tmp_path / "compare"
    tiny = [
        "--data.sources=[{kind: python_docs}]", "--data.max_documents=30", "--data.validation_documents=2",
        "--data.vocab_size=300", "--data.max_seq_length=32", f"--data.cache_dir={tmp_path / 'cache'}",
        *TINY_MODEL_ARGS, "--train.max_steps=4", "--train.eval_every=2", "--train.eval_batches=1",
        "--train.per_device_batch_size=8", "--train.snapshot_steps=[]",
    ]  # fmt: skip
    env = {**os.environ, "OUT": str(out), "SEED": "3"}
    result = subprocess.run(
        ["bash", str(ROOT / "launch" / "compare_placements.sh"), "small", *tiny],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for placement in ("post", "pre"):
        run = out / placement
        assert read_status(run)["status"] == "finished"
        assert read_status(run)["norm_placement"] == placement
        assert any("val/mlm_loss" in r for r in read_metrics(run))
    configs = [json.loads((out / p / "run_config.json").read_text()) for p in ("post", "pre")]
    assert configs[0]["train"]["seed"] == configs[1]["train"]["seed"] == 3
    assert configs[0]["data"] == configs[1]["data"]
    assert "post-LN  status=finished" in result.stdout and " pre-LN  status=finished" in result.stdout


# A stand-in for `python pretrain/run.py` (the comparison's LAUNCH): it records its output_dir and writes the
# status the real run writes. With INTERRUPT set, its first call does what a Ctrl-C in the terminal does (SIGINT
# to the whole foreground process group: the script and the run) and ends as the run does: checkpoint saved,
# status preempted, exit code 0.
FAKE_RUN = """
out=$(printf '%s\\n' "$@" | sed -n 's/^--train.output_dir=//p')
echo "$out" >> "$CALLS"
mkdir -p "$out"
status=finished
if [[ -n ${INTERRUPT:-} && ! -e $CALLS.interrupted ]]; then
  touch "$CALLS.interrupted"
  trap 'status=preempted' INT
  kill -INT 0
fi
printf '{"status": "%s"}' "$status" > "$out/status.json"
touch "$out/metrics.jsonl"
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_one_interrupt_stops_the_whole_comparison_and_the_same_command_continues(tmp_path: Path) -> None:
    _fake(tmp_path, "fake_run", FAKE_RUN)
    calls, out = tmp_path / "calls.log", tmp_path / "compare"
    env = {**os.environ, "LAUNCH": f"bash {tmp_path / 'fake_run'}", "OUT": str(out), "CALLS": str(calls)}

    def compare(**extra: str) -> subprocess.CompletedProcess:
        # A process group of its own: the fake's SIGINT reaches this script and its run, as a terminal's would. SIGINT
        # handled as by default, as in a terminal: a signal ignored when bash starts cannot be trapped, and a test
        # process (a pytest-xdist worker) may have inherited or set it ignored.
        return subprocess.run(["bash", str(ROOT / "launch" / "compare_placements.sh"), "small"], cwd=tmp_path,
                              env={**env, **extra}, capture_output=True, text=True, timeout=120,
                              start_new_session=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip

    first = compare(INTERRUPT="1")
    assert first.returncode == 130, first.stdout + first.stderr
    assert calls.read_text().split() == [str(out / "post")]  # Pre-LN was not started
    assert "run the same command again to continue the comparison" in first.stderr
    second = compare()
    assert second.returncode == 0, second.stdout + second.stderr
    assert calls.read_text().split() == [str(out / "post"), str(out / "post"), str(out / "pre")]
    assert "post-LN  status=finished" in second.stdout and " pre-LN  status=finished" in second.stdout
    # A run stopped by a signal sent to it alone (a scheduler's SIGTERM) stops the comparison too.
    _fake(tmp_path, "fake_run", FAKE_RUN.replace("status=finished", "status=preempted", 1))
    calls.unlink()
    assert compare().returncode == 130 and calls.read_text().split() == [str(out / "post")]


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "launch").glob("*.sh")))
def test_launch_scripts_parse(script: str) -> None:
    result = subprocess.run(["bash", "-n", str(ROOT / "launch" / script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_reproduce_script_names_its_missing_inputs(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("CORPUS", "GLUE")}
    result = subprocess.run(
        ["bash", str(ROOT / "launch" / "reproduce_cpu.sh")], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "set CORPUS to a folder with wiki.jsonl and books.jsonl" in result.stderr


def _reproduce_calls(tmp_path: Path, fail: str = "") -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """launch/reproduce_cpu.sh run whole against a stand-in python that records each command's arguments (and
    exits 1 for a command whose arguments contain ``fail``), with the commands it ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    calls_dir = tmp_path / "calls"  # a file a call: the script runs several at once
    calls_dir.mkdir()
    body = f'printf "%s\\0" "$@" > "$(mktemp -p {calls_dir})"\n'
    if fail:
        body += f'[[ "$*" == *{shlex.quote(fail)}* ]] && exit 1\nexit 0\n'
    _fake(bin_dir, "python", body)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CORPUS": "/corpus", "GLUE": "/glue",
           "OUT": str(tmp_path / "out"), "FT_PRECISION": "no"}  # fmt: skip
    result = subprocess.run(["bash", str(ROOT / "launch" / "reproduce_cpu.sh")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    return result, [path.read_text().split("\0")[:-1] for path in calls_dir.iterdir()]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_reproduce_script_trains_every_run_on_the_mixture_it_describes(tmp_path: Path) -> None:
    """The real config parser reads the data sections of the script's pretraining runs and of its grid. They are
    one data config (the runs differ in placement and schedule only), mixing the sources 34:1 counted in documents,
    as the script's comment and docs/results.md say: the presets count weights in words, under which 34:1 took 2
    of the 81 books (found in the run of 2026-12-02)."""
    result, calls = _reproduce_calls(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    pretraining = [call[1:] for call in calls if call[0] == "pretrain/run.py"]
    assert len(pretraining) == 4, calls  # the cache warm-up, Post-LN, Pre-LN, Post-LN at 3e-4
    data = [parse_args(argv).data for argv in pretraining]
    (grid,) = [call for call in calls if call[:3] == ["-m", "pretrain.analysis", "grid"]]
    preset = next(a.removeprefix("--preset=") for a in grid if a.startswith("--preset="))
    overrides = yaml.safe_load(next(a.removeprefix("--overrides=") for a in grid if a.startswith("--overrides=")))
    data.append(parse_args(["--config", preset, *(f"--{item}" for item in overrides)]).data)
    for cfg in data:
        assert cfg.weight_by == "documents"
        assert [(s.path, s.weight) for s in cfg.sources] == [("/corpus/wiki.jsonl", 34), ("/corpus/books.jsonl", 1)]
    shared = [dataclasses.replace(cfg, tokenizer=None) for cfg in data]  # the warm-up trains the shared tokenizer
    assert all(cfg == shared[0] for cfg in shared)
    tokenizer = str(tmp_path / "out" / "warm_cache" / "tokenizer")
    assert sorted(cfg.tokenizer or "" for cfg in data) == ["", tokenizer, tokenizer, tokenizer, tokenizer]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_reproduce_script_baseline_jobs_run_side_by_side_and_report_a_failure(tmp_path: Path) -> None:
    """The random-init baseline runs one finetune.run per task at once: each needs its own results folder (a folder
    has one writer, which holds its lock), and a task that fails stops the script with its name and log instead of
    a "done"."""
    result, calls = _reproduce_calls(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    folders = [
        next(a for a in call if a.startswith("--results_dir=")) for call in calls if call[:2] == ["-m", "finetune.run"]
    ]
    assert len(folders) == 2 and len(set(folders)) == 2, folders
    schedule = next(call for call in calls if call[:2] == ["-m", "finetune.schedule"])
    assert not set(folders) & set(schedule)

    result, _ = _reproduce_calls(tmp_path / "failing", fail="--task=mrpc")
    assert result.returncode == 1
    assert (
        f"finetune_random_init_mrpc failed: see {tmp_path}/failing/out/finetune_random_init_mrpc.log" in result.stderr
    )
    assert "4. random-init baseline done" not in result.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_reproduce_script_stops_at_a_failed_pretraining_run(tmp_path: Path) -> None:
    """One of the three runs fails (the others finish): the script names it and stops, and fine-tunes nothing
    more; `wait %1 %2 %3` returned only the last run's status and went on."""
    result, calls = _reproduce_calls(tmp_path, fail="--train.run_name=pre_ln")
    assert result.returncode == 1
    assert f"pre_ln failed: see {tmp_path}/out/pre_ln.log" in result.stderr
    assert "pretraining done" not in result.stdout
    assert not [call for call in calls if call[:2] in (["-m", "finetune.report"], ["-m", "finetune.run"])]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
    ("signal", "run_status", "restarts", "requeued"),
    [
        ("midway", "preempted", "0", True),  # the time limit's warning signal: continue in a new allocation
        ("midway", "preempted", "50", False),  # the cap (MAX_REQUEUES, default 50) is reached
        ("none", "preempted", "0", False),  # train.stop_at_step: the run asked to stop
        # The signal as the run ends: the shell reaps the run before its trap returns, and the run's own status
        # (not wait's 138 for the trap) is the job's.
        ("at_exit", "preempted", "0", True),
        # Stopped by its watchdog (exit 3) after a checkpoint of this job's, or before any (it would hang again).
        ("none", "hung", "0", True),
        ("none", "hung", "0", False),
    ],
)
def test_slurm_script_requeues_a_preempted_run_until_it_ends(
    tmp_path: Path, signal: str, run_status: str, restarts: str, requeued: bool
) -> None:
    """A stand-in accelerate plays the run: it signals the batch shell (USR1, as SLURM's --signal=B:USR1 does before
    the time limit) when asked, stops once RUN/STOP appears, and ends with the given status.json (a hung one exits 3,
    having saved a checkpoint where it requeues); a stand-in scontrol records whether the job requeued."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    run_dir = tmp_path / "out"
    _fake(bin_dir, "scontrol", f'echo "scontrol $*" >> {log}\n[[ $1 == show ]] && echo node-1\ntrue\n')
    # One node; srun runs the launcher in its place (exec), in the subshell that reports srun's status to the batch
    # shell: the batch shell is the run's grandparent.
    _fake(bin_dir, "srun", 'while [[ $1 == -* ]]; do shift; done\nSLURM_NODEID=0 exec "$@"\n')
    body = f'echo \'{{"status": "{run_status}"}}\' > {run_dir}/status.json\n'
    checkpoint = run_dir / "checkpoints" / "step_00000004"
    if run_status == "hung":
        body += f"mkdir -p {checkpoint}\ntouch {checkpoint}/train_state.json\n" if requeued else ""
        body += "exit 3\n"
    signal_batch_shell = 'read -r -a parent < "/proc/$PPID/stat"\nkill -USR1 "${parent[3]}"\n'
    if signal == "midway":  # SLURM's USR1 reaches the batch shell, which asks the run to stop through RUN/STOP
        body = signal_batch_shell + f"for _ in $(seq 600); do [[ -e {run_dir}/STOP ]] && break; sleep 0.1; done\n" + body
    elif signal == "at_exit":
        body += signal_batch_shell
    _fake(bin_dir, "accelerate", body)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node-1", "SLURM_NNODES": "1",
           "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": restarts, "PRESET": "configs/pretrain/small_pre_ln.yaml"}  # fmt: skip
    result = subprocess.run(
        ["bash", str(ROOT / "launch" / "slurm_pretrain.sbatch"), f"--train.output_dir={run_dir}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == (3 if run_status == "hung" else 0), result.stdout + result.stderr
    assert ("scontrol requeue 4242" in log.read_text()) == requeued, result.stdout + result.stderr


# A stand-in for `python pretrain/run.py` that leaves what a finished run leaves for the next command to compare:
# its run_config.json (the options as given, resolved as the run would) and a status at max_steps.
FINISHING_RUN = """
out=$(printf '%s\\n' "$@" | sed -n 's/^--train.output_dir=//p')
echo "$out" >> "$CALLS"
mkdir -p "$out"
python - "$@" <<'PY'
import json, sys
from pretrain.common.atomic import write_json
from pretrain.common.cli import to_dict
from pretrain.common.formats import RUN_FORMAT, stamped
from pretrain.config import parse_args
cfg = parse_args(sys.argv[2:])  # after pretrain/run.py
write_json(f"{cfg.train.output_dir}/run_config.json", stamped(to_dict(cfg), RUN_FORMAT))
write_json(f"{cfg.train.output_dir}/status.json", {"status": "finished", "step": cfg.train.max_steps})
PY
touch "$out/metrics.jsonl"
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_changed_option_after_a_first_attempt_names_the_scripts_fix_and_only_the_option(tmp_path: Path) -> None:
    """--train.max_steps=400 after the preset's 2000: refused before either run starts, naming OUT= (the script sets
    the folders) and train.max_steps, not the evaluation cadence the script computed from it."""
    _fake(tmp_path, "fake_run", FINISHING_RUN)
    calls, out = tmp_path / "calls.log", tmp_path / "compare"
    env = {**os.environ, "LAUNCH": f"bash {tmp_path / 'fake_run'}", "OUT": str(out), "CALLS": str(calls),
           "PYTHONPATH": str(ROOT)}  # fmt: skip

    def compare(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(ROOT / "launch" / "compare_placements.sh"), "small", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)  # fmt: skip

    first = compare()
    assert first.returncode == 0, first.stdout + first.stderr
    # The cost, before the first run: both runs' steps at the scale's measured time a step.
    assert "cost: 2,000 + 2,000 steps to train (Post-LN, Pre-LN), about " in first.stderr
    # The next command carries the scale's measured fine-tuning step time: the scheduler's cost before its first job.
    assert "--mode=follow --workers=2 --step_time_s=0.4\n" in first.stdout
    assert calls.read_text().split() == [str(out / "post"), str(out / "pre")]
    again = compare()
    assert again.returncode == 0 and "cost: 0 + 0 steps to train" in again.stderr  # the same command: finished
    changed = compare("--train.max_steps=400")
    assert changed.returncode == 2, changed.stdout + changed.stderr
    assert "already holds this run with other settings (train.max_steps 2000 -> 400: " in changed.stderr
    assert "OUT=NEW_DIR launch/compare_placements.sh small" in changed.stderr
    assert "eval_every" not in changed.stderr and "--train.output_dir=NEW_DIR" not in changed.stderr
    assert len(calls.read_text().split()) == 4  # neither run started


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "launch").glob("*.sbatch")))
def test_slurm_logs_need_no_folder(script: str) -> None:
    """SLURM opens --output before the script runs: a folder in it that a fresh checkout lacks fails the job with no
    log at all."""
    (output,) = [line.split("=", 1)[1] for line in (ROOT / "launch" / script).read_text().splitlines()
                 if line.startswith("#SBATCH --output=")]  # fmt: skip
    assert "/" not in output, output


def test_the_one_gpu_config_keeps_the_gpu_the_scheduler_gave(monkeypatch: pytest.MonkeyPatch) -> None:
    """Accelerate's launcher sets CUDA_VISIBLE_DEVICES from gpu_ids: '0' would move a job that SLURM gave GPU 3 of a
    shared node onto GPU 0. Its own code, with the device type it would find on a GPU node."""
    import accelerate.utils.launch as accelerate_launch
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setattr(accelerate_launch, "get_torch_accelerator_backend", lambda check_available=False: ("cuda", None))
    config = ROOT / "configs" / "accelerate" / "1gpu.yaml"
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(["--config_file", str(config), "x.py"]))
    _, env = accelerate_launch.prepare_simple_launcher_cmd_env(args)
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
