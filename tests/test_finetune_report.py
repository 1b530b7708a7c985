"""The Figure 5 report: steps to a validation loss, best-lr points with t-intervals, baselines and one-class
flags, figures, summary, W&B."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from finetune.manifest import JobSpec, ManifestJob, ResultsFolder
from finetune.report import ReportConfig, clipped_interval, confidence_interval, report, steps_to_loss
from finetune.report import main as report_main
from pretrain.run_folder.identity import ensure_run_id, read_run_id
from tests.finetune_fixtures import job_spec, results, set_status
from tests.wandb_records import read_runs

# Synthetic validation curves: Post-LN falls 1 per 100 steps, Pre-LN 1 per 60 steps.
POST = {step: 8 - step / 100 for step in range(0, 501, 100)}
PRE = {step: 8 - step / 60 for step in range(0, 301, 100)}
# (run, step, lr) -> accuracies over 3 seeds
RESULTS = {
    ("post_ln", 100, 1e-5): [0.60, 0.62, 0.64],
    ("post_ln", 100, 2e-5): [0.70, 0.72, 0.74],
    ("post_ln", 300, 2e-5): [0.75, 0.75, 0.78],
    ("pre_ln", 100, 1e-5): [0.80, 0.82, 0.84],
    ("pre_ln", 100, 2e-5): [0.70, 0.90, 0.71],
}


def write_run(root: Path, name: str, placement: str, curve: dict[int, float]) -> Path:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    ensure_run_id(run_dir)
    lines = [{"step": s, "tokens_seen": s, "val/mlm_loss": loss} for s, loss in curve.items()]
    lines.insert(1, {"step": 50, "tokens_seen": 50, "train/loss": 1.0})  # training lines are not curve points
    lines.append({"step": max(curve) + 100, "tokens_seen": 0, "val/mlm_loss": float("nan")})  # diverged: no point
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"step": 9')
    set_status(run_dir, name, placement, "finished", max(curve))
    return run_dir


def write_results(
    root: Path, runs: dict[str, Path], accuracies_of: dict[tuple[str, int, float], list[float]] = RESULTS
) -> None:
    """Result files as array tasks write them (the report reads them as they are). An accuracy at the dev set's
    majority (0.68) or minority (0.32) share is a job that answered one class."""
    folder = ResultsFolder(root)
    for (name, step, lr), accuracies in accuracies_of.items():
        for task in ("mrpc", "rte"):
            for seed, accuracy in enumerate(accuracies):
                spec = JobSpec(
                    run_id=read_run_id(runs[name]),
                    run_name=name,
                    run_dir=str(runs[name].resolve()),
                    placement="post" if name == "post_ln" else "pre",
                    pretrain_step=step,
                    tokens_seen=None,
                    model_path="/m",
                    snapshot_hash=f"{name}{step}",
                    task=task,
                    lr=lr,
                    seed=seed,
                    recipe={"epochs": 3},
                )
                f1 = accuracy - 0.1 if task == "mrpc" else None
                one_class = accuracy in (0.68, 0.32)
                metrics = results(accuracy=accuracy, f1=f1, dev_loss=0.5 + step / 1000, majority_accuracy=0.68,
                                  majority_f1=0.81 if task == "mrpc" else None,
                                  top_class_share=1.0 if one_class else 0.6)  # fmt: skip
                assert folder.write_done(ManifestJob(spec, 1), 1, metrics)


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, Path]:
    runs = {
        "post_ln": write_run(tmp_path, "post_ln", "post", POST),
        "pre_ln": write_run(tmp_path, "pre_ln", "pre", PRE),
    }
    write_results(tmp_path / "results.d", runs)
    return runs


def test_confidence_interval_uses_t_distribution() -> None:
    assert confidence_interval([0.7, 0.72, 0.74]) == pytest.approx(4.302653 * 0.02 / math.sqrt(3), rel=1e-5)
    assert math.isnan(confidence_interval([0.7]))  # undefined for one seed: no error bar, no "± 0"


def test_clipped_interval_stays_in_the_range_of_an_accuracy() -> None:
    # An RTE point with seeds at 46% and 54% give 50 ± 50.82 from the t-distribution: past both 0 and 100.
    half = confidence_interval([0.46, 0.54])
    assert half == pytest.approx(0.5082, abs=1e-4)
    assert clipped_interval(0.5, half) == (0.0, 1.0, True)
    assert clipped_interval(0.72, 0.05) == (pytest.approx(0.67), pytest.approx(0.77), False)
    low, high, clipped = clipped_interval(0.7, float("nan"))  # one seed: no interval, nothing clipped
    assert math.isnan(low) and math.isnan(high) and not clipped


def test_steps_to_loss_interpolates() -> None:
    curve = sorted(PRE.items())
    assert steps_to_loss(curve, 5.5) == pytest.approx(150.0)
    assert steps_to_loss(curve, 8.0) == 0.0
    assert steps_to_loss(curve, 2.0) is None


def test_report_figures_table_and_points(runs: dict[str, Path], tmp_path: Path) -> None:
    config = ReportConfig(
        runs=[str(runs["post_ln"]), str(runs["pre_ln"])],
        results_dir=str(tmp_path / "results.d"),
        out=str(tmp_path / "fig"),
    )
    result = report(config)
    # Default target: the smallest loss both runs reach (3.0); Pre-LN gets there in 300 steps, Post-LN in 500.
    assert result["target_loss"] == pytest.approx(3.0)
    assert [(r["run"], r["steps"], r["ratio"]) for r in result["steps"]] == [
        ("post_ln (post)", pytest.approx(500.0), pytest.approx(1.0)),
        ("pre_ln (pre)", pytest.approx(300.0), pytest.approx(0.6)),
    ]
    mrpc = {(p["run"], p["step"]): p for p in result["points"] if p["task"] == "mrpc"}
    best = mrpc[("post_ln (post)", 100)]
    assert (best["lr"], best["seeds"]) == (2e-5, 3) and best["accuracy"] == pytest.approx(0.72)
    # t(0.975, 2) = 4.3027: half-width = 4.3027 * 0.02 / sqrt(3)
    assert best["accuracy_ci"] == pytest.approx(4.302653 * 0.02 / math.sqrt(3), rel=1e-5)
    assert best["f1"] == pytest.approx(0.62)
    # Best lr by mean accuracy (0.82 beats 0.77), not by the single best seed (0.90).
    assert mrpc[("pre_ln (pre)", 100)]["lr"] == 1e-5
    rte = [p for p in result["points"] if p["task"] == "rte"]
    assert len(rte) == 3 and all(p["f1"] is None for p in rte)
    for image in ("figure5a_val_loss.png", "figure5b_mrpc.png", "figure5c_rte.png"):
        assert (tmp_path / "fig" / image).read_bytes()[:4] == b"\x89PNG"
    summary = (tmp_path / "fig" / "summary.md").read_text()
    assert "| pre_ln (pre) | 300 | 0.600 | 1.67x |" in summary
    assert "| MRPC | post_ln (post) | 100 | 2e-05 | 3 | 72.00 ± 4.97 | 62.00 ± 4.97 | 0.6000 |  |" in summary
    assert "![figure5c_rte](figure5c_rte.png)" in summary
    assert "![figure5d_dev_loss](figure5d_dev_loss.png)" in summary
    # The steps in the runs' own terms, never next to the paper's BERT-base numbers.
    assert (
        "In this comparison, pre_ln (pre) reaches validation loss 3 in 300 steps, 1.67x fewer than post_ln (post)"
        in summary
    )
    assert "1.69" not in summary and "500k" not in summary
    assert "| MRPC | 68.00 | 81.00 | 50.00 |" in summary and "| RTE | 68.00 | — | 50.00 |" in summary
    assert result["warnings"] == [] and "No snapshot beats" not in summary


def test_report_cli_with_target_loss_and_wandb_offline(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "fig"
    args = [
        f"--runs=[{runs['post_ln']}, {runs['pre_ln']}]",
        "--results_dir",
        str(tmp_path / "results.d"),
        "--out",
        str(out),
    ]
    assert report_main([*args, "--target_loss=5.5", "--wandb"]) == 0
    assert "| post_ln (post) | 250 | 1.000 | 1.00x |" in capsys.readouterr().out
    assert report_main([*args, "--target_loss=5.5", "--wandb"]) == 0  # re-run: updates the same W&B run
    first, second = read_runs(out / "wandb")
    assert first.id == second.id and first.id.startswith("report-") and second.resumed
    assert (second.job_type, second.config["norm_placement"]) == ("report", ["post", "pre"])
    assert second.metrics["figure5/*"]["step_metric"] == "pretrain_step"
    curve = [(row["pretrain_step"], row["figure5/val_mlm_loss/pre_ln (pre)"]) for row in second.history
             if "figure5/val_mlm_loss/pre_ln (pre)" in row]  # fmt: skip
    assert curve == sorted(PRE.items())
    assert any(row.get("figure5/mrpc_accuracy/post_ln (post)") == pytest.approx(0.72) for row in second.history)
    tables = next(row for row in second.history if "tables/seed_rows._type" in row)  # nested values: dotted keys
    for key in ("tables/seed_rows", "tables/steps_to_loss", "tables/best_lr_points"):
        assert tables[f"{key}._type"] == "table-file"
    assert tables["tables/seed_rows.nrows"] == 2 * sum(len(accuracies) for accuracies in RESULTS.values())
    assert second.summary["baseline/mrpc/majority_accuracy"] == pytest.approx(0.68)
    assert second.summary["warnings"] == ""
    assert any(row.get("figure5/rte_dev_loss/pre_ln (pre)") == pytest.approx(0.6) for row in second.history)


def test_report_refuses_mixed_recipes_and_a_missing_folder(runs: dict[str, Path], tmp_path: Path) -> None:
    other = job_spec(run_id=read_run_id(runs["post_ln"]), recipe={"epochs": 2})  # another recipe, same run
    ResultsFolder(tmp_path / "results.d").write_done(ManifestJob(other, 1), 1, results())
    config = ReportConfig(runs=[str(runs["post_ln"])], results_dir=str(tmp_path / "results.d"),
                          out=str(tmp_path / "fig"))  # fmt: skip
    with pytest.raises(ValueError, match=r"several fine-tuning recipes.*--recipe_hash"):
        report(config)
    assert report(replace(config, recipe_hash=other.recipe_hash))["points"][0]["seeds"] == 1
    config = replace(config, results_dir=str(tmp_path / "none.d"))
    # The folder beside it is named (the smoke preset writes smoke.d, the report reads results.d by default).
    with pytest.raises(FileNotFoundError, match=rf"results folder .*none\.d not found; .* holds results\.d: "
                                                rf"pass --results_dir={tmp_path / 'results.d'}"):  # fmt: skip
        report(config)
    config = replace(config, results_dir=str(tmp_path / "nowhere" / "results.d"))
    with pytest.raises(FileNotFoundError, match=r"not found; run finetune\.schedule first or pass --results_dir"):
        report(config)


# Issue 25's desk-scale runs: every job answers one class; seeds on either class give 32% and 68% at one point.
ONE_CLASS = {
    ("post_ln", 100, 2e-5): [0.68, 0.68],
    ("post_ln", 300, 2e-5): [0.68, 0.32],
    ("pre_ln", 100, 2e-5): [0.68, 0.68],
}


def test_report_flags_points_that_predict_one_class(tmp_path: Path) -> None:
    runs = {
        "post_ln": write_run(tmp_path, "post_ln", "post", POST),
        "pre_ln": write_run(tmp_path, "pre_ln", "pre", PRE),
    }
    write_results(tmp_path / "results.d", runs, ONE_CLASS)
    config = ReportConfig(
        runs=[str(runs["post_ln"]), str(runs["pre_ln"])],
        results_dir=str(tmp_path / "results.d"),
        out=str(tmp_path / "fig"),
    )
    result = report(config)
    assert all(p["one_class"] and p["one_class_seeds"] == 2 for p in result["points"])
    assert result["baselines"]["mrpc"] == {"majority_accuracy": 0.68, "majority_f1": 0.81, "chance": 0.5}
    split = next(p for p in result["points"] if p["task"] == "rte" and p["step"] == 300)
    # 50 ± t(0.975, 1) * 0.2546 = 50 ± 229: drawn and tabled clipped to [0, 100], and marked.
    assert (split["accuracy_low"], split["accuracy_high"], split["accuracy_clipped"]) == (0.0, 1.0, True)
    summary = (tmp_path / "fig" / "summary.md").read_text()
    assert "**No snapshot beats the majority class**" in summary and "pretrain longer or use a larger model" in summary
    assert (
        "| RTE | post_ln (post) | 300 | 2e-05 | 2 | 50.00 [0.00, 100.00]† | — | 0.8000 | **one class** (2/2 seeds) |"
        in summary
    )
    assert result["warnings"] and result["warnings"][0].startswith("**No snapshot beats")


def test_a_task_where_no_point_beats_the_majority_class_says_so() -> None:
    from finetune.report import warnings_for

    point = {"task": "rte", "accuracy": 0.515, "one_class": False}
    baselines = {"rte": {"majority_accuracy": 0.54, "majority_f1": None, "chance": 0.5}}
    warning = (
        "No RTE point beats the majority class (54.00%) beyond its 95% interval: pretrain longer or use a larger "
        "model before reading its accuracies."
    )
    assert warnings_for([point], ["rte"], baselines) == [warning]
    assert warnings_for([{**point, "accuracy": 0.6}], ["rte"], baselines) == []  # one seed: no interval, the mean
    # A mean a point above the majority class whose interval reaches below it does not beat it (as the CPU
    # reproduction's RTE: 53.43 ± 3.59 against 52.71); one whose whole interval is above it does.
    assert warnings_for([{**point, "accuracy": 0.55, "accuracy_low": 0.51}], ["rte"], baselines) == [warning]
    assert warnings_for([{**point, "accuracy": 0.6, "accuracy_low": 0.55}], ["rte"], baselines) == []
