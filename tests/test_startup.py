"""Every command reads and checks its options before it imports torch, transformers or datasets (about 9 s of
CPU), so a typo answers at once; ``import pretrain.modeling`` registers the model with the Auto classes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "datasets", "accelerate", "tokenizers", "sklearn", "wandb", "scipy", "matplotlib")

COMMANDS = {
    "pretrain.run": ["-m", "pretrain.run"],
    "pretrain/run.py": ["pretrain/run.py"],  # what `accelerate launch pretrain/run.py` starts
    "pretrain.prepare": ["-m", "pretrain.prepare"],
    "pretrain.export": ["-m", "pretrain.export"],
    "pretrain.output_dir": ["-m", "pretrain.output_dir"],  # launch/slurm_pretrain.sbatch, at every (re)start
    "pretrain.analysis": ["-m", "pretrain.analysis", "grid"],
    "finetune.run": ["-m", "finetune.run"],
    "finetune.schedule": ["-m", "finetune.schedule", "run"],
    "finetune.report": ["-m", "finetune.report"],
    "finetune.dashboard": ["-m", "finetune.dashboard"],
}


def imported_modules(importtime_log: str) -> set[str]:
    """The top-level packages ``python -X importtime`` reports as imported."""
    names = (line.rsplit("|", 1)[-1].strip() for line in importtime_log.splitlines() if line.startswith("import time:"))
    return {name.split(".")[0] for name in names}


def run_python(*args: str, importtime: bool = True) -> subprocess.CompletedProcess[str]:
    """``python [-X importtime] ARGS`` in the checkout (importtime's report goes to stderr)."""
    flags = ["-X", "importtime"] if importtime else []
    return subprocess.run([sys.executable, *flags, *args], cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_typo_is_answered_before_the_heavy_imports(command: str) -> None:
    result = run_python(*COMMANDS[command], "--typo=1")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "unknown key 'typo'" in result.stderr
    heavy = imported_modules(result.stderr) & set(HEAVY)
    assert not heavy, f"{command} imported {sorted(heavy)} before reading its options"


def test_a_wrong_choice_is_answered_before_the_heavy_imports_with_a_suggestion() -> None:
    result = run_python("-m", "pretrain.run", "--model.norm_placement=preln")
    assert result.returncode == 2
    assert "did you mean 'pre'?" in result.stderr
    assert not imported_modules(result.stderr) & set(HEAVY)


def test_a_whole_valid_config_is_read_before_the_heavy_imports(tmp_path: Path) -> None:
    """Every section's checks run without torch or transformers: what launch/slurm_pretrain.sbatch pays at each
    (re)start to find the run folder."""
    preset = REPO / "configs" / "pretrain" / "bert_base_pre_ln.yaml"
    result = run_python("-m", "pretrain.output_dir", "--config", str(preset), f"--train.output_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == str(tmp_path)
    assert not imported_modules(result.stderr) & set(HEAVY)


def test_import_pretrain_is_light_and_pretrain_modeling_registers_the_auto_classes() -> None:
    code = (
        "import sys, pretrain\n"
        "print('torch' in sys.modules)\n"
        "import pretrain.modeling\n"
        "from transformers import AutoConfig\n"
        "print(type(AutoConfig.for_model('lnbert')).__name__)\n"
    )
    result = run_python("-c", code, importtime=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "LNBertConfig"]


def _finished_run(folder: Path, *options: str) -> Path:
    """A run folder as a run that finished leaves its run_config.json (all the early check reads)."""
    from pretrain.common.atomic import write_json
    from pretrain.common.cli import to_dict
    from pretrain.common.formats import RUN_FORMAT, stamped
    from pretrain.config import parse_args

    write_json(folder / "run_config.json", stamped(to_dict(parse_args([f"--train.output_dir={folder}", *options])),
                                                     RUN_FORMAT))  # fmt: skip
    return folder


def test_bad_input_that_needs_no_torch_is_refused_before_it(tmp_path: Path) -> None:
    """Refusals that once waited for torch and the data (a minute under load): each answers with its fix, exit 2."""
    broken, no_text = tmp_path / "broken.jsonl", tmp_path / "no_text.jsonl"
    broken.write_text('{"text": "one"}\n{"text": "two"}\n{"text": "three\n')
    no_text.write_text('{"body": "one"}\n{"body": "two"}\n')
    run = _finished_run(tmp_path / "run", "--optim.lr=1e-4")
    (run / "checkpoints" / "step_00000010").mkdir(parents=True)
    (run / "checkpoints" / "step_00000010" / "train_state.json").write_text("{}")
    cases = {
        "broken.jsonl line 3 is not valid JSON": ["pretrain/run.py", f"--data.sources=[{{kind: json, path: {broken}}}]"],
        "text column 'text' not found; columns are ['body'] (none of the first 2 lines": [
            "pretrain/run.py", f"--data.sources=[{{kind: json, path: {no_text}}}]"],
        "holds a different run: optim.lr 0.0001 -> 0.0003": ["pretrain/run.py", f"--train.output_dir={run}",
                                                             "--optim.lr=3e-4"],
        f"is a training checkpoint (for resuming the run), not a model folder; fine-tune a snapshot of the run, "
        f"RUN/snapshots/step_N: {run / 'snapshots'} holds no complete snapshot yet": [
            "-m", "finetune.run", f"--model={run / 'checkpoints' / 'step_00000010'}", "--task=mrpc"],
        f"--model '{tmp_path / 'nowhere'}': no such model folder": ["-m", "finetune.run", f"--model={tmp_path / 'nowhere'}"],
    }  # fmt: skip
    for message, args in cases.items():
        result = run_python(*args)
        assert result.returncode == 2, (args, result.stderr[-2000:])
        assert message in result.stderr, (message, result.stderr[-2000:])
        assert not imported_modules(result.stderr) & set(HEAVY), args


def test_wandb_without_credentials_is_refused_before_torch(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE")}
    env |= {"NETRC": str(tmp_path / "no-netrc"), "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
            "PYTHONPATH": str(REPO)}  # fmt: skip
    result = subprocess.run([sys.executable, "-X", "importtime", str(REPO / "pretrain" / "run.py"),
                             "--tracking.backend=wandb"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "no W&B credentials found" in result.stderr
    assert not imported_modules(result.stderr) & {"torch", "transformers", "datasets", "accelerate"}
