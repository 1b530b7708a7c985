"""The suite's own promises (tests/conftest.py): a test that fails leaves no process it started behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]

# A command that waits for a signal that never comes, with a step of its own (as a script's), and a test that fails
# while it runs: its timeout raises and the command would sleep on.
FAILING_TEST = """
import subprocess, sys

STEP = "import time; time.sleep(600)"
COMMAND = f"import subprocess, sys, time; step = subprocess.Popen([sys.executable, '-c', {STEP!r}]); " \\
          "open('pids', 'w').write(f'{step.pid} '); time.sleep(600)"

def test_that_fails_while_its_command_still_runs():
    command = subprocess.Popen([sys.executable, "-c", COMMAND])
    while not open("pids", "a+").tell():
        pass
    open("pids", "a").write(str(command.pid))
    assert command.wait(timeout=1) == 0
"""


# The same command killed by the test (as subprocess.run's timeout kills it) before it fails: its step lives on,
# orphaned, no longer a descendant of the test's process.
FAILING_TEST_ORPHAN = FAILING_TEST.split("def test_")[0] + """
def test_that_fails_after_killing_its_command():
    command = subprocess.Popen([sys.executable, "-c", COMMAND])
    while not open("pids", "a+").tell():
        pass
    command.kill()
    command.wait()
    open("pids", "a").write(str(command.pid))
    assert False
"""


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("inner", [FAILING_TEST, FAILING_TEST_ORPHAN], ids=["running", "orphaned"])
def test_a_failed_test_leaves_no_process_behind(tmp_path: Path, inner: str) -> None:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import no_processes_left_by_a_failed_test, pytest_runtest_makereport  # noqa: F401\n"
    )
    (tmp_path / "test_inner.py").write_text(inner)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_inner.py"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert "1 failed" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
    pids = [int(pid) for pid in (tmp_path / "pids").read_text().split()]
    assert len(pids) == 2  # the step, then the command
    deadline = time.monotonic() + 30
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(alive, pids))
