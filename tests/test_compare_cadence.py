"""launch/compare_placements.sh evaluates often enough for its run's length (the report's steps to a loss
interpolate between evaluations)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A stand-in for `python pretrain/run.py` (the comparison's LAUNCH): it records its arguments, one per line, and
# writes the files the script's closing summary reads.
FAKE_RUN = """#!/bin/bash
out=$(printf '%s\\n' "$@" | sed -n 's/^--train.output_dir=//p')
mkdir -p "$out"
printf '%s\\n' "$@" > "$out/args.txt"
printf '{"status": "finished"}' > "$out/status.json"
touch "$out/metrics.jsonl"
"""


def cadences(tmp_path: Path, *args: str) -> list[list[str]]:
    """The --train.eval_every arguments each of the two runs got, in the order given."""
    fake = tmp_path / "fake_run"
    fake.write_text(FAKE_RUN)
    fake.chmod(0o755)
    out = tmp_path / "compare"
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "LAUNCH": f"bash {fake}", "OUT": str(out)}
    result = subprocess.run(
        ["bash", str(ROOT / "launch" / "compare_placements.sh"), "small", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return [
        [a for a in (out / p / "args.txt").read_text().splitlines() if a.startswith("--train.eval_every")]
        for p in ("post", "pre")
    ]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_compare_placements_sizes_the_evaluation_cadence_to_the_run(tmp_path: Path) -> None:
    # 120 steps: every 6 (20 evaluations), not the preset's 100 (evaluations at 0, 100 and 120 only).
    assert cadences(tmp_path, "--train.max_steps=120") == [["--train.eval_every=6"]] * 2
    # The preset's 2000 steps: its own cadence, every 100, is already 20 evaluations.
    assert cadences(tmp_path) == [["--train.eval_every=100"]] * 2
    # A cadence the user passes comes last, so it wins.
    assert (
        cadences(tmp_path, "--train.max_steps=120", "--train.eval_every=50")
        == [["--train.eval_every=6", "--train.eval_every=50"]] * 2
    )
