"""The pretraining job end to end on CPU with tiny models: default run, both placements learn, exact resume,
preemption, divergence, atomic checkpoints, and clear errors for bad input (through run.main)."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import transformers.modeling_utils
from safetensors.torch import load_file
from transformers import AutoTokenizer

from pretrain.modeling import LNBertForPreTraining
from pretrain.run import main
from pretrain.run_folder.checkpointing import latest_checkpoint, list_checkpoints
from pretrain.run_folder.layout import list_snapshots, read_metrics, read_status
from pretrain.tracking.design_stats import measure
from pretrain.training import final_validation, progress_postfix
from tests import pretrain_helpers
from tests.conftest import TINY
from tests.faults.kill_trials import sigterm_while_importing
from tests.pretrain_helpers import ROOT, RUN_PY, accelerate_launch, tiny_args

# The shared fixtures (tests/pretrain_helpers.py): one data cache per module, a clean Accelerate state per test,
# one thread.
data_cache = pretrain_helpers.data_cache
fresh_accelerate_state = pretrain_helpers.fresh_accelerate_state
one_thread = pretrain_helpers.one_thread


def train_losses(run_dir: Path) -> dict[int, float]:
    return {row["step"]: row["train/loss"] for row in read_metrics(run_dir) if "train/loss" in row}


def val_losses(run_dir: Path) -> list[float]:
    return [row["val/mlm_loss"] for row in read_metrics(run_dir) if "val/mlm_loss" in row]


def test_tiny_run_writes_the_documented_layout(tmp_path: Path, data_cache: Path) -> None:
    run = tmp_path / "run"
    assert main(tiny_args(run, data_cache, "--train.snapshot_steps=[4]")) == 0
    status = read_status(run)
    assert status["status"] == "finished" and status["step"] == 6 and status["norm_placement"] == "post"
    assert json.loads((run / "run_config.json").read_text())["model"]["vocab_size"] >= 100
    assert [step for step, _ in list_checkpoints(run)] == [3, 6]  # keep_last_checkpoints=2
    snapshots = list_snapshots(run)
    assert [s.step for s in snapshots] == [0, 4, 6]
    info = snapshots[-1].info
    assert (
        info["tokens_seen"] > 0
        and "val/mlm_loss" in info["metrics"]
        and info["pretrain_config"]["train"]["max_steps"] == 6
    )
    # A snapshot opens with the Auto classes, with clean key names.
    model = LNBertForPreTraining.from_pretrained(snapshots[-1].path)
    assert model.config.norm_placement == "post"
    keys = load_file(snapshots[-1].path / "model.safetensors").keys()
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in keys)
    rows = read_metrics(run)
    assert all("step" in r and "tokens_seen" in r for r in rows)
    last_train = [r for r in rows if "train/loss" in r][-1]
    for key in (
        "train/mlm_loss",
        "train/nsp_loss",
        "train/lr",
        "train/grad_norm",
        "train/tokens_per_s",
        "train/slot_tokens_per_s",
        "train/mfu",
        "grad_norm/layer_00/attn",
        "grad_norm/layer_01/ffn",
    ):
        assert key in last_train, key
    # Slots count the padding too (what a fixed-shape benchmark counts); the MFU peak of a CPU is 0.
    assert last_train["train/slot_tokens_per_s"] >= last_train["train/tokens_per_s"] > 0
    assert json.loads((run / "run_config.json").read_text())["train"]["peak_flops_per_device"] == 0.0
    assert {"val/mlm_loss", "val/mlm_accuracy", "val/nsp_accuracy"} <= set(rows[-1])
    assert (run / "tokenizer" / "tokenizer.json").is_file()
    # The standard scheme logs what it logged before residual schemes existed.
    assert not [k for row in rows for k in row if k.startswith("residual/") or k.endswith("residual")]


# Each residual scheme on the tiny model: its variant (the run's name) and its options.
SCHEME_RUNS = {
    "pre-hc4": ["--model.residual_scheme=hc"],
    "pre-shc2": ["--model.residual_scheme=hc", "--model.hc_dynamic=false", "--model.hc_streams=2"],
    "pre-mhc4": ["--model.residual_scheme=mhc", "--model.mhc_sinkhorn_iters=5"],
    "pre-attnres": ["--model.residual_scheme=attn_res"],
    "pre-attnres-b3": ["--model.residual_scheme=attn_res", "--model.attn_res_block_size=3"],
    "pre-mhclite4": ["--model.residual_scheme=mhc_lite"],
    "pre-frac4": ["--model.residual_scheme=frac"],
    "pre-denseformer": ["--model.residual_scheme=denseformer"],
}


def scheme_run(run: Path, data_cache: Path, variant: str) -> list[dict]:
    """A 3-step run of ``variant`` logging at steps 2 and 3; its training lines."""
    argv = tiny_args(run, data_cache, "--model.norm_placement=pre", *SCHEME_RUNS[variant], "--train.max_steps=3",
                     "--train.log_every=2", "--train.eval_every=0", "--train.checkpoint_every=0",
                     "--train.snapshot_at_start=false")  # fmt: skip
    assert main(argv) == 0
    rows = [row for row in read_metrics(run) if "train/loss" in row]
    assert [row["step"] for row in rows] == [2, 3]
    return rows


@pytest.mark.parametrize("variant", list(SCHEME_RUNS))
def test_a_residual_scheme_run_logs_its_measurements_and_saves_a_snapshot_of_its_scheme(
    tmp_path: Path, data_cache: Path, variant: str
) -> None:
    from transformers import AutoModelForPreTraining

    run = tmp_path / "run"
    last = scheme_run(run, data_cache, variant)[-1]
    sublayers = 4  # 2 layers
    norms = [last[f"residual/output_norm/{k:02d}"] for k in range(sublayers)]
    assert all(math.isfinite(v) and v > 0 for v in norms), norms
    assert last["grad_norm/layer_00/residual"] > 0 and last["grad_norm/layer_01/residual"] > 0
    assert last["grad_norm/layer_01/ffn"] > 0  # the sub-layers' groups as before
    if "hc" in variant or "frac" in variant:
        n = 2 if variant == "pre-shc2" else 4
        h_res = torch.tensor(last["residual/h_res"])
        assert h_res.shape == (sublayers, n, n)
        pre_width = n * n if "frac" in variant else n  # Frac-Connections' H_pre is Gamma^T, m x m
        assert torch.tensor(last["residual/h_pre"]).shape == (sublayers, pre_width)
        assert torch.tensor(last["residual/h_post"]).shape == (sublayers, n)
        gain = last["residual/composite_gain/per_sublayer"]
        assert len(gain) == sublayers and gain[-1] == pytest.approx(
            [last["residual/composite_gain/row"], last["residual/composite_gain/col"]], rel=1e-3
        )
        if "mhc" in variant:  # doubly stochastic, so the composite gain stays 1
            assert torch.allclose(h_res.sum(-1), torch.ones(sublayers, n), atol=1e-3)
            assert last["residual/composite_gain/row"] == pytest.approx(1.0, abs=1e-2)
        if variant == "pre-mhclite4":  # exactly: to float32 rounding, row and column sums alike
            assert last["residual/composite_gain/row"] == pytest.approx(1.0, abs=1e-5)
            assert last["residual/composite_gain/col"] == pytest.approx(1.0, abs=1e-5)
        if variant == "pre-shc2":  # two small steps from A_r = I
            assert torch.allclose(h_res, torch.eye(n).expand(sublayers, n, n), atol=0.05)
    elif variant == "pre-denseformer":  # one row per layer: its weights over X_0 .. X_(i+1), a few steps from e_last
        weights = torch.tensor(last["residual/depth_weights"])
        assert torch.allclose(weights, torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), atol=0.05)
    else:
        weights = torch.tensor(last["residual/depth_weights"])  # (sub-layers + the output) x sources
        assert weights.shape == ((sublayers + 1, sublayers + 1) if variant == "pre-attnres" else (sublayers + 1, 3))
        assert torch.allclose(weights.sum(-1), torch.ones(sublayers + 1), atol=1e-3)
        assert last["grad_norm/output_residual"] > 0
        assert "residual/composite_gain/row" not in last
    # The snapshot is the scheme's, named by its variant; loading it as another scheme is refused.
    snapshot = list_snapshots(run)[-1]
    assert snapshot.info["run_name"] == f"lnbert-{variant}"
    model = AutoModelForPreTraining.from_pretrained(snapshot.path)
    assert model.config.residual_scheme == SCHEME_RUNS[variant][0].split("=")[1]
    with pytest.raises(ValueError, match="Checkpoint does not match residual_scheme='standard'"):
        LNBertForPreTraining.from_pretrained(snapshot.path, residual_scheme="standard")


def test_a_compiled_model_measures_its_scheme_in_a_forward_of_its_own(
    tmp_path: Path, data_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under torch.compile the training forward records nothing (its graph would be traced again with the
    recorder and the hooks in it): one eval forward without gradients a log step measures the same things, the
    scheme's and the layers' alike."""
    from pretrain import training

    monkeypatch.setattr(training, "is_compiled_module", lambda model: True)  # compiling itself takes minutes
    monkeypatch.setattr(training, "measuring", None)  # never reached
    forwards = []
    monkeypatch.setattr(training, "measure", lambda *args: forwards.append(1) or measure(*args))
    last = scheme_run(tmp_path / "run", data_cache, "pre-mhc4")[-1]
    assert len(forwards) == 2 and math.isfinite(last["attention/first_token/01"])  # log steps 2 and 3
    h_res = torch.tensor(last["residual/h_res"])
    assert torch.allclose(h_res.sum(-1), torch.ones(4, 4), atol=1e-3)
    assert all(last[f"residual/output_norm/{k:02d}"] > 0 for k in range(4))


