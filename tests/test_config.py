"""The pretraining config: presets and CLI overrides parse into one schema; bad input fails with the key and fix."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pretrain.common.cli import ConfigError, parser, to_dict
from pretrain.config import (
    ModelConfig,
    OptimConfig,
    PretrainConfig,
    TrackingConfig,
    TrainConfig,
    parse_args,
)
from pretrain.data.config import DataConfig, SourceConfig
from pretrain.training import check_environment

ROOT = Path(__file__).resolve().parents[1]
PRETRAIN_PRESETS = sorted((ROOT / "configs" / "pretrain").glob("*.yaml"))
DEEPSPEED_CONFIGS = sorted((ROOT / "configs" / "deepspeed").glob("*.json"))
ACCELERATE_CONFIGS = sorted((ROOT / "configs" / "accelerate").glob("*.yaml"))
SECTIONS = (ModelConfig, OptimConfig, TrainConfig, TrackingConfig, PretrainConfig)


def test_every_config_dir_has_files() -> None:
    assert len(PRETRAIN_PRESETS) >= 6 and len(DEEPSPEED_CONFIGS) >= 2 and len(ACCELERATE_CONFIGS) >= 4


@pytest.mark.parametrize("preset", PRETRAIN_PRESETS, ids=lambda p: p.name)
def test_pretrain_presets_parse_into_the_schema(preset: Path) -> None:
    if preset.name.endswith("_seq512.yaml"):  # an overlay on its phase-1 preset
        base = ROOT / "configs" / "pretrain" / preset.name.replace("_seq512", "")
        cfg = parse_args(["--config", str(base), "--config", str(preset)])
        assert cfg.data.max_seq_length == 512 <= cfg.model.max_position_embeddings
    else:
        cfg = parse_args(["--config", str(preset)])
    assert "../shared" not in preset.read_text()
    assert cfg.model.norm_placement in ("post", "pre")


def test_bert_base_presets_follow_the_paper() -> None:
    post = parse_args(["--config", str(ROOT / "configs/pretrain/bert_base_post_ln.yaml")])
    pre = parse_args(["--config", str(ROOT / "configs/pretrain/bert_base_pre_ln.yaml")])
    assert (post.model.hidden_size, post.model.num_hidden_layers, post.model.num_attention_heads) == (768, 12, 12)
    assert post.model.intermediate_size == 3072 and post.model.vocab_size == 30522
    assert (post.optim.lr, post.optim.warmup_steps, post.optim.scheduler) == (1e-4, 10000, "linear")
    assert (pre.optim.lr, pre.optim.warmup_steps) == (3e-4, 0)
    assert post.optim.betas == (0.9, 0.999) and post.optim.eps == 1e-6 and post.optim.weight_decay == 0.01
    assert post.train.max_steps == 1_000_000 and post.data.max_seq_length == 128
    assert post.train.global_batch_size(8) == 256
    assert post.data.tokenizer == "bert-base-uncased"
    # Identical apart from placement, schedule and names.
    differing = _differences(to_dict(post), to_dict(pre))
    assert differing == {"model.norm_placement", "optim.lr", "optim.warmup_steps", "train.output_dir", "train.run_name"}


def test_small_presets_differ_only_in_placement_and_schedule() -> None:
    post = parse_args(["--config", str(ROOT / "configs/pretrain/small_post_ln.yaml")])
    pre = parse_args(["--config", str(ROOT / "configs/pretrain/small_pre_ln.yaml")])
    differing = _differences(to_dict(post), to_dict(pre))
    assert differing == {
        "model.norm_placement",
        "optim.lr",
        "optim.warmup_fraction",
        "train.output_dir",
        "train.run_name",
    }
    assert post.optim.resolved_warmup_steps(post.train.max_steps) == 20
    assert pre.optim.resolved_warmup_steps(pre.train.max_steps) == 0
    assert all(s.kind == "json" for s in post.data.sources)


def _differences(a: dict, b: dict, prefix: str = "") -> set[str]:
    out = set()
    for key in a:
        name = f"{prefix}{key}"
        if isinstance(a[key], dict):
            out |= _differences(a[key], b[key], name + ".")
        elif a[key] != b[key]:
            out.add(name)
    return out


@pytest.mark.parametrize("path", DEEPSPEED_CONFIGS, ids=lambda p: p.name)
def test_deepspeed_configs_leave_batch_and_clipping_to_the_project_config(path: Path) -> None:
    ds = json.loads(path.read_text())
    for key in (
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
    ):
        assert ds[key] == "auto", key
    assert ds["bf16"]["enabled"] == "auto" and ds["fp16"]["enabled"] == "auto"
    assert ds["zero_optimization"]["stage"] in (1, 2)
    assert "optimizer" not in ds and "scheduler" not in ds  # both come from pretrain/run.py


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=lambda p: p.name)
def test_accelerate_configs_load(path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(path))
    assert config.num_processes >= 1
    raw = yaml.safe_load(path.read_text())
    if raw["distributed_type"] == "DEEPSPEED":
        assert (ROOT / raw["deepspeed_config"]["deepspeed_config_file"]).is_file()


def test_yaml_and_cli_give_the_same_config(tmp_path: Path) -> None:
    preset = tmp_path / "p.yaml"
    preset.write_text("train:\n  max_steps: 100\noptim:\n  betas: [0.9, 0.98]\n  lr: 1e-4\n")
    from_yaml = parse_args(["--config", str(preset)])
    from_cli = parse_args(["--train.max_steps=100", "--optim.betas", "[0.9, 0.98]", "--optim.lr=1e-4"])
    assert from_yaml == from_cli
    assert from_cli.optim.lr == 1e-4 and from_cli.optim.betas == (0.9, 0.98)
    # Overrides win over the preset.
    assert parse_args(["--config", str(preset), "--train.max_steps=7"]).train.max_steps == 7


def test_list_of_dataclasses_from_the_cli() -> None:
    cfg = parse_args(['--data.sources=[{"kind": "json", "path": "a.jsonl", "weight": 2}, {kind: text, path: b.txt}]'])
    assert [(s.kind, s.path, s.weight) for s in cfg.data.sources] == [("json", "a.jsonl", 2.0), ("text", "b.txt", 1.0)]


def _through_json(cfg: PretrainConfig, folder: Path) -> PretrainConfig:
    """``cfg`` written as run_config.json is, then read back as a preset."""
    (folder / "run_config.json").write_text(json.dumps(to_dict(cfg)))
    return parse_args(["--config", str(folder / "run_config.json")])


def test_resolved_config_round_trips_through_json(tmp_path: Path) -> None:
    cfg = parse_args(["--model.norm_placement=pre", "--train.snapshot_steps=[1, 10, 100]"])
    assert _through_json(cfg, tmp_path) == cfg
    assert cfg.train.run_name == "lnbert-pre" and cfg.train.output_dir == "runs/lnbert-pre"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--train.max_step=10"], r"unknown key 'train.max_step'; did you mean 'train.max_steps'\?"),
        (["--trian.seed=1"], r"unknown key 'trian'; did you mean 'train'\?"),
        (['--data.sources=[{"kind": "json", "paht": "x"}]'], r"unknown key 'data.sources.paht'; did you mean"),
        (["--train.max_steps=abc"], r"train.max_steps expects int, got 'abc'"),
        (["--train.compile=maybe"], r"train.compile expects bool, got 'maybe'"),
        (["--optim.lr=fast"], r"optim.lr expects float, got 'fast'"),
        (["--optim.betas=[0.9]"], r"optim.betas expects tuple\[float, float\]"),
        (["--model.norm_placement=middle"], r"model.norm_placement must be one of post, pre, sandwich, peri, deepnorm, admin"),
        (["--train.mixed_precision=fp8"], r"train.mixed_precision must be one of no, bf16, fp16"),
        (["--optim.scheduler=triangle"], r"optim.scheduler must be one of .*linear"),
        (
            ["--optim.warmup_steps=500", "--train.max_steps=100"],
            r"optim.warmup_steps = 500 exceeds train.max_steps=100",
        ),
        (["--model.num_attention_heads=5"], r"model.num_attention_heads must divide model.hidden_size=64"),
        (["--data.max_seq_length=512"], r"model.max_position_embeddings = 128 is smaller than data.max_seq_length=512"),
        (
            ["--model.vocab_size=1000", "--data.vocab_size=4000"],
            r"data.vocab_size = 4000 .* exceeds model.vocab_size=1000",
        ),
        (["--data.sources=[{kind: tape}]"], r"data.sources\[\].kind='tape' is unknown"),
        (["--train.stop_at_step=500"], r"train.stop_at_step must be in \[1, train.max_steps=300\]"),
        (["--model.hidden_size"], r"--model.hidden_size needs a value"),
        (["max_steps=3"], r"unexpected argument 'max_steps=3'"),
        (
            ["--model.residual_scheme=hc"],
            r"model.residual_scheme='hc' needs model.norm_placement='pre' \(got 'post'\).*set model.norm_placement=pre",
        ),
        (["--model.residual_scheme=hyper"], r"model.residual_scheme must be one of standard, hc, mhc, attn_res"),
        (["--model.norm_placement=pre", "--model.hc_streams=0"], r"model.hc_streams=0 must be an integer >= 1"),
        (["--model.mhc_sinkhorn_iters=0"], r"model.mhc_sinkhorn_iters=0 must be an integer >= 1"),
        (["--model.attn_res_block_size=0"], r"model.attn_res_block_size=0 must be an integer >= 1"),
        (["--model.mhc_bias_init=ones"], r"model.mhc_bias_init must be one of zero, identity; got 'ones'"),
        (
            ["--model.norm_placement=ngpt", "--model.norm_type=rmsnorm"],
            r"model.norm_type='rmsnorm' does not apply to model.norm_placement='ngpt'",
        ),
    ],
)
def test_bad_configs_name_the_key_and_the_fix(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args(argv)


def test_missing_preset_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file .*nope.yaml not found"):
        parse_args(["--config", str(tmp_path / "nope.yaml")])


def test_unknown_key_in_a_preset(tmp_path: Path) -> None:
    preset = tmp_path / "p.yaml"
    preset.write_text("optim:\n  learning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown key 'optim.learning_rate'"):
        parse_args(["--config", str(preset)])


def test_fp16_on_cpu_deepspeed_with_compile_or_ngpt_fail_before_any_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"train.mixed_precision=fp16 needs a GPU"):
        check_environment(parse_args(["--train.mixed_precision=fp16"]))
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ConfigError, match=r"train.compile=true does not work with DeepSpeed"):
        check_environment(parse_args(["--train.compile=true"]))
    with pytest.raises(ConfigError, match=r"model.norm_placement=ngpt does not work with DeepSpeed"):
        check_environment(parse_args(["--model.norm_placement=ngpt"]))


@pytest.mark.parametrize("cls", [*SECTIONS, DataConfig, SourceConfig], ids=lambda c: c.__name__)
def test_every_field_is_documented(cls: type) -> None:
    """--help shows the docstring under each field (jsonargparse reads them)."""
    helps = {action.dest: action.help for action in parser(cls, prog="test")._actions}
    missing = [f.name for f in dataclasses.fields(cls) if not dataclasses.is_dataclass(f.type) and not helps[f.name]]
    assert not missing, f"{cls.__name__} fields without a docstring: {missing}"


def _help(main: Any, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_help_lists_every_field_with_type_default_and_doc(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(parse_args, capsys)
    for cls, section in [
        (ModelConfig, "model"),
        (OptimConfig, "optim"),
        (TrainConfig, "train"),
        (TrackingConfig, "tracking"),
        (DataConfig, "data"),
    ]:
        for f in dataclasses.fields(cls):
            assert re.search(rf"^  --{section}\.{f.name}[ \n]", text, re.M), f.name
    assert "Where the norms go" in text
    assert re.search(r"--train.max_steps MAX_STEPS\s+Optimizer steps[^-]*\(type: int,\s+default: 300\)", text)
    assert "--data.sources.help" in text  # the keys of a source: --data.sources.help SourceConfig


def test_help_of_the_items_of_a_list(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--config", str(PRETRAIN_PRESETS[0]), "--data.sources.help", "SourceConfig"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "--data.sources.kind" in text and "Column holding the document text" in text


def test_run_and_prepare_help_exit_zero(capsys: pytest.CaptureFixture[str]) -> None:
    from pretrain.prepare import main as prepare_main
    from pretrain.run import main

    text = _help(main, capsys)
    assert "--optim.warmup_steps" in text and "Exit codes: 0 finished" in text  # pretrain/run.py's docstring
    assert "--data.num_proc" in _help(prepare_main, capsys)


def test_tensorboard_backend_without_the_extra_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real_find_spec(name, *a)
    )
    with pytest.raises(
        ConfigError, match=r"tracking.backend is tensorboard, which is not installed: .*\[tensorboard\]"
    ):
        TrackingConfig(backend="tensorboard")
    TrackingConfig(backend="none")  # the other backends do not need it


def test_the_schedules_checked_without_transformers_are_transformers_own() -> None:
    """OptimConfig accepts these names without importing transformers (the command line is read before it), so
    each must be a schedule transformers' get_scheduler knows; one dropped upstream would pass here and fail later."""
    from transformers.trainer_utils import SchedulerType

    from pretrain.config import COMMON_SCHEDULERS

    assert set(COMMON_SCHEDULERS) <= {s.value for s in SchedulerType}


