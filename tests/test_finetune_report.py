"""The Figure 5 report: steps to a validation loss, best-lr points with t-intervals, baselines and one-class
flags, figures, summary, W&B."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from finetune.config import FinetuneConfig
from finetune.manifest import JobSpec, Manifest, ManifestJob, ResultsFolder, Runtime
from finetune.report import ReportConfig, report
from finetune.report import main as report_main
from finetune.report_figures import MIN_LOSS_SPAN, loss_limits
from finetune.report_numbers import clipped_interval, confidence_interval, crossing, prior_loss, run_infos
from pretrain.common.atomic import write_json
from pretrain.common.cli import read_yaml, run_cli, to_dict
from pretrain.common.formats import RUN_FORMAT, stamped
from pretrain.config import parse_args
from pretrain.run_folder.identity import ensure_run_id, read_run_id
from pretrain.run_folder.layout import RUN_CONFIG_FILE
from tests.finetune_fixtures import FIXTURE_GLUE, job_spec, results, set_status
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


def write_run(root: Path, name: str, placement: str, curve: dict[int, float], *options: str) -> Path:
    """A finished run with its validation curve and its resolved config (the default recipe, ``options`` on top)."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    ensure_run_id(run_dir)
    config = to_dict(parse_args([f"--model.norm_placement={placement}", f"--train.run_name={name}", *options]))
    write_json(run_dir / RUN_CONFIG_FILE, stamped(config, RUN_FORMAT))
    lines = [{"step": s, "tokens_seen": s, "val/mlm_loss": loss} for s, loss in curve.items()]
    lines.insert(1, {"step": 50, "tokens_seen": 50, "train/loss": 1.0})  # training lines are not curve points
    lines.append({"step": max(curve) + 100, "tokens_seen": 0, "val/mlm_loss": float("nan")})  # diverged: no point
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"step": 9')
    set_status(run_dir, name, placement, "finished", max(curve))
    return run_dir


def spec_of(run_dir: Path, step: int, task: str, lr: float, seed: int, recipe: dict | None = None) -> JobSpec:
    """The job of a test run's snapshot (the run's folder name is its name)."""
    return JobSpec(
        run_id=read_run_id(run_dir),
        run_name=run_dir.name,
        run_dir=str(run_dir.resolve()),
        placement="post" if run_dir.name.startswith("post") else "pre",
        pretrain_step=step,
        tokens_seen=None,
        model_path="/m",
        snapshot_hash=f"{run_dir.name}{step}",
        task=task,
        lr=lr,
        seed=seed,
        recipe=recipe or {"epochs": 3},
    )