def test_an_ngpt_run_keeps_its_matrices_on_the_sphere_and_logs_its_invariants(tmp_path: Path, data_cache: Path) -> None:
    from pretrain.ngpt import ngpt_stats

    run = tmp_path / "run"
    argv = tiny_args(run, data_cache, "--model.norm_placement=ngpt", "--train.max_steps=3", "--train.log_every=2",
                     "--train.eval_every=0", "--train.checkpoint_every=0", "--optim.weight_decay=0")  # fmt: skip
    assert main(argv) == 0
    last = [row for row in read_metrics(run) if "train/loss" in row][-1]
    # Read between the update and the re-normalisation: one step moved the vectors off the sphere, a little.
    assert 0 < last["ngpt/weight_norm_error"] < 0.1
    assert {"ngpt/attn_alpha/01", "ngpt/mlp_alpha/00", "ngpt/sqk/00", "ngpt/su/01", "ngpt/sz"} <= set(last)
    model = LNBertForPreTraining.from_pretrained(list_snapshots(run)[-1].path)
    assert ngpt_stats(model).weight_norm_error < 1e-5  # after every step: back on the sphere
    assert read_status(run)["run_name"] == "lnbert-ngpt"


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_both_placements_learn(tmp_path: Path, data_cache: Path, placement: str) -> None:
    run = tmp_path / placement
    argv = tiny_args(
        run, data_cache, f"--model.norm_placement={placement}", "--train.max_steps=20", "--optim.lr=5e-3",
        "--train.eval_every=20", "--train.checkpoint_every=0", "--train.snapshot_at_start=false",
        "--train.snapshot_at_end=false", "--train.log_every=4",
    )  # fmt: skip
    assert main(argv) == 0
    first, last = val_losses(run)  # at step 0 and step 20 (ln(300) = 5.7 at init)
    assert last < first - 0.3, (first, last)
    losses = train_losses(run)
    assert losses[20] < losses[4]


