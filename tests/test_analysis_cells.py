"""init-grads and init-scale keep every finished cell on disk and continue from them; init-perturb (Admin's
output-change measure) and the spread of per-layer gradients."""

from __future__ import annotations

import json
import math

import pytest

from pretrain.analysis import cli, common, init_grads, init_scale, perturb
from pretrain.modeling import LNBertConfig

# --------------------------------------------------------------------------------------------------
# cell files: written per cell, read back, measured again under other settings
# --------------------------------------------------------------------------------------------------


def test_cell_result_is_written_at_once_and_read_back(tmp_path):
    calls = []

    def measure():
        calls.append(1)
        return {"w2": [[1.5, 2.5]]}

    settings = {"seeds": 2}
    assert common.cell_result(tmp_path, "xavier/pre/12", settings, measure) == {"w2": [[1.5, 2.5]]}
    stored = json.loads((tmp_path / "cells" / "xavier__pre__12.json").read_text())
    assert stored == {"key": "xavier/pre/12", "settings": settings, "result": {"w2": [[1.5, 2.5]]}}
    assert not [p for p in (tmp_path / "cells").iterdir() if p.name.endswith(".tmp")]  # the atomic write's temp
    assert common.cell_result(tmp_path, "xavier/pre/12", settings, measure) == {"w2": [[1.5, 2.5]]}
    assert len(calls) == 1  # the second call read the file
    common.cell_result(tmp_path, "xavier/pre/12", {"seeds": 3}, measure)  # other settings: not this cell's numbers
    assert len(calls) == 2
    assert json.loads((tmp_path / "cells" / "xavier__pre__12.json").read_text())["settings"] == {"seeds": 3}
    (tmp_path / "cells" / "xavier__pre__12.json").write_text('{"key": "xavier/pre/12", "resu')  # damaged file
    assert common.cell_result(tmp_path, "xavier/pre/12", {"seeds": 3}, measure) == {"w2": [[1.5, 2.5]]}
    assert len(calls) == 3  # measured again, never used, and rewritten whole
    assert json.loads((tmp_path / "cells" / "xavier__pre__12.json").read_text())["key"] == "xavier/pre/12"


class Killed(Exception):
    pass


def grads_argv(tmp_path, out, *extra):
    return ["init-grads", "--cache_dir", str(tmp_path / "cache"), "--hidden_size=16", "--num_heads=2",
            "--seq_len=16", "--batch_size=2", "--vocab_size=200", "--max_documents=30", "--seeds=2",
            "--num_layers=2", "--depths=[1, 2]", "--init_schemes=[bert]", "--placements=[post, pre]",
            "--device=cpu", "--out", str(out), *extra]  # fmt: skip


def test_init_grads_killed_mid_way_keeps_its_cells_and_continues(tmp_path, monkeypatch):
    out = tmp_path / "grads"
    real = init_grads.measure_init_grads
    measured = []

    def dies_on_the_third(args, data, init_scheme, placement, depth, norm_type="layernorm", scheme="standard"):
        if len(measured) == 2:
            raise Killed
        measured.append((placement, depth))
        return real(args, data, init_scheme, placement, depth, norm_type, scheme)

    monkeypatch.setattr(init_grads, "measure_init_grads", dies_on_the_third)
    with pytest.raises(Killed):
        cli.main(grads_argv(tmp_path, out))
    assert sorted(p.name for p in (out / "cells").iterdir()) == ["bert__post__1.json", "bert__post__2.json"]
    assert not (out / "results.json").exists()

    measured.clear()
    monkeypatch.setattr(init_grads, "measure_init_grads", lambda *a, **k: measured.append(a[3:5]) or real(*a, **k))
    assert cli.main(grads_argv(tmp_path, out)) == 0
    assert measured == [("pre", 1), ("pre", 2)]  # the two finished cells were read, not measured again
    resumed = json.loads((out / "results.json").read_text())["raw"]

    # The same numbers as one uninterrupted run into a fresh folder.
    monkeypatch.setattr(init_grads, "measure_init_grads", real)
    assert cli.main(grads_argv(tmp_path, tmp_path / "fresh")) == 0
    assert resumed == json.loads((tmp_path / "fresh" / "results.json").read_text())["raw"]

    # Another setting (more seeds) is not the stored cells' measurement: everything is measured again.
    measured.clear()
    monkeypatch.setattr(init_grads, "measure_init_grads", lambda *a, **k: measured.append(a[3:5]) or real(*a, **k))
    assert cli.main([*grads_argv(tmp_path, out), "--seeds=3"]) == 0
    assert len(measured) == 4
    assert len(json.loads((out / "results.json").read_text())["raw"]["bert/post/2"]["w2"]) == 3


