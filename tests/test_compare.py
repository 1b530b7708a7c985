"""The comparison protocol (``compare``): the paired tests, Holm's correction and the verdicts on synthetic numbers,
the provenance it refuses or marks, the report over synthetic cells, and the whole protocol through pretrain/run.py."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

from pretrain.analysis import cli, compare, provenance
from pretrain.analysis.grid import Cell
from pretrain.analysis.options import StudyModel
from pretrain.common.atomic import write_json
from pretrain.common.cli import ConfigError, to_dict
from pretrain.common.formats import STUDY_FORMAT, stamped

HOME = {"commit": "a" * 40, "code": "1234abcd5678", "torch": "2.13.0", "transformers": "5.25.0", "python": "3.11.9",
        "machine": {"cpu": "AMD EPYC (family 25, model 17), AVX512", "threads": 1, "gpu": None}}
INPUTS = {"tokenizer": "307c602bce1fb1a1", "data": "0123456789abcdef"}


# --------------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------------


def test_the_paired_interval_and_p_value_are_scipys_and_pair_by_seed():
    rng = np.random.default_rng(0)
    seed_effect = rng.normal(0, 0.05, 8)  # what a seed does to both models (its split, its batch order)
    a, b = -0.20 + seed_effect + rng.normal(0, 0.005, 8), -0.17 + seed_effect + rng.normal(0, 0.005, 8)
    found = compare.paired(list(a), list(b), 0.95)
    d = a - b
    half = stats.t.ppf(0.975, 7) * d.std(ddof=1) / math.sqrt(8)  # the textbook interval, written out
    assert found["n"] == 8 and found["mean"] == pytest.approx(d.mean())
    assert (found["low"], found["high"]) == pytest.approx((d.mean() - half, d.mean() + half))
    assert found["p"] == pytest.approx(stats.ttest_rel(a, b).pvalue)
    assert found["p"] == pytest.approx(stats.ttest_1samp(d, 0.0).pvalue)
    assert found["p"] < 1e-4 < stats.ttest_ind(a, b).pvalue  # unpaired, the seeds' spread would hide it
    assert compare.paired([-0.2], [-0.1], 0.95) == {"n": 1, "mean": pytest.approx(-0.1), "sd": None, "low": None,
                                                     "high": None, "p": None}  # fmt: skip


def test_holm_on_a_worked_example():
    # sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04, raised to 0.06 (step-down)
    assert compare.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert compare.holm([0.5, None, 0.02]) == [pytest.approx(0.5), None, pytest.approx(0.04)]  # two tests, not three
    assert compare.holm([0.9, 0.4]) == pytest.approx([0.9, 0.8])
    assert compare.holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])  # capped at 1


def test_the_detectable_difference_has_the_stated_power():
    rng = np.random.default_rng(1)
    n, sd, level = 8, 0.04, 0.05 / 6
    delta = compare.detectable(sd, n, level, 0.8)
    diffs = rng.normal(delta, sd, (40_000, n))  # paired differences whose true mean is the detectable one
    t = diffs.mean(1) / (diffs.std(1, ddof=1) / math.sqrt(n))
    assert np.mean(np.abs(t) > stats.t.ppf(1 - level / 2, n - 1)) == pytest.approx(0.8, abs=0.01)
    # many pairs: the normal approximation (z_{1-level/2} + z_power) sd / sqrt(n)
    assert compare.detectable(1.0, 4000, 0.05, 0.8) == pytest.approx(2.8016 / math.sqrt(4000), rel=2e-3)
    assert compare.detectable(sd, 2, level, 0.8) > 10 * compare.detectable(sd, 8, level, 0.8)  # n = 2 detects little


def test_verdicts_follow_the_holm_p_value_and_the_sign():
    assert compare.verdict(-0.05, 0.01, 0.05) == "ahead"  # a's gap lower: a ahead
    assert compare.verdict(0.05, 0.01, 0.05) == "behind"
    assert compare.verdict(-0.3, 0.05, 0.05) == "cannot tell at this n"
    assert compare.verdict(-0.3, None, 0.05) == "cannot tell at this n"  # fewer than two pairs


def test_contrasts_pair_the_seeds_both_have_and_correct_over_all():
    _, args = cli.parse_args(["compare", "--data=c.jsonl", "--tokenizer=t", "--models=[{placement: pre},"
                              " {residual_scheme: hc4}, {placement: rezero}, {placement: post, warmup: 50}]",
                              "--baseline=pre", "--pairs=[[pre, post+w50], [pre-hc4, rezero]]"])  # fmt: skip
    base = [-0.15, -0.10, -0.20, -0.12, -0.18, -0.16, -0.11, -0.14]
    summaries = {
        "pre": {"seeds": list(range(8)), "gaps": base, "marked": [], "diverged": []},
        "pre-hc4": {"seeds": list(range(8)), "gaps": [g - 0.05 + 0.002 * (i % 2) for i, g in enumerate(base)],
                    "marked": [], "diverged": []},
        "rezero": {"seeds": list(range(8)), "gaps": [g + 0.1 * (-1) ** i for i, g in enumerate(base)], "marked": [],
                   "diverged": []},
        "post+w50": {"seeds": [0, 1, 2, 5], "gaps": [g + 0.04 + 0.002 * (g > -0.15) for g in (base[0], base[1], base[2], base[5])],
                     "marked": [2], "diverged": []},
    }  # fmt: skip
    found = {(c["a"], c["b"]): c for c in compare.contrasts(args, summaries)}
    # every model against pre, then the pair not already there (pre vs post+w50 is post+w50 vs pre, reversed)
    assert list(found) == [("pre-hc4", "pre"), ("rezero", "pre"), ("post+w50", "pre"), ("pre-hc4", "rezero")]
    hc4, rezero, post = found["pre-hc4", "pre"], found["rezero", "pre"], found["post+w50", "pre"]
    assert (hc4["verdict"], post["verdict"], rezero["verdict"]) == ("ahead", "behind", "cannot tell at this n")
    assert post["seeds"] == [0, 1, 2, 5] and post["n"] == 4 and post["marked"] and not hc4["marked"]
    ps = [c["p"] for c in found.values()]
    assert [c["p_holm"] for c in found.values()] == pytest.approx(compare.holm(ps))
    assert hc4["detectable"] == pytest.approx(compare.detectable(hc4["sd"], 8, 0.05 / 4, 0.8))


# --------------------------------------------------------------------------------------------------
# Provenance
# --------------------------------------------------------------------------------------------------


def _found(n: int, **changes) -> dict[str, dict]:
    cells = {f"pre-s{i}": {"sittings": [HOME], "inputs": dict(INPUTS)} for i in range(n)}
    for name, change in changes.items():
        cells[name] = {**cells[name], **change}
    return cells


def test_cells_of_another_tokenizer_or_data_are_refused_whatever_the_option():
    for key in ("tokenizer", "data"):
        found = _found(4, **{"pre-s3": {"inputs": {**INPUTS, key: "ffff000011112222"}}})
        for mixed in (False, True):
            with pytest.raises(ValueError, match=rf"2 different {key}s: {INPUTS[key]} \(3 cells.*ffff000011112222 "
                                                 r"\(1 cells, e.g. pre-s3\)"):  # fmt: skip
                compare.check_provenance(found, mixed)


def test_cells_from_another_machine_or_code_are_refused_or_marked():
    """A machine that names its CPU alike but runs other kernels is another machine: AVX2 against AVX-512 moved
    the headline study's Pre-LN cell by 0.0014 nats at one code and seed (docs/results.md)."""
    zen3 = {**HOME, "machine": {**HOME["machine"], "cpu": "AMD EPYC (family 25, model 1), AVX2"}}
    older = {**HOME, "code": "99990000aaaa", "commit": "b" * 40}
    found = _found(5, **{"pre-s3": {"sittings": [zen3]}, "pre-s4": {"sittings": [HOME, older]},
                         "pre-s2": {"sittings": []}})  # fmt: skip
    with pytest.raises(ValueError, match=r"3 cells ran elsewhere.*machine\.cpu: AMD EPYC \(family 25, model 17\), "
                                         r"AVX512 vs AMD EPYC \(family 25, model 1\), AVX2.*--mixed_provenance=true"):  # fmt: skip
        compare.check_provenance(found, mixed=False)
    home, marks = compare.check_provenance(found, mixed=True)
    assert home == HOME
    assert marks == {"pre-s2": ["no provenance recorded (run before it was)"],
                     "pre-s3": ["machine.cpu: AMD EPYC (family 25, model 17), AVX512 vs AMD EPYC (family 25, "
                                "model 1), AVX2"],
                     "pre-s4": ["code: 1234abcd5678 vs 99990000aaaa"]}  # fmt: skip
    # a later commit that changes nothing the cells run is the same code
    assert compare.check_provenance(_found(2, **{"pre-s1": {"sittings": [{**HOME, "commit": "c" * 40}]}}), False)[1] == {}


