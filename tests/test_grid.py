"""The grid of short pretraining runs: its axes (depth included), the outcome rules on synthetic loss curves,
the boundary and its extra seeds, the probes, and a stopped grid that continues without rerunning."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
import torch

from pretrain.analysis import cli, grid, outcomes, probes, provenance
from pretrain.common import reporting
from pretrain.common.atomic import write_json
from pretrain.common.cli import ConfigError, parse, to_dict
from pretrain.common.formats import RUN_FORMAT, stamped
from pretrain.config import PretrainConfig

RULES = outcomes.Rules(trained_margin=0.1, blowup_margin=1.0, tail_fraction=0.1)
H_TRAIN, CE_VAL = 6.0, 6.2  # unigram entropy of the training tokens, validation unigram cross-entropy


def classify(curve, val_loss, status="finished"):
    return outcomes.classify(
        status=status,
        train_losses=list(curve),
        val_loss=val_loss,
        train_unigram_entropy=H_TRAIN,
        val_unigram_cross_entropy=CE_VAL,
        rules=RULES,
    )


def descent(steps=100, start=7.6, end=5.5):
    return np.linspace(start, end, steps).tolist()


# --------------------------------------------------------------------------------------------------
# Outcome rules on synthetic curves
# --------------------------------------------------------------------------------------------------


def test_a_non_finite_loss_is_diverged_whatever_the_curve():
    assert classify(descent(), None, status="diverged") == "diverged"


def test_a_loss_well_below_the_unigram_reference_trained():
    assert classify(descent(end=5.5), 5.6) == "trained"
    assert classify(descent(end=5.5), CE_VAL - 0.11) == "trained"


def test_a_loss_that_stays_on_the_unigram_plateau_failed_to_train():
    plateau = descent(20, 7.6, 6.05) + [6.05] * 80
    assert classify(plateau, CE_VAL - 0.05) == "failed to train"  # within the margin: still the plateau
    assert classify(plateau, CE_VAL + 0.3) == "failed to train"


def test_a_run_stuck_at_its_initial_loss_failed_to_train_rather_than_blew_up():
    # 7.6 = ln(vocab): uniform predictions. Above the plateau by more than the margin, but it never rose.
    stuck = [7.6 + 0.01 * math.sin(i) for i in range(100)]
    assert classify(stuck, 7.6) == "failed to train"


def test_a_loss_that_rises_far_above_the_plateau_and_stays_blew_up():
    rise = descent(40, 7.6, 6.1) + np.linspace(6.1, 9.0, 20).tolist() + [9.0] * 40
    assert classify(rise, 9.1) == "blew up"
    # also when it jumps at once from the initial loss and never comes back
    assert classify([7.6] + [15.0] * 99, 15.0) == "blew up"


def test_a_spike_that_comes_back_down_is_not_a_blow_up():
    spike = descent(40, 7.6, 6.1) + [9.0] * 40 + descent(20, 6.1, 5.6)
    assert classify(spike, 5.7) == "trained"
    # one point of the tail back under the threshold: it did not stay there
    almost = descent(40, 7.6, 6.1) + [9.0] * 59 + [6.5]
    assert classify(almost, 6.6) == "failed to train"


def test_a_moderate_rise_above_the_plateau_is_not_a_blow_up():
    rise = descent(40, 7.6, 6.0) + [6.9] * 60  # 0.9 nats above: less than blowup_margin
    assert classify(rise, 6.9) == "failed to train"


def test_a_run_without_its_final_evaluation_is_incomplete():
    assert classify(descent(), None) == "incomplete"
    assert classify(descent(), 5.6, status="preempted") == "incomplete"


def test_seeds_combine_into_one_outcome_or_disagree():
    assert outcomes.combine(["trained", "trained"]) == "trained"
    assert outcomes.combine(["trained", "incomplete"]) == "trained"
    assert outcomes.combine(["incomplete"]) == "incomplete"
    assert outcomes.combine(["trained", "diverged"]) == "seeds differ"


def test_boundary_is_where_the_outcome_changes_along_an_axis():
    axes = [["post", "pre"], [2, 4, 8], [1e-3, 1e-2, 1e-1]]  # placement, depth, lr
    outcome_of = {(p, d, lr): "trained" for p in axes[0] for d in axes[1] for lr in axes[2]}
    assert outcomes.boundary(outcome_of, axes) == set()
    outcome_of[("post", 8, 1e-1)] = "diverged"
    found = outcomes.boundary(outcome_of, axes)
    # its neighbours along lr and depth, and the other placement at the same setting
    assert found == {("post", 8, 1e-1), ("post", 8, 1e-2), ("post", 4, 1e-1), ("pre", 8, 1e-1)}
    outcome_of[("pre", 2, 1e-3)] = "seeds differ"
    outcome_of[("pre", 2, 1e-2)] = "incomplete"  # not known yet: no boundary with it
    found = outcomes.boundary(outcome_of, axes)
    assert ("pre", 2, 1e-3) in found and ("pre", 2, 1e-2) not in found


# --------------------------------------------------------------------------------------------------
# Probes
# --------------------------------------------------------------------------------------------------


def test_unigram_reference_from_token_counts():
    special = [0, 1]  # never MLM targets: left out of both counts
    train = [[0, 2, 2, 3, 1], [0, 3, 1]]  # tokens 2, 3 twice each: p = 1/2, 1/2
    val = [[0, 2, 4, 1]]  # 4 never seen in training: add-one smoothing keeps it finite
    ref = probes.unigram_reference(train, val, special, vocab_size=5)
    assert ref["train_unigram_entropy"] == pytest.approx(math.log(2))
    smoothed = {2: 3 / 7, 3: 3 / 7, 4: 1 / 7}  # (count + 1) / (4 + 3 non-special tokens)
    assert ref["val_unigram_cross_entropy"] == pytest.approx(-(math.log(smoothed[2]) + math.log(smoothed[4])) / 2)
    with pytest.raises(ValueError, match="no non-special tokens"):
        probes.unigram_reference([[0, 1]], val, special, vocab_size=5)


def test_relative_output_change_counts_only_real_positions():
    before = torch.ones(1, 3, 2)
    after = before.clone()
    after[0, 0] += 1.0  # a change of norm sqrt(2) where the norm was sqrt(2)
    after[0, 2] += 100.0  # padding: ignored
    assert probes.relative_output_change(before, after, torch.tensor([[1, 0, 0]])) == pytest.approx(1.0)
    assert probes.relative_output_change(before, after, torch.tensor([[1, 1, 0]])) == pytest.approx(math.sqrt(0.5))


def test_first_grad_norms_are_read_per_step_and_layer():
    rows = [
        {"step": 0, "val/mlm_loss": 7.6},
        {"step": 1, "train/loss": 8.0, "grad_norm/layer_00/ffn": 1.0, "grad_norm/layer_01/ffn": 2.0,
         "grad_norm/layer_00/attn": 0.5, "grad_norm/layer_01/attn": 0.25},
        {"step": 2, "train/loss": 8.0, "grad_norm/layer_00/ffn": 3.0, "grad_norm/layer_01/ffn": 4.0},
    ]  # fmt: skip
    found = probes.first_grad_norms(rows, max_step=1)
    assert found == {"1": {"attn": [0.5, 0.25], "ffn": [1.0, 2.0]}}
    assert probes.ratio_last_to_first(found["1"]["ffn"]) == 2.0
    # Layer order is by number: "layer_100" sorts before "layer_11" as text (depth 100 and more).
    deep = {"step": 1, "train/loss": 8.0, **{f"grad_norm/layer_{i:02d}/ffn": float(i) for i in range(101)}}
    assert probes.first_grad_norms([deep], max_step=1)["1"]["ffn"] == [float(i) for i in range(101)]


# --------------------------------------------------------------------------------------------------
# The depth axis, cell arguments, extra seeds
# --------------------------------------------------------------------------------------------------


def test_depth_is_an_axis_of_the_grid_and_reaches_each_run():
    argv = ["grid", "--placements=[post, deepnorm]", "--depths=[2, 5]", "--hidden_sizes=[48]", "--lrs=[1e-3]",
            "--warmup_steps=[0, 3]", "--max_steps=7", "--probe_steps=2",
            "--overrides=[train.max_steps=9, --data.vocab_size=500]"]  # fmt: skip
    _, args = cli.parse_args(argv)
    cells = grid.grid_cells(args, args.seeds)
    assert len(cells) == 2 * 2 * 2  # placements x depths x warm-ups
    assert cells[0].placement == "post" and cells[1].placement == "deepnorm"  # placements innermost
    assert {c.depth for c in cells} == {2, 5} and len({c.name for c in cells}) == len(cells)
    cell = next(c for c in cells if c.depth == 5 and c.warmup == 3 and c.placement == "deepnorm")
    assert cell.name == "deepnorm-d5-h48-w3-lr0.001-s0"
    run_argv = grid.cell_overrides(args, cell, grid.Path("cell"))
    for expected in ("--model.num_hidden_layers=5", "--model.hidden_size=48", "--model.intermediate_size=192",
                     "--model.norm_placement=deepnorm", "--optim.warmup_steps=3", "--optim.lr=0.001",
                     "--train.seed=0", "--train.log_every=1", "--train.snapshot_at_start=true",
                     "--train.snapshot_steps=[1, 2]"):  # fmt: skip
        assert expected in run_argv
    assert run_argv[-2:] == ["--train.max_steps=9", "--data.vocab_size=500"]  # last: they win in pretrain/run.py


def test_the_residual_scheme_is_an_axis_of_the_grid_and_names_each_run():
    _, args = cli.parse_args(["grid", "--placements=[post, pre]", "--residual_schemes=[standard, hc4, attnres-b2]",
                              "--depths=[2]", "--lrs=[1e-3]", "--warmup_steps=[0]"])  # fmt: skip
    assert args.variants == ["post", "pre", "pre-hc4", "pre-attnres-b2"]  # a scheme goes on the placement that takes it
    cells = {cell.placement: cell for cell in grid.grid_cells(args, args.seeds)}
    assert cells["pre-hc4"].name == "pre-hc4-d2-h128-w0-lr0.001-s0"
    plain = grid.cell_overrides(args, cells["pre"], grid.Path("cell"))
    assert not [a for a in plain if a.startswith(("--model.residual_scheme", "--model.hc_", "--model.mhc_", "--model.attn_res"))]
    for label, scheme in (("pre", "standard"), ("pre-hc4", "hc"), ("pre-attnres-b2", "attn_res")):
        run_argv = grid.cell_overrides(args, cells[label], grid.Path("cell"))
        cfg = parse(PretrainConfig, run_argv, prog="pretrain.run")
        assert (cfg.model.residual_scheme, cfg.model.variant) == (scheme, label)  # the cell's name is its run's variant
    assert "--model.attn_res_block_size=2" in grid.cell_overrides(args, cells["pre-attnres-b2"], grid.Path("cell"))
    assert [grid.heading(args, label) for label in args.variants] == ["post-LN", "pre-LN", "pre-hc4", "pre-attnres-b2"]
    # A preset's scheme options cannot change what a cell's label says: the cell's own come after it.
    _, preset_args = cli.parse_args(["grid", "--placements=[pre]", "--residual_schemes=[shc2]"])
    run_argv = grid.cell_overrides(preset_args, grid.grid_cells(preset_args, [0])[0], grid.Path("cell"))
    assert {"--model.hc_streams=2", "--model.hc_dynamic=false", "--model.residual_scheme=hc"} <= set(run_argv)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--residual_schemes=[standard, hc]"], r"residual_schemes item 'hc' is not a residual scheme's label; did you mean 'hc4'"),
        (["--placements=[post, sandwich]", "--residual_schemes=[standard, mhc4]"],
         r"residual_schemes item 'mhc4' is in no model the other axes allow: .*needs norm_placement='pre'"),
        (["--placements=[ngpt]", "--norm_types=[rmsnorm]"],
         r"placements item 'ngpt' is in no model the other axes allow: norm_type='rmsnorm' does not apply"),
        (["--residual_schemes=[hc4, hc4]"], r"residual_schemes must be a non-empty list without repeats"),
        (["--residual_schemes=[]"], r"residual_schemes must be a non-empty list without repeats"),
    ],
)  # fmt: skip
def test_the_scheme_axis_is_checked_before_any_run(argv, message):
    with pytest.raises(ConfigError, match=message):
        cli.parse_args(["grid", *argv])


def test_grid_options_are_checked():
    with pytest.raises(ConfigError, match="overrides item 'max_steps' is not KEY=VALUE"):
        cli.parse_args(["grid", "--overrides=[max_steps]"])
    with pytest.raises(ConfigError, match=r"unknown key 'train\.max_step'; did you mean 'train\.max_steps'"):
        cli.parse_args(["grid", "--overrides=[train.max_step=3]"])
    with pytest.raises(ConfigError, match="depths must be positive"):
        cli.parse_args(["grid", "--depths=[0, 4]"])
    with pytest.raises(ConfigError, match="depths must be a non-empty list without repeats"):
        cli.parse_args(["grid", "--depths=[4, 4]"])
    with pytest.raises(ConfigError, match="hidden_sizes must be positive multiples of num_heads=2"):
        cli.parse_args(["grid", "--hidden_sizes=[33]"])
    with pytest.raises(ConfigError, match="warmup_steps must be <= max_steps=10"):
        cli.parse_args(["grid", "--warmup_steps=[20]", "--max_steps=10"])


def _result(outcome, loss=6.0, step=None):
    return {"outcome": outcome, "status": "diverged" if outcome == "diverged" else "finished", "val_mlm_loss": loss,
            "diverged_at_step": step, "train_curve": [], "message": ""}  # fmt: skip


def test_boundary_settings_get_more_seeds_and_disagreeing_seeds_are_shown():
    _, args = cli.parse_args(["grid", "--placements=[post, pre]", "--depths=[2, 4]", "--lrs=[1e-3, 1e-2]",
                                   "--warmup_steps=[0]", "--seeds=[0]", "--boundary_seeds=2"])  # fmt: skip
    results = {cell: _result("trained") for cell in grid.grid_cells(args, [0])}
    assert grid.extra_seed_cells(args, results) == []
    deep_fast_post = grid.Cell("post", 128, 4, 0, 1e-2, 0)
    results[deep_fast_post] = _result("diverged", None, 17)
    extra = grid.extra_seed_cells(args, results)
    assert all(c.seed == 1 for c in extra)
    assert {(c.placement, c.depth, c.lr) for c in extra} == {("post", 4, 1e-2), ("post", 2, 1e-2), ("post", 4, 1e-3),
                                                              ("pre", 4, 1e-2)}  # fmt: skip
    # once they ran, no more
    results |= {cell: _result("trained") for cell in extra}
    results[grid.Cell("post", 128, 4, 0, 1e-2, 1)] = _result("diverged", None, 25)
    assert grid.extra_seed_cells(args, results) == []
    combined = grid.setting_outcomes(results)
    assert combined[deep_fast_post.setting] == "diverged"
    assert grid.describe_setting(grid._seed_results(results, deep_fast_post.setting), "diverged") == "div@17,25 (2)"
    results[grid.Cell("post", 128, 4, 0, 1e-2, 1)] = _result("trained", 5.5)
    combined = grid.setting_outcomes(results)
    assert combined[deep_fast_post.setting] == "seeds differ"
    assert grid.describe_setting(grid._seed_results(results, deep_fast_post.setting), "seeds differ") == "div@17|5.500"
    plateau = [_result("failed to train", 6.3), _result("failed to train", 6.5)]
    assert grid.describe_setting(plateau, "failed to train") == "plateau 6.400 (2)"


def test_read_cell_takes_the_last_line_of_a_step_logged_twice(tmp_path):
    """A run killed after its checkpoint at step 2 had logged step 3; the resumed run logs step 3 again."""
    write_json(tmp_path / "status.json", {"status": "finished", "step": 4, "diverged_at_step": None})
    lines = (
        [{"step": 0, "val/mlm_loss": 7.6}]
        + [{"step": step, "train/mlm_loss": loss} for step, loss in ((1, 7.5), (2, 7.0), (3, 9.9), (3, 6.8), (4, 6.5))]
        + [{"step": 4, "val/mlm_loss": 6.6}]
    )
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"st')
    cell = grid.read_cell(tmp_path)
    assert cell["train_curve"] == [[1, 7.5], [2, 7.0], [3, 6.8], [4, 6.5]]
    assert (cell["status"], cell["val_mlm_loss"], cell["val_step"]) == ("finished", 6.6, 4)


class FakeRun:
    """Stands in for pretrain/run.py's process: records its arguments, writes a status, and (when ``block``) runs
    until it is sent a signal, like a training run."""

    started: list[FakeRun] = []

    def __init__(self, argv, stdout=None, stderr=None, block=False):
        self.argv, self.signals, self.stopped = argv, [], threading.Event()
        self.block = block
        FakeRun.started.append(self)

    def send_signal(self, sig):
        self.signals.append(sig)
        self.stopped.set()

    def wait(self):
        if self.block:
            assert self.stopped.wait(timeout=30)
        out = next(a.split("=", 1)[1] for a in self.argv if a.startswith("--train.output_dir="))
        write_json(grid.Path(out) / "status.json", {"status": "preempted", "step": 3})
        return 0


@pytest.fixture
def fake_runs(monkeypatch):
    FakeRun.started = []
    reporting.pyplot()  # matplotlib's first import lists the system fonts through subprocess: before the fake
    provenance.environment()  # git, through subprocess too
    monkeypatch.setattr(subprocess, "Popen", FakeRun)
    monkeypatch.setattr(probes, "probe_cell", lambda run_dir, **kw: {})
    monkeypatch.setattr(provenance, "with_inputs", lambda run_dir: {})  # a fake run saves no tokenizer
    return FakeRun.started


def test_an_interrupted_cell_resumes_and_a_finished_one_is_read(tmp_path, fake_runs):
    """What run_cell asks pretrain/run.py for: nothing for a finished run, --train.resume=auto for a run with a
    checkpoint; a run killed before its first checkpoint is moved aside and started over."""
    _, args = cli.parse_args(["grid", "--out", str(tmp_path), "--probe_steps=0"])
    finished, resumable, killed = (grid.Cell("pre", 128, d, 0, 1e-3, 0) for d in (2, 3, 4))
    runs = tmp_path / "runs"
    write_json(runs / finished.name / "status.json", {"status": "finished", "step": 7})
    write_json(runs / resumable.name / "checkpoints" / "step_00000003" / "train_state.json", {"step": 3})
    write_json(runs / killed.name / "run_config.json", _run_config(args, killed, runs / killed.name))
    assert grid.run_cell(args, finished)["status"] == "finished" and fake_runs == []
    grid.run_cell(args, resumable)
    assert fake_runs[-1].argv[-1] == "--train.resume=auto"
    grid.run_cell(args, killed)
    assert "--train.resume=auto" not in fake_runs[-1].argv
    assert len(list(runs.glob(f"{killed.name}.stopped-*"))) == 1


def _run_config(args, cell, run_dir) -> dict:
    """The run_config.json pretrain/run.py writes for ``cell`` of the grid ``args``."""
    return stamped(to_dict(parse(PretrainConfig, grid.cell_overrides(args, cell, run_dir), prog="pretrain.run")), RUN_FORMAT)


def test_a_run_with_other_settings_in_a_cells_folder_is_neither_read_nor_continued(tmp_path, fake_runs):
    """A grid rerun on the same --out with another --max_steps (or other overrides) must not take the old
    finished runs for its cells, nor continue the interrupted ones with another schedule."""
    _, old = cli.parse_args(["grid", "--out", str(tmp_path), "--probe_steps=0", "--max_steps=100"])
    _, new = cli.parse_args(["grid", "--out", str(tmp_path), "--probe_steps=0", "--max_steps=500"])
    finished, resumable = grid.Cell("pre", 128, 2, 0, 1e-3, 0), grid.Cell("post", 128, 2, 0, 1e-3, 0)
    runs = tmp_path / "runs"
    for cell in (finished, resumable):
        write_json(runs / cell.name / "run_config.json", _run_config(old, cell, runs / cell.name))
    write_json(runs / finished.name / "status.json", {"status": "finished", "step": 100})
    write_json(runs / resumable.name / "checkpoints" / "step_00000003" / "train_state.json", {"step": 3})
    for cell in (finished, resumable):
        result = grid.run_cell(new, cell)
        assert (result["status"], result["outcome"]) == ("failed", "incomplete")
        assert "train.max_steps" in result["message"] and "another --out" in result["message"]
    assert fake_runs == [] and (runs / resumable.name / "checkpoints").is_dir()  # nothing run, nothing moved
    # Saving more or less often does not make another cell.
    _, saving = cli.parse_args(["grid", "--out", str(tmp_path), "--probe_steps=0", "--max_steps=100",
                                     "--overrides=[train.checkpoint_every=50]"])  # fmt: skip
    assert grid.run_cell(saving, finished)["status"] == "finished" and fake_runs == []
    # The grid it was made with reads the finished run (and resumes the other) as before.
    assert grid.run_cell(old, finished)["status"] == "finished" and fake_runs == []
    grid.run_cell(old, resumable)
    assert fake_runs[-1].argv[-1] == "--train.resume=auto"


def test_report_only_runs_nothing_and_reports_the_cells_that_ran(tmp_path, fake_runs, monkeypatch):
    """A map grown over several grids into one --out (depth 6 at two lrs, depth 48 at one) is reported over the
    union of their axes without running the missing cells."""
    argv = ["grid", "--out", str(tmp_path), "--probe_steps=0", "--placements=[post, pre]", "--depths=[6, 48]",
            "--warmup_steps=[0]", "--lrs=[1e-3, 3e-3]", "--report_only"]  # fmt: skip
    runs = tmp_path / "runs"
    losses = {("post", 6, 1e-3, 0): 5.9, ("pre", 6, 1e-3, 0): 5.9, ("post", 6, 3e-3, 0): 6.2,
              ("pre", 6, 3e-3, 0): 6.2, ("post", 48, 1e-3, 0): 6.2, ("pre", 48, 1e-3, 0): 5.9,
              ("post", 48, 1e-3, 1): 6.2}  # fmt: skip
    for (placement, depth, lr, seed), loss in losses.items():
        run_dir = runs / grid.Cell(placement, 128, depth, 0, lr, seed).name
        write_json(run_dir / "status.json", {"status": "finished", "step": 4})
        rows = [{"step": s, "train/mlm_loss": 6.5} for s in (1, 2, 3, 4)] + [{"step": 4, "val/mlm_loss": loss}]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    unended = grid.Cell("sandwich", 128, 6, 0, 1e-3, 0)  # not among --placements: not reported
    write_json(runs / unended.name / "status.json", {"status": "running", "step": 2})
    started = grid.Cell("pre", 128, 48, 0, 3e-3, 0)  # started elsewhere, not ended
    write_json(runs / started.name / "status.json", {"status": "running", "step": 2})
    reference = {"train_unigram_entropy": 6.1, "val_unigram_cross_entropy": 6.2}
    monkeypatch.setattr(probes, "probe_cell", lambda run_dir, **kw: dict(reference))
    assert cli.main(argv) == 0
    assert fake_runs == []  # nothing was run
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["cells"]) == {grid.Cell(p, 128, d, 0, lr, s).name for p, d, lr, s in losses} | {started.name}
    assert results["cells"][started.name]["outcome"] == "incomplete"
    assert results["settings"]["post/128/48/0/0.001"] == "failed to train"  # both seeds agree
    assert "post/128/48/0/0.003" not in results["settings"]  # never run: no outcome, not on any boundary
    table = (tmp_path / "table.txt").read_text()
    post_rows = table.split("post-LN")[1].split("pre-LN")[0]
    assert re.search(r"depth 48, warm-up 0 +plateau 6\.200 \(2\) +-\n", post_rows), post_rows  # 3e-3: never run
    assert "pre d48 h128 w0 lr0.001: trained" in table  # on the boundary: Post-LN failed there


def test_a_stopped_grid_stops_its_running_cells_and_starts_no_more(tmp_path, fake_runs, monkeypatch):
    monkeypatch.setattr(subprocess, "Popen", lambda argv, **kw: FakeRun(argv, block=True))
    _, args = cli.parse_args(["grid", "--out", str(tmp_path), "--placements=[pre]", "--depths=[2, 3, 4]",
                                   "--warmup_steps=[0]", "--lrs=[1e-3]", "--jobs=1"])  # fmt: skip
    stopper = grid.Stopper()
    cells = grid.grid_cells(args, args.seeds)
    worker = threading.Thread(target=lambda: found.update(grid.run_cells(args, cells, stopper)))
    found: dict = {}
    worker.start()
    deadline = time.monotonic() + 30
    while not fake_runs and time.monotonic() < deadline:
        time.sleep(0.01)
    stopper.request(signal.SIGTERM)  # as the signal handler does
    worker.join(timeout=30)
    assert len(fake_runs) == 1 and fake_runs[0].signals == [signal.SIGTERM]  # asked to checkpoint and stop
    assert [found[c]["status"] for c in cells] == ["preempted", "not started", "not started"]
    assert all(found[c]["outcome"] == "incomplete" for c in cells)


# --------------------------------------------------------------------------------------------------
# The whole command, through pretrain/run.py
# --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_grid_runs_its_cells_and_continues_after_a_stop(tmp_path):
    """End to end at one depth (each cell is a process that imports torch; the depth axis reaching each run and a
    report over several depths have their own tests above)."""
    out = tmp_path / "grid"
    overrides = [
        "data.max_documents=40",
        "data.vocab_size=200",
        "data.max_seq_length=32",
        "train.per_device_batch_size=4",
        "train.eval_batches=2",
        f"data.cache_dir={tmp_path / 'cache'}",
    ]
    argv = ["grid", "--placements=[pre]", "--depths=[2]", "--warmup_steps=[0]", "--lrs=[1e-3, 1e6]",
            "--max_steps=6", "--hidden_sizes=[16]", "--probe_steps=2", "--boundary_seeds=0", "--jobs=2",
            "--out", str(out)]  # fmt: skip
    # The first sitting is stopped at step 3 (as SIGTERM would: a checkpoint, status preempted).
    assert cli.main([*argv, "--overrides", json.dumps([*overrides, "train.stop_at_step=3"])]) == 1
    cells = json.loads((out / "results.json").read_text())["cells"]
    ok = cells["pre-d2-h16-w0-lr0.001-s0"]
    assert ok["status"] == "preempted" and ok["outcome"] == "incomplete"
    blown = cells["pre-d2-h16-w0-lr1e+06-s0"]
    assert blown["outcome"] == "diverged" and 1 <= blown["diverged_at_step"] <= 3
    # The second sitting: the diverged cells are read, the stopped ones continue from step 3.
    argv += ["--overrides", json.dumps(overrides)]
    assert cli.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    cells = results["cells"]
    ok = cells["pre-d2-h16-w0-lr0.001-s0"]
    assert ok["status"] == "finished" and ok["val_step"] == 6 and math.isfinite(ok["val_mlm_loss"])
    assert [step for step, _ in ok["train_curve"]] == [1, 2, 3, 4, 5, 6]  # resumed, not restarted
    assert ok["outcome"] in ("trained", "failed to train")
    probe = ok["probe"]
    assert 0 < probe["train_unigram_entropy"] < math.log(200)
    assert [(c["from"], c["to"]) for c in probe["output_changes"]] == [(0, 1), (1, 2)]
    assert all(c["change"] > 0 for c in probe["output_changes"])
    assert len(probe["first_grad_norms"]["1"]["ffn"]) == 2  # one per layer
    assert not list((out / "runs").glob("*.stopped-*"))  # nothing was started over
    table = (out / "table.txt").read_text()
    assert "depth 2, warm-up 0" in table and "div@" in table and "boundary (" in table
    assert (out / "grid.png").stat().st_size > 1000 and (out / "boundary.png").stat().st_size > 1000
    # A third sitting trains nothing: every cell is read; a damaged stored probe is measured again, to the same.
    (out / "runs" / "pre-d2-h16-w0-lr0.001-s0" / "grid_probe.json").write_text('{"train_unigram')
    logs = {p: p.stat().st_mtime_ns for p in (out / "logs").iterdir()}
    assert cli.main(argv) == 0
    assert {p: p.stat().st_mtime_ns for p in (out / "logs").iterdir()} == logs
    assert json.loads((out / "results.json").read_text())["cells"]["pre-d2-h16-w0-lr0.001-s0"]["probe"] == probe


def test_loss_curves_are_drawn_as_running_means():
    curve = [[1, 8.0], [2, 6.0], [3, 7.0], [4, 5.0]]
    assert grid.smoothed(curve, 2) == ([2, 3, 4], [7.0, 6.5, 6.0])
    assert grid.smoothed(curve, 1) == ([1, 2, 3, 4], [8.0, 6.0, 7.0, 5.0])
    assert grid.smoothed(curve[:1], 5) == ([1], [8.0])  # shorter than the window: one mean


def test_read_cell_keeps_the_lowest_and_highest_layers_gradient_over_the_run(tmp_path):
    rows = [{"step": 0, "val/mlm_loss": 7.6}] + [
        {"step": step, "train/mlm_loss": 6.5, **{f"grad_norm/layer_{i:02d}/ffn": step * 100 + i for i in range(101)},
         "grad_norm/layer_00/attn": -1.0}
        for step in (1, 2)
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert grid.read_cell(tmp_path)["ffn_grad_first_last"] == [[1, 100, 200], [2, 200, 300]]


def test_late_gradients_are_the_median_of_the_last_tenth():
    rows = [[step, 1.0, 2.0] for step in range(1, 91)] + [[91, 1e-9, 3.0], [92, 5e-9, 3.0], [93, 9.0, 3.0]]
    rows += [[step, 2e-9, 3.0] for step in range(94, 101)]
    assert grid.late_grads(rows) == pytest.approx((2e-9, 3.0))
    assert grid.late_grads([]) is None


class FinishingRun(FakeRun):
    """A FakeRun that, once released, records a finished run."""

    def wait(self):
        assert self.stopped.wait(timeout=30)
        out = next(a.split("=", 1)[1] for a in self.argv if a.startswith("--train.output_dir="))
        write_json(grid.Path(out) / "status.json", {"status": "finished", "step": 3})
        return 0


def test_two_grids_on_one_out_run_a_shared_cell_once(tmp_path, fake_runs, monkeypatch):
    """Grids with overlapping axes on one --out: while one runs a cell, the other waits for it (or stops, when
    asked to) and then reads the ended cell; it never starts the same run into the same folder."""
    monkeypatch.setattr(subprocess, "Popen", lambda argv, **kw: FinishingRun(argv))
    lines: list[str] = []
    monkeypatch.setattr(grid, "say", lines.append)
    _, args = cli.parse_args(["grid", "--out", str(tmp_path), "--probe_steps=0"])
    cell = grid.Cell("pre", 128, 2, 0, 1e-3, 0)
    results: dict[str, dict] = {}

    def in_thread(name: str, stopper: grid.Stopper) -> threading.Thread:
        thread = threading.Thread(target=lambda: results.update({name: grid.run_cell(args, cell, stopper)}))
        thread.start()
        return thread

    def until(condition) -> None:
        deadline = time.monotonic() + 30
        while not condition():
            assert time.monotonic() < deadline, lines
            time.sleep(0.01)

    def waits() -> int:
        return sum("another grid is running this cell" in line for line in lines)

    first = in_thread("first", grid.Stopper())
    until(lambda: len(fake_runs) == 1)
    stopped = grid.Stopper()
    second = in_thread("second", stopped)
    until(lambda: waits() == 1)
    stopped.requested.set()  # the waiting grid is asked to stop: it gives up the wait, starts nothing
    second.join(timeout=30)
    assert results["second"]["status"] == "not started" and len(fake_runs) == 1
    third = in_thread("third", grid.Stopper())
    until(lambda: waits() == 2)
    fake_runs[0].stopped.set()  # the first grid's run ends
    first.join(timeout=30)
    third.join(timeout=30)
    assert results["first"]["status"] == results["third"]["status"] == "finished"
    assert len(fake_runs) == 1  # the third read the cell the first ran


def test_the_grid_says_what_it_will_cost_before_it_starts(tmp_path):
    """Its cells to run and their steps, times the time a cell takes: measured on the cells of --out that ended, else
    --seconds_per_cell as a stated estimate (compare's rule and wording)."""
    grid_args = ["grid", "--out", str(tmp_path), "--jobs=2", "--placements=[post, pre]", "--depths=[2]",
                 "--hidden_sizes=[64]", "--warmup_steps=[0]", "--lrs=[1e-3]", "--seeds=[0, 1]", "--max_steps=150"]
    _, args = cli.parse_args(grid_args)
    cells = grid.grid_cells(args, args.seeds)
    assert grid.cost_line(args, cells) == ("grid: 4 of 4 cells to run (600 steps); the time a cell takes follows as "
                                           "cells end (none of --out has; --seconds_per_cell=S gives an estimate now)")
    _, estimated = cli.parse_args([*grid_args, "--seconds_per_cell=120"])
    assert grid.cost_line(estimated, cells) == (f"grid: 4 of 4 cells to run (600 steps) x 120 s (an estimate, "
                                                f"--seconds_per_cell: no cell under {tmp_path} has ended) = about 4 min "
                                                "with 2 job(s)")  # fmt: skip
    for cell, seconds in zip(cells[:2], (60, 100), strict=False):  # two ended: 60 s and 100 s from start to end
        run = tmp_path / "runs" / cell.name
        write_json(run / "run_config.json", {})
        write_json(run / "status.json", {"status": "finished", "step": 150})
        os.utime(run / "run_config.json", (1000, 1000))
        os.utime(run / "status.json", (1000 + seconds, 1000 + seconds))
    measured = (f"grid: 2 of 4 cells to run (300 steps) x 80 s (the mean run time of the 2 ended cells under "
                f"{tmp_path}) = about 1 min with 2 job(s)")  # fmt: skip
    assert grid.cost_line(args, cells) == grid.cost_line(estimated, cells) == measured