def test_init_scale_killed_mid_way_keeps_its_cells_and_continues(tmp_path, monkeypatch):
    out = tmp_path / "scale"
    argv = ["init-scale", "--num_layers=2", "--paper_hidden_size=16", "--seeds=4", "--model_seeds=1",
            "--hidden_size=16", "--num_heads=2", "--vocab_size=50", "--seq_len=8", "--batch_size=2",
            "--placements=[post, pre]", "--init_schemes=[xavier]", "--out", str(out)]  # fmt: skip
    real = init_scale.model_stream_scale
    calls = []

    def dies_on_pre(config, *a):
        calls.append(config.norm_placement)
        if config.norm_placement == "pre":
            raise Killed
        return real(config, *a)

    monkeypatch.setattr(init_scale, "model_stream_scale", dies_on_pre)
    with pytest.raises(Killed):
        cli.main(argv)
    names = sorted(p.name for p in (out / "cells").iterdir())
    assert names == ["model__post__xavier.json", "simplified__post.json", "simplified__pre.json"]
    calls.clear()
    monkeypatch.setattr(init_scale, "model_stream_scale", lambda config, *a: calls.append(config.norm_placement)
                        or real(config, *a))  # fmt: skip
    assert cli.main(argv) == 0
    assert calls == ["pre"]
    assert sorted(json.loads((out / "results.json").read_text())["model"]) == ["post/xavier", "pre/xavier"]


# --------------------------------------------------------------------------------------------------
# spread of per-layer gradients (Mix-LN, NormFormer)
# --------------------------------------------------------------------------------------------------


def test_layer_spread_is_the_coefficient_of_variation_and_the_first_to_last_ratio():
    assert init_grads.layer_spread([2.0, 2.0, 2.0]) == (0.0, 1.0)
    cv, ratio = init_grads.layer_spread([1.0, 3.0])  # mean 2, population std 1
    assert cv == pytest.approx(0.5) and ratio == pytest.approx(1 / 3)
    cv, ratio = init_grads.layer_spread([0.0, 0.0])  # ReZero at init
    assert math.isnan(cv) and math.isnan(ratio)


def test_init_grads_table_has_the_spread(tmp_path):
    out = tmp_path / "grads"
    assert cli.main(grads_argv(tmp_path, out)) == 0
    table = (out / "table.txt").read_text()
    assert "spread of the per-layer gradient norms" in table and "W2 CV" in table


# --------------------------------------------------------------------------------------------------
# init-perturb: Admin's output change
# --------------------------------------------------------------------------------------------------


def tiny(placement: str, layers: int = 3, init: str = "xavier") -> LNBertConfig:
    return LNBertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32, norm_placement=placement, init_scheme=init,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip


def test_output_change_is_zero_without_a_perturbation_and_quadratic_in_its_size():
    config = tiny("post")
    assert perturb.output_change(config, 2, 8, 0.0, seed=0) == 0.0
    small = perturb.output_change(config, 2, 8, 1e-3, seed=0)
    double = perturb.output_change(config, 2, 8, 2e-3, seed=0)
    assert small > 0
    assert double / small == pytest.approx(4.0, rel=0.05)  # a small change: first order in delta, squared


def test_output_change_perturbs_only_the_weight_matrices_of_the_layers():
    # ReZero's gates are 0 at init, so its layers are the identity whatever their weight matrices: a perturbation
    # of those (and not of the gates, embeddings or norms) leaves the output exactly unchanged.
    assert perturb.output_change(tiny("rezero"), 2, 8, 1e-2, seed=1) == 0.0
    assert perturb.output_change(tiny("pre"), 2, 8, 1e-2, seed=1) > 0.0