def test_resume_reproduces_the_uninterrupted_run_exactly(
    tmp_path: Path, data_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N steps straight == k steps, stop, resume, N-k steps: same per-step losses and bit-identical weights.
    Dropout on, gradient accumulation 2, and enough steps to cross an epoch boundary. The resumed part recomputes
    its activations (train.gradient_checkpointing, which a continued run may change): the same bits."""
    checkpointed: list[int] = []  # one entry per layer forward run under transformers' activation checkpointing

    def counting_checkpoint(*args: object, **kwargs: object) -> object:
        checkpointed.append(1)
        return torch.utils.checkpoint.checkpoint(*args, **kwargs)

    monkeypatch.setattr(transformers.modeling_utils, "checkpoint", counting_checkpoint)
    common = ["--train.gradient_accumulation_steps=2", "--data.max_documents=6", "--train.max_steps=10",
              "--train.eval_every=4", "--train.checkpoint_every=4"]  # fmt: skip
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(tiny_args(straight, data_cache, *common)) == 0
    assert main(tiny_args(split, data_cache, *common, "--train.stop_at_step=5")) == 0
    assert read_status(split)["status"] == "preempted" and latest_checkpoint(split).name == "step_00000005"
    assert not checkpointed
    assert main(tiny_args(split, data_cache, *common, "--train.resume=auto", "--train.gradient_checkpointing=true")) == 0
    assert read_status(split)["status"] == "finished"
    # Every layer of each micro-batch of steps 6-10 (2 a step, 1 where the epoch ends mid-step); evaluation
    # (no_grad) runs as is.
    layers = TINY["num_hidden_layers"]
    assert 5 * layers <= len(checkpointed) <= 5 * 2 * layers and len(checkpointed) % layers == 0
    epochs = [r["train/epoch"] for r in read_metrics(straight) if "train/epoch" in r]
    assert epochs[-1] >= 1, "the test should cross an epoch boundary"
    assert train_losses(straight) == train_losses(split)
    assert val_losses(straight)[-1] == val_losses(split)[-1]
    a = load_file(latest_checkpoint(straight) / "model.safetensors")
    b = load_file(latest_checkpoint(split) / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_corpus_changed_in_place_is_other_data_and_one_touched_is_not(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The same path and options, other text: the prepared instances differ, and the resumed run says that the data
    starts over (it had continued at its position in other data without a word). Copied again with a new time but
    the same text, the instances are made again to the same bytes: the run continues where it was."""
    corpus = tmp_path / "corpus.jsonl"
    lines = [json.dumps({"text": f"The {w} sat on mat {i}.\nA {w} ran past the red barn {i} times."})
             for i, w in enumerate(["cat", "dog", "bird", "fox", "owl", "cow"] * 5)]  # fmt: skip
    corpus.write_text("\n".join(lines) + "\n")
    argv = tiny_args(tmp_path / "run", tmp_path / "cache", f"--data.sources=[{{kind: json, path: {corpus}}}]",
                     "--data.vocab_size=120", "--train.max_steps=9")  # fmt: skip
    assert main([*argv, "--train.stop_at_step=3"]) == 0
    corpus.write_text(corpus.read_text())  # a new modification time, the same bytes
    capsys.readouterr()
    assert main([*argv, "--train.stop_at_step=6", "--train.resume=auto"]) == 0
    assert "the data starts over" not in capsys.readouterr().out
    corpus.write_text("\n".join(line.replace("sat on", "slept by") for line in lines) + "\n")
    assert main([*argv, "--train.resume=auto"]) == 0
    assert "with other data (its settings, or a corpus file changed in place: other prepared instances): the data " \
           "starts over" in capsys.readouterr().out


@pytest.mark.parametrize("variant", ["pre-mhclite4", "pre-frac4", "pre-denseformer"])
def test_a_residual_scheme_resumes_exactly(tmp_path: Path, data_cache: Path, variant: str) -> None:
    """A residual scheme's run stopped at a checkpoint and resumed: the same per-step losses and bit-identical
    weights as straight through (the scheme's parameters, their optimizer state and its measurements' steps)."""
    common = ["--model.norm_placement=pre", *SCHEME_RUNS[variant], "--train.max_steps=4", "--train.eval_every=0",
              "--train.checkpoint_every=2", "--train.log_every=2"]  # fmt: skip
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(tiny_args(straight, data_cache, *common)) == 0
    assert main(tiny_args(split, data_cache, *common, "--train.stop_at_step=2")) == 0
    assert main(tiny_args(split, data_cache, *common, "--train.resume=auto")) == 0
    assert train_losses(straight) == train_losses(split)
    a = load_file(latest_checkpoint(straight) / "model.safetensors")
    b = load_file(latest_checkpoint(split) / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# The designs inside the layer (tests/test_layer_designs.py), two runs covering each: its options and its run name.
DESIGN_RUNS = {
    "pre-gpas-gated-vres-learn-derf": ["--model.norm_placement=pre", "--model.gpas=true", "--model.norm_type=derf",
                                       "--model.attention_gate=elementwise", "--model.value_residual=learnable"],
    "deepnorm-gpas-gated-head-vres-seednorm": ["--model.norm_placement=deepnorm", "--model.gpas=true",
                                               "--model.norm_type=seednorm", "--model.attention_gate=headwise",
                                               "--model.value_residual=identity"],
}  # fmt: skip


@pytest.mark.parametrize("variant", list(DESIGN_RUNS))
def test_a_design_run_logs_its_claims_saves_reloads_and_resumes_exactly(
    tmp_path: Path, data_cache: Path, variant: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Through run.py: the claims of docs/placements.md logged at log steps, histograms in metrics.jsonl alone, an
    alarm printed once, a snapshot the Auto classes open to the same outputs, and 4 steps straight == 2 steps, stop,
    resume, 2 steps, bit for bit."""
    from transformers import AutoModelForPreTraining

    from pretrain import training

    alarm = {"gpas/scale/00": "gpas/scale/00 = 0.0500: its gate is past 1.2"}  # at every log step
    monkeypatch.setattr(training, "gpas_alarms", lambda design: alarm if "gpas/scale/00" in design else {})

    common = [*DESIGN_RUNS[variant], "--train.max_steps=4", "--train.log_every=2", "--train.eval_every=0",
              "--train.checkpoint_every=2", "--train.snapshot_at_start=false"]  # fmt: skip
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(tiny_args(straight, data_cache, *common)) == 0
    assert capsys.readouterr().out.count("alarm at step 2: gpas/scale/00 = 0.0500") == 1  # not again at step 4
    assert main(tiny_args(split, data_cache, *common, "--train.stop_at_step=2")) == 0
    assert main(tiny_args(split, data_cache, *common, "--train.resume=auto")) == 0
    assert train_losses(straight) == train_losses(split) and list(train_losses(straight)) == [2, 4]
    a = load_file(latest_checkpoint(straight) / "model.safetensors")
    b = load_file(latest_checkpoint(split) / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    last = [row for row in read_metrics(straight) if "train/loss" in row][-1]
    claims = ["hidden/variance/01", "hidden/absmax/01", "attention/first_token/01", "attention/sep/01",
              "attention/gate/01", "gpas/scale/01", "preact/absmax/03", "preact/saturated/03", "attention/max_logit/01",
              "branch/ratio/03", "norm/alpha/03" if "derf" in variant else "grad_norm/seednorm_beta/03"]  # fmt: skip
    assert all(math.isfinite(last[key]) for key in claims), {key: last.get(key) for key in claims}
    for key in ("preact/histogram/03", "attention/gate_histogram/01"):  # fractions of the values per bin
        assert len(last[key]) == 10 and sum(last[key]) == pytest.approx(1, abs=1e-3), last.get(key)
    evaluations = [row for row in read_metrics(straight) if "val/mlm_loss" in row]
    assert [row["step"] for row in evaluations] == [0, 4]
    for row in evaluations:  # Derf's claim: the validation loss against the fit, measured alike
        assert row["val/generalization_gap"] == row["val/mlm_loss"] - row["val/train_split_mlm_loss"]
    assert ("value_residual/lambda1/01" in last) == variant.startswith("pre-")
    snapshot = list_snapshots(straight)[-1]
    assert snapshot.info["run_name"] == f"lnbert-{variant}"
    model = AutoModelForPreTraining.from_pretrained(snapshot.path).eval()
    model.save_pretrained(tmp_path / "again")
    again = AutoModelForPreTraining.from_pretrained(tmp_path / "again").eval()
    ids = torch.randint(5, model.config.vocab_size, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(again(ids).prediction_logits, model(ids).prediction_logits, rtol=0, atol=0)


def test_nan_loss_stops_as_diverged_without_checkpoint(tmp_path: Path, data_cache: Path) -> None:
    run = tmp_path / "nan"
    argv = tiny_args(run, data_cache, "--optim.lr=1e30", "--train.checkpoint_every=1", "--train.snapshot_every=1",
                     "--optim.max_grad_norm=0")  # fmt: skip
    assert main(argv) == 0  # divergence is an outcome, not a crash
    status = read_status(run)
    assert status["status"] == "diverged", status
    bad = status["diverged_at_step"]
    assert bad is not None and status["step"] == bad - 1 and f"step {bad}" in status["message"]
    assert all(step < bad for step, _ in list_checkpoints(run))
    assert all(s.step < bad for s in list_snapshots(run))
    for snapshot in list_snapshots(run):  # what was saved is finite
        assert all(torch.isfinite(t).all() for t in load_file(snapshot.path / "model.safetensors").values())


def test_nan_from_the_model_is_caught_in_that_step(
    tmp_path: Path, data_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}
    forward = LNBertForPreTraining.forward

    def poisoned(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        calls["n"] += self.training
        if self.training and calls["n"] == 3:
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(LNBertForPreTraining, "forward", poisoned)
    run = tmp_path / "poisoned"
    assert main(tiny_args(run, data_cache, "--train.checkpoint_every=1")) == 0
    status = read_status(run)
    assert (status["status"], status["diverged_at_step"], status["step"]) == ("diverged", 3, 2)
    assert [step for step, _ in list_checkpoints(run)] == [1, 2]


def test_leftover_temp_folder_is_never_used_for_resume(tmp_path: Path, data_cache: Path) -> None:
    run = tmp_path / "atomic"
    assert main(tiny_args(run, data_cache, "--train.stop_at_step=3")) == 0
    checkpoints = run / "checkpoints"
    # A save killed just before its rename: a temp folder as complete as can be (step 3's files, a train_state.json
    # that says step 5). And a torn folder of a later step, with no train_state.json.
    leftover = checkpoints / ".step_00000005.tmp"
    shutil.copytree(checkpoints / "step_00000003", leftover)
    state = json.loads((leftover / "train_state.json").read_text())
    (leftover / "train_state.json").write_text(json.dumps({**state, "step": 5}))
    (checkpoints / "step_00000009").mkdir()
    (checkpoints / "step_00000009" / "model.safetensors").write_bytes(b"torn")
    assert latest_checkpoint(run).name == "step_00000003"
    assert main(tiny_args(run, data_cache, "--train.resume=auto")) == 0
    assert read_status(run)["status"] == "finished"
    # Resumed from step 3, so steps 4 and 5 were trained; from the temp folder they would have been skipped.
    assert [r["step"] for r in read_metrics(run) if "train/loss" in r] == [1, 2, 3, 4, 5, 6]


def test_sigterm_saves_a_checkpoint_and_marks_preempted(tmp_path: Path, data_cache: Path) -> None:
    run = tmp_path / "sigterm"
    argv = tiny_args(run, data_cache, "--train.max_steps=100000", "--train.checkpoint_every=0", "--train.eval_every=0")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(RUN_PY), *argv], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not any(r.get("step", 0) >= 2 for r in read_metrics(run)):
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, output
    status = read_status(run)
    assert status["status"] == "preempted", status
    checkpoint = latest_checkpoint(run)
    assert (
        checkpoint is not None and json.loads((checkpoint / "train_state.json").read_text())["step"] == status["step"]
    )
    assert "stop requested (SIGTERM)" in output


def test_sigterm_while_the_command_imports_ends_preempted(tmp_path: Path, data_cache: Path) -> None:
    """SIGTERM while pretrain/run.py still imports its modules (a job preempted as it starts) is a stop request:
    status preempted and exit code 0, what the SLURM script requeues on, not a death by the signal (exit 143, no
    status)."""
    run = tmp_path / "early"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    code, output = sigterm_while_importing([sys.executable, str(RUN_PY), *tiny_args(run, data_cache)], env)
    assert code == 0, output[-3000:]
    status = read_status(run)
    assert (status["status"], status["step"]) == ("preempted", 0), (status, output[-3000:])
    assert "stop requested (SIGTERM) before training" in status["message"]


# --------------------------------------------------------------------------------------------------
# Bad input: clear errors, before any training
# --------------------------------------------------------------------------------------------------


def _corpus(tmp_path: Path, name: str, content: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(content)
    return f'--data.sources=[{{"kind": "json", "path": "{path}"}}]'


def test_missing_data_file(tmp_path: Path, data_cache: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no such file or folder .*nowhere.jsonl"):
        main(
            tiny_args(tmp_path / "r", data_cache, f'--data.sources=[{{kind: json, path: "{tmp_path}/nowhere.jsonl"}}]')
        )


def test_empty_corpus(tmp_path: Path, data_cache: Path) -> None:
    with pytest.raises(ValueError, match="empty corpus"):
        main(tiny_args(tmp_path / "r", data_cache, _corpus(tmp_path, "empty.jsonl", b"")))


def test_invalid_utf8_corpus(tmp_path: Path, data_cache: Path) -> None:
    content = b'{"text": "fine"}\n{"text": "caf\xe9 latin-1"}\n'
    with pytest.raises(ValueError, match="UTF-8"):
        main(tiny_args(tmp_path / "r", data_cache, _corpus(tmp_path, "latin1.jsonl", content)))


def test_tokenizer_not_found(tmp_path: Path, data_cache: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"data.tokenizer=.*no such tokenizer folder"):
        main(tiny_args(tmp_path / "r", data_cache, f"--data.tokenizer={tmp_path}/no-tokenizer"))


def test_vocabulary_mismatch(tmp_path: Path, data_cache: Path) -> None:
    source = tmp_path / "run"
    assert main(tiny_args(source, data_cache, "--train.max_steps=1", "--train.snapshot_at_start=false")) == 0
    tokenizer = source / "tokenizer"
    with pytest.raises(ValueError, match=r"model's vocabulary has 120; set model.vocab_size >= 300"):
        main(tiny_args(tmp_path / "r", data_cache, f"--data.tokenizer={tokenizer}", "--model.vocab_size=120"))


def test_output_dir_holding_another_run(tmp_path: Path, data_cache: Path) -> None:
    run = tmp_path / "taken"
    assert main(tiny_args(run, data_cache, "--train.max_steps=1", "--train.snapshot_at_start=false")) == 0
    # A key --train.resume=auto may change is named, with that way on.
    with pytest.raises(
        ValueError, match=r"already holds this run .*\(train\.snapshot_at_start false -> true: .*--train.resume=auto"
    ):
        main(tiny_args(run, data_cache, "--train.max_steps=1"))
    # One it may not is named at once, rerun or resumed: no detour through --train.resume=auto.
    for resume in ([], ["--train.resume=auto"]):
        with pytest.raises(ValueError, match=r'holds a different run: model.norm_placement "post" -> "pre", '):
            main(tiny_args(run, data_cache, "--model.norm_placement=pre", *resume))


def test_resume_with_nothing_to_resume(tmp_path: Path, data_cache: Path, capsys: pytest.CaptureFixture) -> None:
    # A job killed before it wrote run_config.json, requeued with --train.resume=auto: it starts, with a warning.
    assert main(tiny_args(tmp_path / "empty", data_cache, "--train.resume=auto", "--train.max_steps=1")) == 0
    out, err = capsys.readouterr()
    assert "nothing to resume" in err
    # The console shows the data each source gave and, at the end, the validation loss.
    assert "per source (training instances" in out and "validation   MLM loss " in out
    with pytest.raises(FileNotFoundError, match="is not a complete checkpoint"):
        main(tiny_args(tmp_path / "r", data_cache, f"--train.resume={tmp_path}/no-checkpoint"))


def test_the_progress_bar_and_the_end_of_a_run_show_the_validation_loss() -> None:
    assert progress_postfix(2.5, 1e-4, {}) == {"loss": "2.500", "lr": "1.00e-04"}
    evaluated = {"val/mlm_loss": 7.71912, "val/mlm_accuracy": 0.05}
    assert progress_postfix(2.5, 1e-4, evaluated)["val"] == "7.719"
    assert progress_postfix(None, None, evaluated) == {"val": "7.719"}  # after an evaluation step
    assert final_validation(evaluated) == "\n  validation   MLM loss 7.7191, MLM accuracy 0.0500"
    assert final_validation({}) == ""


def test_command_line_errors_exit_2_with_the_message(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(RUN_PY), "--train.max_step=3"], capture_output=True, text=True,
                            cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2
    assert "unknown key 'train.max_step'; did you mean 'train.max_steps'?" in result.stderr
    assert "Traceback" not in result.stderr


# --------------------------------------------------------------------------------------------------
# The true default, several processes, DeepSpeed (slow)
# --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_true_default_run_finishes_offline(tmp_path: Path) -> None:
    """`python pretrain/run.py` with no arguments, in a fresh directory, offline (under a minute on 2 idle cores: the
    README's figure, not this test's; its timeout only stops a run that hangs, and is far from a loaded machine's
    times)."""
    # One thread: other jobs share the CI cores, and oversubscribed OpenMP threads slow tiny models 10x.
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "WANDB_MODE": "offline",
        "OMP_NUM_THREADS": "1",
    }
    result = subprocess.run([sys.executable, str(RUN_PY)], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=1800)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = tmp_path / "runs" / "lnbert-post"
    assert read_status(run)["status"] == "finished"
    assert f"snapshots    {Path('runs/lnbert-post/snapshots')}" in result.stdout
    assert [s.step for s in list_snapshots(run)] == [0, read_status(run)["step"]]
    first, *_, last = val_losses(run)
    assert last < first
    # Its first screen: no warning about its own validation split, no datasets or transformers bars, no DeepSpeed line.
    for noise in ("the validation split is", "Generating train split", "Filter:", "Writing model shards",
                  "Setting accelerator to CPU"):  # fmt: skip
        assert noise not in result.stdout + result.stderr, noise


@pytest.mark.slow
@pytest.mark.deepspeed
def test_deepspeed_zero2_one_process(tmp_path: Path, data_cache: Path) -> None:
    try:
        import deepspeed  # noqa: F401
    except Exception as err:  # any import failure means: not available here
        pytest.skip(f"deepspeed not importable: {err}")
    run = tmp_path / "zero2"
    result = accelerate_launch(
        ["--config_file", str(ROOT / "configs/accelerate/deepspeed_zero2.yaml"), "--num_processes", "1",
         "--main_process_port", "29519"],
        tiny_args(run, data_cache, "--train.max_steps=3", "--train.mixed_precision=bf16"), ROOT, force_cpu=False,
    )  # fmt: skip
    output = result.stdout + result.stderr
    if result.returncode != 0 and any(s in output for s in ("CUDA_HOME", "ninja", "op_builder", "OpBuilder", "build")):
        pytest.skip(f"deepspeed could not build/load an op here: {output[-500:]}")
    assert result.returncode == 0, output[-4000:]
    assert read_status(run)["status"] == "finished"
    assert (latest_checkpoint(run) / "pytorch_model").is_dir()  # DeepSpeed's own checkpoint layout
    assert [s.step for s in list_snapshots(run)] == [0, 3]
    # bf16: the engine casts the module to bf16; snapshots hold the optimizer's fp32 master weights.
    weights = load_file(list_snapshots(run)[-1].path / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.float32}
    assert LNBertForPreTraining.from_pretrained(list_snapshots(run)[-1].path).dtype == torch.float32
    # The DeepSpeed checkpoint resumes.
    result = accelerate_launch(
        ["--config_file", str(ROOT / "configs/accelerate/deepspeed_zero2.yaml"), "--num_processes", "1",
         "--main_process_port", "29519"],
        tiny_args(run, data_cache, "--train.max_steps=5", "--train.resume=auto", "--train.mixed_precision=bf16"), ROOT,
        force_cpu=False,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert read_status(run)["step"] == 5 and sorted(train_losses(run)) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("backend", ["tensorboard", "wandb"])
def test_trackers_write_offline(
    tmp_path: Path, data_cache: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TensorBoard event files in RUN/tensorboard; W&B offline runs in RUN/wandb (for `wandb sync` later)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / backend
    argv = tiny_args(run, data_cache, f"--tracking.backend={backend}", "--train.max_steps=2",
                     "--tracking.tags=[unit-test]", "--tracking.group=g")  # fmt: skip
    assert main(argv) == 0
    if backend == "tensorboard":
        assert list((run / "tensorboard").rglob("events.out.tfevents.*"))
    else:
        offline = list((run / "wandb").glob("offline-run-*"))
        assert len(offline) == 1 and list(offline[0].glob("run-*.wandb"))
    assert any("train/loss" in r for r in read_metrics(run))  # metrics.jsonl is written whatever the tracker


def test_resume_after_a_kill_drops_the_lines_logged_after_the_checkpoint(tmp_path: Path, data_cache: Path) -> None:
    run = tmp_path / "killed"
    assert main(tiny_args(run, data_cache, "--train.stop_at_step=3")) == 0
    # As if the process had been killed at step 5, after logging steps 4 and 5 but before a checkpoint.
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 4, "tokens_seen": 1, "train/loss": 99.0}) + "\n")
        f.write('{"step": 5, "tokens_se')  # a torn last line
    assert main(tiny_args(run, data_cache, "--train.resume=auto")) == 0
    steps = [r["step"] for r in read_metrics(run) if "train/loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6] and 99.0 not in train_losses(run).values()


def _stopped_once(run: Path, output: str) -> None:
    """What a stop request leaves: status preempted, one checkpoint (checkpoint_every=0) at the step where every
    process stopped, with both processes' RNG states, and no stop file."""
    status = read_status(run)
    assert status["status"] == "preempted", (status, output[-3000:])
    checkpoint = latest_checkpoint(run)
    assert [step for step, _ in list_checkpoints(run)] == [status["step"]], output[-3000:]
    assert json.loads((checkpoint / "train_state.json").read_text())["step"] == status["step"]
    assert {p.name for p in checkpoint.glob("random_states_*.pkl")} == {"random_states_0.pkl", "random_states_1.pkl"}
    assert not (run / "STOP").exists()


def _signal_once_training(proc: subprocess.Popen, run: Path, signum: int, tree: bool = False) -> None:
    """Signal ``proc`` (and with ``tree`` every process under it) once the run has trained a few steps."""
    deadline = time.time() + 300
    while time.time() < deadline and not any(r.get("step", 0) >= 3 for r in read_metrics(run)):
        assert proc.poll() is None, "the run ended before it was signalled"
        time.sleep(0.5)
    top = psutil.Process(proc.pid)
    for process in [top, *top.children(recursive=True)] if tree else [top]:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signum)


# Long enough to be signalled while training; a DataLoader worker per process, which the signals reach too.
SIGNALLED_RUN = ("--train.max_steps=100000", "--train.checkpoint_every=0", "--train.eval_every=0",
                 "--train.snapshot_at_start=false", "--train.num_workers=1")  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("whom", ["launcher", "every process"])
def test_sigterm_to_the_launcher_preempts_every_process(tmp_path: Path, data_cache: Path, whom: str) -> None:
    """SIGTERM to `accelerate launch --multi_gpu` (torchrun): it sends SIGTERM to each worker's process group, the
    DataLoader workers included, and the workers agree on the step to stop at. The same when SIGTERM reaches every
    process of the launch at once, the launcher, the trainers and their loader workers: SLURM's preemption signals
    the tasks of a job step that way."""
    run = tmp_path / "ddp-sigterm"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--main_process_port", "29521", str(RUN_PY), *tiny_args(run, data_cache, *SIGNALLED_RUN)]  # fmt: skip
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    log = tmp_path / "launcher.log"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _signal_once_training(proc, run, signal.SIGTERM, tree=whom == "every process")
        # The launcher exits 128 + 15 (torchrun's way) once its workers have; status.json tells. A hang guard: the
        # launcher kills its workers 30 s after the signal in any case. The output goes to a file, not a pipe, which
        # a stray grandchild could hold open after the launcher exits.
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            tree = subprocess.run(["ps", "-eo", "pid,ppid,pgid,stat,etime,args", "--forest"], capture_output=True,
                                  text=True).stdout  # fmt: skip
            pytest.fail(f"the launcher still runs 300 s after SIGTERM:\n{tree}\n{log.read_text()[-3000:]}")
    finally:
        proc.kill()
    _stopped_once(run, log.read_text())


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_slurm_warning_stops_every_process_at_one_step_and_requeues(tmp_path: Path, data_cache: Path) -> None:
    """launch/slurm_pretrain.sbatch with stand-ins for srun and scontrol only: the real `accelerate launch` of two
    processes (gloo), each with a DataLoader worker. SLURM's warning (--signal=B:USR1) reaches the batch shell alone;
    the run stops at one step with one checkpoint, exits 0 through the launcher and srun, and the job requeues."""
    bin_dir, log, run = tmp_path / "bin", tmp_path / "calls.log", tmp_path / "run"
    bin_dir.mkdir()
    fakes = {"scontrol": f'echo "scontrol $*" >> {log}\n[[ $1 == show ]] && echo 127.0.0.1\ntrue\n',
             "srun": 'while [[ $1 == -* ]]; do shift; done\nSLURM_NODEID=0 exec "$@"\n'}  # fmt: skip
    for name, body in fakes.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]]),
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1", "SLURM_JOB_NODELIST": "node",
           "SLURM_NNODES": "1", "SLURM_JOB_ID": "77", "SLURM_CPUS_PER_TASK": "1", "GPUS_PER_NODE": "2",
           "MAIN_PORT": "29523", "PRESET": str(ROOT / "configs" / "pretrain" / "tiny_model.yaml")}  # fmt: skip
    script = [str(ROOT / "launch" / "slurm_pretrain.sbatch"), *tiny_args(run, data_cache, *SIGNALLED_RUN)]
    proc = subprocess.Popen(["bash", *script], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        _signal_once_training(proc, run, signal.SIGUSR1)
        output, _ = proc.communicate(timeout=180)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output[-3000:]
    _stopped_once(run, output)
    assert "scontrol requeue 77" in log.read_text() and "stop requested" in output


def test_resume_keeps_its_vocabulary_whatever_the_cache_holds(tmp_path: Path) -> None:
    """WordPiece training is not bit-reproducible: a data cache can come to hold another tokenizer for the config
    (re-trained after it was lost, or by another run sharing it). A resumed run continues with the one it saved,
    to the losses of an uninterrupted run, and the cache is left as it is."""
    full, run, data_cache = tmp_path / "full", tmp_path / "tok", tmp_path / "cache"  # its own: it is altered
    assert main(tiny_args(full, data_cache)) == 0
    assert main(tiny_args(run, data_cache, "--train.stop_at_step=3")) == 0
    (cached,) = data_cache.glob("tokenizer-*/tokenizer.json")
    spec = json.loads(cached.read_text())
    vocab = spec["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[-2:]  # as if training had broken a tie the other way
    vocab[a], vocab[b] = vocab[b], vocab[a]
    cached.write_text(json.dumps(spec))
    assert main(tiny_args(run, data_cache, "--train.resume=auto")) == 0
    assert read_status(run)["status"] == "finished"
    assert train_losses(run) == train_losses(full)
    assert json.loads(cached.read_text())["model"]["vocab"][a] == vocab[a]


def test_resume_takes_its_own_tokenizer_when_the_corpus_was_copied_again(tmp_path: Path) -> None:
    """A corpus copied again (a cluster's scratch restaged, rsync without -t) has new mtimes, so a new cache key
    and no cached tokenizer: the resumed run continues with the vocabulary its checkpoint was trained with instead
    of training another one (not bit-reproducible)."""
    from pretrain.data.corpus import iter_python_docs

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in itertools.islice(iter_python_docs(), 30)))
    run, cache = tmp_path / "run", tmp_path / "cache"
    source = f'--data.sources=[{{"kind": "json", "path": "{corpus}"}}]'
    assert main(tiny_args(run, cache, source, "--train.stop_at_step=3")) == 0
    vocabulary = (run / "tokenizer" / "tokenizer.json").read_text()
    os.utime(corpus, ns=(corpus.stat().st_atime_ns, corpus.stat().st_mtime_ns + 10**9))
    assert main(tiny_args(run, cache, source, "--train.resume=auto")) == 0
    assert read_status(run)["status"] == "finished"
    assert (run / "tokenizer" / "tokenizer.json").read_text() == vocabulary
    assert len(list(cache.glob("tokenizer-*"))) == 1  # none trained again


