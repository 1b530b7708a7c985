"""What reaches W&B, read back from the offline run files (tests/wandb_records.py), and the dashboard view.

W&B runs offline here (WANDB_MODE=offline); each start costs seconds, so the runs are made once per module
and shared by the assertions.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState

import finetune.train as finetune_train
from finetune.config import FinetuneConfig
from finetune.run import RunConfig, run
from finetune.schedule import ScheduleConfig, wandb_settings
from finetune.worker import describe_model, job_specs
from pretrain.common.atomic import write_json
from pretrain.common.cli import to_dict
from pretrain.common.formats import RUN_FORMAT, stamped
from pretrain.config import parse_args
from pretrain.modeling import LNBertForPreTraining
from pretrain.run import main as pretrain_main
from pretrain.run_folder.layout import RUN_CONFIG_FILE, WANDB_RUN_FILE, read_status
from pretrain.tracking.wandb_logging import (
    CURVES_ONLY,
    WandbCredentialsError,
    WandbSettings,
    job_run,
    job_run_id,
    model_variant,
    pretrain_group,
    recipe,
    short_hash,
    snapshot_artifact,
)
from tests.finetune_fixtures import FIXTURE_GLUE, make_run
from tests.pretrain_helpers import tiny_args
from tests.wandb_records import LoggedRun, read_runs

QUICK = dict(batch_size=4, epochs=1, max_train_examples=8, max_eval_examples=8, torch_threads=1, progress=False)


@pytest.fixture(autouse=True)
def quiet_offline_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def _reset_accelerate() -> None:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny W&B-tracked pretraining run, preempted at step 3 (train.stop_at_step) and resumed to step 6."""
    root = tmp_path_factory.mktemp("wandb-pretrain")
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        args = tiny_args(root / "run", root / "cache", "--tracking.backend=wandb", "--tracking.comparison=unit")
        for extra in ("--train.stop_at_step=3", "--train.resume=auto"):
            assert pretrain_main([*args, extra]) == 0
            _reset_accelerate()
    finally:
        torch.set_num_threads(threads)
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    return root / "run"


@pytest.fixture(scope="module")
def pretrain_runs(pretrained: Path) -> list[LoggedRun]:
    return read_runs(pretrained / "wandb")


def test_a_preempted_and_resumed_run_is_one_wandb_run(pretrained: Path, pretrain_runs: list[LoggedRun]) -> None:
    identity = json.loads((pretrained / WANDB_RUN_FILE).read_text())
    assert len(pretrain_runs) == 2  # two processes (preempted, resumed) ...
    assert {r.id for r in pretrain_runs} == {identity["id"]}  # ... one W&B run
    for info in (pretrained / "snapshots").glob("*/snapshot.json"):  # what a damaged RUN/wandb_run.json is restored from
        assert json.loads(info.read_text())["wandb_run"] == identity
    assert all(r.resumed for r in pretrain_runs)  # resume="allow": the second start continues the first
    first, resumed = pretrain_runs
    assert [s for s, _ in first.logged("train/loss")] == [1, 2, 3]
    assert [s for s, _ in resumed.logged("train/loss")] == [4, 5, 6]


def test_pretrain_group_job_type_tags_and_config(pretrained: Path, pretrain_runs: list[LoggedRun]) -> None:
    resolved = json.loads((pretrained / RUN_CONFIG_FILE).read_text())
    model = LNBertForPreTraining.from_pretrained(pretrained / "snapshots" / "step_00000006")
    parameters = sum(p.numel() for p in model.parameters())
    for logged in pretrain_runs:
        assert logged.job_type == "pretrain"
        assert logged.group == f"unit-post-{logged.config['recipe_hash']}"
        assert set(logged.tags) == {"post", "unit"}
        config = logged.config
        # One key for the placement in every run type, the comparison, and derived values, at the top level.
        assert (config["norm_placement"], config["comparison"]) == ("post", "unit")
        assert config["global_batch_size"] == 8 and config["tokens_per_step"] == 8 * 32
        assert config["warmup_steps"] == 0 and config["num_processes"] == 1
        assert config["parameters"] == parameters
        # Native values for W&B (TensorBoard alone gets JSON strings): lists stay lists, sections stay nested.
        assert config["optim"]["betas"] == [0.9, 0.999] and config["model"] == resolved["model"]