# --------------------------------------------------------------------------------------------------
# Residual schemes: the six model fields, their names, their check before torch
# --------------------------------------------------------------------------------------------------

SCHEME_ARGS = ["--model.norm_placement=pre", "--model.residual_scheme=mhc", "--model.hc_streams=2",
               "--model.mhc_sinkhorn_iters=7", "--model.mhc_bias_init=identity"]  # fmt: skip


def test_the_scheme_fields_round_trip_through_a_preset_the_cli_json_and_the_model_config(tmp_path: Path) -> None:
    preset = tmp_path / "mhc.yaml"
    preset.write_text("model:\n  norm_placement: pre\n  residual_scheme: mhc\n  hc_streams: 2\n"
                      "  mhc_sinkhorn_iters: 7\n  mhc_bias_init: identity\n")  # fmt: skip
    cfg = parse_args(["--config", str(preset)])
    assert cfg == parse_args(SCHEME_ARGS)
    assert _through_json(cfg, tmp_path) == cfg
    lnbert = cfg.model.to_lnbert(vocab_size=100)
    fields = ("residual_scheme", "hc_streams", "hc_dynamic", "mhc_sinkhorn_iters", "mhc_bias_init", "attn_res_block_size")
    assert {k: getattr(lnbert, k) for k in fields} == {k: getattr(cfg.model, k) for k in fields}
    assert (lnbert.residual_scheme, lnbert.hc_streams, lnbert.mhc_sinkhorn_iters) == ("mhc", 2, 7)
    # The defaults are the model's own (pretrain.variants.DEFAULTS).
    from pretrain.modeling import LNBertConfig

    assert {k: getattr(ModelConfig(), k) for k in fields} == {k: getattr(LNBertConfig(), k) for k in fields}


