"""The GPU check: environment, CUDA correctness, throughput against Hugging Face, a smoke test of the scale path
(three short BERT-base runs and their fine-tuning), then the ``torch.compile`` row: 6 minutes on one H200 for the
first four stages, plus at most 2 for the compile.

    bash launch/prepare_gpu_check.sh                      # here, once: wheels + corpus + GLUE into .gpu_payload/
    bash launch/gpu_check.sh OUT --corpus .gpu_payload/corpus --glue .gpu_payload/glue
    bash launch/gpu_check.sh OUT --corpus C --glue G --dry-run     # CPU, tiny shapes, every stage (CI runs this)

Stages, in order, each in its own process under its own time budget (a stage that overruns is killed, with its
process group, and recorded as ``timed_out`` with whatever it had written; the next stage still runs):

1. ``environment`` (60 s): GPU, driver, versions; installs the carried wheels the machine lacks (``--wheels``,
   into WORK/site, which every later stage has on its path) and the project (``pip install --no-deps -e .``);
   imports what the later stages need (``STAGE_IMPORTS``): one that fails fails this stage, and the stages that
   need it are skipped with the reason (a missing wheel shows in the first lines, not as three failed runs);
   measured bf16 and TF32 GEMM peaks (8192^3).
2. ``cuda_tests`` (60 s): ``pytest tests/test_cuda.py`` (skipped where CUDA is absent), outcomes parsed.
3. ``throughput`` (90 s): ``benchmarks.train_step`` at BERT-base, seq 128, bf16 autocast, batch 64 and 128:
   Hugging Face (SDPA), ours Post-LN with the sparse MLM head (our default) and with the dense one (the FLOPs
   Hugging Face executes: the implementation's ratio), Pre-LN; the attention kernel each row ran; MFU against
   stage 1's measured peak and the data sheet.
4. ``pretrain`` (the rest of the 6 minutes): a smoke test of the scale path, not a reproduction: three BERT-base
   runs through ``accelerate launch pretrain/run.py`` (Post-LN paper recipe; Pre-LN, 3e-4 without warm-up;
   Post-LN with Pre-LN's recipe, the paper's failing case and Pre-LN's matched contrast), steps sized from stage
   3's throughput so that all three fit, then one MRPC fine-tuning job per final snapshot.
5. ``compile`` (120 s, its own): Hugging Face, ours and ours under ``torch.compile`` at batch 128 (a cold inductor
   compile of forward and backward; compile time apart). Last, so that it takes no time from the runs; a compile
   that overruns is recorded as ``timed_out`` without failing the check (a crash still fails it).

Written as the stages finish: OUT/results.json (atomically), OUT/summary.md, OUT/loss_curves.png, OUT/check.log
(every stage's output). OUT stays at four files (the GPU tool brings back at most eight); runs, caches and installed
wheels go to --work.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _load_atomic() -> Any:
    """pretrain/common/atomic.py, the project's one atomic writer, loaded by its path: ``import
    pretrain.common.atomic`` would run pretrain/__init__.py, which imports torch and transformers (it registers the
    model with the Auto classes), and this script must run, and report, before either is known to work. atomic.py
    imports only the standard library."""
    if "pretrain.common.atomic" in sys.modules:
        return sys.modules["pretrain.common.atomic"]
    spec = importlib.util.spec_from_file_location("_lnbert_atomic", REPO / "pretrain" / "common" / "atomic.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


atomic = _load_atomic()

STAGES = ("environment", "cuda_tests", "throughput", "pretrain", "compile")
# Seconds per stage on one H200. REST_STAGE gets the rest of TOTAL_S (at least its own figure when earlier stages
# overran): 60 + 60 + 90 s and the rest, 6 minutes for the first four stages. The compile stage comes after them
# with its own budget: a cold inductor compile of BERT-base forward and backward is estimated at 1-2 minutes.
BUDGETS_S: dict[str, float] = {"environment": 60, "cuda_tests": 60, "throughput": 90, "pretrain": 180, "compile": 120}
TOTAL_S = 360.0
REST_STAGE = "pretrain"
# Stages whose timeout is reported but does not fail the check: the compile row's time is what it measures.
OPTIONAL_STAGES = frozenset({"compile"})
KILL_GRACE_S = 5.0
TIMED_OUT_RC = 124  # a stage's exit code when its own deadline cut its work short (as timeout(1))
SKIPPED_RC = 3  # a stage's exit code when it has nothing to do (the dry run's compile), with the reason emitted
# What each stage after the first imports; stage 1 imports them all and names the failures, and a stage any of
# whose imports failed is skipped with them as the reason.
STAGE_IMPORTS: dict[str, tuple[str, ...]] = {
    "cuda_tests": ("pytest", "transformers", "pretrain.modeling"),
    "throughput": ("benchmarks.train_step",),
    "pretrain": ("accelerate", "datasets", "pretrain.data.pipeline", "finetune.run", "finetune.store", "matplotlib"),
    "compile": ("benchmarks.train_step",),
}

# Stage 4 sizing (seconds on one H200, estimated before any run; the check reports what they really took, so the
# next person can correct them). Data preparation: WordPiece on the corpus + instances with 16 processes.
DATA_PREP_S = 40.0
RUN_OVERHEAD_S = 20.0  # per pretraining run: start, imports, model init, cache load, snapshots, final checkpoint
FINETUNE_S = 45.0  # the three MRPC jobs side by side, process start included
MARGIN_S = 10.0
LOOP_EFFICIENCY = 0.8  # the real loop (data, clipping, scheduler, logging) against the benchmark's bare step
FALLBACK_TOKENS_PER_S = 200_000.0  # when stage 3 left no figure: a conservative H200 guess, flagged as such
MIN_STEPS, MAX_STEPS = 20, 3000
PRETRAIN_BATCH, PRETRAIN_SEQ = 256, 128
WARMUP_FRACTION = 0.1  # the preset's 10k of 1M (1%) would warm up for 2-3 steps of a run this short: no warm-up
FINETUNE_LR = 3e-5  # the middle of BERT's grid

TINY_MODEL = ["--config", str(REPO / "configs" / "pretrain" / "tiny_model.yaml")]  # --dry-run: the tests' tiny model


# --------------------------------------------------------------------------------------------------
# Plumbing: context, atomic JSON, stage processes
# --------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class Context:
    """What every stage needs; written to WORK/context.json for the stage processes."""

    out: str
    """Folder for results.json, summary.md, loss_curves.png, check.log."""
    work: str
    """Folder for runs, caches, logs and installed wheels."""
    corpus: str
    """JSON Lines corpus ({"text": ...} per line; .jsonl.gz too): a file or a folder of such files."""
    glue: str
    """Folder with MRPC/train.tsv and MRPC/dev.tsv (GLUE layout)."""
    wheels: str | None = None
    """Folder of wheels to install where their distribution is missing; None: install nothing."""
    dry_run: bool = False
    """CPU, tiny shapes, a few steps; every stage runs."""
    started: float = 0.0
    """time.time() when the check started."""
    total_s: float = TOTAL_S
    """Wall-clock budget of the whole check."""
    budgets: dict[str, float] = field(default_factory=lambda: dict(BUDGETS_S))
    """Seconds per stage."""
    deadline: float = 0.0
    """time.time() by which the running stage is killed (set per stage)."""

    @property
    def results_path(self) -> Path:
        return Path(self.out) / "results.json"

    def stage_file(self, name: str) -> Path:
        return Path(self.work) / "stages" / f"{name}.json"


def write_json_atomic(path: Path, payload: Any) -> None:
    atomic.write_text(path, json.dumps(payload, indent=2, default=str) + "\n")


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def stage_env(ctx: Context) -> dict[str, str]:
    """The environment of stage processes: this checkout and the installed wheels first on the path, offline."""
    env = dict(os.environ)
    paths = [str(REPO), str(Path(ctx.work) / "site"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="offline")
    env["PYTHONUNBUFFERED"] = "1"
    return env


# Child process groups of this process, killed when this process is told to stop (see on_terminate).
ACTIVE: set[subprocess.Popen] = set()


def kill_group(proc: subprocess.Popen, grace: float = KILL_GRACE_S) -> None:
    """SIGTERM to the process group (accelerate's children included), SIGKILL after ``grace`` seconds (at once
    when 0: pretrain/run.py takes SIGTERM as a preemption and would spend the time saving a checkpoint)."""
    signals = ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_GRACE_S)) if grace else ((signal.SIGKILL, KILL_GRACE_S),)
    for sig, wait in signals:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def on_terminate(signum: int, frame: Any) -> None:
    """SIGTERM (the orchestrator's timeout, or a user): take the child process groups down, then exit."""
    for proc in list(ACTIVE):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit(128 + signum)


def start_process(cmd: list[str], log: Path, env: dict[str, str], cwd: Path = REPO) -> subprocess.Popen:
    """Start ``cmd`` in its own process group, output appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    ACTIVE.add(proc)
    return proc


def wait_process(proc: subprocess.Popen, timeout: float, grace: float = 0.0) -> int | None:
    """Exit code, or None when it ran past ``timeout`` and was killed."""
    try:
        return proc.wait(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
        kill_group(proc, grace)
        return None
    except BaseException:  # Ctrl-C here: take the children down too
        kill_group(proc, 0)
        raise
    finally:
        ACTIVE.discard(proc)


def run_process(
    cmd: list[str], log: Path, timeout: float, env: dict[str, str], grace: float = 0.0
) -> tuple[int | None, float]:
    """Run ``cmd`` in its own process group with output to ``log``; (exit code or None if it timed out, seconds)."""
    start = time.time()
    rc = wait_process(start_process(cmd, log, env), timeout, grace)
    return rc, time.time() - start


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


# --------------------------------------------------------------------------------------------------
# Orchestration
# --------------------------------------------------------------------------------------------------


def stage_budget(ctx: Context, name: str) -> float:
    """The stage's own budget; REST_STAGE gets what is left of the total (never less than a minimum)."""
    if name == REST_STAGE:
        left = ctx.total_s - (time.time() - ctx.started)
        return max(left, min(ctx.budgets[name], 30.0 if ctx.dry_run else 60.0))
    return ctx.budgets[name]


def failed_imports(env_result: dict[str, Any]) -> dict[str, str]:
    """Module -> error for the imports stage 1 tried and could not do."""
    return {module: error for module, error in (env_result.get("imports") or {}).items() if error != "ok"}


def skip_reason(name: str, env_result: dict[str, Any]) -> str | None:
    """Why stage ``name`` cannot run after stage 1's imports, or None when it can."""
    failed = failed_imports(env_result)
    missing = [f"{module} ({failed[module]})" for module in STAGE_IMPORTS.get(name, ()) if module in failed]
    return f"stage 1 could not import {'; '.join(missing)}" if missing else None


def stage_status(rc: int | None) -> str:
    if rc in (None, TIMED_OUT_RC):
        return "timed_out"
    return {0: "ok", SKIPPED_RC: "skipped"}.get(rc, "failed")


def check_passed(stages: dict[str, dict[str, Any]]) -> bool:
    """Exit code 0's condition: every stage ok or skipped by itself (the dry run's compile), an optional stage
    also when it timed out. A stage skipped for a failed import leaves stage 1 failed, so the check fails."""
    return all(
        s["status"] in ("ok", "skipped") or (name in OPTIONAL_STAGES and s["status"] == "timed_out")
        for name, s in stages.items()
    )


def run_check(ctx: Context) -> dict[str, Any]:
    out, work = Path(ctx.out), Path(ctx.work)
    out.mkdir(parents=True, exist_ok=True)
    (work / "stages").mkdir(parents=True, exist_ok=True)
    (work / "site").mkdir(exist_ok=True)  # on every stage's path from its start: the wheels land here
    results: dict[str, Any] = {
        "check": "lnbert GPU check (launch/gpu_check.py)",
        "dry_run": ctx.dry_run,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ctx.started)),
        "corpus": ctx.corpus,
        "glue": ctx.glue,
        "work": ctx.work,
        "budgets_s": {name: ctx.budgets[name] for name in STAGES} | {"total": ctx.total_s},
        "stages": {name: {"status": "pending"} for name in STAGES},
    }
    publish(ctx, results)
    env = stage_env(ctx)
    check_log = out / "check.log"
    for name in STAGES:
        reason = skip_reason(name, (results["stages"]["environment"].get("result") or {}))
        if reason is not None:
            results["stages"][name] = {"status": "skipped", "reason": reason}
            with open(check_log, "a") as f:
                f.write(f"\n===== stage {name}: skipped: {reason} =====\n")
            publish(ctx, results)
            print(f"[gpu_check] stage {name}: skipped: {reason}", flush=True)
            continue
        budget = stage_budget(ctx, name)
        ctx.deadline = time.time() + budget
        write_json_atomic(work / "context.json", asdict(ctx))
        ctx.stage_file(name).unlink(missing_ok=True)
        log = work / "logs" / f"{name}.log"
        print(f"[gpu_check] stage {name} (budget {budget:.0f} s) ...", flush=True)
        results["stages"][name] = {"status": "running", "budget_s": round(budget, 1)}
        publish(ctx, results)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--stage", name, "--context", str(work / "context.json")]
        rc, seconds = run_process(cmd, log, budget, env, grace=KILL_GRACE_S)
        status = stage_status(rc)
        record: dict[str, Any] = {"status": status, "seconds": round(seconds, 1), "budget_s": round(budget, 1)}
        record["result"] = read_json(ctx.stage_file(name)) or {}
        if status == "skipped":
            record["reason"] = record["result"].get("skipped", "")
        elif status != "ok":
            record["log_tail"] = tail(log)
        if name == "environment" and failed_imports(record["result"]):
            record["reason"] = f"could not import {', '.join(failed_imports(record['result']))}"
        results["stages"][name] = record
        with open(check_log, "a") as f:
            f.write(f"\n===== stage {name}: {status} in {seconds:.1f} s (budget {budget:.0f} s) =====\n")
            f.write(log.read_text(errors="replace") if log.exists() else "")
        results["elapsed_s"] = round(time.time() - ctx.started, 1)
        publish(ctx, results)
        why = f" ({record['reason']})" if record.get("reason") else ""
        print(f"[gpu_check] stage {name}: {status} in {seconds:.1f} s{why}", flush=True)
    return results