def test_a_machine_records_its_environment_and_a_run_its_inputs_by_content(tmp_path):
    env = provenance.environment()
    assert env["machine"]["threads"] >= 1 and env["torch"] and env["code"] != ""
    assert env["machine"]["cpu"].endswith(f", {torch.backends.cpu.get_cpu_capability()}")  # the kernels torch runs
    provenance.record_sitting(tmp_path)
    provenance.record_sitting(tmp_path)  # resumed here: one sitting
    assert provenance.read(tmp_path)["sittings"] == [env]
    record = (tmp_path / provenance.PROVENANCE_FILE).read_bytes()
    (tmp_path / provenance.PROVENANCE_FILE).write_bytes(record[:-9])  # damaged since: where the cell ran is unknown
    with pytest.raises(ValueError, match=r"provenance\.json is damaged .*restore it from a copy, or remove it .*"
                                         r"--mixed_provenance=true"):  # fmt: skip
        provenance.record_sitting(tmp_path)
    (tmp_path / provenance.PROVENANCE_FILE).write_bytes(record)
    corpus = tmp_path / "a.jsonl"
    corpus.write_text('{"text": "one"}\n')
    data = {"sources": [{"kind": "json", "path": str(corpus), "name": None, "split": "train", "text_column": "text",
                         "weight": 1.0, "rows_per_document": 1}], "cache_dir": "here", "max_seq_length": 64}  # fmt: skip
    moved = tmp_path / "elsewhere" / "a.jsonl"
    moved.parent.mkdir()
    moved.write_text(corpus.read_text())
    same = provenance.data_hash({**data, "cache_dir": "there", "sources": [{**data["sources"][0], "path": str(moved)}]})
    assert provenance.data_hash(data) == same  # content, not place
    moved.write_text('{"text": "two"}\n')
    assert provenance.data_hash({**data, "sources": [{**data["sources"][0], "path": str(moved)}]}) != same
    assert provenance.data_hash({**data, "max_seq_length": 32}) != same