@pytest.mark.parametrize(
    ("argv", "variant"),
    [
        ([], "post"),
        (["--model.norm_placement=pre", "--model.hc_streams=8"], "pre"),  # a scheme option alone names nothing
        (["--model.norm_placement=pre", "--model.residual_scheme=hc"], "pre-hc4"),
        (["--model.norm_placement=pre", "--model.residual_scheme=hc", "--model.hc_dynamic=false"], "pre-shc4"),
        (SCHEME_ARGS, "pre-mhc2-idres"),
        (["--model.norm_placement=pre", "--model.residual_scheme=attn_res"], "pre-attnres"),
        (["--model.norm_placement=pre", "--model.residual_scheme=attn_res", "--model.attn_res_block_size=4",
          "--model.norm_type=rmsnorm"], "pre-attnres-b4-rmsnorm"),
    ],
)  # fmt: skip
def test_runs_and_wandb_groups_are_named_by_the_variant(argv: list[str], variant: str) -> None:
    from pretrain.tracking.wandb_logging import pretrain_group

    cfg = parse_args(argv)
    assert cfg.model.variant == variant
    assert cfg.train.run_name == f"lnbert-{variant}" and cfg.train.output_dir == f"runs/lnbert-{variant}"
    assert pretrain_group(to_dict(cfg.tracking), cfg.model.variant, "abcd1234") == f"lnbert-{variant}-abcd1234"


