"""The GPU check (launch/gpu_check.sh, docs/gpu_check.md): its dry run goes through every step on CPU, a failed or hung
step is recorded and the next one runs, Ctrl-C stops the running step and the script, bad arguments exit 2."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "launch" / "gpu_check.py"
GLUE = Path(__file__).resolve().parent / "fixtures" / "glue"
WORDS = ["the", "cat", "sat", "on", "a", "mat", "while", "dogs", "ran", "past", "old", "red", "barns", "near",
         "quiet", "rivers", "under", "grey", "skies", "and", "children", "sang", "songs", "about", "stars"]  # fmt: skip
PYTHON_PASS = [sys.executable, "-c", "pass"]


def make_corpus(folder: Path, documents: int = 40) -> Path:
    """A tiny JSON Lines corpus: documents of sentences, paragraphs split by newlines."""
    rng = random.Random(0)
    folder.mkdir(parents=True)
    with open(folder / "docs.jsonl", "w") as f:
        for _ in range(documents):
            sentences = [" ".join(rng.choices(WORDS, k=rng.randint(6, 14))).capitalize() + "." for _ in range(12)]
            f.write(json.dumps({"text": "\n".join(" ".join(sentences[i : i + 3]) for i in range(0, 12, 3))}) + "\n")
    return folder


def gpu_check(*args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}
    cmd = ["bash", str(ROOT / "launch" / "gpu_check.sh"), *map(str, args)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def load_script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_dry_run_runs_every_step_and_summarises_them(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = gpu_check(out, "--corpus", make_corpus(tmp_path / "corpus"), "--glue", GLUE, "--dry-run")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    recipes = ["post_ln"]  # the dry run runs the steps of one recipe, and that recipe on two processes (DDP)
    names = [
        "environment",
        "cuda_tests",
        "throughput",
        "residual_schemes",
        *[f"{kind}_{r}" for r in recipes for kind in ("pretrain", "mrpc")],
        "pretrain_post_ln_ddp2",
    ]
    assert [(s["name"], s["status"]) for s in results["steps"]] == [(name, "passed") for name in names]
    assert results["environment"]["torch"] and results["environment"]["gpu"] is None
    # On CPU every CUDA test skips; the training steps of every placement pass with the GPU's bound, and the
    # helpers' test.
    tests = results["cuda_tests"]
    assert tests["skipped"] >= 50 and tests["passed"] == 17 and tests["failed"] == 0, tests
    rows = {(r["precision"], r["variant"]): r for r in results["throughput"]}
    assert set(rows) == {(p, v) for p in ("fp32", "bf16") for v in ("hf", "post", "post+dense")}
    assert all(r["tokens_per_s"] > 0 and r["vs_hf"] > 0 for r in rows.values())
    schemes = {(r["precision"], r["variant"]): r for r in results["residual_schemes"]}
    eager = ("pre", "pre+shc4", "pre+hc4", "pre+mhc4", "pre+attnres", "pre+attnres-b2")  # the dry run compiles none
    assert set(schemes) == {(p, v) for p in ("fp32", "bf16") for v in eager}
    assert all(r["baseline"] == "pre" and r["peak_mib"] > 0 for r in schemes.values())
    assert schemes["bf16", "pre"]["time"] == schemes["bf16", "pre"]["peak"] == 0
    for name in recipes:
        run = results["smoke_runs"][name]
        assert run["status"] == "finished" and run["step"] == 4 and run["batch"] == 8, (name, run)
        assert run["train_mlm_loss"] > 0 and run["val_mlm_loss"] > 0 and run["tokens_per_s"] > 0, (name, run)
        assert 0 <= run["mrpc_accuracy"] <= 1, (name, run)  # read from finetune.run's table
    ddp = results["smoke_runs"]["post_ln_ddp2"]
    assert ddp["status"] == "finished" and ddp["step"] == 4, ddp
    assert (out / "runs" / "post_ln_ddp2" / "checkpoints" / "step_00000004" / "random_states_1.pkl").is_file()
    summary = (out / "summary.md").read_text()
    parts = ("7 of 7 steps passed", "## CUDA tests", "| bf16 | post+dense |", "| tiny | bf16 | pre+mhc4 | pre |",
             "not a reproduction", "| post_ln |", "| post_ln_ddp2 |")  # fmt: skip
    for part in parts:
        assert part in summary, part


def test_the_three_recipes_are_the_papers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What each smoke run is given, as pretrain/run.py parses it: only Post-LN's own recipe warms up."""
    from pretrain.config import parse_args

    module = load_script(monkeypatch)
    optim = {}
    for recipe in module.RECIPES:
        command = module.pretrain_command(recipe, tmp_path / "corpus", tmp_path, module.GPU)
        optim[recipe.name] = parse_args(command[command.index("pretrain/run.py") + 1 :]).optim
    assert {name: o.lr for name, o in optim.items()} == {"post_ln": 1e-4, "pre_ln": 3e-4, "post_ln_lr3e-4": 3e-4}
    assert optim["post_ln"].warmup_fraction == 0.1 and optim["post_ln"].warmup_steps is None
    assert optim["pre_ln"].warmup_steps == optim["post_ln_lr3e-4"].warmup_steps == 0


