"""Shared fixtures: tiny odd-sized configs, and the real data beside the checkout when it exists."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch
import yaml

# Tests never reach the Hub or W&B servers, and stay within the 2 CPU cores.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist (the README's `-n 2`) the two workers share the cores: one thread each, as oversubscribed
# threads slow tiny models several-fold.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))

ROOT = Path(__file__).resolve().parents[1]
# Real data for development and CI sits beside the checkout; users will not have it.
SHARED_DATA = Path(os.environ.get("LNBERT_SHARED_DATA", ROOT.parent / "shared" / "data"))

# The tiny model, declared once in a preset that the command-line tests pass as --config (TINY_MODEL_ARGS).
TINY_MODEL_PRESET = ROOT / "configs" / "pretrain" / "tiny_model.yaml"
TINY_MODEL_ARGS = ["--config", str(TINY_MODEL_PRESET)]
# Built directly (LNBertConfig(**TINY)) a model needs a vocabulary size: 99, odd, where the preset says "the
# tokenizer's size".
TINY = {**yaml.safe_load(TINY_MODEL_PRESET.read_text())["model"], "vocab_size": 99}


@pytest.fixture
def tiny_kwargs() -> dict:
    return dict(TINY)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA}")
    return SHARED_DATA


# A test that fails must not leave what it started running (a command past its timeout, a process still waiting for
# a signal that never came): the processes it started are killed when it fails. Its descendants, and the processes
# that carry its mark in their environment (inherited): a step whose command was killed (as subprocess.run's timeout
# kills it) is orphaned, no longer a descendant, and sleeps on.
_FAILED = pytest.StashKey[bool]()
_MARK = "LNBERT_TEST_MARK"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[pytest.TestReport]:
    report = yield
    if report.failed:
        item.stash[_FAILED] = True
    return report


@pytest.fixture(autouse=True)
def no_processes_left_by_a_failed_test(request: pytest.FixtureRequest,
                                       monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:  # fmt: skip
    me = psutil.Process()
    before = {child.pid for child in me.children(recursive=True)}
    mark = f"{me.pid}:{request.node.nodeid}"
    monkeypatch.setenv(_MARK, mark)
    yield
    if not request.node.stash.get(_FAILED, False):
        return
    started = {child.pid for child in me.children(recursive=True)} - before
    for proc in psutil.process_iter():
        # W&B's service processes serve this process for its whole life, later tests included.
        with contextlib.suppress(psutil.Error):
            ours = proc.pid in started or (proc.pid != me.pid and proc.environ().get(_MARK) == mark)
            if ours and not proc.name().startswith("wandb-"):
                proc.kill()
