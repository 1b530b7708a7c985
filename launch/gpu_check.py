"""The GPU check: the CUDA tests, the training-step benchmark at BERT-base, a smoke run of the three pretraining
recipes with one MRPC fine-tune each, and the first recipe on two GPUs (DDP, DeepSpeed) where the node has two. Every
step is the command a user would type; docs/gpu_check.md says what each checks and what to read in the summary.

    bash launch/gpu_check.sh OUT --corpus DIR --glue DIR              # one GPU: minutes
    bash launch/gpu_check.sh OUT --corpus DIR --glue DIR --dry-run    # CPU, tiny shapes, every step, one recipe

Each step's output goes to OUT/logs/STEP.log (its command on the first line); a step that fails, or runs past the
check's time limit for one step (a hang), is recorded with the last lines of its log, and the next step runs. OUT/summary.md and OUT/results.json (the figures) are rewritten after
every step. Exit code 0 when every step passed, 1 otherwise, 2 on bad arguments, 130 when stopped (Ctrl-C).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import itertools
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil  # accelerate's dependency: a launcher's workers may run in process groups of their own (setsid)

from pretrain.common import atomic
from pretrain.run_folder.layout import STOP_FILE, list_snapshots, read_metrics, read_status

REPO = Path(__file__).resolve().parents[1]
PRESETS = REPO / "configs" / "pretrain"
TAIL_LINES = 30  # of a failed step's log, in the summary
STOP_WAIT_S = 60  # after Ctrl-C, how long a step may take to stop (a smoke run: a step, a checkpoint) before a kill


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """One smoke run: a BERT-base preset and what changes in it."""

    name: str
    """The run's name: OUT/runs/NAME, and its steps' names."""
    preset: str
    """The preset under configs/pretrain/."""
    overrides: tuple[str, ...]
    """pretrain/run.py options after the preset."""
    about: str
    """One line for the summary."""


RECIPES = (
    # The preset's 10,000 warm-up steps would outlast a smoke run: it warms up over its first 10% instead.
    Recipe(name="post_ln", preset="bert_base_post_ln.yaml",
           overrides=("--optim.warmup_steps=null", "--optim.warmup_fraction=0.1"),
           about="Post-LN, the paper's recipe: lr 1e-4, warm-up (10% of the steps)"),
    Recipe(name="pre_ln", preset="bert_base_pre_ln.yaml", overrides=(),
           about="Pre-LN, the paper's recipe: lr 3e-4, no warm-up"),
    Recipe(name="post_ln_lr3e-4", preset="bert_base_post_ln.yaml",
           overrides=("--optim.lr=3e-4", "--optim.warmup_steps=0"),
           about="Post-LN with Pre-LN's recipe (lr 3e-4, no warm-up): the paper's failing case, Pre-LN's contrast"),
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Sizes:
    """What differs between the check on a GPU and its dry run on CPU."""

    benchmark: tuple[str, ...]
    """benchmarks.train_step's shape and repetition options."""
    launch: tuple[str, ...]
    """The command before pretrain/run.py: accelerate launch with its options."""
    pretrain: tuple[str, ...]
    """pretrain/run.py options after the recipe's: model, data, steps and batch of a smoke run."""
    finetune: tuple[str, ...]
    """finetune.run's recipe options."""
    recipes: tuple[Recipe, ...]
    """The smoke runs."""
    two_process: dict[str, tuple[str, ...]]
    """The first recipe's smoke run on two processes: the run's name suffix -> the command before pretrain/run.py."""
    step_timeout_s: float
    """A step still running after this long has hung: it is stopped and recorded as failed, and the next one runs."""