def publish(ctx: Context, results: dict[str, Any]) -> None:
    write_json_atomic(ctx.results_path, results)
    atomic.write_text(Path(ctx.out) / "summary.md", summary_markdown(results))


# --------------------------------------------------------------------------------------------------
# Stage 1: environment
# --------------------------------------------------------------------------------------------------


def package_versions(names: list[str]) -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def wheel_distribution(path: Path) -> str:
    """Distribution name of a wheel file (``pyarrow-21.0.0-cp312-...whl`` -> ``pyarrow``), normalised."""
    return re.sub(r"[-_.]+", "-", path.name.split("-")[0]).lower()


def wheel_requirements(path: Path) -> list[str]:
    """The Requires-Dist lines of a wheel (read from its METADATA, without installing it)."""
    import zipfile

    with zipfile.ZipFile(path) as wheel:
        meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        text = wheel.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def wheels_to_install(wheels: list[Path], present: dict[str, str | None]) -> list[Path]:
    """Wheels whose distribution is missing, or present at a version another carried wheel does not accept (e.g. an
    older pyarrow than the carried datasets needs: carry a newer one with EXTRA_WHEELS and it is used)."""
    from packaging.requirements import Requirement

    rejected: set[str] = set()
    for wheel in wheels:
        for line in wheel_requirements(wheel):
            req = Requirement(line)
            name = re.sub(r"[-_.]+", "-", req.name).lower()
            have = present.get(name)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            if have is not None and req.specifier and not req.specifier.contains(have, prereleases=True):
                rejected.add(name)
    return [w for w in wheels if present[wheel_distribution(w)] is None or wheel_distribution(w) in rejected]