def test_pretrain_summary_holds_the_outcome(pretrain_runs: list[LoggedRun]) -> None:
    first, resumed = pretrain_runs
    assert (first.summary["status"], first.summary["step"]) == ("preempted", 3)
    assert (resumed.summary["status"], resumed.summary["step"]) == ("finished", 6)
    assert resumed.summary["diverged_at_step"] is None
    assert resumed.metrics["val/mlm_loss"]["summary"] == {"min": True, "last": True}
    val = [v for _, v in first.logged("val/mlm_loss")]
    assert first.summary["val/mlm_loss"] == {"min": min(val), "last": val[-1]}
    assert resumed.summary["tokens_seen"] > first.summary["tokens_seen"] > 0
    # One name per metric: no flat copies (val_mlm_loss beside val/mlm_loss, val_nsp_accuracy beside val/...).
    assert "val/nsp_accuracy" in resumed.summary and not [key for key in resumed.summary if key.startswith("val_")]


def test_the_end_of_run_summary_shows_the_validation_metrics_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """W&B prints 10 summary values by default, in key order: val/* came after "+8 ..."; each under one name."""
    import wandb

    monkeypatch.setenv("WANDB_SILENT", "false")
    wandb.teardown()  # W&B reads its settings once per process: from these ...
    try:
        assert pretrain_main(tiny_args(tmp_path / "run", tmp_path / "cache", "--tracking.backend=wandb")) == 0
    finally:
        _reset_accelerate()
        monkeypatch.setenv("WANDB_SILENT", "true")
        wandb.teardown()  # ... and, for the next test, from the quiet ones
    printed = capfd.readouterr()
    summary = (printed.out + printed.err).split("Run summary:")[-1]
    assert "val/nsp_accuracy" in summary and "train/loss" in summary and "..." not in summary
    assert "val_" not in summary
    assert not [family for family in CURVES_ONLY if family in summary]  # charts, not summary values


def test_snapshots_are_model_artifacts_by_reference(pretrained: Path, pretrain_runs: list[LoggedRun]) -> None:
    run_id = pretrain_runs[0].id
    artifacts = [a for r in pretrain_runs for a in r.artifacts]
    assert [(a["name"], a["type"]) for a in artifacts] == [(f"snapshot-{run_id}", "model")] * 2
    assert [sorted(a["aliases"]) for a in artifacts] == [["latest", "step-0"], ["latest", "step-6"]]
    entries = artifacts[1]["manifest"]["contents"]
    snapshot = (pretrained / "snapshots" / "step_00000006").resolve()
    # References to the files where they are (nothing uploaded), with their checksums.
    assert {e["ref"] for e in entries} == {f.as_uri() for f in snapshot.iterdir()}
    assert all(e.get("digest") for e in entries)
    # What a fine-tuning run uses has the same digest: W&B resolves it to this version (the lineage link).
    assert snapshot_artifact(snapshot, run_id).manifest.digest() == artifacts[1]["digest"]


def _phase(pretrained: Path, cont: Path, checkpoint: int, max_steps: int) -> tuple[LoggedRun, dict[str, Any]]:
    """A 48-token phase in ``cont`` from the checkpoint of step ``checkpoint`` of ``pretrained``: its W&B run, and
    the identity of the source's."""
    args = tiny_args(cont, pretrained.parent / "cache", "--tracking.backend=wandb", "--tracking.comparison=unit")
    args += ["--data.max_seq_length=48", f"--train.max_steps={max_steps}", "--train.snapshot_at_end=false",
             f"--train.resume={pretrained / 'checkpoints' / f'step_{checkpoint:08d}'}"]  # fmt: skip
    torch.set_num_threads(1)
    try:
        assert pretrain_main(args) == 0
    finally:
        _reset_accelerate()
    (logged,) = read_runs(cont / "wandb")
    return logged, json.loads((pretrained / WANDB_RUN_FILE).read_text())