def test_init_perturb_command_writes_table_png_and_cells(tmp_path):
    out = tmp_path / "perturb"
    argv = ["init-perturb", "--hidden_size=16", "--num_heads=2", "--vocab_size=64", "--seq_len=8", "--batch_size=2",
            "--seeds=2", "--depths=[1, 4]", "--init_schemes=[xavier]", "--placements=[post, admin, rezero]",
            "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert sorted(results["raw"]) == sorted(f"xavier/{p}/{d}" for p in ("post", "admin", "rezero") for d in (1, 4))
    assert results["raw"]["xavier/rezero/4"] == [0.0, 0.0]
    assert all(v > 0 for v in results["raw"]["xavier/post/4"])
    table = (out / "table.txt").read_text()
    assert "4/1" in table and "n/a (0)" in table
    assert (out / "init_perturb.png").stat().st_size > 1000
    assert len(list((out / "cells").iterdir())) == 6


# --------------------------------------------------------------------------------------------------
# learned scalars over a run's snapshots
# --------------------------------------------------------------------------------------------------


def fake_snapshots(run_dir, config, gates_by_step):
    """Snapshots of a tiny model whose ReZero gates (or DyT alphas) are set to given values, in the run layout."""
    import torch

    from pretrain.modeling import LNBertForPreTraining
    from pretrain.run_folder.layout import SNAPSHOT_INFO, SNAPSHOT_MARKER, step_dirname

    model = LNBertForPreTraining(config)
    for step, values in gates_by_step.items():
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith(("rezero_gate.weight", ".alpha")) and ".layer." in name:
                    param.fill_(values[int(name.split(".layer.")[1].split(".")[0])])
        path = run_dir / "snapshots" / step_dirname(step)
        model.save_pretrained(path)
        (path / SNAPSHOT_INFO).write_text(json.dumps({"step": step}))
        (path / SNAPSHOT_MARKER).write_text("")


def test_learned_scalars_follow_the_snapshots(tmp_path):
    from pretrain.analysis import grid, probes

    fake_snapshots(tmp_path / "rz", tiny("rezero", layers=2), {0: [0.0, 0.0], 100: [0.25, -0.5]})
    found = probes.learned_scalars(tmp_path / "rz")
    assert found["steps"] == [0, 100]
    assert found["values"] == {"encoder.layer.0.rezero_gate.weight": [0.0, 0.25],
                               "encoder.layer.1.rezero_gate.weight": [0.0, -0.5]}  # fmt: skip
    post = LNBertConfig(**{**tiny("post", layers=2).to_dict(), "norm_type": "dyt"})
    fake_snapshots(tmp_path / "dyt", post, {0: [0.5, 0.5], 100: [0.75, 1.0]})
    alphas = probes.learned_scalars(tmp_path / "dyt")["values"]
    assert alphas["encoder.layer.1.output.LayerNorm.alpha"] == [0.5, 1.0]
    assert alphas["embeddings.LayerNorm.alpha"] == [0.5, 0.5]  # the embedding norm's alpha, left at its init here
    assert probes.learned_scalars(tmp_path / "nothing") == {"steps": [], "values": {}}

    args = grid.GridConfig(placements=["rezero"], probe_steps=4)
    cell = grid.Cell("rezero", 128, 2, 0, 1e-3, 0)
    rows = grid.scalar_lines(args, {cell: {"probe": {"learned_scalars": found}}})
    assert rows == [[cell.name, "ReZero gate (x2)", "0: 0 [0, 0]  100: 0.375 [-0.5, 0.25]"]]


def test_cell_cost_sums_the_steps_and_spans_the_run(tmp_path):
    import os

    from pretrain.analysis import grid

    (tmp_path / "run_config.json").write_text("{}")
    (tmp_path / "status.json").write_text('{"status": "finished"}')
    os.utime(tmp_path / "run_config.json", (1000.0, 1000.0))
    os.utime(tmp_path / "status.json", (1090.0, 1090.0))
    rows = [{"step": 1, "tokens_seen": 100, "train/tokens_per_s": 50.0},
            {"step": 2, "tokens_seen": 300, "train/tokens_per_s": 100.0},
            {"step": 2, "tokens_seen": 300, "val/mlm_loss": 6.0}]  # fmt: skip
    assert grid.cell_cost(tmp_path, rows) == {"train_seconds": 4.0, "wall_seconds": 90.0}
    assert grid.cell_cost(tmp_path / "none", []) == {"train_seconds": None, "wall_seconds": None}


def test_the_gpu_grid_preset_parses_to_every_placement_and_norm_type():
    from pathlib import Path

    from pretrain.analysis.grid import grid_cells
    from pretrain.placements import ALIASES, PLACEMENTS
    from pretrain.variants import NORM_TYPES

    preset = Path(__file__).resolve().parents[1] / "configs" / "analysis" / "grid_gpu.yaml"
    command, args = cli.parse_args(["grid", "--config", str(preset)])
    assert command == "grid"
    assert {m.placement for m in args.models.values()} == set(PLACEMENTS) - set(ALIASES) - {"ngpt"}  # peri is sandwich
    assert {m.norm_type for m in args.models.values()} == set(NORM_TYPES)
    assert len(grid_cells(args, args.seeds)) == 14 * 5 * 2 * 2 * 2


# --------------------------------------------------------------------------------------------------
# Residual schemes as models of the analyses
# --------------------------------------------------------------------------------------------------


def test_a_scheme_adds_a_model_on_each_placement_that_takes_it():
    from pretrain.analysis.options import models

    found = models(["post", "pre"], ["layernorm", "rmsnorm"], ["standard", "shc4", "attnres-b2"])
    assert [m.label for m in found] == ["post", "pre", "pre-shc4", "pre-attnres-b2",
                                        "post-rmsnorm", "pre-rmsnorm", "pre-shc4-rmsnorm", "pre-attnres-b2-rmsnorm"]  # fmt: skip
    shc = found[2]
    assert (shc.placement, shc.norm_type, shc.scheme) == ("pre", "layernorm", "shc4")
    assert common.model_config(
        cli.parse_args(["init-scale"])[1], shc.placement, "bert", 2, 50, scheme=shc.scheme
    ).to_dict()["hc_dynamic"] is False  # fmt: skip
    # The combinations the model refuses are left out: a scheme on Post-LN, a norm type for nGPT.
    assert [m.label for m in models(["post", "ngpt"], ["layernorm", "rmsnorm"], ["standard", "hc4"])] == [
        "post", "ngpt", "post-rmsnorm"]  # fmt: skip
    # A placement's own model keeps its placement's colour; every other model has one of its own in the figure.
    colors = common.model_colors((m.label, m.placement) for m in found)
    assert colors["pre"] == common.placement_color("pre") and colors["post"] == common.placement_color("post")
    assert len(set(colors.values())) == len(found)


def test_init_scale_over_scheme_models_reads_their_streams(tmp_path):
    """At their Pre-LN-equivalent init, HC's streams and AttnRes's summed sources are Pre-LN's stream."""
    out = tmp_path / "scale"
    argv = ["init-scale", "--num_layers=2", "--paper_hidden_size=16", "--seeds=2", "--model_seeds=1",
            "--hidden_size=16", "--num_heads=2", "--vocab_size=50", "--seq_len=8", "--batch_size=2",
            "--placements=[post, pre]", "--residual_schemes=[standard, hc4, shc2, attnres, mhc4]",
            "--init_schemes=[xavier]", "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    model = json.loads((out / "results.json").read_text())["model"]
    assert sorted(model) == sorted(f"{m}/xavier" for m in ("post", "pre", "pre-hc4", "pre-shc2", "pre-attnres", "pre-mhc4"))
    for label in ("pre-hc4", "pre-shc2", "pre-attnres"):
        assert model[f"{label}/xavier"]["mean"] == pytest.approx(model["pre/xavier"]["mean"], rel=1e-4), label
    assert model["pre-mhc4/xavier"]["mean"] != model["pre/xavier"]["mean"]  # phi's random init: near, not equal
    assert "HC, mHC: the mean over their n streams" in (out / "table.txt").read_text()
    # Adding the scheme axis left the standard models' cells as they were: read, not measured again.
    assert cli.main([*argv[:-3], "--residual_schemes=[standard]", "--init_schemes=[xavier]", "--out", str(out)]) == 0


def test_init_grads_and_init_perturb_over_scheme_models(tmp_path):
    out = tmp_path / "grads"
    assert cli.main(grads_argv(tmp_path, out, "--residual_schemes=[standard, shc4, attnres-b2]")) == 0
    raw = json.loads((out / "results.json").read_text())["raw"]
    assert {key.split("/")[1] for key in raw} == {"post", "pre", "pre-shc4", "pre-attnres-b2"}
    for label in ("pre-shc4", "pre-attnres-b2"):  # the Pre-LN model at init: its gradients
        for seed, expected in enumerate(raw["bert/pre/2"]["w2"]):
            assert raw[f"bert/{label}/2"]["w2"][seed] == pytest.approx(expected, rel=1e-3), label
    assert "pre-shc4 W1" in (out / "table.txt").read_text()

    out = tmp_path / "perturb"
    argv = ["init-perturb", "--hidden_size=16", "--num_heads=2", "--vocab_size=64", "--seq_len=8", "--batch_size=2",
            "--seeds=1", "--depths=[1, 2]", "--init_schemes=[xavier]", "--placements=[pre]",
            "--residual_schemes=[standard, mhc4]", "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    raw = json.loads((out / "results.json").read_text())["raw"]
    assert sorted(raw) == ["xavier/pre-mhc4/1", "xavier/pre-mhc4/2", "xavier/pre/1", "xavier/pre/2"]
    assert all(v[0] > 0 for v in raw.values())
