"""Two "nodes" on one machine: two `accelerate launch --num_machines 2 --machine_rank 0|1` commands with one gloo
process each, each node with its own data cache (node-local disk) and the one shared run folder."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pretrain.common.cli import ConfigError
from pretrain.data import vocabulary
from pretrain.run_folder.layout import read_metrics, read_status
from tests.conftest import TINY_MODEL_ARGS

ROOT = Path(__file__).resolve().parents[1]
MULTINODE_CONFIG = ROOT / "configs" / "accelerate" / "multinode_2x8.yaml"
ARGS = [
    *TINY_MODEL_ARGS, "--data.max_seq_length=32",
    "--data.vocab_size=300", "--data.max_documents=30", "--data.validation_documents=2",
    "--train.per_device_batch_size=8", "--train.max_steps=4", "--train.log_every=1", "--train.eval_every=2",
    "--train.eval_batches=2", "--train.checkpoint_every=2", "--train.collective_timeout_s=120",
]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_two_nodes(
    tmp_path: Path, run_dir: Path, *extra: str, node1_env: dict[str, str] | None = None
) -> list[subprocess.CompletedProcess]:
    port = str(_free_port())
    nodes = []
    for rank in (0, 1):
        env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
        env.update(node1_env if rank == 1 and node1_env else {})
        # The multi-node config and the flags launch/slurm_pretrain.sbatch adds to it on every node.
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(MULTINODE_CONFIG),
               "--num_machines", "2", "--num_processes", "2", "--machine_rank", str(rank),
               "--main_process_ip", "127.0.0.1", "--main_process_port", port, str(ROOT / "pretrain" / "run.py"), *ARGS,
               f"--train.output_dir={run_dir}", f"--data.cache_dir={tmp_path / f'node{rank}-cache'}", *extra]  # fmt: skip
        log = (tmp_path / f"node{rank}.log").open("a")
        nodes.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT))
    codes = [node.wait(timeout=600) for node in nodes]
    return [
        subprocess.CompletedProcess(node.args, code, (tmp_path / f"node{rank}.log").read_text())
        for rank, (node, code) in enumerate(zip(nodes, codes, strict=True))
    ]


@pytest.mark.slow  # two launches of two nodes: ~90 s on a quiet 2-core machine, 3 min on a busy one
def test_two_nodes_with_their_own_caches_train_one_run_and_resume_after_a_kill(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # Node 1's process is killed (SIGKILL) at the end of step 3, after the step-2 checkpoint: node 0 fails at the
    # next collective, and the same two commands with --train.resume=auto continue from step 2.
    killed = launch_two_nodes(tmp_path, run_dir, node1_env={"LNBERT_KILL_AT": "step:3"})
    assert killed[1].returncode != 0 and read_status(run_dir)["status"] == "failed", killed[0].stdout[-3000:]
    assert "another process of the run ended first" in read_status(run_dir)["message"], read_status(run_dir)
    before = {r["step"]: r["train/loss"] for r in read_metrics(run_dir) if "train/loss" in r}
    assert sorted(before) == [1, 2, 3]
    results = launch_two_nodes(tmp_path, run_dir, "--train.resume=auto")
    for result in results:
        assert result.returncode == 0, result.stdout[-3000:]
    assert read_status(run_dir)["status"] == "finished"
    after = {r["step"]: r["train/loss"] for r in read_metrics(run_dir) if "train/loss" in r}
    assert after[3] == before[3] and {s: after[s] for s in (1, 2)} == {s: before[s] for s in (1, 2)}  # bit-exact
    # Data: prepared once per node (each node-local cache), from one vocabulary: the main process's tokenizer,
    # which the other node takes from the run folder instead of training its own (WordPiece training breaks
    # ties differently from one run to the next).
    caches = [tmp_path / f"node{rank}-cache" for rank in (0, 1)]
    tokenizers = [sorted(c.glob("tokenizer-*/tokenizer.json")) for c in caches]
    assert all(len(t) == 1 for t in tokenizers), tokenizers
    vocabularies = [json.loads(t[0].read_text())["model"]["vocab"] for t in tokenizers]
    assert vocabularies[0] == vocabularies[1]
    assert json.loads((run_dir / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"] == vocabularies[0]
    instances = [sorted(p.name for p in c.glob("instances-*") if p.is_dir()) for c in caches]
    assert instances[0] == instances[1] and len(instances[0]) == 1  # the same instances, once on each node
    # The run folder is written once, by the global main process: one metrics line per logged step and
    # evaluation, both processes' random states in each checkpoint, nothing of the run in the node caches.
    rows = read_metrics(run_dir)
    steps = [r["step"] for r in rows if "train/loss" in r]
    assert steps == [1, 2, 3, 4]
    assert [r["step"] for r in rows if "val/mlm_loss" in r] == [0, 2, 4]  # the killed try's lines after 2 dropped
    for step in (2, 4):
        checkpoint = run_dir / "checkpoints" / f"step_{step:08d}"
        assert {p.name for p in checkpoint.glob("random_states_*.pkl")} == {"random_states_0.pkl",
                                                                            "random_states_1.pkl"}  # fmt: skip
    for cache in caches:  # the data only (the datasets library's own cache, the tokenizer, the instances)
        assert {p.name.split("-")[0].split(".")[0] for p in cache.iterdir()} <= {"hf", "tokenizer", "instances"}
    assert "2 process(es), global batch 16, resuming at step 2" in results[0].stdout


def test_processes_with_different_vocabularies_are_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node that prepared its own cache with a tokenizer trained there would train on other token ids."""
    tokenizer = SimpleNamespace(get_vocab=lambda: {"[PAD]": 0, "a": 1})
    accelerator = SimpleNamespace(num_processes=2)
    monkeypatch.setattr(vocabulary, "gather_object", lambda items: [*items, "another vocabulary"])
    with pytest.raises(ConfigError, match=r"different vocabularies .* --data\.tokenizer=FOLDER on every node"):
        vocabulary.check_one_vocabulary(accelerator, tokenizer)
    sent = []
    monkeypatch.setattr(vocabulary, "gather_object", lambda items: sent.extend(items) or items * 2)
    vocabulary.check_one_vocabulary(accelerator, tokenizer)  # the same on both: nothing to say
    assert sent == [vocabulary.vocab_hash(tokenizer)]  # the one vocabulary hash (data_fingerprint's too)


def test_the_slurm_script_adds_to_the_multinode_config_the_flags_the_test_passes() -> None:
    """The two-node test launches as launch/slurm_pretrain.sbatch does: its config file and the same flags."""
    script = (ROOT / "launch" / "slurm_pretrain.sbatch").read_text()
    assert "ACCELERATE_CONFIG:-configs/accelerate/multinode_2x8.yaml" in script
    for flag in ("--config_file", "--num_machines", "--num_processes", "--machine_rank", "--main_process_ip",
                 "--main_process_port"):  # fmt: skip
        assert f"{flag} " in script, flag