def test_the_512_token_phase_continues_the_same_wandb_run(pretrained: Path, tmp_path: Path) -> None:
    """A run continued from another run's checkpoint (the seq512 overlay) logs into that run's W&B run."""
    cont = tmp_path / "seq48"
    logged, source = _phase(pretrained, cont, checkpoint=6, max_steps=8)
    assert logged.id == source["id"] and logged.group == source["group"]
    assert [s for s, _ in logged.logged("train/loss")] == [7, 8]  # the curve goes on
    assert logged.config["data"]["max_seq_length"] == 48  # the config says which phase logged last
    assert json.loads((cont / WANDB_RUN_FILE).read_text())["continued_from"] == str(pretrained.resolve())


def test_a_phase_from_a_checkpoint_its_source_logged_past_is_a_new_wandb_run(
    pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The source logged steps 4-6 after the checkpoint of step 3: W&B keeps a step's first value, so the phase's
    steps 4-6 would be dropped from its curve. The phase logs to a new W&B run, in its own group, and says why."""
    logged, source = _phase(pretrained, tmp_path / "seq48", checkpoint=3, max_steps=4)
    assert logged.id != source["id"] and logged.group != source["group"]  # its recipe (48 tokens) is its own
    assert [s for s, _ in logged.logged("train/loss")] == [4]
    assert logged.config["continued_from"] == str(pretrained.resolve())
    err = capsys.readouterr().err
    assert f"logged steps up to 6 to W&B run {source['id']}, after the checkpoint's step 3" in err


def test_a_run_started_again_before_its_first_checkpoint_names_its_earlier_wandb_run(
    pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stopped before its first checkpoint, a run starts again from step 0: W&B would drop steps it already holds,
    so the new attempt is a new W&B run, and the warning names the earlier one, whose steps are logged again."""
    run = tmp_path / "again"
    run.mkdir()
    write_json(run / WANDB_RUN_FILE, {"id": "0123456789ab", "group": "g", "project": "lnbert"})  # the first attempt's
    torch.set_num_threads(1)
    try:
        assert pretrain_main(tiny_args(run, pretrained.parent / "cache", "--tracking.backend=wandb",
                                       "--train.max_steps=1")) == 0  # fmt: skip
    finally:
        _reset_accelerate()
    (logged,) = read_runs(run / "wandb")
    assert logged.id != "0123456789ab"
    assert "warning: W&B run 0123456789ab holds the steps this run logged before it stopped" in capsys.readouterr().err


def test_a_diverged_run_says_so_in_its_summary(
    pretrained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the outcome in the summary, a diverged run would look finished in the runs table."""
    forward = LNBertForPreTraining.forward

    def poisoned(self: LNBertForPreTraining, *args: object, **kwargs: object) -> object:
        out = forward(self, *args, **kwargs)
        if self.training:
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(LNBertForPreTraining, "forward", poisoned)
    run_dir = tmp_path / "nan"
    torch.set_num_threads(1)
    try:
        assert pretrain_main(tiny_args(run_dir, pretrained.parent / "cache", "--tracking.backend=wandb")) == 0
    finally:
        _reset_accelerate()
    (logged,) = read_runs(run_dir / "wandb")
    status = read_status(run_dir)
    assert (status["status"], status["step"], status["diverged_at_step"]) == ("diverged", 0, 1)
    outcome = ("status", "step", "diverged_at_step")
    assert [logged.summary[key] for key in outcome] == ["diverged", 0, 1]  # status.json's, not the metrics line's
    assert logged.group.startswith("lnbert-post-")  # no comparison set: the default prefix


def test_group_pools_seeds_never_placements() -> None:
    def group(*overrides: str) -> str:
        cfg = parse_args(["--tracking.comparison=cmp", *overrides])
        resolved = to_dict(cfg)
        return pretrain_group(resolved["tracking"], cfg.model.norm_placement, short_hash(recipe(resolved, 256)))

    post = group("--model.norm_placement=post")
    assert post.startswith("cmp-post-")
    assert group("--model.norm_placement=post", "--train.seed=7", "--train.output_dir=elsewhere") == post
    assert group("--model.norm_placement=pre").startswith("cmp-pre-")
    assert group("--model.norm_placement=post", "--optim.lr=0.5") != post  # another recipe: not pooled


@pytest.fixture
def no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """W&B online, and no API key in the environment, a .netrc or W&B's settings files."""
    import wandb

    for key in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.chdir(tmp_path)  # no ./wandb/settings either
    wandb.teardown()  # W&B reads its settings once per process: from these ...
    yield
    wandb.teardown()  # ... and, for the next test, from the restored ones


@pytest.mark.usefixtures("no_credentials")
def test_online_without_credentials_fails_before_training(tmp_path: Path) -> None:
    """A bad-input error (a ValueError: exit code 2 from the command line, as every config error) before any
    work, so the run folder stays as it was and the same command starts the run once logged in."""
    run_dir = tmp_path / "run"
    with pytest.raises(WandbCredentialsError, match=r"wandb login.*WANDB_MODE=offline.*--tracking.backend=none"):
        pretrain_main([f"--train.output_dir={run_dir}", "--tracking.backend=wandb"])
    assert issubclass(WandbCredentialsError, ValueError)
    assert not run_dir.exists()


@pytest.mark.usefixtures("no_credentials")
def test_finetune_and_report_check_credentials_first(tmp_path: Path) -> None:
    snapshot = make_run(tmp_path, "r", steps=(10,)) / "snapshots" / "step_00000010"
    config = RunConfig(model=str(snapshot), task="mrpc", data_dir=str(FIXTURE_GLUE), lrs=[1e-3], seeds=[0],
                       results_dir=str(tmp_path / "results.d"), wandb=True)  # fmt: skip
    with pytest.raises(WandbCredentialsError, match=r"wandb login.*WANDB_MODE=offline"):
        run(config)
    assert not (tmp_path / "results.d").exists()


# --------------------------------------------------------------------------------------------------
# Fine-tuning: one W&B run per job
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict], list[LoggedRun]]:
    root = tmp_path_factory.mktemp("wandb-finetune")
    run_dir = make_run(root, "pre_ln", "pre", steps=(10,))
    write_json(run_dir / WANDB_RUN_FILE, {"id": "pretrain01", "group": "cmp-pre-abc", "project": "lnbert"})
    write_json(run_dir / RUN_CONFIG_FILE, stamped({"tracking": {"project": "lnbert", "comparison": "cmp"}}, RUN_FORMAT))
    config = RunConfig(
        model=str(run_dir / "snapshots" / "step_00000010"),
        task="mrpc",
        data_dir=str(FIXTURE_GLUE),
        lrs=[1e-3],
        seeds=[0, 1],
        results_dir=str(root / "results.d"),
        recipe=FinetuneConfig(**QUICK),
        wandb=True,
    )
    saved = {k: os.environ.get(k) for k in ("WANDB_MODE", "WANDB_SILENT")}
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
    try:
        rows = run(config)
        assert run(config) == rows  # a second invocation has nothing to do: no new W&B run either
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    return run_dir, rows, read_runs(root / "wandb")