def test_a_failed_step_is_recorded_and_the_next_one_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = load_script(monkeypatch)
    broken = [sys.executable, "-c", "import sys; print('the cause of it'); sys.exit(3)"]
    plan = [("first", PYTHON_PASS), ("broken", broken), ("waiting", "its input is missing"), ("last", PYTHON_PASS)]
    results = module.run_check(plan, tmp_path, dry_run=True, timeout_s=600)
    assert [(s["name"], s["status"], s["returncode"]) for s in results["steps"]] == [
        ("first", "passed", 0), ("broken", "failed", 3), ("waiting", "skipped", None), ("last", "passed", 0),
    ]  # fmt: skip
    assert "the cause of it" in results["steps"][1]["note"]
    assert json.loads((tmp_path / "results.json").read_text())["steps"] == results["steps"]
    summary = (tmp_path / "summary.md").read_text()
    assert "2 of 7 steps passed, 3 not run" in summary and "## broken failed (exit code 3)" in summary
    assert "the cause of it" in summary and "## waiting skipped: its input is missing" in summary
    # A failed environment (e.g. no CUDA) stops the check: the rest would take hours on a CPU.
    plan = [("environment", broken), ("later", PYTHON_PASS)]
    results = module.run_check(plan, tmp_path / "again", dry_run=False, timeout_s=600)
    assert [s["name"] for s in results["steps"]] == ["environment"]


def test_a_hung_step_is_stopped_and_the_next_one_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step past the check's limit for one step (a hang: this one never ends) is stopped, process and children,
    recorded as failed with its log's tail, and the next step runs."""
    module = load_script(monkeypatch)
    monkeypatch.setattr(module, "STOP_WAIT_S", 1)
    pid_file = tmp_path / "child.pid"
    hang = [sys.executable, "-c", "import subprocess, sys, time; print('started', flush=True); "
            f"open({str(pid_file)!r}, 'w').write(str(subprocess.Popen([sys.executable, '-c', "
            "'import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)']).pid)); "
            "time.sleep(600)"]  # fmt: skip
    results = module.run_check([("hang", hang), ("after", PYTHON_PASS)], tmp_path, dry_run=True, timeout_s=10)
    assert [(s["name"], s["status"], s["returncode"]) for s in results["steps"]] == [
        ("hang", "failed", None), ("after", "passed", 0),
    ]  # fmt: skip
    assert "started" in results["steps"][0]["note"] and "still running after 10 s" in results["steps"][0]["note"]
    import psutil

    child = int(pid_file.read_text())  # the step's own child, which ignored the interrupt, is gone too (or a zombie)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert "## hang failed (timed out)" in (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize("to_group", [True, False], ids=["ctrl-c", "sigint-to-the-script"])
def test_ctrl_c_stops_the_running_step_and_the_script(tmp_path: Path, to_group: bool) -> None:
    """Ctrl-C reaches the whole foreground process group; a SIGINT to the script alone does the same. The script
    starts as a shell's background job (`&`) does, with SIGINT ignored: it sets its handler itself."""
    pid_file = tmp_path / "step.pid"
    sleeper = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    code = (
        f"import sys, importlib.util; spec = importlib.util.spec_from_file_location('gpu_check', {str(SCRIPT)!r}); "
        "m = sys.modules['gpu_check'] = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
        f"m.steps = lambda *args: iter([('sleeper', [sys.executable, '-c', {sleeper!r}]), ('after', {PYTHON_PASS!r})]); "
        "sys.exit(m.main(sys.argv[1:]))"
    )
    args = [tmp_path / "out", "--corpus", make_corpus(tmp_path / "corpus"), "--glue", GLUE, "--dry-run"]
    proc = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=ROOT, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        step_pid = int(pid_file.read_text())
        if to_group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130
        with pytest.raises(ProcessLookupError):
            os.kill(step_pid, 0)
    finally:  # a failure leaves nothing sleeping
        for pid in (proc.pid, int(pid_file.read_text()) if pid_file.is_file() and pid_file.read_text() else None):
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.killpg(pid, signal.SIGKILL)
    steps = json.loads((tmp_path / "out" / "results.json").read_text())["steps"]
    assert [(s["name"], s["status"]) for s in steps] == [("sleeper", "interrupted")]


def test_bad_arguments_exit_2_with_what_to_fix(tmp_path: Path) -> None:
    corpus, empty = make_corpus(tmp_path / "corpus"), tmp_path / "empty"
    empty.mkdir()
    used = tmp_path / "used"
    used.mkdir()
    (used / "summary.md").write_text("an earlier check")
    cases = {
        "the following arguments are required: --glue": [tmp_path / "o", "--corpus", corpus],
        "not a folder of \\*.jsonl files": [tmp_path / "o", "--corpus", empty, "--glue", GLUE],
        "no MRPC/train.tsv or MRPC/dev.tsv": [tmp_path / "o", "--corpus", corpus, "--glue", empty],
        "is not an empty folder: give the check a new one": [used, "--corpus", corpus, "--glue", GLUE],
    }
    for message, args in cases.items():
        result = gpu_check(*args, timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        assert re.search(message, result.stderr), (message, result.stderr)
    assert not (tmp_path / "o").exists()