@pytest.mark.parametrize(
    ("label", "fields"),
    [
        ("standard", {"residual_scheme": "standard"}),
        ("hc4", {"residual_scheme": "hc", "hc_streams": 4, "hc_dynamic": True}),
        ("shc8", {"residual_scheme": "hc", "hc_streams": 8, "hc_dynamic": False}),
        ("mhc4-idres", {"residual_scheme": "mhc", "mhc_bias_init": "identity"}),
        ("attnres", {"residual_scheme": "attn_res", "attn_res_block_size": None}),
        ("attnres-b64", {"residual_scheme": "attn_res", "attn_res_block_size": 64}),
    ],
)
def test_a_scheme_label_reads_back_into_the_fields_that_name_it(label: str, fields: dict) -> None:
    from pretrain.config import residual_scheme_fields
    from pretrain.variants import DEFAULTS, residual_scheme_label

    found = residual_scheme_fields(label)
    assert {k: found[k] for k in fields} == fields
    assert all(found[k] == getattr(DEFAULTS, k) for k in found.keys() - fields.keys())  # the rest at their defaults
    assert (residual_scheme_label(**found) or "standard") == label


@pytest.mark.parametrize(
    ("label", "message"),
    [("hc", r"'hc' is not a residual scheme's label; did you mean 'hc4'\?"),
     ("attn_res", r"did you mean 'attnres'\?"), ("hc65", r"any stream count, block size, fraction count, dilation or period up to 64")],
)  # fmt: skip
def test_a_bad_scheme_label_names_the_label_meant(label: str, message: str) -> None:
    from pretrain.config import residual_scheme_fields

    with pytest.raises(ValueError, match=message):
        residual_scheme_fields(label)


def test_a_scheme_on_another_placement_is_refused_before_torch_is_imported() -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pretrain.run", "--model.norm_placement=sandwich",
         "--model.residual_scheme=attn_res"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert "error: model.residual_scheme='attn_res' needs model.norm_placement='pre' (got 'sandwich')" in result.stderr
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in result.stderr.splitlines()
                if line.startswith("import time:")}  # fmt: skip
    assert not imported & {"torch", "transformers"}