def test_one_wandb_run_per_finetuning_job(finetuned: tuple[Path, list[dict], list[LoggedRun]]) -> None:
    _, rows, logged = finetuned
    assert len(rows) == 2 and len(logged) == 2
    assert len({r.id for r in logged}) == 2 and all(r.id.startswith("ft-") for r in logged)
    assert {r.job_type for r in logged} == {"finetune"}
    # The two seeds pool: one group, named after the pretraining group, task, step, lr and recipe.
    assert len({r.group for r in logged}) == 1 and logged[0].group.startswith("cmp-pre-abc-mrpc-step10-lr0.001-")
    by_seed = {r.config["seed"]: r for r in logged}
    for row in rows:
        job = by_seed[row["seed"]]
        config = job.config
        assert (config["norm_placement"], config["pretrain_step"], config["task"], config["lr"]) == (
            "pre",
            10,
            "mrpc",
            1e-3,
        )
        assert (config["pretrain_run_id"], config["comparison"]) == ("pretrain01", "cmp")
        assert config["variant"] == "pre"  # the dashboard groups by variant
        assert config["recipe_hash"] == row["recipe_hash"] and config["recipe"]["batch_size"] == 4
        assert config["snapshot_artifact"] == "snapshot-pretrain01:step-10"
        assert job.summary["accuracy"] == pytest.approx(row["accuracy"])
        assert job.summary["mrpc/accuracy"] == pytest.approx(row["accuracy"])
        assert job.summary["f1"] == pytest.approx(row["f1"]) and job.summary["dev_loss"] == pytest.approx(
            row["dev_loss"]
        )
        assert job.summary["device"] == row["device"]  # the dashboard can group jobs by what they computed on
        assert job.metrics["train/*"]["step_metric"] == "train_step"
        assert [row["train_step"] for row in job.history] == [1, 2]  # the training-loss curve, per step
        assert all("train/loss" in row for row in job.history)