def install_wheels(ctx: Context) -> dict[str, Any]:
    """Install the carried wheels the machine lacks (see wheels_to_install) into WORK/site, which is first on every
    stage's path; ``pip install --no-index --no-deps`` never reaches the network. The machine's own versions stay
    for the rest; their fit is checked afterwards (unmet_requirements). In a dry run the plan is recorded only.
    """
    report: dict[str, Any] = {"wheels_dir": ctx.wheels, "installed": [], "already_present": {}, "dry_run": ctx.dry_run}
    if not ctx.wheels:
        report["note"] = "no --wheels folder given: nothing to install"
        return report
    wheels = sorted(Path(ctx.wheels).glob("*.whl"))
    if not wheels:
        report["note"] = f"no wheels in {ctx.wheels}"
        return report
    present = package_versions([wheel_distribution(w) for w in wheels])
    chosen = wheels_to_install(wheels, present)
    report["already_present"] = {k: v for k, v in present.items() if v is not None}
    report["installed"] = [w.name for w in chosen]
    if chosen and not ctx.dry_run:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--disable-pip-version-check", "--target", str(Path(ctx.work) / "site"), *map(str, chosen)]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        report["pip_returncode"] = proc.returncode
        if proc.returncode:
            report["pip_error"] = (proc.stdout + proc.stderr)[-2000:]
    return report


def unmet_requirements(dists: list[str]) -> list[str]:
    """Requirements (without extras) of ``dists`` that the installed packages do not meet, as readable lines."""
    from importlib.metadata import PackageNotFoundError, requires, version

    from packaging.requirements import Requirement

    unmet = []
    for dist in dists:
        try:
            reqs = requires(dist) or []
        except PackageNotFoundError:
            unmet.append(f"{dist}: not installed")
            continue
        for line in reqs:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                have = version(req.name)
            except PackageNotFoundError:
                unmet.append(f"{dist} needs {req}: missing")
                continue
            if req.specifier and not req.specifier.contains(have, prereleases=True):
                unmet.append(f"{dist} needs {req}: found {have}")
    return unmet


def install_project(ctx: Context) -> dict[str, Any]:
    """``pip install --no-deps -e .`` (offline: no build isolation). The stages also have the checkout on their
    path, so a failure here is reported and does not stop the check."""
    if ctx.dry_run:
        return {"skipped": "dry run: the local environment is left alone"}
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-build-isolation",
           "--disable-pip-version-check", "-e", str(REPO)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return {"returncode": proc.returncode, "output": (proc.stdout + proc.stderr)[-1500:]}


def gpu_description() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"cuda_available": torch.cuda.is_available()}
    if not torch.cuda.is_available():
        return info
    props = torch.cuda.get_device_properties(0)
    info.update(name=props.name, memory_gib=round(props.total_memory / 2**30, 1), sm_count=props.multi_processor_count,
                capability=f"{props.major}.{props.minor}", cuda=torch.version.cuda,
                bf16_supported=torch.cuda.is_bf16_supported())  # fmt: skip
    smi = shutil.which("nvidia-smi")
    if smi:
        query = [smi, "--query-gpu=driver_version,memory.total", "--format=csv,noheader"]
        proc = subprocess.run(query, capture_output=True, text=True, check=False)
        info["nvidia_smi"] = proc.stdout.strip() or proc.stderr.strip()
    return info


def stage_environment(ctx: Context, emit: Callable[[dict[str, Any]], None]) -> None:
    result: dict[str, Any] = {}
    result["install"] = install_wheels(ctx)
    emit(result)
    import importlib

    importlib.invalidate_caches()
    names = ["torch", "transformers", "accelerate", "tokenizers", "datasets", "huggingface-hub", "numpy",
             "pyarrow", "pandas", "dill", "multiprocess", "scikit-learn", "matplotlib", "pytest"]  # fmt: skip
    result["versions"] = package_versions(names)
    carried = sorted({wheel_distribution(w) for w in Path(ctx.wheels).glob("*.whl")}) if ctx.wheels else []
    result["unmet_requirements"] = unmet_requirements(carried) if carried else []
    result["project_install"] = install_project(ctx)
    imports = {}
    for module in dict.fromkeys(m for needed in STAGE_IMPORTS.values() for m in needed):
        try:
            importlib.import_module(module)
            imports[module] = "ok"
        except Exception as err:  # e.g. datasets 5.2 with pyarrow < 24: the stages that need it are skipped
            imports[module] = f"{type(err).__name__}: {err}"[:500]
    result["imports"] = imports
    emit(result)
    import torch

    from benchmarks.common import gemm_peaks, machine_info

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result["gpu"] = gpu_description()
    result["machine"] = machine_info(device)
    emit(result)
    torch.backends.cuda.matmul.allow_tf32 = True  # the fp32 figure is TF32, as the data sheet's
    result["gemm"] = gemm_peaks(device, 256 if ctx.dry_run else 8192)
    emit(result)
    failed = failed_imports(result)
    if failed:  # everything above is recorded; the stage fails so that the summary's first lines say so
        print("could not import: " + "; ".join(f"{m}: {e}" for m, e in failed.items()), flush=True)
        raise SystemExit(1)


# --------------------------------------------------------------------------------------------------
# Stage 2: CUDA correctness (tests/test_cuda.py)
# --------------------------------------------------------------------------------------------------

JUNIT_OUTCOMES = {"failure": "failed", "error": "error", "skipped": "skipped"}  # child element -> outcome


def read_junit(path: Path) -> dict[str, Any]:
    """Per-test outcomes from pytest's ``--junitxml`` report. pytest writes it when its session ends, so a pytest
    killed at the stage's deadline leaves none: then the outcomes are unknown (the log keeps what it printed)."""
    import xml.etree.ElementTree as ET

    if not path.is_file():
        return {"counts": {}, "tests": {}, "skip_reasons": [], "report": "absent: pytest did not finish"}
    tests: dict[str, dict[str, Any]] = {}
    skip_reasons: set[str] = set()
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in JUNIT_OUTCOMES:
                outcome, message = JUNIT_OUTCOMES[child.tag], child.get("message") or ""
        if outcome == "skipped" and (case.find("skipped").get("type") or "") == "pytest.xfail":
            outcome = "xfailed"
        tests[name] = {"outcome": outcome} | ({"message": message[:500]} if outcome in ("failed", "error") else {})
        if outcome == "skipped":
            skip_reasons.add(message.removeprefix("pytest.skip: ") if message else "(no reason given)")
    counts: dict[str, int] = {}
    for t in tests.values():
        counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
    return {"counts": counts, "tests": tests, "skip_reasons": sorted(skip_reasons)}


def stage_cuda_tests(ctx: Context, emit: Callable[[dict[str, Any]], None]) -> None:
    log = Path(ctx.work) / "logs" / "pytest_cuda.log"
    report = Path(ctx.work) / "logs" / "pytest_cuda.xml"
    log.unlink(missing_ok=True)
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-v", "-rA", "-p", "no:cacheprovider", f"--junitxml={report}",
           "tests/test_cuda.py"]  # fmt: skip
    # Leave a few seconds to read what ran if pytest itself overruns.
    rc, seconds = run_process(cmd, log, ctx.deadline - time.time() - 4, stage_env(ctx))
    result = read_junit(report)
    result.update(returncode=rc, timed_out=rc is None, seconds=round(seconds, 1))
    emit(result)
    print(tail(log, 40))
    if rc is None:
        raise SystemExit(TIMED_OUT_RC)
    if rc not in (0, 5):  # 5: nothing collected
        raise SystemExit(1)