# --------------------------------------------------------------------------------------------------
# The report over synthetic cells
# --------------------------------------------------------------------------------------------------


def _cell(out: Path, label: str, lr: float, seed: int, gap: float | None, *, warmup: int = 0, env=HOME, inputs=INPUTS):
    """A run folder as an ended grid cell leaves it (status, metrics, the probe and provenance files)."""
    run_dir = out / "runs" / Cell(label, 128, 12, warmup, lr, seed).name
    write_json(run_dir / "status.json", {"status": "diverged" if gap is None else "finished", "step": 6})
    # Every run is evaluated at step 0: a diverged one's last validation line is that one (a low loss here, as a
    # gap taken from it would rank its model first).
    rows = [{"step": 0, "val/mlm_loss": 6.2 - 0.9}, *({"step": s, "train/mlm_loss": 7.0 - 0.1 * s} for s in range(1, 7))]
    rows += [] if gap is None else [{"step": 6, "val/mlm_loss": 6.2 + gap}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_json(run_dir / "grid_probe.json", {"train_unigram_entropy": 6.0, "val_unigram_cross_entropy": 6.2})
    write_json(run_dir / "provenance.json", {"sittings": [env], "inputs": inputs})


def _study(out: Path, *extra: str) -> list[str]:
    return ["compare", "--data=corpus.jsonl", "--tokenizer=tok", f"--out={out}", "--report_only", "--lrs=[1e-3, 3e-3]",
            "--seeds=[0, 1, 2, 3, 4, 5]", "--models=[{placement: pre}, {residual_scheme: hc4}, "
            "{placement: post, warmup: 50}]", "--baseline=pre", *extra]  # fmt: skip


def test_the_report_picks_each_lr_and_marks_other_machines_and_unfinished_models(tmp_path):
    base = [-0.15, -0.10, -0.20, -0.12, -0.18, -0.16]
    for seed, g in enumerate(base):
        _cell(tmp_path, "pre", 1e-3, seed, g)
        _cell(tmp_path, "pre-hc4", 1e-3, seed, g - 0.06 + 0.003 * (seed % 2))
    for seed in (0, 1):
        _cell(tmp_path, "pre", 3e-3, seed, -0.01)
        _cell(tmp_path, "pre-hc4", 3e-3, seed, None if seed else -0.5)  # diverged in one seed: not this lr
        _cell(tmp_path, "post", 1e-3, seed, -0.02, warmup=50)
    elsewhere = {**HOME, "machine": {**HOME["machine"], "cpu": "Intel Xeon 8480"}}
    for seed, g in zip((0, 1, 2, 3), (-0.18, -0.14, -0.21, -0.15), strict=True):  # post's best lr; 4 of 6 seeds
        _cell(tmp_path, "post", 3e-3, seed, g, warmup=50, env=elsewhere if seed == 3 else HOME)
    with pytest.raises(ValueError, match="1 cells ran elsewhere"):
        cli.main(_study(tmp_path))
    assert cli.main(_study(tmp_path, "--mixed_provenance=true")) == 0
    found = json.loads((tmp_path / "results.json").read_text())
    assert found["chosen"] == {"pre": 1e-3, "pre-hc4": 1e-3, "post+w50": 3e-3}
    assert found["stage1"]["pre-hc4"]["0.003"]["mean_gap"] is None  # its diverged seed rules the lr out
    assert [m["name"] for m in found["models"]] == ["pre-hc4", "post+w50", "pre"]
    _, follow = cli.parse_args(["compare", "--data=c", "--tokenizer=t", f"--follow={tmp_path / 'results.json'}"])
    assert [(m.name, m.lr) for m in follow.models] == [("pre-hc4", 1e-3), ("post+w50", 3e-3)]
    post = found["models"][1]
    assert (post["seeds"], post["planned"], post["marked"]) == ([0, 1, 2, 3], 6, [3])
    contrasts = {(c["a"], c["b"]): c for c in found["contrasts"]}
    assert contrasts["pre-hc4", "pre"]["verdict"] == "ahead" and contrasts["post+w50", "pre"]["n"] == 4
    marked = ["machine.cpu: AMD EPYC (family 25, model 17), AVX512 vs Intel Xeon 8480"]
    assert found["provenance"]["marked"] == {Cell("post", 128, 12, 50, 3e-3, 3).name: marked}
    assert found["provenance"]["inputs"] == INPUTS and len(found["provenance"]["environments"]) == 2
    table = (tmp_path / "table.txt").read_text()
    assert "post+w50 (lr 0.003, 4 of 6 seeds) †" in table and "post+w50 - pre †" in table
    assert "-0.010*" not in table and "-0.150" in table  # pre's lr 3e-3 not picked
    assert (tmp_path / "compare.png").stat().st_size > 10_000
    # another tokenizer in one cell: refused, option or not
    _cell(tmp_path, "pre", 1e-3, 5, -0.16, inputs={**INPUTS, "tokenizer": "ffff000011112222"})
    with pytest.raises(ValueError, match="2 different tokenizers"):
        cli.main(_study(tmp_path, "--mixed_provenance=true"))


def test_seeds_a_model_lost_to_divergence_are_named_beside_its_numbers(tmp_path):
    """hc4 diverged in 3 of 6 seeds at its lr: its gaps, rank and contrast are of the 3 survivors, which flatter it;
    the ranking and the contrast say so."""
    for seed, g in enumerate([-0.15, -0.10, -0.20, -0.12, -0.18, -0.16]):
        _cell(tmp_path, "pre", 1e-3, seed, g)
        _cell(tmp_path, "pre-hc4", 1e-3, seed, None if seed % 2 else g - 0.3)
    study = [a for a in _study(tmp_path) if not a.startswith(("--models", "--lrs"))]
    assert cli.main([*study, "--models=[{placement: pre, lr: 1e-3}, {residual_scheme: hc4, lr: 1e-3}]"]) == 0
    found = json.loads((tmp_path / "results.json").read_text())
    hc4 = next(m for m in found["models"] if m["name"] == "pre-hc4")
    assert (hc4["seeds"], hc4["diverged"]) == ([0, 2, 4], [1, 3, 5])
    (contrast,) = found["contrasts"]
    assert contrast["n"] == 3 and contrast["diverged"] == {"pre-hc4": [1, 3, 5]}
    table = (tmp_path / "table.txt").read_text()
    assert "pre-hc4 (lr 0.001, 3 of 6 seeds, 3 diverged)" in table
    assert f"{contrast['verdict']} (pre-hc4: 3 diverged, left out)" in table


def test_a_model_whose_stage_1_cells_have_not_ended_waits_for_them(tmp_path):
    """A stopped cell (status preempted, as a preempted sitting leaves it) is not ended: its model gets no lr yet, and
    the study says what it waits for."""
    for lr in (1e-3, 3e-3):
        for seed in (0, 1):
            _cell(tmp_path, "pre", lr, seed, -0.1 - 0.01 * seed)
            _cell(tmp_path, "pre-hc4", lr, seed, -0.2 + 0.003 * seed)
    write_json(tmp_path / "runs" / Cell("pre-hc4", 128, 12, 0, 3e-3, 1).name / "status.json",
               {"status": "preempted", "step": 3})  # fmt: skip
    study = [a for a in _study(tmp_path) if not a.startswith("--models")]
    assert cli.main([*study, "--models=[{placement: pre}, {residual_scheme: hc4}]"]) == 0
    found = json.loads((tmp_path / "results.json").read_text())
    assert found["chosen"] == {"pre": 1e-3} and found["waiting"] == {"pre-hc4": "1 stage-1 cells not ended"}


def _followed_study(path: Path, *ranked: tuple[dict[str, Any], float | None]) -> None:
    """A study's results.json as compare writes it, reduced to what --follow reads: each model's fields, its mean gap."""
    models = [{**to_dict(StudyModel(**model)), "mean_gap": mean_gap} for model, mean_gap in ranked]
    write_json(path, stamped({"models": models}, STUDY_FORMAT))


def test_a_follow_up_takes_the_best_models_at_their_lrs(tmp_path):
    results = tmp_path / "results.json"
    _followed_study(results, (dict(placement="pre", residual_scheme="hc4", lr=1e-3), -0.25),
                    (dict(placement="rezero", lr=3e-3), -0.24), (dict(placement="post", warmup=50), None))  # fmt: skip
    _, args = cli.parse_args(["compare", "--data=c", "--tokenizer=t", f"--follow={results}", "--seeds=[0, 1]"])
    assert [(m.name, m.lr) for m in args.models] == [("pre-hc4", 1e-3), ("rezero", 3e-3)] and args.baseline == "pre-hc4"
    assert compare.stage1_cells(args) == [] and compare.choose_lrs(args, {})[0] == {"pre-hc4": 1e-3, "rezero": 3e-3}
    with pytest.raises(ConfigError, match=r"top is 3, but .* ranks 2 models"):
        cli.parse_args(["compare", "--data=c", "--tokenizer=t", f"--follow={results}", "--top=3"])
    with pytest.raises(ConfigError, match="follow takes models and baseline"):
        cli.parse_args(["compare", "--data=c", "--tokenizer=t", f"--follow={results}", "--baseline=pre"])


def test_a_study_results_file_of_another_format_is_refused_with_what_to_do(tmp_path):
    """One written before its models named gpas, attention_gate and value_residual (no format_version) is not read
    with those at their defaults: the study is reported again by this code."""
    old = tmp_path / "results.json"
    old.write_text(json.dumps({"models": [{"placement": "pre", "norm_type": "layernorm", "residual_scheme": "standard",
                                          "warmup": 0, "lr": 1e-3, "mean_gap": -0.2}]}))  # fmt: skip
    with pytest.raises(ConfigError, match=rf"has no format_version .* reads format_version {STUDY_FORMAT}: .*--report_only"):
        cli.parse_args(["compare", "--data=c", "--tokenizer=t", f"--follow={old}", "--top=1"])
    write_json(old, stamped(json.loads(old.read_text()), STUDY_FORMAT))  # a model without a field: not compare's
    with pytest.raises(ConfigError, match=r"is not a study's results.json \('gpas'\)"):
        cli.parse_args(["compare", "--data=c", "--tokenizer=t", f"--follow={old}", "--top=1"])


def test_study_options_are_checked_before_any_run():
    base = ["compare", "--data=c", "--tokenizer=t"]
    for extra, message in [
        ([], "models must name at least one model"),
        (["--models=[{placement: pre}]", "--baseline=post"], r"baseline names 'post', not a model of the study \(one of pre\)"),
        (["--models=[{placement: pre}, {placement: pre}]"], "models must not repeat a model"),
        (["--models=[{placement: post, residual_scheme: mhc4}]"], r"models item 'post-mhc4' cannot be built"),
        (["--models=[{placement: post, gpas: true}]"], r"models item 'post-gpas' cannot be built: gpas=True is an option"),
        (["--models=[{placement: pre, warmup: 600}]"], "warm-ups must be <= max_steps=500"),
    ]:  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            cli.parse_args([*base, *extra])


def test_a_study_model_names_the_designs_inside_its_layers_and_its_cells_run_them():
    from pretrain.analysis import grid

    models = ("--models=[{placement: pre}, {placement: deepnorm, gpas: true, attention_gate: headwise, norm_type: derf},"
              " {placement: output_ln, qk_norm: true}]")  # fmt: skip
    _, args = cli.parse_args(["compare", "--data=c", "--tokenizer=t", models, "--lrs=[1e-3]"])
    assert [m.name for m in args.models] == ["pre", "deepnorm-gpas-gated-head-derf", "output_ln-qknorm"]
    cell = compare.study_cell(args, args.models[1], 1e-3, 0)
    assert {"--model.norm_placement=deepnorm", "--model.norm_type=derf", "--model.gpas=true",
            "--model.attention_gate=headwise"} <= set(grid.cell_overrides(args, cell, Path("cell")))  # fmt: skip
    qk = grid.cell_overrides(args, compare.study_cell(args, args.models[2], 1e-3, 0), Path("cell"))
    assert "--model.qk_norm=true" in qk and "--model.qk_norm=true" not in grid.cell_overrides(
        args, compare.study_cell(args, args.models[0], 1e-3, 0), Path("cell"))


def test_the_headline_configs_parse_to_their_models_and_contrasts(tmp_path):
    root = Path(__file__).resolve().parents[1]
    _, args = cli.parse_args(["compare", "--config", str(root / "configs/analysis/headline.yaml"), "--data=c"])
    assert [m.name for m in args.models] == ["post+w50", "pre", "pre-hc4", "pre-hc1", "pre-attnres-b4", "rezero"]
    assert compare.contrast_names(args) == [("post+w50", "pre"), ("pre-hc4", "pre"), ("pre-hc1", "pre"),
                                            ("pre-attnres-b4", "pre"), ("rezero", "pre"), ("pre-hc4", "pre-hc1")]  # fmt: skip
    assert len(compare.stage1_cells(args)) == 36 and (args.depth, args.width, args.max_steps) == (12, 128, 500)
    assert provenance.tokenizer_hash(root / args.tokenizer)  # the committed vocabulary loads
    _followed_study(tmp_path / "headline.json", (dict(placement="pre", residual_scheme="hc4", lr=1e-3), -0.3),
                    (dict(placement="post", warmup=50, lr=3e-4), -0.2))  # fmt: skip
    _, longer = cli.parse_args(["compare", "--config", str(root / "configs/analysis/headline.yaml"), "--config",
                                str(root / "configs/analysis/headline_2000.yaml"), "--data=c",
                                f"--follow={tmp_path / 'headline.json'}"])  # fmt: skip
    assert [(m.name, m.lr) for m in longer.models] == [("pre-hc4", 1e-3), ("post+w50", 3e-4)]
    assert (longer.max_steps, longer.seeds, longer.overrides) == (2000, [0, 1], args.overrides)
    assert compare.contrast_names(longer) == [("post+w50", "pre-hc4")] and compare.stage1_cells(longer) == []
    _, frontier = cli.parse_args(["compare", "--config", str(root / "configs/analysis/headline.yaml"), "--config",
                                  str(root / "configs/analysis/headline_frontier.yaml"), "--data=c"])  # fmt: skip
    assert [m.name for m in frontier.models] == ["pre", "pre-seednorm", "pre-denseformer", "pre-gated"]
    _, qk = cli.parse_args(["compare", "--config", str(root / "configs/analysis/headline.yaml"), "--config",
                            str(root / "configs/analysis/qk_norm.yaml"), "--data=c"])  # fmt: skip
    assert compare.contrast_names(qk) == [("pre-qknorm", "pre"), ("output_ln", "pre"), ("output_ln-qknorm", "pre"),
                                          ("output_ln-qknorm", "output_ln")]  # fmt: skip
    assert compare.stage1_cells(qk) == [] and len(compare.stage2_cells(qk, compare.choose_lrs(qk, {})[0])) == 16


# --------------------------------------------------------------------------------------------------
# The whole protocol, through pretrain/run.py
# --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_protocol_runs_from_nothing_and_a_second_sitting_runs_nothing(tmp_path, capsys):
    """Stage 1, the lrs picked, stage 2 and the report in one sitting; the same command again runs nothing. (A stopped
    cell continuing from its checkpoint, and one that diverges, through pretrain/run.py: test_grid.py, whose
    ``run_cells`` runs the cells here; a model waiting for its stage-1 cells: the test above.)"""
    from pretrain.data.corpus import iter_python_docs
    from pretrain.data.tokenizer import train_wordpiece_tokenizer

    texts = [text for _, text in zip(range(60), iter_python_docs(), strict=False)]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tokenizer = tmp_path / "tokenizer"
    train_wordpiece_tokenizer(texts, vocab_size=200).save_pretrained(tokenizer)
    out = tmp_path / "study"
    overrides = ["data.max_seq_length=32", "train.per_device_batch_size=4", "train.eval_batches=2",
                 f"data.cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    argv = ["compare", f"--data={corpus}", f"--tokenizer={tokenizer}", f"--out={out}", "--models=[{placement: pre},"
            " {placement: post, warmup: 2}]", "--baseline=pre", "--depth=2", "--width=16", "--max_steps=6",
            "--lrs=[1e-3]", "--lr_seeds=[0]", "--seeds=[0, 1]", "--jobs=2", f"--overrides={json.dumps(overrides)}"]  # fmt: skip
    assert cli.main(argv) == 0
    assert "x 300 s (an estimate, --seconds_per_cell" in capsys.readouterr().out
    found = json.loads((out / "results.json").read_text())
    assert found["chosen"] == {"pre": 1e-3, "post+w2": 1e-3} and found["waiting"] == {}
    (contrast,) = found["contrasts"]
    assert (contrast["a"], contrast["b"], contrast["n"], contrast["seeds"]) == ("post+w2", "pre", 2, [0, 1])
    assert contrast["p"] is not None and contrast["verdict"] in ("ahead", "behind", "cannot tell at this n")
    assert found["provenance"]["environments"] == [provenance.environment()] and not found["provenance"]["marked"]
    assert found["provenance"]["inputs"]["tokenizer"] == provenance.tokenizer_hash(tokenizer)
    assert (out / "compare.png").stat().st_size > 10_000

    logs = {p: p.stat().st_mtime_ns for p in (out / "logs").iterdir()}
    capsys.readouterr()
    assert len(logs) == 4 and cli.main(argv) == 0  # every cell ended: read, none run again
    assert re.search(r"cost: 0 cells to run .* \(the mean run time of the 4 ended cells under", capsys.readouterr().out)
    assert {p: p.stat().st_mtime_ns for p in (out / "logs").iterdir()} == logs
    assert json.loads((out / "results.json").read_text())["contrasts"] == found["contrasts"]


def test_the_diagnostics_read_each_designs_claim_from_the_late_logged_steps(tmp_path):
    """The median over the last tenth of the logged steps (here steps 19 and 20 of 20): the variance after the last
    layer over the first, the mean [CLS] and [SEP] masses, attention entropy and saturated fraction over layers, the
    averages' weight on X_0; the last evaluation's generalization gap."""
    from pretrain.run_folder import layout

    rows = [{"step": s, "hidden/variance/00": 2.0, "hidden/variance/01": 2.0 * s, "attention/first_token/00": 0.1 * s,
             "attention/first_token/01": 0.3 * s, "attention/entropy/00": 1.0, "attention/entropy/01": 0.1 * s,
             "attention/sep/00": 0.5, "attention/sep/01": 0.1 * s,
             "hidden/token_similarity/00": 0.9, "hidden/token_similarity/01": 0.01 * s,
             "preact/saturated/00": 0.0, "preact/saturated/01": 0.01 * s,
             "attention/max_logit/00": 2.0, "attention/max_logit/01": 0.5 * s,
             "residual/depth_weights": [[0.1 * s, 0.9], [0.3 * s, 0.7]], "grad_norm/layer_00/ffn": 1.0,
             "grad_norm/layer_01/ffn": 3.0} for s in range(1, 21)]  # fmt: skip
    rows += [{"step": s, "val/mlm_loss": 6.0, "val/generalization_gap": 0.01 * s} for s in (10, 20)]  # evaluations
    (tmp_path / layout.METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = compare.diagnostics({}, tmp_path, None, 100)
    assert found["variance_last_over_first"] == pytest.approx(19.5)
    assert found["first_token_mass"] == pytest.approx(0.2 * 19.5)
    assert found["attention_entropy"] == pytest.approx((1.0 + 0.1 * 19.5) / 2)
    assert found["sep_mass"] == pytest.approx((0.5 + 0.1 * 19.5) / 2)
    assert found["token_similarity"] == pytest.approx(0.01 * 19.5)  # the last layer's
    assert found["generalization_gap"] == pytest.approx(0.2)  # the last evaluation's
    assert found["preact_saturated"] == pytest.approx(0.005 * 19.5)
    assert found["weight_on_embeddings"] == pytest.approx(0.2 * 19.5)
    assert found["grad_spread"] == pytest.approx(0.5)  # std 1 over mean 2
    assert found["max_logit"] == pytest.approx(0.5 * 19.5)  # the largest over layers
    assert found["composite_gain"] is None and found["input_similarity"] is None
    assert found["loss_spikes"] is None  # no training loss logged
    # A run that logged none of them (Post-LN with LayerNorm: no pre-activation, no averages) has them as None.
    (tmp_path / layout.METRICS_FILE).write_text(json.dumps({"step": 1, "train/loss": 7.0}) + "\n")
    assert compare.diagnostics({}, tmp_path, None, 100)["preact_saturated"] is None
    # Past 99 layers the names' order is not the layers': layer 100's variance is the last.
    deep = {"step": 1, **{f"hidden/variance/{i:02d}": 1.0 + i for i in range(101)}}
    (tmp_path / layout.METRICS_FILE).write_text(json.dumps(deep) + "\n")
    assert compare.diagnostics({}, tmp_path, None, 100)["variance_last_over_first"] == pytest.approx(101.0)


def test_a_spike_is_a_logged_value_seven_standard_deviations_above_the_hundred_before_it(tmp_path):
    """mHC's and gated attention's stability claims, counted from RUN/metrics.jsonl: noise, a slow drift, a drop and
    a non-finite value are not spikes; a jump is one; a second jump within the window of the first is judged against
    the spread the first added."""
    from pretrain.run_folder import layout

    rng = np.random.default_rng(0)
    losses = list(7.0 - 0.001 * np.arange(300) + rng.normal(0, 0.05, 300))
    assert compare.spikes(losses) == 0
    losses[120], losses[170], losses[200], losses[260] = 9.0, 8.0, float("nan"), 8.0
    losses[280] = 1.0  # a drop
    assert compare.spikes(losses) == 2  # 120 and 260; 170 is within 2.1 sd of a window that holds 120
    assert compare.spikes(losses[:100]) is None  # nothing to judge the values against
    assert compare.spikes([1.0] * 100 + [1.001]) == 1  # a flat window: any rise
    norms = [1.0 + 0.01 * (s % 3) for s in range(150)]
    norms[130] = 5.0
    rows = [{"step": s, "train/loss": loss, "train/grad_norm": norm}
            for s, (loss, norm) in enumerate(zip(losses[:150], norms, strict=True))]
    (tmp_path / layout.METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = compare.diagnostics({}, tmp_path, None, 100)
    assert (found["loss_spikes"], found["grad_spikes"]) == (1, 1)