def test_finetuning_runs_record_the_models_variant(tmp_path: Path) -> None:
    """The dashboard groups by variant: a fine-tuning run reads it from its model's config.json."""
    write_json(tmp_path / "config.json", {"model_type": "lnbert", "norm_placement": "pre", "norm_type": "rmsnorm"})
    assert model_variant(str(tmp_path)) == "pre-rmsnorm"
    write_json(tmp_path / "config.json", {"model_type": "lnbert", "norm_placement": "pre", "residual_scheme": "hc",
                                          "hc_streams": 4, "hc_dynamic": False})  # fmt: skip
    assert model_variant(str(tmp_path)) == "pre-shc4"
    write_json(tmp_path / "config.json", {"model_type": "bert"})
    assert model_variant(str(tmp_path)) == "post"  # Hugging Face BERT
    assert model_variant("google-bert/bert-base-uncased") == "post"  # a Hub id: not read, BERT's


def test_a_failing_job_ends_its_wandb_run_as_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> dict:
        raise RuntimeError("out of memory")

    monkeypatch.setattr(finetune_train, "finetune", broken)  # the worker imports it per job
    snapshot = make_run(tmp_path, "r", steps=(10,)) / "snapshots" / "step_00000010"
    config = RunConfig(model=str(snapshot), task="rte", data_dir=str(FIXTURE_GLUE), lrs=[1e-3], seeds=[0],
                       results_dir=str(tmp_path / "results.d"), recipe=FinetuneConfig(**QUICK), wandb=True,
                       max_attempts=1)  # fmt: skip
    (row,) = run(config)
    assert row["status"] == "failed" and "out of memory" in row["error"]
    (logged,) = read_runs(tmp_path / "wandb")
    assert (logged.summary["status"], logged.exit_code) == ("failed", 1)
    assert logged.group.startswith("r-rte-step10-")  # a run without W&B id: grouped by its name