# --------------------------------------------------------------------------------------------------
# Stage 3: throughput against Hugging Face
# --------------------------------------------------------------------------------------------------


def earlier_result(ctx: Context, stage: str) -> dict[str, Any]:
    results = read_json(ctx.results_path) or {}
    return results.get("stages", {}).get(stage, {}).get("result", {}) or {}


THROUGHPUT_VARIANTS = ["hf", "post", "post+dense", "pre"]
COMPILE_VARIANTS = ["hf", "post", "post+compile"]


def measure(ctx: Context, specs: list[str], batch: int) -> dict[str, Any]:
    """One group of ``benchmarks.train_step`` rows at the check's shape and ``batch``, with both MFUs."""
    from argparse import Namespace

    import torch

    from benchmarks.common import configure_device, gemm_peaks
    from benchmarks.train_step import SHAPES, add_mfu, measure_group, parse_variant

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    configure_device(device)
    peaks = earlier_result(ctx, "environment").get("gemm") or gemm_peaks(device, 256 if ctx.dry_run else 8192)
    shape = SHAPES["tiny" if ctx.dry_run else "base"]
    # padded_batches: one padded position, so that every row (compiled too) takes the same attention kernel.
    bench = Namespace(seed=0, optimizer="fused", warmup=2, reps=2 if ctx.dry_run else 10, profile=None,
                      profile_rows=0, baseline="hf", padded_batches=True)  # fmt: skip
    group = measure_group([parse_variant(s) for s in specs], dict(shape, batch=batch), "bf16", bench, device)
    add_mfu(group, peaks)
    measured = peaks["measured_tflops"]["bf16"]
    sheet = (peaks.get("datasheet_tflops") or {}).get("bf16")
    for row in group["rows"]:
        row["mfu_vs_measured_gemm"] = row["exec_tflops"] / measured
        row["mfu_vs_datasheet"] = row["exec_tflops"] / sheet if sheet else None
    return {"batch": batch, "peaks": peaks, **group}


def implementation_ratio(group: dict[str, Any]) -> dict[str, Any]:
    """Ours / Hugging Face with the same MLM head (``post+dense``: the FLOPs HF executes) -- the implementation's
    ratio -- beside the sparse head's (our default), whose extra share pretrain/flops.py predicts."""
    speed = {r["variant"]: (r.get("speedup_vs_baseline") or {}).get("median") for r in group["rows"]}
    dense, sparse = speed.get("post+dense"), speed.get("post")
    fpt = group["flops_per_token"]
    return {
        "dense_head_vs_hf": dense,
        "sparse_head_vs_hf": sparse,
        "sparse_head_gain": sparse / dense if sparse and dense else None,
        "sparse_head_gain_from_flops": fpt["dense_head"] / fpt["sparse_head"],
    }


def kernels_of(group: dict[str, Any]) -> dict[str, str]:
    return {row["variant"]: row.get("attention_kernel", "-") for row in group["rows"]}


def stage_throughput(ctx: Context, emit: Callable[[dict[str, Any]], None]) -> None:
    from benchmarks.train_step import SHAPES

    result: dict[str, Any] = {"shape": SHAPES["tiny" if ctx.dry_run else "base"], "precision": "bf16", "groups": []}
    for batch in [2] if ctx.dry_run else [64, 128]:
        group = measure(ctx, THROUGHPUT_VARIANTS, batch)
        group["implementation_ratio"] = implementation_ratio(group)
        group["same_attention_kernel"] = len(set(kernels_of(group).values())) == 1
        result["peaks"] = group.pop("peaks")
        result["groups"].append(group)
        emit(result)


def stage_compile(ctx: Context, emit: Callable[[dict[str, Any]], None]) -> None:
    if ctx.dry_run:  # torch.compile on a CPU takes minutes (BENCHMARKS.md: 341 s); the GPU run does it
        emit({"skipped": "dry run: torch.compile on a CPU takes minutes"})
        raise SystemExit(SKIPPED_RC)
    batch = 128
    # Written first: a compile killed at the budget still says what it was doing and since when.
    emit({"batch": batch, "variants": COMPILE_VARIANTS, "started": time.time(), "groups": []})
    group = measure(ctx, COMPILE_VARIANTS, batch)
    group["same_attention_kernel"] = len(set(kernels_of(group).values())) == 1
    rows = {r["variant"]: r for r in group["rows"]}
    compiled, eager = rows["post+compile"], rows["post"]
    emit({"batch": batch, "variants": COMPILE_VARIANTS, "peaks": group.pop("peaks"), "groups": [group],
          "compile_s": compiled["first_step_s"],
          "compiled_vs_eager": eager["step_s"]["median"] / compiled["step_s"]["median"]})  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Stage 4: BERT-base comparison through the real entry point
# --------------------------------------------------------------------------------------------------

# name -> (preset, extra overrides); the runs share data, seed, batch, steps and tokenizer (one cache).
RUNS: dict[str, tuple[str, list[str]]] = {
    "post_ln": ("configs/pretrain/bert_base_post_ln.yaml", []),  # paper recipe: warm-up (WARMUP_RUNS), peak 1e-4
    "pre_ln": ("configs/pretrain/bert_base_pre_ln.yaml", []),  # paper recipe: no warm-up, 3e-4
    # Pre-LN's recipe with Post-LN: the paper's failing case, and the run Pre-LN is matched against (CONTRAST).
    "post_ln_lr3e-4": ("configs/pretrain/bert_base_post_ln.yaml", ["--optim.lr=3e-4", "--optim.warmup_steps=0"]),
}
WARMUP_RUNS = ("post_ln",)  # warm-up scaled to the run (the preset's 10k steps would never end)
# The placement contrast: the same recipe (lr 3e-4, no warm-up), only the norm placement differs. Post-LN's paper
# recipe stays beside it, outside the ratio: against it the steps would mostly measure the 3x learning rate.
CONTRAST = ("pre_ln", "post_ln_lr3e-4")
# The loop's tokens/s over every position of its padded batches (what the benchmark counts), where it logs one.
SLOT_TOKENS_KEY = "train/slot_tokens_per_s"


def benchmark_row(throughput: dict[str, Any]) -> tuple[dict[str, Any] | None, int | None]:
    """Stage 3's row of our Post-LN (the loop's model: sparse head) at its largest batch, and that batch."""
    found: tuple[dict[str, Any] | None, int | None] = (None, None)
    for group in throughput.get("groups", []):
        for row in group["rows"]:
            if row["variant"] == "post":
                found = (row, group["batch"])
    return found


def benchmark_tokens_per_s(throughput: dict[str, Any]) -> float | None:
    """Stage 3's tokens/s of our Post-LN at its largest batch (the closest to the loop's 256 x 128)."""
    row, _ = benchmark_row(throughput)
    return row["tokens_per_s"] if row else None


def plan_steps(seconds: float, tokens_per_s: float | None, dry_run: bool) -> dict[str, Any]:
    """Steps per run so that three runs plus data preparation and fine-tuning fit in ``seconds``."""
    if dry_run:
        return {
            "model": "tiny (2 x 32)",
            "steps": 4,
            "batch": 8,
            "seq": 32,
            "warmup_steps": 1,
            "note": "dry run: fixed tiny plan",
        }
    measured = tokens_per_s is not None
    rate = (tokens_per_s if measured else FALLBACK_TOKENS_PER_S) * LOOP_EFFICIENCY
    train_s = seconds - DATA_PREP_S - len(RUNS) * RUN_OVERHEAD_S - FINETUNE_S - MARGIN_S
    steps = int(max(train_s, 0) / len(RUNS) * rate / (PRETRAIN_BATCH * PRETRAIN_SEQ))
    steps = min(max(steps, MIN_STEPS), MAX_STEPS)
    return {
        "model": "BERT-base",
        "steps": steps,
        "batch": PRETRAIN_BATCH,
        "seq": PRETRAIN_SEQ,
        "warmup_steps": max(1, round(WARMUP_FRACTION * steps)),
        "budget_s": round(seconds, 1),
        "training_s_per_run_planned": round(train_s / len(RUNS), 1),
        "tokens_per_s_used": round(rate),
        "tokens_per_s_source": "stage 3 (ours Post-LN) x loop efficiency" if measured else "fallback guess",
    }