LAUNCH = (sys.executable, "-m", "accelerate.commands.launch")
ACCELERATE_CONFIGS = REPO / "configs" / "accelerate"
GPU = Sizes(
    benchmark=("--shapes=[base]", "--batch=64", "--reps=10"),
    launch=(*LAUNCH, "--config_file", str(ACCELERATE_CONFIGS / "1gpu.yaml")),
    # 200 steps of the presets' batch, 256 x 128 (64 x 4 micro-batches fit a 16 GB card), a vocabulary of BERT's
    # size, a loss every 10 steps, a validation every 50.
    pretrain=("--data.vocab_size=30522", "--train.max_steps=200", "--train.per_device_batch_size=64",
              "--train.gradient_accumulation_steps=4", "--train.log_every=10", "--train.eval_every=50"),
    finetune=(),
    recipes=RECIPES,
    # Two GPUs of the node: the collectives and the sharded optimizer that one GPU never exercises.
    two_process={"ddp2": (*LAUNCH, "--config_file", str(ACCELERATE_CONFIGS / "8gpu.yaml"), "--num_processes=2"),
                 "deepspeed2": (*LAUNCH, "--config_file", str(ACCELERATE_CONFIGS / "deepspeed_zero2.yaml"),
                                "--num_processes=2")},
    step_timeout_s=3600,  # the longest step, a 200-step BERT-base run on one GPU, takes minutes
)  # fmt: skip
DRY_RUN = Sizes(
    benchmark=("--shapes=[tiny]", "--reps=2", "--warmup=1", "--gemm_size=256"),
    launch=(*LAUNCH, "--cpu", "--num_processes=1", "--num_machines=1", "--mixed_precision=no", "--dynamo_backend=no"),
    pretrain=("--config", str(PRESETS / "tiny_model.yaml"), "--data.vocab_size=300",
              "--data.max_seq_length=32", "--data.num_proc=1", "--train.max_steps=4", "--train.per_device_batch_size=8",
              "--train.gradient_accumulation_steps=1", "--train.log_every=1", "--train.eval_every=2",
              "--train.eval_batches=2", "--train.num_workers=0"),
    # The tiny model has 64 positions (MRPC pairs are longer than that: truncated).
    finetune=("--recipe.epochs=1", "--recipe.max_train_examples=32", "--recipe.max_eval_examples=16",
              "--recipe.max_length=64"),
    recipes=RECIPES[:1],  # the same steps for one recipe: each run costs its imports, about 20 s on two cores
    # DDP on two CPU processes (gloo); DeepSpeed would first build a CPU op, about a minute.
    two_process={"ddp2": ("env", "ACCELERATE_USE_CPU=1", *LAUNCH, "--multi_gpu", "--num_processes=2",
                          "--num_machines=1", "--main_process_port=29547", "--mixed_precision=no",
                          "--dynamo_backend=no")},
    step_timeout_s=1800,  # each step takes a few minutes on two loaded cores
)  # fmt: skip

# Versions, GPU and driver; fails without CUDA unless --dry-run (then nothing after it runs: hours on a CPU).
ENVIRONMENT = """\
import json, shutil, subprocess, sys
from importlib.metadata import version
import torch
cuda = torch.cuda.is_available()
info = {name: version(name) for name in ("torch", "transformers", "accelerate", "datasets", "tokenizers")}
info.update(python=sys.version.split()[0], cuda=torch.version.cuda, gpus=torch.cuda.device_count(),
            gpu=torch.cuda.get_device_name(0) if cuda else None, driver=None)
if cuda and shutil.which("nvidia-smi"):
    smi = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "--id=0"]
    info["driver"] = subprocess.run(smi, capture_output=True, text=True).stdout.strip() or None
print("environment:", json.dumps(info))
if not cuda and "--require-cuda" in sys.argv:
    sys.exit("torch sees no CUDA device: run the check on a GPU node with a CUDA build of torch, or with --dry-run")
"""


