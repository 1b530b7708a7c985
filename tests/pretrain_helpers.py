"""What the tests of whole pretraining runs share (test_pretrain, test_crash_safety, test_prepare, test_wandb): the
tiny run's arguments, the launcher, and the fixtures a module binds to take them (``data_cache = helpers.data_cache``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState

from tests.conftest import ROOT, TINY_MODEL_ARGS

RUN_PY = ROOT / "pretrain" / "run.py"


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data cache for the module: the tokenizer and instances are built once."""
    return tmp_path_factory.mktemp("data-cache")


@pytest.fixture(autouse=True)
def fresh_accelerate_state() -> None:
    """Accelerate keeps process-wide singletons; each in-process run starts from a clean slate."""
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(autouse=True)
def one_thread() -> None:
    """Tiny models run fastest on one thread, and far faster than two when other jobs share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_args(run_dir: Path, cache: Path, *extra: str) -> list[str]:
    return [
        *TINY_MODEL_ARGS,
        "--data.max_seq_length=32",
        "--data.vocab_size=300",
        "--data.max_documents=30",
        "--data.validation_documents=2",
        f"--data.cache_dir={cache}",
        f"--train.output_dir={run_dir}",
        "--train.per_device_batch_size=8",
        "--train.max_steps=6",
        "--train.log_every=1",
        "--train.eval_every=3",
        "--train.eval_batches=2",
        "--train.checkpoint_every=3",
        *extra,
    ]


def accelerate_launch(args: list[str], argv: list[str], cwd: Path, force_cpu: bool = True) -> subprocess.CompletedProcess:
    # ACCELERATE_USE_CPU=1 is what makes `--multi_gpu` start CPU processes; DeepSpeed finds the CPU by itself.
    full_env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if force_cpu:
        full_env["ACCELERATE_USE_CPU"] = "1"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *args, str(RUN_PY), *argv]
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=900)