def pretrain_command(ctx: Context, name: str, plan: dict[str, Any], peak_flops: float) -> list[str]:
    preset, extra = RUNS[name]
    steps = plan["steps"]
    work = Path(ctx.work)
    if ctx.dry_run:
        launch = ["--cpu", "--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no",
                  "--dynamo_backend", "no"]  # fmt: skip
    else:
        launch = ["--config_file", str(REPO / "configs/accelerate/1gpu.yaml")]
    sources = f"[{{kind: json, path: {json.dumps(str(Path(ctx.corpus).resolve()))}}}]"
    args = [
        f"--data.sources={sources}",
        "--data.tokenizer=null",  # trained on the corpus by the first run, then cached for the other two
        f"--data.cache_dir={work / 'cache'}",
        f"--train.output_dir={work / 'runs' / name}",
        f"--train.run_name={name}",
        f"--train.max_steps={steps}",
        f"--train.per_device_batch_size={plan['batch']}",
        "--train.gradient_accumulation_steps=1",
        "--train.mixed_precision=bf16",
        f"--train.log_every={max(1, steps // 40)}",
        f"--train.eval_every={max(1, steps // 4)}",
        "--train.eval_batches=4",
        "--train.checkpoint_every=0",  # only the final checkpoint
        f"--train.snapshot_steps=[{max(1, steps // 2)}]",
        "--train.snapshot_every=0",
        "--train.snapshot_at_start=false",
        f"--train.peak_flops_per_device={peak_flops}",
        "--tracking.backend=none",
    ]
    if name in WARMUP_RUNS:
        args.append(f"--optim.warmup_steps={plan['warmup_steps']}")
    if ctx.dry_run:
        args += [*TINY_MODEL, "--data.vocab_size=300", f"--data.max_seq_length={plan['seq']}",
                 "--data.max_documents=40", "--data.validation_documents=2", "--data.num_proc=1",
                 "--train.num_workers=0"]  # fmt: skip
    else:
        args += ["--data.vocab_size=30522", f"--data.max_seq_length={plan['seq']}",
                 f"--data.num_proc={min(16, os.cpu_count() or 1)}", "--data.validation_documents=20"]  # fmt: skip
    return [sys.executable, "-m", "accelerate.commands.launch", *launch, str(REPO / "pretrain/run.py"),
            "--config", str(REPO / preset), *args, *extra]  # fmt: skip


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """RUN/metrics.jsonl (docs/run_layout.md); a torn last line is skipped."""
    rows = []
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return rows
    for line in lines:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def summarize_run(run_dir: Path) -> dict[str, Any]:
    status = read_json(run_dir / "status.json") or {}
    rows = read_metrics(run_dir)
    # MLM loss (the NSP part saturates early and is not what the paper compares); the total where it is absent.
    key = "train/mlm_loss" if any("train/mlm_loss" in r for r in rows) else "train/loss"
    train = [(r["step"], r[key]) for r in rows if key in r]
    val = [(r["step"], r["val/mlm_loss"]) for r in rows if "val/mlm_loss" in r]
    # The first logged window includes CUDA warm-up and the first batches: left out of the loop's speed.
    speeds = [r["train/tokens_per_s"] for r in rows if "train/tokens_per_s" in r][1:]
    slot_speeds = [r[SLOT_TOKENS_KEY] for r in rows if SLOT_TOKENS_KEY in r][1:]
    mfus = [r["train/mfu"] for r in rows if r.get("train/mfu") is not None][1:]
    finite = [loss for _, loss in train if math.isfinite(loss)]
    return {
        "status": status.get("status"),
        "step": status.get("step"),
        "diverged_at_step": status.get("diverged_at_step"),
        "message": status.get("message"),
        "train_loss_key": key,
        "train_loss": train,
        "val_mlm_loss": val,
        "final_train_loss": finite[-1] if finite else None,
        "min_train_loss": min(finite) if finite else None,
        "tokens_per_s_median": statistics.median(speeds) if speeds else None,
        "slot_tokens_per_s_median": statistics.median(slot_speeds) if slot_speeds else None,
        "mfu_median": statistics.median(mfus) if mfus else None,
        "snapshots": complete_snapshots(run_dir),
    }


def complete_snapshots(run_dir: Path) -> list[dict[str, Any]]:
    """Snapshots with their COMPLETE marker, by step (read from snapshot.json, never from the folder name)."""
    found = []
    for marker in (run_dir / "snapshots").glob("*/COMPLETE"):
        info = read_json(marker.parent / "snapshot.json") or {}
        if isinstance(info.get("step"), int):
            found.append({"path": str(marker.parent), "step": info["step"]})
    return sorted(found, key=lambda s: s["step"])