def pretrain_command(recipe: Recipe, corpus: Path, out: Path, sizes: Sizes, launch: tuple[str, ...] = (),
                     name: str = "") -> list[str]:  # fmt: skip
    """``accelerate launch pretrain/run.py`` with the recipe's preset, the corpus and a smoke run's size (``launch``:
    another launch than the sizes', for the run ``name``). The tokenizer is a WordPiece trained on the corpus by the
    first run (cached for the others): nothing downloaded."""
    sources = f"[{{kind: json, path: {json.dumps(str(corpus))}}}]"
    name = name or recipe.name
    return [*(launch or sizes.launch), "pretrain/run.py",
            "--config", str(PRESETS / recipe.preset), *recipe.overrides, f"--data.sources={sources}",
            "--data.tokenizer=null", f"--data.cache_dir={out / 'cache'}", f"--train.output_dir={out / 'runs' / name}",
            f"--train.run_name={name}", "--train.checkpoint_every=0", "--train.snapshot_every=0",
            "--train.snapshot_steps=[]", "--train.snapshot_at_start=false", "--tracking.backend=none",
            *sizes.pretrain]  # fmt: skip


def finetune_command(snapshot: Path, glue: Path, out: Path, sizes: Sizes) -> list[str]:
    """One MRPC job (BERT's recipe in bf16, lr 3e-5: the middle of its grid; seed 0). With mrpc_accuracy, all this
    script knows of finetune.run: its command line and the table it prints."""
    return [sys.executable, "-m", "finetune.run", f"--model={snapshot}", "--task=mrpc", f"--data_dir={glue}",
            "--lrs=[3e-5]", "--seeds=[0]", f"--results_dir={out / 'finetune'}",
            "--recipe.mixed_precision=bf16", "--recipe.progress=false", *sizes.finetune]  # fmt: skip


def mrpc_accuracy(log: str) -> float | None:
    """The accuracy column of finetune.run's table (``lr  seeds  accuracy  f1  status``, then one row per lr)."""
    for header, row in itertools.pairwise(log.splitlines()):
        if header.split()[:3] == ["lr", "seeds", "accuracy"]:
            with contextlib.suppress(IndexError, ValueError):  # "-": no job finished
                return float(row.split()[2])
    return None


# The residual schemes against Pre-LN (BENCHMARKS.md section 10): each eager and compiled per layer, against the
# faster Pre-LN; the dry run leaves out the compiled ones (minutes of compiling each on a CPU).
SCHEME_VARIANTS = ("pre", "pre+shc4", "pre+hc4", "pre+mhc4", "pre+attnres", "pre+attnres-b2")


def residual_schemes_command(out: Path, dry_run: bool) -> list[str]:
    """benchmarks.train_step's rows of BENCHMARKS.md section 10, at small and base with a GPU's batch."""
    sizes = DRY_RUN.benchmark if dry_run else ("--shapes=[small, base]", "--batch=64", "--reps=10")
    variants = SCHEME_VARIANTS if dry_run else [v for s in SCHEME_VARIANTS for v in (s, f"{s}+compile-layers")]
    return [sys.executable, "-m", "benchmarks.train_step", *sizes, "--precisions=[fp32, bf16]",
            f"--variants=[{', '.join(variants)}]", "--baseline=pre", f"--out={out / 'residual_schemes.json'}"]  # fmt: skip


def residual_scheme_rows(path: Path) -> list[dict[str, Any]]:
    """Per shape, precision and variant: the extra time and peak memory over the faster Pre-LN."""
    groups = json.loads(path.read_text())["groups"] if path.is_file() else []
    return [{"shape": group["shape_name"], "precision": group["precision"], "variant": row["variant"],
             "baseline": group["baseline"], **row["extra_vs_baseline"], "peak_mib": row["peak_mib"]}
            for group in groups for row in group["rows"]]  # fmt: skip