def test_resume_refuses_a_named_tokenizer_whose_size_changed(tmp_path: Path, data_cache: Path) -> None:
    """model.vocab_size=null is decided at the start (the tokenizer's size); a resumed run must decide what it was
    trained with. A named tokenizer that grew since (a Hub repo updated upstream) stops the run with the key that
    differs, and its run_config.json keeps the size the checkpoint has."""
    run, named = tmp_path / "run", tmp_path / "named-tokenizer"
    assert main(tiny_args(run, data_cache, "--train.stop_at_step=3")) == 0
    shutil.copytree(run / "tokenizer", named)
    fresh = tmp_path / "fresh"
    assert main(tiny_args(fresh, data_cache, "--train.stop_at_step=3", f"--data.tokenizer={named}")) == 0
    size = json.loads((fresh / "run_config.json").read_text())["model"]["vocab_size"]
    grown = AutoTokenizer.from_pretrained(str(named))
    grown.add_tokens(["zzqx"])
    grown.save_pretrained(named)
    with pytest.raises(ValueError, match=r"holds a different run: model\.vocab_size \d+ -> \d+ "):
        main(tiny_args(fresh, data_cache, "--train.resume=auto", f"--data.tokenizer={named}"))
    assert json.loads((fresh / "run_config.json").read_text())["model"]["vocab_size"] == size


def test_a_checkpoint_continued_in_a_new_folder_saves_the_tokenizer_there_not_over_its_own(
    tmp_path: Path, data_cache: Path
) -> None:
    """Resuming a checkpoint of the run's own folder keeps the tokenizer it saved; continuing one in a new folder
    gives that folder the same tokenizer (run.pretrain decides "the same run" once, for both)."""
    run, new = tmp_path / "run", tmp_path / "new"
    assert main(tiny_args(run, data_cache, "--train.stop_at_step=3")) == 0
    saved = run / "tokenizer" / "tokenizer.json"
    written = saved.stat().st_mtime_ns
    assert main(tiny_args(new, data_cache, f"--train.resume={latest_checkpoint(run)}")) == 0
    assert (new / "tokenizer" / "tokenizer.json").read_bytes() == saved.read_bytes()
    assert [r["step"] for r in read_metrics(new) if "train/loss" in r] == [4, 5, 6]
    assert main(tiny_args(run, data_cache, "--train.resume=auto")) == 0
    assert saved.stat().st_mtime_ns == written
    assert read_status(run)["status"] == read_status(new)["status"] == "finished"