def test_online_job_runs_use_their_snapshot_artifact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B has no artifacts offline, so the online call is checked against a stand-in for wandb.init."""
    import wandb

    used = []

    class Run:
        summary: dict = {}

        def define_metric(self, *args: object, **kwargs: object) -> None: ...

        def use_artifact(self, artifact: object) -> None:
            used.append(artifact)

        def finish(self, exit_code: int = 0) -> None: ...

    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setattr(wandb, "init", lambda **kwargs: Run())
    run_dir = make_run(tmp_path, "r", steps=(10,))
    write_json(run_dir / WANDB_RUN_FILE, {"id": "abc", "group": "g", "project": "p"})
    description = describe_model(str(run_dir / "snapshots" / "step_00000010"))
    (spec,) = job_specs(description, "rte", [1e-3], [0], FinetuneConfig(**QUICK))
    with job_run(spec, WandbSettings(dir=str(tmp_path))):
        pass
    (artifact,) = used
    assert (artifact.name, artifact.type, artifact.metadata["step"]) == ("snapshot-abc", "model", 10)


def test_scheduler_workers_get_the_wandb_settings(tmp_path: Path) -> None:
    config = ScheduleConfig(runs=[str(tmp_path)], results_dir=str(tmp_path / "s" / "results.d"), wandb=True,
                            wandb_project="p")  # fmt: skip
    assert wandb_settings(config) == WandbSettings(project="p", dir=str(tmp_path / "s"))
    assert wandb_settings(ScheduleConfig(runs=[str(tmp_path)])) is None


def test_job_run_ids_are_deterministic(finetuned: tuple[Path, list[dict], list[LoggedRun]]) -> None:
    """The same job always maps to the same W&B run (a retried job continues its run)."""
    run_dir, _, logged = finetuned
    description = describe_model(str(run_dir / "snapshots" / "step_00000010"))
    specs = job_specs(description, "mrpc", [1e-3], [0, 1], FinetuneConfig(**QUICK))
    assert {job_run_id(spec) for spec in specs} == {r.id for r in logged}


# --------------------------------------------------------------------------------------------------
# The dashboard view (built offline; saving needs the network)
# --------------------------------------------------------------------------------------------------


def test_dashboard_view_has_figure5_gradients_throughput_and_outcomes() -> None:
    from finetune.dashboard import DashboardConfig, build_workspace

    workspace = build_workspace(DashboardConfig(comparison="bert-base-placements", project="lnbert"), "team")
    assert (workspace.entity, workspace.project) == ("team", "lnbert")
    panels = {section.name: section.panels for section in workspace.sections}
    figure5 = panels["Figure 5"]
    assert (figure5[0].x, figure5[0].y, figure5[0].groupby_aggfunc) == ("Step", ["val/mlm_loss"], "mean")
    scatter = [p for p in figure5 if type(p).__name__ == "ScatterPlot"]
    assert [(p.x.name, p.y.name) for p in scatter] == [
        ("pretrain_step", "mrpc/accuracy"),
        ("pretrain_step", "rte/accuracy"),
    ]
    report_lines = [p for p in figure5[1:] if type(p).__name__ == "LinePlot"]
    assert [(p.x, p.metric_regex) for p in report_lines] == [
        ("pretrain_step", "figure5/mrpc_accuracy/.*"),
        ("pretrain_step", "figure5/rte_accuracy/.*"),
    ]
    regexes = {p.metric_regex for p in panels["Gradient norms per layer"]}
    assert {r"grad_norm/layer_\d+/attn", r"grad_norm/layer_\d+/ffn"} <= regexes
    assert {y for p in panels["Throughput and MFU"] for y in p.y} >= {"train/tokens_per_s", "train/mfu"}
    claims = panels["The designs' claims (docs/placements.md)"]
    assert claims[0].y == ["val/generalization_gap"]
    assert {r"attention/sep/\d+", r"hidden/absmax/\d+", r"hidden/token_similarity/\d+"} <= {p.metric_regex for p in claims}
    runset = workspace.runset_settings
    assert "comparison" in str(runset.filters) and "bert-base-placements" in str(runset.filters)
    assert [g.name for g in runset.groupby] == ["variant"]
    for column in ("summary:status", "summary:diverged_at_step", "summary:val/mlm_loss.min", "summary:tokens_seen"):
        assert column in runset.pinned_columns
    model = workspace._to_model()  # what would be sent: the filter, grouping and panels survive serialisation
    spec = model.model_dump_json()
    assert "variant" in spec and "config:pretrain_step" in spec and "summary:mrpc/accuracy" in spec


def test_dashboard_creates_then_updates_the_same_view(monkeypatch: pytest.MonkeyPatch) -> None:
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces.workspaces import internal

    from finetune.dashboard import DashboardConfig, build_workspace, save_workspace

    saved: dict[str, dict] = {}

    def from_name(entity: str, project: str, name: str) -> object:
        if name not in saved:
            raise ValueError(f"Workspace `{name}` not found in project `{project}`")
        return type("View", (), {"id": saved[name]["id"]})()

    def upsert(view: object) -> dict:
        inserted = view.name not in saved
        saved.setdefault(view.name, {"id": f"id-{len(saved)}"})["display"] = view.display_name
        return {"upsertView": {"view": {"id": saved[view.name]["id"], "name": view.name}, "inserted": inserted}}

    monkeypatch.setattr(internal.View, "from_name", staticmethod(from_name))
    monkeypatch.setattr(internal, "upsert_view2", upsert)
    monkeypatch.setattr(ws.Workspace, "url", property(lambda self: f"https://wandb.test/{self._internal_name}"))
    config = DashboardConfig(comparison="Bert base placements")
    first = save_workspace(build_workspace(config, "team"), config.comparison)
    second = save_workspace(build_workspace(config, "team"), config.comparison)
    assert list(saved) == ["nw-lnbert-bert-base-placements-v"]  # one view, updated in place
    assert first._internal_id == second._internal_id == "id-0"


@pytest.mark.usefixtures("no_credentials")
def test_dashboard_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """--dry_run builds and prints the view without W&B; saving it needs credentials, and says so."""
    from finetune.dashboard import main

    assert main(["--comparison=cmp", "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert "section 'Figure 5'" in out and "grouped by" in out and "summary:status" in out
    with pytest.raises(WandbCredentialsError, match=r"wandb login.*--dry_run"):
        main(["--comparison=cmp"])