def finite_points(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    return [(step, loss) for step, loss in points if math.isfinite(loss)]


def placement_contrast(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Pre-LN against Post-LN trained with Pre-LN's recipe (CONTRAST: lr 3e-4, no warm-up, the same data, seed,
    batch and steps), so that only the norm placement differs: status, where Post-LN diverged, final and best MLM
    losses, and the steps Pre-LN needs to reach Post-LN's last finite (smoothed) loss."""
    pre, post = CONTRAST
    both = {name: runs[name] for name in CONTRAST if name in runs}
    final = {name: run.get("final_train_loss") for name, run in both.items()}
    return {
        "runs": list(CONTRAST),
        "matched": "lr 3e-4, no warm-up, same data, seed, batch and steps: only the norm placement differs",
        "status": {name: run.get("status") for name, run in both.items()},
        "diverged_at_step": {name: run.get("diverged_at_step") for name, run in both.items()},
        "final_loss": final,
        "min_loss": {name: run.get("min_train_loss") for name, run in both.items()},
        "final_loss_gap": final[post] - final[pre]
        if final.get(pre) is not None and final.get(post) is not None
        else None,
        "steps_to_loss": steps_to_loss(both, reference=post),
    }


def vs_stage3(run: dict[str, Any], bench_tokens_per_s: float | None) -> tuple[float | None, str]:
    """The loop's tokens/s over stage 3's, and what the loop's figure counts: slots (every position of the padded
    batch, as the benchmark counts) where the loop logs them, else real tokens."""
    slot = run.get("slot_tokens_per_s_median")
    speed = slot or run.get("tokens_per_s_median")
    return (speed / bench_tokens_per_s if speed and bench_tokens_per_s else None), ("slot" if slot else "real")


def adamw_of(config: dict[str, Any], cuda: bool) -> str:
    """The AdamW kernel a run's resolved config picks (optim.implementation; auto is PyTorch's own choice)."""
    chosen = (config.get("optim") or {}).get("implementation") or "auto"
    if chosen == "auto":
        return "foreach (auto)" if cuda else "for_loop (auto)"
    return chosen


def loop_vs_benchmark(
    run: dict[str, Any], config: dict[str, Any], bench: dict[str, Any] | None, bench_batch: int | None, cuda: bool
) -> list[str]:
    """What still differs between a run's logged tokens/s and the stage 3 row it is divided by (``config``: the
    run's run_config.json), as lines beside the ratio: it is no loop efficiency until these are accounted for."""
    train, data = config.get("train") or {}, config.get("data") or {}
    lines = []
    if run.get("slot_tokens_per_s_median") is None:
        lines.append("tokens: the loop counts real tokens, the benchmark every slot (padding, about 10% at the presets' "
                     f"data, is missing from the loop's figure; the loop logged no {SLOT_TOKENS_KEY})")  # fmt: skip
    adamw = adamw_of(config, cuda)
    if adamw != "fused":
        lines.append(f"AdamW: the loop's {adamw}, the benchmark's fused")
    if bench is not None:
        loop_batch = (train.get("per_device_batch_size") or 0) * (train.get("gradient_accumulation_steps") or 1)
        lines.append(f"batch: the loop's {loop_batch} x up to {data.get('max_seq_length')} tokens (padded to the "
                     f"longest row, a multiple of 8), the benchmark's {bench_batch} x {bench.get('seq')} random "
                     "tokens with one padded position")  # fmt: skip
        lines.append(f"attention: the benchmark row ran {bench.get('attention_kernel') or 'an unrecorded kernel'}; "
                     "the loop's padded batches pass a mask too (its kernel is not recorded)")  # fmt: skip
    if train.get("compile"):
        lines.append("compile: the loop runs under torch.compile, the benchmark row eagerly")
    lines.append("the loop also loads and collates batches, clips gradients, steps the LR scheduler and logs "
                 "(per-layer gradient norms on log steps)")  # fmt: skip
    return lines


def smoothed(points: list[tuple[int, float]], window: int = 3) -> list[tuple[int, float]]:
    out = []
    for i in range(len(points)):
        chunk = [v for _, v in points[max(0, i - window + 1) : i + 1]]
        out.append((points[i][0], sum(chunk) / len(chunk)))
    return out


def steps_to_loss(runs: dict[str, dict[str, Any]], reference: str = "post_ln") -> dict[str, Any]:
    """Steps each run needs to reach the reference run's final (smoothed) training loss, and the ratio to it.

    The paper's measure of "Pre-LN reaches the same loss in fewer steps"; None where a run never gets there.
    Non-finite losses (a diverged run's last ones) are left out, so the target is the last finite one."""
    ref = smoothed(finite_points(runs.get(reference, {}).get("train_loss") or []))
    if not ref:
        return {"target_loss": None}
    target = ref[-1][1]
    reached = {}
    for name, run in runs.items():
        curve = smoothed(finite_points(run.get("train_loss") or []))
        reached[name] = next((step for step, loss in curve if loss <= target), None)
    ratio = {
        name: (reached[reference] / step if step and reached.get(reference) else None) for name, step in reached.items()
    }
    return {"target_loss": target, "reference": reference, "steps": reached, "speedup_vs_reference": ratio}


def finetune_command(snapshot: Path, glue: str, store: Path, dry_run: bool) -> list[str]:
    """One MRPC job (one lr, one seed) with ``finetune.run``; kept in one place as its flag style may change."""
    cmd = [sys.executable, "-m", "finetune.run", "--model", str(snapshot), "--task", "mrpc", "--data_dir", glue,
           f"--lrs=[{FINETUNE_LR}]", "--seeds=[0]", "--store", str(store), "--recipe.mixed_precision", "bf16",
           "--recipe.progress", "false"]  # fmt: skip
    if dry_run:  # the tiny model has 64 positions: a longer recipe.max_length is refused (real MRPC pairs need it)
        cmd += ["--recipe.epochs", "1", "--recipe.max_train_examples", "32", "--recipe.max_eval_examples", "16",
                "--recipe.max_length", "64"]  # fmt: skip
    return cmd


def finetune_accuracy(store: Path) -> dict[str, Any]:
    from finetune.store import ResultStore

    with ResultStore(store) as results:
        rows = results.rows()
    done = [r for r in rows if r.get("status") == "done"]
    if not done:
        return {"accuracy": None, "status": [r.get("status") for r in rows], "error": [r.get("error") for r in rows]}
    return {"accuracy": done[0].get("accuracy"), "f1": done[0].get("f1"), "wall_time_s": done[0].get("wall_time_s")}


def plot_losses(runs: dict[str, dict[str, Any]], plan: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, run in runs.items():
        if run.get("train_loss"):
            steps, losses = zip(*run["train_loss"], strict=True)
            (line,) = ax.plot(steps, losses, label=f"{name} (train)")
            if run.get("val_mlm_loss"):
                vs, vl = zip(*run["val_mlm_loss"], strict=True)
                ax.plot(vs, vl, "o", color=line.get_color(), label=f"{name} (val MLM)")
            if run.get("diverged_at_step") is not None:
                ax.axvline(run["diverged_at_step"], color=line.get_color(), linestyle=":")
    ax.set_xlabel("step")
    ax.set_ylabel("MLM loss")
    ax.set_title(f"{plan['model']} pretraining, batch {plan['batch']} x {plan['seq']}, bf16")
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic.writing(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def stage_pretrain(ctx: Context, emit: Callable[[dict[str, Any]], None]) -> None:
    work = Path(ctx.work)
    env = stage_env(ctx)
    throughput = earlier_result(ctx, "throughput")
    gemm = earlier_result(ctx, "environment").get("gemm") or {}
    peak_tflops = (gemm.get("measured_tflops") or {}).get("bf16")
    plan = plan_steps(ctx.deadline - time.time(), benchmark_tokens_per_s(throughput), ctx.dry_run)
    peak_flops = peak_tflops * 1e12 if peak_tflops else 0.0
    result: dict[str, Any] = {"plan": plan, "runs": {}, "peak_flops_for_mfu": peak_flops}
    emit(result)
    for name in RUNS:
        run_dir = work / "runs" / name
        # Leave time for the fine-tuning of whatever has finished.
        timeout = ctx.deadline - time.time() - (0 if ctx.dry_run else FINETUNE_S)
        log = work / "logs" / f"{name}.log"
        rc, seconds = run_process(pretrain_command(ctx, name, plan, peak_flops), log, timeout, env)
        print(f"--- {name}: exit code {rc} after {seconds:.1f} s; end of its log ---\n{tail(log, 30)}", flush=True)
        result["runs"][name] = {"returncode": rc, "timed_out": rc is None, "seconds": round(seconds, 1),
                                **summarize_run(run_dir)}  # fmt: skip
        emit(result)
    bench_row, bench_batch = benchmark_row(throughput)
    bench = bench_row["tokens_per_s"] if bench_row else None
    if bench_row is not None:
        bench_row = dict(bench_row, seq=(throughput.get("shape") or {}).get("seq"))
    cuda = bool((earlier_result(ctx, "environment").get("gpu") or {}).get("cuda_available"))
    for name, run in result["runs"].items():
        run["tokens_per_s_vs_stage3"], run["vs_stage3_counts"] = vs_stage3(run, bench)
        config = read_json(work / "runs" / name / "run_config.json") or {}
        run["vs_stage3_differences"] = loop_vs_benchmark(run, config, bench_row, bench_batch, cuda)
        mfu = run.get("mfu_median")
        sheet = ((gemm.get("datasheet_tflops") or {}).get("bf16") or 0) * 1e12
        run["mfu_vs_datasheet"] = mfu * peak_flops / sheet if mfu and sheet else None
    result["placement_contrast"] = placement_contrast(result["runs"])
    plot_losses(result["runs"], plan, Path(ctx.out) / "loss_curves.png")
    result["loss_curves"] = str(Path(ctx.out) / "loss_curves.png")
    emit(result)
    # One MRPC job per final snapshot, side by side (three processes share the GPU and the 16 cores).
    jobs = {}
    for name, run in result["runs"].items():
        final = [s["path"] for s in run["snapshots"] if s["step"] == run.get("step")]
        if run.get("status") == "finished" and final:
            store = work / "finetune" / f"{name}.sqlite"
            store.parent.mkdir(parents=True, exist_ok=True)
            log = work / "logs" / f"finetune_{name}.log"
            jobs[name] = start_process(finetune_command(Path(final[0]), ctx.glue, store, ctx.dry_run), log, env)
        else:
            run["mrpc"] = {"skipped": f"no final snapshot (status {run.get('status')})"}
    for name, proc in jobs.items():
        rc = wait_process(proc, ctx.deadline - time.time() - 2)
        print(
            f"--- MRPC of {name}: exit code {rc}; end of its log ---\n{tail(work / 'logs' / f'finetune_{name}.log', 15)}"
        )
        store = work / "finetune" / f"{name}.sqlite"
        result["runs"][name]["mrpc"] = {"returncode": rc, **(finetune_accuracy(store) if store.exists() else {})}
        emit(result)
    # A diverged run is a result (exit code 0); a crash or a killed job is not.
    codes = [(r["returncode"], (r.get("mrpc") or {}).get("returncode", 0)) for r in result["runs"].values()]
    if any(None in pair for pair in codes):
        raise SystemExit(TIMED_OUT_RC)
    if any(pair != (0, 0) for pair in codes):
        raise SystemExit(1)


# --------------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------------


def fmt(value: Any, spec: str = ".3g", pct: bool = False) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return f"{100 * value:.1f}%" if pct else format(value, spec)


def summary_markdown(results: dict[str, Any]) -> str:
    stages = results["stages"]
    budgets = results["budgets_s"]
    lines = [f"# GPU check{' (dry run, CPU)' if results['dry_run'] else ''}", ""]
    failed = failed_imports(stages["environment"].get("result") or {})
    if failed:  # first: a missing wheel explains whatever is skipped below
        skipped = [name for name in STAGES if stages[name]["status"] == "skipped" and stages[name].get("reason")]
        lines += [f"**Stage 1 could not import {', '.join(failed)}**"
                  + (f"; skipped: {', '.join(skipped)}" if skipped else "") + ".", ""]  # fmt: skip
    lines += [f"Started {results['started']}; elapsed {results.get('elapsed_s', '-')} s of {budgets['total']:.0f} "
              f"(plus {budgets.get('compile', 0):.0f} for the compile stage).",
              "", "| stage | status | seconds | budget s | note |", "|---|---|---|---|---|"]  # fmt: skip
    for name in STAGES:
        s = stages[name]
        note = s.get("reason", "")
        if name in OPTIONAL_STAGES and s["status"] == "timed_out":
            note = "over its own budget: reported, the check does not fail on it"
        lines.append(f"| {name} | {s['status']} | {s.get('seconds', '-')} | {s.get('budget_s', '-')} | {note} |")
    lines += environment_lines(stages["environment"].get("result") or {})
    lines += cuda_test_lines(stages["cuda_tests"].get("result") or {})
    lines += throughput_lines(stages["throughput"].get("result") or {})
    lines += pretrain_lines(stages["pretrain"].get("result") or {})
    lines += compile_lines(stages["compile"])
    for name in STAGES:
        if stages[name].get("log_tail"):
            lines += ["", f"## {name}: {stages[name]['status']}, last lines of its log", "", "```",
                      stages[name]["log_tail"], "```"]  # fmt: skip
    return "\n".join(lines) + "\n"


def environment_lines(env: dict[str, Any]) -> list[str]:
    if not env:
        return []
    gpu, gemm = env.get("gpu", {}), env.get("gemm", {})
    lines = ["", "## 1. Environment", ""]
    if gpu.get("cuda_available"):
        lines.append(f"- GPU: {gpu.get('name')}, {gpu.get('memory_gib')} GiB, CUDA {gpu.get('cuda')}, "
                     f"nvidia-smi: {gpu.get('nvidia_smi', '-')}")  # fmt: skip
    elif gpu:
        lines.append("- GPU: none (CUDA not available)")
    versions = env.get("versions", {})
    lines.append("- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v))
    install = env.get("install", {})
    lines.append(f"- wheels installed: {', '.join(install.get('installed', [])) or 'none'}"
                 f"{' (planned only: dry run)' if install.get('dry_run') and install.get('installed') else ''}")  # fmt: skip
    if install.get("pip_error"):
        lines.append(f"- **pip install failed**: {install['pip_error'][-300:]}")
    if env.get("unmet_requirements"):
        lines.append(f"- **unmet requirements**: {'; '.join(env['unmet_requirements'])}")
    if "imports" in env:
        failed = failed_imports(env)
        lines.append(f"- imports: {'; '.join(f'**{m}**: {e}' for m, e in failed.items()) if failed else 'all ok'}")
    if gemm:
        m, sheet = gemm["measured_tflops"], gemm.get("datasheet_tflops")
        lines.append(f"- GEMM {gemm['gemm_size']}^3 measured: bf16 {m['bf16']:.1f} TFLOP/s, fp32/TF32 "
                     f"{m['fp32']:.1f} TFLOP/s; data sheet: {sheet or 'unknown card'}")  # fmt: skip
    return lines


def cuda_test_lines(tests: dict[str, Any]) -> list[str]:
    if not tests:
        return []
    lines = ["", "## 2. CUDA correctness (tests/test_cuda.py)", "",
             f"- outcomes: {tests.get('counts')}" + (" (pytest timed out)" if tests.get("timed_out") else "")]  # fmt: skip
    if tests.get("report"):
        lines.append(f"- JUnit report {tests['report']} (its log: `logs/pytest_cuda.log`)")
    for name, t in tests.get("tests", {}).items():
        if t["outcome"] not in ("passed", "skipped"):
            lines.append(f"- **{t['outcome']}** `{name}`: {t.get('message', '')}")
    for reason in tests.get("skip_reasons", []):
        lines.append(f"- skipped: {reason}")
    return lines


def row_table(groups: list[dict[str, Any]]) -> list[str]:
    lines = ["| batch | variant | step ms | tokens/s | x HF | MFU vs measured GEMM | MFU vs data sheet | 1st step s "
             "| attention kernel |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for g in groups:
        for r in g["rows"]:
            speed = (r.get("speedup_vs_baseline") or {}).get("median")
            lines.append(f"| {g['batch']} | {r['variant']} | {1e3 * r['step_s']['median']:.1f} | {r['tokens_per_s']:.0f} "
                         f"| {fmt(speed, '.2f')} | {fmt(r.get('mfu_vs_measured_gemm'), pct=True)} "
                         f"| {fmt(r.get('mfu_vs_datasheet'), pct=True)} | {r['first_step_s']:.1f} "
                         f"| {r.get('attention_kernel', '-')} |")  # fmt: skip
    for g in groups:
        if g.get("same_attention_kernel") is False:
            lines.append(f"\n**Batch {g['batch']}: the rows ran different attention kernels**: {kernels_of(g)}.")
    return lines


def throughput_lines(thr: dict[str, Any]) -> list[str]:
    if not thr.get("groups"):
        return []
    shape = thr["shape"]
    lines = ["", f"## 3. Throughput, {shape['layers']} x {shape['hidden']}, seq {shape['seq']}, bf16 autocast", ""]
    lines += row_table(thr["groups"])
    lines.append("")
    for g in thr["groups"]:
        ratio = g.get("implementation_ratio") or {}
        lines.append(f"- batch {g['batch']}: ours / HF with the same (dense) MLM head, the implementation's ratio: "
                     f"{fmt(ratio.get('dense_head_vs_hf'), '.2f')}x; with the sparse head (our default): "
                     f"{fmt(ratio.get('sparse_head_vs_hf'), '.2f')}x, the head's gain "
                     f"{fmt(ratio.get('sparse_head_gain'), '.2f')}x (FLOPs predict "
                     f"{fmt(ratio.get('sparse_head_gain_from_flops'), '.2f')}x)")  # fmt: skip
    lines.append("\nMFU counts executed FLOPs (`post`, `pre`: sparse MLM head). Every batch has one padded position so "
                 "that every row passes SDPA the same mask (the loop's batches are padded too).")  # fmt: skip
    return lines


def pretrain_lines(pre: dict[str, Any]) -> list[str]:
    if not pre.get("runs"):
        return []
    plan = pre["plan"]
    post, ref = CONTRAST[1], WARMUP_RUNS[0]
    lines = ["", "## 4. Smoke test of the scale path (accelerate launch pretrain/run.py), not a reproduction", "",
             f"{plan['steps']} steps of {plan['batch']} x {plan['seq']} per run on a small corpus copy: it shows that "
             "the path runs at scale (launch, bf16, data, snapshots, fine-tuning) and gives a first placement "
             f"contrast, not the paper's curves. {ref} (paper recipe) warms up for {plan['warmup_steps']} steps; "
             f"{' and '.join(CONTRAST)} have none. Steps from {plan.get('tokens_per_s_source', 'a fixed plan')}.", "",
             "| run | status | diverged at | final MLM loss | min MLM loss | tokens/s (loop) | vs stage 3 | MFU vs measured | MFU vs data sheet | MRPC acc | seconds |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in pre["runs"].items():
        acc = (r.get("mrpc") or {}).get("accuracy")
        lines.append(f"| {name} | {r.get('status')} | {fmt(r.get('diverged_at_step'))} | {fmt(r.get('final_train_loss'), '.3f')} "
                     f"| {fmt(r.get('min_train_loss'), '.3f')} | {fmt(r.get('tokens_per_s_median'), '.0f')} "
                     f"| {fmt(r.get('tokens_per_s_vs_stage3'), '.2f')} | {fmt(r.get('mfu_median'), pct=True)} "
                     f"| {fmt(r.get('mfu_vs_datasheet'), pct=True)} | {fmt(acc, '.3f')} | {r.get('seconds')} |")  # fmt: skip
    contrast = pre.get("placement_contrast") or {}
    if contrast:
        final, stl = contrast["final_loss"], contrast["steps_to_loss"]
        lines.append(f"\nPlacement contrast ({contrast['matched']}): final MLM loss "
                     + ", ".join(f"{name} {fmt(final.get(name), '.3f')}" for name in CONTRAST)
                     + f", gap {fmt(contrast.get('final_loss_gap'), '.3f')}"
                     + (f"; {post} diverged at step {contrast['diverged_at_step'][post]}"
                        if (contrast.get("diverged_at_step") or {}).get(post) is not None else ""))  # fmt: skip
        if stl.get("target_loss") is not None:
            steps = stl["steps"]
            lines.append(f"Steps to reach {post}'s last finite smoothed loss {stl['target_loss']:.3f}: "
                         + ", ".join(f"{k} {fmt(v)}" for k, v in steps.items())
                         + f" (x{fmt(stl['speedup_vs_reference'].get(CONTRAST[0]), '.2f')} for {CONTRAST[0]}). "
                         f"{ref} is outside the contrast: another learning rate and a warm-up.")  # fmt: skip
    differences = next((r["vs_stage3_differences"] for r in pre["runs"].values() if r.get("vs_stage3_differences")), [])
    if differences:
        counts = next(iter(pre["runs"].values())).get("vs_stage3_counts", "real")
        lines.append(f"\n'vs stage 3' divides the loop's {counts} tokens/s by stage 3's `post` row at its largest batch; "
                     "what still differs between them:")  # fmt: skip
        lines += [f"- {line}" for line in differences]
    if pre.get("loss_curves"):
        lines.append("\nLoss curves: `loss_curves.png`.")
    return lines


def compile_lines(stage: dict[str, Any]) -> list[str]:
    result = stage.get("result") or {}
    lines = ["", "## 5. torch.compile", ""]
    if stage["status"] == "pending":
        return []
    if stage["status"] == "skipped":
        return [*lines, f"Skipped: {stage.get('reason') or result.get('skipped', '')}"]
    if stage["status"] == "timed_out":
        return [*lines, f"Did not finish within its own {stage.get('budget_s')} s (compile of "
                f"{', '.join(result.get('variants', []))} at batch {result.get('batch')}); the check does not fail on it."]  # fmt: skip
    if not result.get("groups"):
        return [*lines, f"No result (status {stage['status']})."]
    lines += row_table(result["groups"])
    lines.append(f"\nCompile (first step of `post+compile`): {fmt(result.get('compile_s'), '.1f')} s; compiled / eager "
                 f"step: {fmt(result.get('compiled_vs_eager'), '.2f')}x.")  # fmt: skip
    return lines


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------

STAGE_FUNCTIONS: dict[str, Callable[[Context, Callable[[dict[str, Any]], None]], None]] = {
    "environment": stage_environment,
    "cuda_tests": stage_cuda_tests,
    "throughput": stage_throughput,
    "pretrain": stage_pretrain,
    "compile": stage_compile,
}


def run_stage(name: str, context_path: Path) -> int:
    signal.signal(signal.SIGTERM, on_terminate)
    ctx = Context(**json.loads(context_path.read_text()))
    STAGE_FUNCTIONS[name](ctx, lambda result: write_json_atomic(ctx.stage_file(name), result))
    return 0


def parse_budgets(items: list[str]) -> dict[str, float]:
    budgets = dict(BUDGETS_S)
    for item in items:
        name, _, seconds = item.partition("=")
        if name not in budgets:
            raise ValueError(f"--budget {item!r}: unknown stage {name!r}; stages: {', '.join(STAGES)}")
        try:
            budgets[name] = float(seconds)
        except ValueError:
            raise ValueError(
                f"--budget {item!r}: {seconds!r} is not a number of seconds (e.g. throughput=90)"
            ) from None
        if not budgets[name] > 0:
            raise ValueError(f"--budget {item!r}: the budget must be > 0 seconds")
    return budgets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", type=Path, help="output folder (results.json, summary.md, ...)")
    parser.add_argument("--corpus", help="JSON Lines corpus: a .jsonl/.jsonl.gz file or a folder of them")
    parser.add_argument("--glue", help="folder with MRPC/train.tsv and MRPC/dev.tsv")
    parser.add_argument("--wheels", help="wheels to install where missing (default: .gpu_payload/wheels if present)")
    parser.add_argument("--work", type=Path, help="runs, caches, logs (default: a new folder under /tmp)")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, a few steps, every stage")
    parser.add_argument(
        "--budget", action="append", default=[], metavar="STAGE=SECONDS", help="override a stage's budget"
    )
    parser.add_argument("--total", type=float, default=TOTAL_S, help="wall-clock budget of the whole check (s)")
    parser.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)
    parser.add_argument("--context", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, on_terminate)
    if args.stage:
        return run_stage(args.stage, args.context)
    problems = []
    if args.out is None:
        problems.append("give the output folder: gpu_check.sh OUT --corpus PATH --glue PATH")
    if not args.corpus or not Path(args.corpus).exists():
        problems.append(f"--corpus {args.corpus!r} does not exist (prepare it with launch/prepare_gpu_check.sh)")
    if not args.glue or not (Path(args.glue) / "MRPC" / "train.tsv").is_file():
        problems.append(f"--glue {args.glue!r} has no MRPC/train.tsv (the GLUE layout: GLUE/MRPC/train.tsv, dev.tsv)")
    wheels = args.wheels or (
        str(REPO / ".gpu_payload" / "wheels") if (REPO / ".gpu_payload" / "wheels").is_dir() else None
    )
    if args.wheels and not Path(args.wheels).is_dir():
        problems.append(f"--wheels {args.wheels!r} is not a folder")
    try:
        budgets = parse_budgets(args.budget)
    except ValueError as err:
        problems.append(str(err))
        budgets = dict(BUDGETS_S)
    if problems:
        print("gpu_check: " + "\n".join(problems), file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="lnbert-gpu-check-"))
    ctx = Context(out=str(args.out.resolve()), work=str(work.resolve()), corpus=str(Path(args.corpus).resolve()),
                  glue=str(Path(args.glue).resolve()), wheels=str(Path(wheels).resolve()) if wheels else None,
                  dry_run=args.dry_run, started=time.time(), total_s=args.total, budgets=budgets)  # fmt: skip
    results = run_check(ctx)
    print(f"\n[gpu_check] done in {results['elapsed_s']} s: {ctx.out}/summary.md, results.json; work folder {ctx.work}")
    print(summary_markdown(results))
    return 0 if check_passed(results["stages"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