def write_results(
    root: Path,
    runs: dict[str, Path],
    accuracies_of: dict[tuple[str, int, float], list[float]] = RESULTS,
    recipe: dict | None = None,
    majority: float = 0.68,
) -> None:
    """Result files as array tasks write them (the report reads them as they are). An accuracy at the dev set's
    majority (0.68) or minority (0.32) share is a job that answered one class."""
    folder = ResultsFolder(root)
    for (name, step, lr), accuracies in accuracies_of.items():
        for task in ("mrpc", "rte"):
            for seed, accuracy in enumerate(accuracies):
                spec = spec_of(runs[name], step, task, lr, seed, recipe)
                f1 = accuracy - 0.1 if task == "mrpc" else None
                one_class = any(math.isclose(accuracy, share) for share in (majority, 1 - majority))
                metrics = results(accuracy=accuracy, f1=f1, dev_loss=0.5 + step / 1000, majority_accuracy=majority,
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


def test_crossing_interpolates_and_says_over_which_gap() -> None:
    curve = sorted(PRE.items())
    found = crossing(curve, 5.5)
    assert found is not None and found.step == pytest.approx(150.0) and found.bracket == (100, 200)
    assert found.wide  # 100 steps apart around a figure of 150: it could be anywhere from 100 to 200
    at_start = crossing(curve, 8.0)
    assert at_start is not None and (at_start.step, at_start.bracket, at_start.wide) == (0.0, None, False)
    assert crossing(curve, 2.0) is None
    dense = [(step, 8 - step / 60) for step in range(0, 301, 10)]
    close = crossing(dense, 5.1)
    assert close is not None and close.bracket == (170, 180) and not close.wide  # 10 steps around 174


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
    assert "| MRPC | post_ln (post) | 100 | 2e-05 | 3 | 72.00 ± 4.97 | 62.00 ± 4.97 | 0.6000 ± 0.0000 |  |" in summary
    assert "![figure5c_rte](figure5c_rte.png)" in summary
    assert "![figure5d_dev_loss](figure5d_dev_loss.png)" in summary
    # The steps in the runs' own terms, never next to the paper's BERT-base numbers.
    assert (
        "In this comparison, pre_ln (pre) reaches validation loss 3 in 300 steps, 1.67x fewer than post_ln (post)"
        in summary
    )
    assert "1.69" not in summary and "500k" not in summary
    assert (
        "| MRPC | all | 68.00 | 81.00 | 0.6269 | 50.00 |" in summary and "| RTE | all | 68.00 | — | 0.6269 |" in summary
    )
    assert "first" not in summary and "max_eval_examples" not in summary  # the whole dev set: nothing to say
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
    assert "| post_ln (post) | ~250 | 1.000 | 1.00x |" in capsys.readouterr().out  # the slowest: 1 exactly
    # Re-run, the runs in the other order, with the target the report chooses: the same W&B run, updated.
    swapped = [f"--runs=[{runs['pre_ln']}, {runs['post_ln']}]", *args[1:]]
    assert report_main([*swapped, "--wandb"]) == 0
    first, second = read_runs(out / "wandb")
    assert first.id == second.id and first.id.startswith("report-") and second.resumed
    assert (second.job_type, second.config["norm_placement"]) == ("report", ["pre", "post"])
    assert first.summary["target_loss"] == first.config["target_loss"] == 5.5
    assert second.summary["target_loss"] == second.config["target_loss"] == pytest.approx(3.0)  # not null
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


# Desk-scale runs: every job answers one class; seeds on either class give 32% and 68% at one point.
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
    mrpc = result["baselines"]["mrpc"]
    assert (mrpc["majority_accuracy"], mrpc["majority_f1"], mrpc["chance"]) == (0.68, 0.81, 0.5)
    split = next(p for p in result["points"] if p["task"] == "rte" and p["step"] == 300)
    # 50 ± t(0.975, 1) * 0.2546 = 50 ± 229: drawn and tabled clipped to [0, 100], and marked.
    assert (split["accuracy_low"], split["accuracy_high"], split["accuracy_clipped"]) == (0.0, 1.0, True)
    summary = (tmp_path / "fig" / "summary.md").read_text()
    assert "**No snapshot beats the majority class**" in summary and "pretrain longer or use a larger model" in summary
    assert (
        "| RTE | post_ln (post) | 300 | 2e-05 | 2 | 50.00 [0.00, 100.00]† | — | 0.8000 ± 0.0000 | **one class** (2/2 "
        "seeds) |" in summary
    )
    assert result["warnings"] and result["warnings"][0].startswith("**No snapshot beats")


def test_a_task_where_no_point_beats_the_majority_class_says_so() -> None:
    from finetune.report_summary import warnings_for

    point = {"task": "rte", "accuracy": 0.515, "one_class": False}
    baselines = {"rte": {"majority_accuracy": 0.54, "majority_f1": None, "chance": 0.5}}
    warning = (
        "No RTE point beats the majority class (54.00%) beyond its 95% interval: pretrain longer or use a larger "
        "model before reading its accuracies."
    )
    assert warnings_for([point], ["rte"], baselines) == [warning]
    # One seed has no interval: however high, it beats nothing.
    assert warnings_for([{**point, "accuracy": 0.69, "accuracy_low": None}], ["rte"], baselines) == [warning]
    # A mean a point above the majority class whose interval reaches below it does not beat it (as the CPU
    # reproduction's RTE: 53.43 ± 3.59 against 52.71); one whose whole interval is above it does.
    assert warnings_for([{**point, "accuracy": 0.55, "accuracy_low": 0.51}], ["rte"], baselines) == [warning]
    assert warnings_for([{**point, "accuracy": 0.6, "accuracy_low": 0.55}], ["rte"], baselines) == []


# --------------------------------------------------------------------------------------------------
# What the inputs cannot show: pending jobs, no results, other recipes, wide gaps, a truncated dev set
# --------------------------------------------------------------------------------------------------


def report_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """The command as a user runs it: exit code, stdout, stderr."""
    code = run_cli(lambda: report_main(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_partial_results_folder_says_what_is_pending_and_withholds_the_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The scheduler's first pass over 2 runs x 2 tasks x 6 seeds: 24 jobs submitted, 2 done (both answered the
    majority class), one failed."""
    runs = {
        "post_ln": write_run(tmp_path, "post_ln", "post", POST),
        "pre_ln": write_run(tmp_path, "pre_ln", "pre", PRE),
    }
    folder = ResultsFolder(tmp_path / "results.d")
    jobs = [ManifestJob(spec_of(runs[name], 100, task, 2e-5, seed), 1)
            for name in runs for task in ("mrpc", "rte") for seed in range(6)]  # fmt: skip
    folder.write_manifest(Manifest(1, "local", 4, Runtime(None, {}, None), jobs))
    for job in jobs[:2]:  # post_ln, MRPC, seeds 0 and 1
        folder.write_done(job, 1, results(accuracy=0.68, majority_accuracy=0.68, top_class_share=1.0))
    folder.write_failed(jobs[-1], 1, "RuntimeError: out of memory")  # pre_ln, RTE, seed 5
    out = tmp_path / "fig"
    args = [f"--runs=[{runs['post_ln']}, {runs['pre_ln']}]", f"--results_dir={folder.root}", f"--out={out}"]
    code, stdout, stderr = report_cli(args, capsys)
    assert code == 0
    summary = (out / "summary.md").read_text()
    for text in (summary, stdout, stderr):
        assert "22 of 24 jobs are not done" in text
        assert "post_ln (post) MRPC: 4 submitted" in text and "post_ln (post) RTE: 6 submitted" in text
        assert "pre_ln (pre) RTE: 5 submitted, 1 failed" in text
    # No verdict from 2 jobs of 24: the banner waits for the rest.
    assert "No snapshot beats the majority class" not in summary
    assert "**No verdict yet**" in summary
    # The one point drawn has 2 of its 6 seeds, and is marked incomplete.
    assert "| MRPC | post_ln (post) | 100 | 2e-05 | 2/6 * |" in summary
    assert "* incomplete" in summary


def test_no_finetuning_results_warns_and_draws_panel_a_alone(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.d"
    empty.mkdir()
    out = tmp_path / "fig"
    args = [f"--runs=[{runs['post_ln']}, {runs['pre_ln']}]", f"--results_dir={empty}", f"--out={out}"]
    code, _, stderr = report_cli(args, capsys)
    # The report is written (panel a and the summary: a normal stage, fine-tuning not run yet): exit 0, warned.
    assert code == 0
    assert "warning: No fine-tuning results of these runs" in stderr and "python -m finetune.schedule" in stderr
    summary = (out / "summary.md").read_text()
    assert "No fine-tuning results of these runs" in summary and "python -m finetune.schedule" in summary
    assert sorted(p.name for p in out.glob("*.png")) == ["figure5a_val_loss.png"]  # no empty axes
    # Results of another run only: the same.
    ResultsFolder(empty).write_done(ManifestJob(job_spec(), 1), 1, results())
    assert report_cli(args, capsys)[0] == 0
    assert sorted(p.name for p in out.glob("*.png")) == ["figure5a_val_loss.png"]
    # --tasks=[]: panel (a) alone, with no results folder at all.
    loss_only = tmp_path / "loss_only"
    code, _, stderr = report_cli([args[0], f"--results_dir={tmp_path / 'nowhere.d'}", f"--out={loss_only}",
                                  "--tasks=[]"], capsys)  # fmt: skip
    assert (code, stderr) == (0, "")
    assert sorted(p.name for p in loss_only.glob("*.png")) == ["figure5a_val_loss.png"]
    # A wrong results folder is an error (exit 2) that names the way to draw panel (a) alone.
    code, _, stderr = report_cli([args[0], f"--results_dir={tmp_path / 'nowhere.d'}", f"--out={out}"], capsys)
    assert code == 2 and "results folder" in stderr and "--tasks='[]'" in stderr


def test_runs_of_different_recipes_name_what_differs_beside_the_ratio(tmp_path: Path) -> None:
    runs = {
        "post_ln": write_run(tmp_path, "post_ln", "post", POST, "--optim.lr=1e-4", "--optim.warmup_steps=100"),
        "pre_ln": write_run(tmp_path, "pre_ln", "pre", PRE, "--optim.lr=3e-4", "--optim.warmup_steps=0"),
    }
    write_results(tmp_path / "results.d", runs)
    config = ReportConfig(runs=[str(runs["post_ln"]), str(runs["pre_ln"])], results_dir=str(tmp_path / "results.d"),
                          out=str(tmp_path / "fig"))  # fmt: skip
    result = report(config)
    assert result["recipe_differences"] == [("optim.lr", [1e-4, 3e-4]), ("optim.warmup_steps", [100, 0])]
    summary = (tmp_path / "fig" / "summary.md").read_text()
    # Next to the headline (fastest first), and in the summary's own section (the order of --runs).
    assert (
        "1.67x fewer than post_ln (post) (500 steps). Their recipes differ besides the model variant (pre_ln (pre) "
        "vs post_ln (post): optim.lr 0.0003 vs 0.0001, optim.warmup_steps 0 vs 100), so the ratio is not the "
        "placement's alone." in summary
    )
    assert "optim.lr 0.0001 vs 0.0003, optim.warmup_steps 100 vs 0" in summary


def test_runs_of_one_recipe_have_no_caveat(runs: dict[str, Path], tmp_path: Path) -> None:
    config = ReportConfig(runs=[str(runs["post_ln"]), str(runs["pre_ln"])], results_dir=str(tmp_path / "results.d"),
                          out=str(tmp_path / "fig"))  # fmt: skip
    assert report(config)["recipe_differences"] == []
    summary = (tmp_path / "fig" / "summary.md").read_text()
    assert "not the placement's alone" not in summary
    assert "The runs share their recipe besides the model variant" in summary


def test_a_job_whose_fine_tuning_diverged_is_flagged_in_its_point() -> None:
    from finetune.report_numbers import RunInfo, best_lr_points
    from finetune.report_summary import _flag_cell

    run = RunInfo(path=Path("r"), name="r", placement="post", variant="post", run_id="id", label="r (post)", config={})
    jobs = [{"task": "rte", "run_id": "id", "pretrain_step": 10, "lr": 2e-5, "seed": seed, "status": "done",
             "accuracy": 0.5, "f1": None, "dev_loss": loss, "top_class_share": 0.6}
            for seed, loss in ((0, 0.69), (1, float("nan")))]  # fmt: skip
    (point,) = best_lr_points(jobs, [run], "rte", 0.95)
    assert point["diverged_seeds"] == 1
    assert _flag_cell(point) == "**diverged** (1/2 seeds: dev loss not finite)"


def test_an_f1_interval_is_clipped_as_an_accuracy_is() -> None:
    from finetune.report_summary import _share_cell

    assert _share_cell(0.79, 2.4142) == "79.00 [0.00, 100.00]†"  # two seeds' t-interval past both ends
    assert _share_cell(0.79, 0.05) == "79.00 ± 5.00" and _share_cell(0.79, float("nan")) == "79.00"


def test_a_run_that_never_reaches_the_target_is_named() -> None:
    from finetune.report_summary import steps_sentence

    table = [{"run": "a", "steps": 100.0, "approximate": False}, {"run": "b", "steps": 200.0, "approximate": False},
             {"run": "c", "steps": None, "approximate": False}]  # fmt: skip
    sentence = steps_sentence(table, 4.5, [])
    assert "a reaches validation loss 4.5 in 100 steps, 2.00x fewer than b (200 steps). c does not reach it" in sentence
    assert steps_sentence(table[1:], 4.5, []).endswith("c does not reach it in the steps logged (— below).")


def test_a_wide_interpolation_gap_is_marked(tmp_path: Path) -> None:
    """A 120-step run evaluated every 100 steps (evaluations at 0, 100 and 120) against one evaluated every 10."""
    runs = {
        "post_ln": write_run(tmp_path, "post_ln", "post", {0: 8.0, 100: 4.0, 120: 3.8}),
        "pre_ln": write_run(tmp_path, "pre_ln", "pre", {step: 8 - step / 60 for step in range(0, 301, 10)}),
    }
    write_results(tmp_path / "results.d", runs)
    config = ReportConfig(runs=[str(runs["post_ln"]), str(runs["pre_ln"])], results_dir=str(tmp_path / "results.d"),
                          out=str(tmp_path / "fig"), target_loss=5.2)  # fmt: skip
    table = {row["run"]: row for row in report(config)["steps"]}
    assert table["post_ln (post)"]["approximate"] and table["post_ln (post)"]["bracket"] == (0, 100)
    assert not table["pre_ln (pre)"]["approximate"]  # 168, between 160 and 170
    summary = (tmp_path / "fig" / "summary.md").read_text()
    # A ratio is as approximate as either step it divides; the slowest's own is 1 exactly.
    assert "| post_ln (post) | ~70 | ~0.417 | ~2.40x |" in summary and "| pre_ln (pre) | 168 | 1.000 | 1.00x |" in summary
    assert "post_ln (post) reaches validation loss 5.2 in ~70 steps, ~2.40x fewer than pre_ln (pre)" in summary
    assert "~ post_ln (post): interpolated between the evaluations at steps 0 and 100" in summary
    assert "more than 10% of the figure apart" in summary


def test_baselines_of_a_truncated_dev_set_say_so(tmp_path: Path) -> None:
    """Jobs scored on the first 3 dev examples (recipe.max_eval_examples=3: labels 0, 1, 0, majority 2/3); the
    fixture's full dev sets (8 examples) are balanced."""
    runs = {
        "post_ln": write_run(tmp_path, "post_ln", "post", POST),
        "pre_ln": write_run(tmp_path, "pre_ln", "pre", PRE),
    }
    write_results(tmp_path / "results.d", runs, recipe={"epochs": 3, "max_eval_examples": 3}, majority=2 / 3)
    config = ReportConfig(runs=[str(runs["post_ln"]), str(runs["pre_ln"])], results_dir=str(tmp_path / "results.d"),
                          out=str(tmp_path / "fig"))  # fmt: skip
    result = report(config)
    assert result["baselines"]["rte"]["eval_examples"] == 3
    summary = (tmp_path / "fig" / "summary.md").read_text()
    assert "| RTE | first 3 | 66.67 |" in summary
    assert "scored on the first 3 dev examples (recipe.max_eval_examples=3)" in summary
    assert "pass --data_dir" in summary  # the full sets' figures need the GLUE files
    # With the GLUE files: the full dev set's figures beside them.
    result = report(replace(config, data_dir=str(FIXTURE_GLUE)))
    assert result["baselines"]["rte"]["full_majority_accuracy"] == pytest.approx(0.5)
    assert result["baselines"]["rte"]["full_prior_loss"] == pytest.approx(math.log(2))
    summary = (tmp_path / "fig" / "summary.md").read_text()
    assert "| RTE | first 3 | 66.67 |" in summary and "| RTE | all 8 | 50.00 |" in summary


def test_panel_d_has_seed_intervals_a_label_prior_and_no_autoscaled_noise(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    # The dev loss of predicting the label prior is the labels' entropy (nats): ln 2 for a balanced set.
    assert prior_loss(0.5) == pytest.approx(math.log(2))
    assert prior_loss(0.68) == pytest.approx(-(0.68 * math.log(0.68) + 0.32 * math.log(0.32)))
    # Noise of 2e-4 around 0.69 is drawn on an axis at least MIN_LOSS_SPAN tall, centred on it.
    low, high = loss_limits([0.6901, 0.6903])
    assert high - low == pytest.approx(MIN_LOSS_SPAN) and low < 0.6901 < 0.6903 < high
    low, high = loss_limits([0.3, 0.9])  # a real spread keeps its own span
    assert low <= 0.3 and high >= 0.9 and high - low < 0.7
    config = ReportConfig(runs=[str(runs["post_ln"]), str(runs["pre_ln"])], results_dir=str(tmp_path / "results.d"),
                          out=str(tmp_path / "fig"))  # fmt: skip
    result = report(config)
    point = next(p for p in result["points"] if p["task"] == "rte")
    assert "dev_loss_ci" in point
    assert result["baselines"]["rte"]["prior_loss"] == pytest.approx(prior_loss(0.68))
    assert (tmp_path / "fig" / "figure5d_dev_loss.png").read_bytes()[:4] == b"\x89PNG"


def test_run_labels_name_the_whole_variant(tmp_path: Path) -> None:
    run = write_run(tmp_path, "lnbert-lns-rmsnorm", "lns", POST, "--model.norm_type=rmsnorm")
    qk = write_run(tmp_path, "post-qk", "post", PRE, "--model.qk_norm=true")
    labels = [info.label for info in run_infos([str(run), str(qk)])]
    assert labels == ["lnbert-lns-rmsnorm (lns-rmsnorm)", "post-qk (post-qknorm)"]


# --------------------------------------------------------------------------------------------------
# What the report read: the results folder, the jobs per run, the runs without results, the recipe
# --------------------------------------------------------------------------------------------------


def test_a_run_without_results_is_named_not_left_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Run A fine-tuned, run B (at another lr) not: B is named as having no results, not silently absent."""
    runs = {
        "post_ln": write_run(tmp_path, "post_ln", "post", POST, "--optim.lr=1e-4"),
        "pre_ln": write_run(tmp_path, "pre_ln", "pre", PRE, "--optim.lr=3e-4"),
    }
    write_results(tmp_path / "results.d", runs, {key: acc for key, acc in RESULTS.items() if key[0] == "post_ln"})
    out, results_dir = tmp_path / "fig", (tmp_path / "results.d").resolve()
    args = [f"--runs=[{runs['post_ln']}, {runs['pre_ln']}]", f"--results_dir={results_dir}", f"--out={out}"]
    code, _, stderr = report_cli(args, capsys)
    assert code == 0
    summary = (out / "summary.md").read_text()
    named = f"No fine-tuning results for 1 of the 2 runs** in {results_dir} (pre_ln (pre): no job)"
    assert named in summary and named.replace("**", "") in stderr
    assert f"--runs='[{runs['pre_ln'].resolve()}]'" in summary  # how to give it results
    assert f"| pre_ln (pre) | `{runs['pre_ln'].resolve()}` | none | none |" in summary
    assert f"| post_ln (post) | `{runs['post_ln'].resolve()}` | 9 of 9 | 9 of 9 |" in summary
    assert "optim.lr 0.0001 vs 0.0003" in summary  # the recipe difference, as before


def test_a_run_without_results_is_told_the_recipe_of_the_others(tmp_path: Path) -> None:
    """Run A fine-tuned with quick.yaml, run B not: B's command is quick.yaml's (another recipe in the same folder
    would make the report refuse it), not the paper's bert_glue.yaml."""
    preset = Path(__file__).resolve().parents[1] / "configs" / "finetune" / "quick.yaml"
    quick = FinetuneConfig(**read_yaml(preset.read_text())["recipe"]).result_key()
    runs = {"post_ln": write_run(tmp_path, "post_ln", "post", POST), "pre_ln": write_run(tmp_path, "pre_ln", "pre", PRE)}
    write_results(tmp_path / "quick.d", runs, {("post_ln", 100, 5e-5): [0.7, 0.72]}, recipe=quick)
    config = ReportConfig(runs=[str(runs["post_ln"]), str(runs["pre_ln"])], results_dir=str(tmp_path / "quick.d"),
                          out=str(tmp_path / "fig"))  # fmt: skip
    warning = next(w for w in report(config)["warnings"] if "No fine-tuning results for 1 of the 2 runs" in w)
    assert f"--config=configs/finetune/quick.yaml --runs='[{runs['pre_ln'].resolve()}]'" in warning


def test_the_report_names_the_results_folder_it_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A scheduler's manifest with 12 jobs submitted, none done: which folder says so is named."""
    runs = {
        "post_ln": write_run(tmp_path, "post_ln", "post", POST),
        "pre_ln": write_run(tmp_path, "pre_ln", "pre", PRE),
    }
    folder = ResultsFolder(tmp_path / "elsewhere.d")
    jobs = [ManifestJob(spec_of(runs[name], 100, task, 2e-5, seed), 1)
            for name in runs for task in ("mrpc", "rte") for seed in range(3)]  # fmt: skip
    folder.write_manifest(Manifest(1, "local", 4, Runtime(None, {}, None), jobs))
    out = tmp_path / "fig"
    args = [f"--runs=[{runs['post_ln']}, {runs['pre_ln']}]", f"--results_dir={folder.root}", f"--out={out}"]
    code, _, stderr = report_cli(args, capsys)
    assert code == 0
    summary, root = (out / "summary.md").read_text(), folder.root.resolve()
    assert f"**Incomplete: 12 of 12 jobs are not done** in {root} (" in summary
    assert f"warning: Incomplete: 12 of 12 jobs are not done in {root} (" in stderr
    assert f"Results folder read: `{root}` (--results_dir)" in summary
    assert f"| pre_ln (pre) | `{runs['pre_ln'].resolve()}` | 0 of 3 | 0 of 3 |" in summary


def test_the_summary_names_the_devices_the_jobs_computed_on(runs: dict[str, Path], tmp_path: Path) -> None:
    """One device: named. Two: each with its count, and the caveat (another device moves a job's last digits)."""
    write_results(tmp_path / "r.d", runs)
    config = ReportConfig(runs=[str(runs["post_ln"]), str(runs["pre_ln"])], results_dir=str(tmp_path / "r.d"),
                          out=str(tmp_path / "fig"))  # fmt: skip
    report(config)
    summary, n = (tmp_path / "fig" / "summary.md").read_text(), len(ResultsFolder(tmp_path / "r.d").done())
    assert f"Computed on: AMD EPYC (family 25, model 1), AVX2 ({n} of {n} jobs)." in summary
    assert "several devices" not in summary
    spec = spec_of(runs["post_ln"], 100, "mrpc", 2e-5, 9)
    assert ResultsFolder(tmp_path / "r.d").write_done(ManifestJob(spec, 1), 1, results(device="NVIDIA H100 80GB HBM3"))
    report(config)
    summary = (tmp_path / "fig" / "summary.md").read_text()
    assert (f"Computed on: AMD EPYC (family 25, model 1), AVX2 ({n} of {n + 1} jobs); NVIDIA H100 80GB HBM3 (1 of "
            f"{n + 1} jobs).") in summary
    assert "These are several devices: a job's numbers differ in their last digits" in summary


def test_the_summary_states_the_finetuning_recipe_beside_the_papers(runs: dict[str, Path], tmp_path: Path) -> None:
    recipe = {"epochs": 1, "batch_size": 32, "max_train_examples": 1000, "max_eval_examples": None}
    write_results(tmp_path / "quick.d", runs, {("post_ln", 100, 5e-5): [0.7, 0.72], ("pre_ln", 100, 5e-5): [0.7, 0.7]},
                  recipe=recipe)  # fmt: skip
    config = ReportConfig(runs=[str(runs["post_ln"]), str(runs["pre_ln"])], results_dir=str(tmp_path / "quick.d"),
                          out=str(tmp_path / "fig"))  # fmt: skip
    report(config)
    summary = (tmp_path / "fig" / "summary.md").read_text()
    assert "## Fine-tuning recipe" in summary
    for row in ("| learning rates | 5e-05 | 2e-05, 3e-05, 5e-05 |", "| seeds per point | 2 | 6 |", "| epochs | 1 | 3 |",
                "| training examples | first 1,000 | all |", "| dev examples | all | all |"):  # fmt: skip
        assert row in summary, row
    assert "Compare these runs with each other, not with the paper's numbers." in summary