def residual_scheme_summary(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = ["", "## Residual schemes against Pre-LN (benchmarks.train_step; BENCHMARKS.md section 10)", "",
             "| shape | precision | variant | against | extra time (IQR) | peak MiB | extra peak |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    return lines + [f"| {r['shape']} | {r['precision']} | {r['variant']} | {r['baseline']} | {r['time']:+.0%} "
                    f"({r['time_iqr']:.0%}) | {r['peak_mib']:.0f} | {r['peak']:+.0%} |" for r in rows]  # fmt: skip


def steps(corpus: Path, glue: Path, out: Path, dry_run: bool) -> Iterator[tuple[str, list[str] | str]]:
    """(name, command) in order, or (name, why it is skipped). Lazily: a fine-tune's snapshot exists only once
    its smoke run has ended."""
    sizes = DRY_RUN if dry_run else GPU
    yield "environment", [sys.executable, "-c", ENVIRONMENT, *([] if dry_run else ["--require-cuda"])]
    yield "cuda_tests", [sys.executable, "-m", "pytest", "tests/test_cuda.py", "-v",
                         f"--junitxml={out / 'logs' / 'cuda_tests.xml'}"]  # fmt: skip
    yield "throughput", [sys.executable, "-m", "benchmarks.train_step", *sizes.benchmark, "--precisions=[fp32, bf16]",
                         "--variants=[hf, post, post+dense]", f"--out={out / 'train_step.json'}"]  # fmt: skip
    yield "residual_schemes", residual_schemes_command(out, dry_run)
    for recipe in sizes.recipes:
        yield f"pretrain_{recipe.name}", pretrain_command(recipe, corpus, out, sizes)
        snapshots = list_snapshots(out / "runs" / recipe.name)
        skipped = "its smoke run left no snapshot"
        yield f"mrpc_{recipe.name}", finetune_command(snapshots[-1].path, glue, out, sizes) if snapshots else skipped
    gpus = environment(out / "logs" / "environment.log").get("gpus") or 0
    for suffix, launch in sizes.two_process.items():
        name = f"{sizes.recipes[0].name}_{suffix}"
        if not dry_run and gpus < 2:
            yield f"pretrain_{name}", f"needs two GPUs; {gpus} visible"
        elif "deepspeed" in suffix and importlib.util.find_spec("deepspeed") is None:
            yield f"pretrain_{name}", "deepspeed is not installed (pip install -e '.[deepspeed]')"
        else:
            yield f"pretrain_{name}", pretrain_command(sizes.recipes[0], corpus, out, sizes, launch, name)


@dataclass(kw_only=True)
class Step:
    """What one step did."""

    name: str
    """Its name; its log is logs/NAME.log."""
    status: str
    """passed, failed, skipped (with ``note``) or interrupted."""
    command: str = ""
    """What ran, shell-quoted."""
    returncode: int | None = None
    """Its exit code; None when it did not run or was stopped."""
    seconds: float | None = None
    """Wall-clock time."""
    note: str = ""
    """Why it was skipped; for a failed step, the last lines of its log."""


def run_step(name: str, cmd: list[str], out: Path, timeout_s: float) -> Step:
    """Run ``cmd`` in the checkout with its output to OUT/logs/NAME.log, in a process group of its own: Ctrl-C (or
    SIGTERM) reaches this script alone, which asks the step to stop (``stop_step``); so does ``timeout_s``."""
    log, command = out / "logs" / f"{name}.log", shlex.join(cmd)
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[gpu_check] {name} ...", flush=True)
    start = time.monotonic()
    with open(log, "wb") as f:  # written as the step runs (a log, not a result: atomic.py is for finished files)
        f.write(f"$ {command}\n".encode())
        f.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except KeyboardInterrupt:
            stop_step(proc, cmd)
            return Step(name=name, status="interrupted", command=command, seconds=round(time.monotonic() - start, 1))
        except subprocess.TimeoutExpired:
            stop_step(proc, cmd)
            rc = None
    lines = log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
    if rc is None:
        lines.append(f"[gpu_check] still running after {timeout_s:g} s (a hang?): stopped")
    tail = "\n".join(lines) if rc != 0 else ""
    step = Step(name=name, status="passed" if rc == 0 else "failed", command=command, returncode=rc,
                seconds=round(time.monotonic() - start, 1), note=tail)  # fmt: skip
    print(f"[gpu_check] {name}: {step.status} in {step.seconds} s (log: {log})", flush=True)
    return step


def stop_step(proc: subprocess.Popen, cmd: list[str]) -> None:
    """Ask a step to stop, wait STOP_WAIT_S, then kill what is left of it. A pretraining run is asked through its
    RUN/STOP file (it stops at its next step with a checkpoint, status preempted): a signal would reach its launcher,
    which kills it 5 s later; any other step gets SIGINT, as from Ctrl-C in a terminal."""
    run_dirs = [arg.removeprefix("--train.output_dir=") for arg in cmd if arg.startswith("--train.output_dir=")]
    if run_dirs:
        Path(run_dirs[-1]).mkdir(parents=True, exist_ok=True)
        (Path(run_dirs[-1]) / STOP_FILE).touch()
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_WAIT_S)
    with contextlib.suppress(psutil.NoSuchProcess):
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_check(
    plan: Iterable[tuple[str, list[str] | str]], out: Path, dry_run: bool, timeout_s: float
) -> dict[str, Any]:
    """Run the steps in order (a failed one does not stop the next; a failed environment, or Ctrl-C, stops the
    check), publishing the summary after each; returns the results. ``timeout_s``: a step's limit."""
    described = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True)
    results: dict[str, Any] = {"dry_run": dry_run, "started": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
                               "commit": described.stdout.strip() or "unknown (not a git checkout)",
                               "host": socket.gethostname(), "steps": []}  # fmt: skip
    for name, cmd in plan:
        run = isinstance(cmd, list)
        step = run_step(name, cmd, out, timeout_s) if run else Step(name=name, status="skipped", note=str(cmd))
        results["steps"].append(asdict(step))
        publish(results, out)
        if step.status == "interrupted" or (name == "environment" and step.status == "failed"):
            break
    return results


def publish(results: dict[str, Any], out: Path) -> None:
    """Read each step's figures from what it wrote, then write OUT/results.json and OUT/summary.md."""
    logs = out / "logs"
    results["environment"] = environment(logs / "environment.log")
    results["cuda_tests"] = junit_counts(logs / "cuda_tests.xml")
    results["throughput"] = benchmark_rows(out / "train_step.json")
    results["residual_schemes"] = residual_scheme_rows(out / "residual_schemes.json")
    results["smoke_runs"] = {name: smoke_run(out / "runs" / name, logs / f"mrpc_{name}.log") for name in run_about()}
    atomic.write_json(out / "results.json", results)
    atomic.write_text(out / "summary.md", summary(results))


def run_about() -> dict[str, str]:
    """Every smoke run's name (OUT/runs/NAME) -> one line for the summary."""
    about = {r.name: r.about for r in RECIPES}
    for suffix in GPU.two_process:
        about[f"{RECIPES[0].name}_{suffix}"] = f"{RECIPES[0].name} on two processes ({suffix.removesuffix('2')})"
    return about


def read_text(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def environment(log: Path) -> dict[str, Any]:
    line = next((line for line in read_text(log).splitlines() if line.startswith("environment: ")), None)
    return json.loads(line.removeprefix("environment: ")) if line else {}


def junit_counts(path: Path) -> dict[str, Any]:
    """Outcomes of tests/test_cuda.py from pytest's JUnit XML; empty when pytest wrote none."""
    if not path.is_file():
        return {}
    counts, failing = dict.fromkeys(("passed", "failed", "skipped"), 0), []
    for case in ET.parse(path).getroot().iter("testcase"):
        tags = {child.tag for child in case}
        outcome = "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
        counts[outcome] += 1
        if outcome == "failed":
            failing.append(case.get("name", "?"))
    return {**counts, "failing": failing}


def benchmark_rows(path: Path) -> list[dict[str, Any]]:
    """benchmarks.train_step's rows, as it wrote them: per precision and variant, tokens/s and the ratio to HF."""
    if not path.is_file():
        return []
    payload = json.loads(path.read_text())
    return [{"precision": group["precision"], "batch": group["shape"]["batch"], "seq": group["shape"]["seq"],
             "variant": row["variant"], "tokens_per_s": row["tokens_per_s"],
             "vs_hf": (row.get("speedup_vs_baseline") or {}).get("median"), "mfu": row.get("mfu_exec"),
             "mfu_reference": payload["peaks"].get("reference"), "attention_kernel": row.get("attention_kernel")}
            for group in payload["groups"] for row in group["rows"]]  # fmt: skip


def smoke_run(run_dir: Path, mrpc_log: Path) -> dict[str, Any]:
    """A run's status and last losses from RUN/status.json and RUN/metrics.jsonl, its MRPC accuracy from the
    fine-tune's log; None for what was not measured."""
    if not run_dir.is_dir():
        return {}
    rows, status = read_metrics(run_dir), read_status(run_dir)
    config = json.loads(read_text(run_dir / "run_config.json") or "{}")  # the resolved config, written at the start
    train = config.get("train", {})

    def last(key: str) -> float | None:
        return next((row[key] for row in reversed(rows) if key in row), None)

    # The first logged window holds the start-up (kernel selection, first batches): left out of the speed.
    speeds = [row["train/tokens_per_s"] for row in rows if "train/tokens_per_s" in row][1:]
    return {"status": status.get("status"), "step": status.get("step"),
            "diverged_at_step": status.get("diverged_at_step"),
            "batch": train.get("per_device_batch_size", 0) * train.get("gradient_accumulation_steps", 0) or None,
            "seq": config.get("data", {}).get("max_seq_length"), "train_mlm_loss": last("train/mlm_loss"),
            "val_mlm_loss": last("val/mlm_loss"), "tokens_per_s": statistics.median(speeds) if speeds else None,
            "mrpc_accuracy": mrpc_accuracy(read_text(mrpc_log))}  # fmt: skip


def fmt(value: Any, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def summary(results: dict[str, Any]) -> str:
    steps_ = results["steps"]
    passed = sum(s["status"] == "passed" for s in steps_)
    sizes = DRY_RUN if results["dry_run"] else GPU
    planned = 4 + 2 * len(sizes.recipes) + len(sizes.two_process)  # 4 steps, 2 per recipe, the two-process runs
    not_run = f", {planned - len(steps_)} not run" if len(steps_) < planned else ""
    lines = [f"# GPU check{' (dry run: CPU, tiny shapes; its figures mean nothing)' if results['dry_run'] else ''}",
             "", f"{results['started']}, commit {results['commit']}, host {results['host']}: {passed} of "
             f"{planned} steps passed{not_run}.", "", "| step | status | seconds | log |", "|---|---|---|---|"]  # fmt: skip
    for s in steps_:
        log = f"logs/{s['name']}.log" if s["command"] else "-"
        lines.append(f"| {s['name']} | {s['status']} | {fmt(s['seconds'])} | {log} |")
    env = results["environment"]
    if env:
        gpu = f"{env['gpu']} ({env['gpus']} visible), driver {fmt(env['driver'])}" if env["gpu"] else "none (no CUDA)"
        lines += ["", "## Environment", "", f"- GPU: {gpu}",
                  f"- torch {env['torch']} (CUDA {fmt(env['cuda'])}), transformers {env['transformers']}, "
                  f"accelerate {env['accelerate']}, datasets {env['datasets']}, tokenizers {env['tokenizers']}, "
                  f"Python {env['python']}"]  # fmt: skip
    tests = results["cuda_tests"]
    if tests:
        lines += ["", "## CUDA tests (tests/test_cuda.py)", "",
                  f"{tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped."]  # fmt: skip
        lines += [f"- failed: `{name}`" for name in tests["failing"]]
    rows = results["throughput"]
    if rows:
        lines += ["", f"## Throughput (benchmarks.train_step, batch {rows[0]['batch']} x {rows[0]['seq']})", "",
                  f"| precision | variant | tokens/s | x hf | MFU (vs {rows[0]['mfu_reference']}) | attention kernel |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        lines += [f"| {r['precision']} | {r['variant']} | {r['tokens_per_s']:.0f} | {fmt(r['vs_hf'], '.2f')} | "
                  f"{fmt(r['mfu'], '.1%')} | {fmt(r['attention_kernel'])} |" for r in rows]  # fmt: skip
        lines += ["", "`post`: ours with the sparse MLM head (the default); `post+dense`: the dense head Hugging Face "
                  "runs, so its `x hf` compares the implementations at the same FLOPs. fp32 is TF32 on CUDA."]  # fmt: skip
    lines += residual_scheme_summary(results["residual_schemes"])
    runs = {name: run for name, run in results["smoke_runs"].items() if run}
    if runs:
        lines += ["", "## Smoke runs (accelerate launch pretrain/run.py, then finetune.run on MRPC)", "",
                  "A few hundred steps per recipe, to show that the scale path runs: **not a reproduction** of the "
                  "paper's curves, and a loss or an accuracy this early says little. MRPC: one fine-tune of the final "
                  "snapshot (BERT's recipe, lr 3e-5, seed 0), dev accuracy.", "",
                  "| run | recipe | status | steps | batch | train MLM loss | val MLM loss | tokens/s | MRPC acc |",
                  "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        about = run_about()
        for name, r in runs.items():
            status = r["status"] + (f" at step {r['diverged_at_step']}" if r["diverged_at_step"] is not None else "")
            lines.append(f"| {name} | {about[name]} | {status} | {fmt(r['step'])} | {fmt(r['batch'])} x "
                         f"{fmt(r['seq'])} | {fmt(r['train_mlm_loss'], '.3f')} | {fmt(r['val_mlm_loss'], '.3f')} | "
                         f"{fmt(r['tokens_per_s'], '.0f')} | {fmt(r['mrpc_accuracy'], '.3f')} |")  # fmt: skip
    for s in steps_:
        if s["status"] == "failed":
            how = "timed out" if s["returncode"] is None else f"exit code {s['returncode']}"
            lines += ["", f"## {s['name']} failed ({how})", "", f"`{s['command']}`", "",
                      f"Last lines of logs/{s['name']}.log:", "", "```", s["note"], "```"]  # fmt: skip
        elif s["status"] == "skipped":
            lines += ["", f"## {s['name']} skipped: {s['note']}"]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bash launch/gpu_check.sh", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("out", type=Path, help="a new or empty folder for summary.md, results.json, logs and runs")
    parser.add_argument("--corpus", type=Path, required=True, help='a folder of *.jsonl files, {"text": ...} a line')
    parser.add_argument("--glue", type=Path, required=True, help="GLUE's TSV layout: MRPC/train.tsv, MRPC/dev.tsv")
    parser.add_argument("--dry-run", action="store_true", help="on CPU, tiny shapes and steps, one recipe: every step")
    args = parser.parse_args(argv)
    if not args.corpus.is_dir() or not any(args.corpus.glob("*.jsonl")):
        parser.error(f'--corpus {args.corpus}: not a folder of *.jsonl files (JSON Lines, {{"text": ...}} a line)')
    mrpc = args.glue / "MRPC"
    missing = " or ".join(f"MRPC/{name}" for name in ("train.tsv", "dev.tsv") if not (mrpc / name).is_file())
    if missing:
        parser.error(f"--glue {args.glue}: no {missing} (GLUE's TSV layout: MRPC/train.tsv, MRPC/dev.tsv)")
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        parser.error(f"{args.out} exists and is not an empty folder: give the check a new one")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    # Ctrl-C and SIGTERM (a scheduler, kill) stop the check, set here: a shell starts a background job (`&`) with
    # SIGINT ignored, which Python would keep.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    plan = steps(args.corpus.resolve(), args.glue.resolve(), out, args.dry_run)
    try:
        results = run_check(plan, out, args.dry_run, (DRY_RUN if args.dry_run else GPU).step_timeout_s)
    except KeyboardInterrupt:  # a second Ctrl-C while a step was stopping
        return 130
    print(f"\n{(out / 'summary.md').read_text()}")
    if any(s["status"] == "interrupted" for s in results["steps"]):
        return 130
    return 0 if all(s["status"] == "passed" for s in results["steps"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
