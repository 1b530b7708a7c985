"""The command line (jsonargparse and pretrain/common/cli.py) as every command uses it: overrides change only the key
they name, floats must be finite, bad YAML names its file and line, and --help shows exactly what is accepted."""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks.data_path import DataPathConfig
from benchmarks.data_prep import DataPrepConfig
from benchmarks.finetune_throughput import FinetuneThroughputConfig
from benchmarks.train_step import TrainStepConfig
from finetune.dashboard import DashboardConfig
from finetune.report import ReportConfig
from finetune.run import RunConfig
from finetune.schedule import ScheduleConfig, StatusConfig
from pretrain.analysis.options import GridConfig, InitGradsConfig, InitScaleConfig, LnJacobianConfig
from pretrain.common.cli import ConfigError, field_type, flatten, parse, parser, run_cli, to_dict
from pretrain.config import PretrainConfig
from pretrain.variants import variant_name

ROOT = Path(__file__).resolve().parents[1]
PRETRAIN_PRESETS = sorted((ROOT / "configs" / "pretrain").glob("*.yaml"))
FINETUNE_PRESETS = sorted((ROOT / "configs" / "finetune").glob("*.yaml"))


def _base_argv(preset: Path) -> list[str]:
    if preset.name.endswith("_seq512.yaml"):  # an overlay on its phase-1 preset
        return ["--config", str(preset.with_name(preset.name.replace("_seq512", ""))), "--config", str(preset)]
    return ["--config", str(preset)]


# (schema, the arguments of one starting configuration: required keys and presets)
CASES: list[tuple[type, list[str]]] = [
    (PretrainConfig, []),
    *[(PretrainConfig, _base_argv(p)) for p in PRETRAIN_PRESETS],
    (RunConfig, ["--model=m"]),
    *[(RunConfig, ["--model=m", "--config", str(p)]) for p in FINETUNE_PRESETS],
    (ScheduleConfig, ["--runs=[r]"]),
    *[(ScheduleConfig, ["--runs=[r]", "--config", str(p)]) for p in FINETUNE_PRESETS],
    (StatusConfig, []),
    (ReportConfig, ["--runs=[r]"]),
    (DashboardConfig, ["--comparison=c"]),
    (LnJacobianConfig, []),
    (InitScaleConfig, []),
    (InitGradsConfig, []),
    (GridConfig, []),
    (TrainStepConfig, []),
    (DataPathConfig, ["--corpus=c.jsonl"]),
    (FinetuneThroughputConfig, ["--data_dir=glue"]),
]
CASE_IDS = [f"{cls.__name__}-{Path(argv[-1]).name if argv else 'default'}" for cls, argv in CASES]


def _resolve(cls: type, argv: list[str]) -> dict[str, Any]:
    return flatten(to_dict(parse(cls, argv, prog="test")))


def _leaf_keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        keys += _leaf_keys(tp, f"{key}.") if dataclasses.is_dataclass(tp) else [key]
    return keys


def _yaml(value: Any) -> str:
    """``value`` as typed on the command line: a text as it is, anything else as YAML."""
    if isinstance(value, str):
        return value
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def _changed(value: Any) -> Any:
    """A different value of the same type, or None when there is no obvious one."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 0.5 if value else 0.5
    return None


# Keys the default run name is made of (PretrainConfig: lnbert-<the model's variant>): variant_name's arguments.
NAMES_THE_RUN = {f"model.{name}" for name in inspect.signature(variant_name).parameters}


@pytest.mark.parametrize(("cls", "base_argv"), CASES, ids=CASE_IDS)
def test_an_override_changes_only_the_key_it_names(cls: type, base_argv: list[str]) -> None:
    # The bug this guards against: on the built-in default, --data.max_documents=500 rebuilt `data` from
    # DataConfig's own defaults (vocab_size 2048 -> 30522, max_seq_length 64 -> 128, ...).
    base = _resolve(cls, base_argv)
    flat_keys = _leaf_keys(cls)
    assert set(flat_keys) <= set(base)
    if "--config" in base_argv:  # every key is tried on the schema's defaults; on a preset, one key per section
        changeable = [key for key in flat_keys if _changed(base[key]) is not None]
        flat_keys = list({key.rpartition(".")[0]: key for key in reversed(changeable)}.values())
    changed_some = 0
    for key in flat_keys:
        # The key's own current value: nothing may change.
        assert _resolve(cls, [*base_argv, f"--{key}={_yaml(base[key])}"]) == base, key
        new = _changed(base[key])
        if new is None:
            continue
        try:
            after = _resolve(cls, [*base_argv, f"--{key}={_yaml(new)}"])
        except ConfigError:  # out of range, or inconsistent with another key: the loader says so
            continue
        differing = {k for k in base if after[k] != base[k]}
        if key in NAMES_THE_RUN:  # the default run name (and folder) is lnbert-<the model's variant> by design
            differing -= {"train.run_name", "train.output_dir"}
        assert differing == {key}, (key, differing)
        changed_some += 1
    assert changed_some > 0


def test_the_data_section_keeps_its_default_when_one_key_is_given() -> None:
    cfg = parse(PretrainConfig, ["--data.max_documents=500"], prog="test")
    default = PretrainConfig().data
    assert (cfg.data.vocab_size, cfg.data.max_seq_length, cfg.data.validation_fraction) == (2048, 64, 0.03)
    assert dataclasses.replace(default, max_documents=500) == cfg.data


def _float_keys(cls: type) -> dict[str, int]:
    """Keys whose type holds floats -> how many (1 for a float or list of floats, n for a tuple of n)."""
    keys = {}
    for key in _leaf_keys(cls):
        tp = field_type(cls, key)
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if tp is float or (float in args and typing.get_origin(tp) is not tuple):
            keys[key] = 1
        elif typing.get_origin(tp) is tuple and float in args:
            keys[key] = len(args)
    return keys


@pytest.mark.parametrize(
    ("cls", "base_argv"), [c for c in CASES if "--config" not in c[1]], ids=lambda v: getattr(v, "__name__", "")
)
@pytest.mark.parametrize("bad", [".nan", ".inf", "-.inf", "1e999", "nan", "inf"])
def test_floats_must_be_finite_everywhere(cls: type, base_argv: list[str], bad: str) -> None:
    # YAML's NaN and infinities (.nan, .inf; 1e999 overflows) are numbers the checks refuse; nan and inf are text.
    refusal = "must be a finite number" if bad.startswith((".", "-.", "1")) else "expects"
    for key, n in _float_keys(cls).items():
        origin = typing.get_origin(field_type(cls, key))
        value = f"[{', '.join([bad] * n)}]" if origin in (list, tuple) else bad
        refused = refusal if origin is not tuple or refusal != "expects" else "expects tuple"
        with pytest.raises(ConfigError, match=rf"^{re.escape(key)}(\[0\])? {refused}"):
            parse(cls, [*base_argv, f"--{key}={value}"], prog="test")


def test_float_keys_are_found() -> None:
    assert {"optim.lr", "optim.betas", "train.peak_flops_per_device"} <= set(_float_keys(PretrainConfig))
    assert {"lrs", "recipe.max_grad_norm", "recipe.adam_eps"} <= set(_float_keys(RunConfig))
    assert {"lrs", "eps"} <= set(_float_keys(GridConfig)) | set(_float_keys(LnJacobianConfig))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--recipe.max_grad_norm=-1"], r"recipe\.max_grad_norm must be >= 0"),
        (["--recipe.adam_eps=0"], r"recipe\.adam_eps must be > 0"),
        (["--recipe.adam_beta2=1"], r"recipe\.adam_beta2 must lie in \[0, 1\)"),
        (["--recipe.weight_decay=-0.1"], r"recipe\.weight_decay must be >= 0"),
        (["--lrs=[0.001, 0]"], r"lrs must be a non-empty list of distinct positive learning rates"),
        (["--lrs=[]"], r"lrs must be a non-empty list"),
        (["--seeds=[-1]"], r"seeds must be a non-empty list of distinct integers >= 0"),
        (["--seeds=[1, 1]"], r"seeds must be a non-empty list of distinct integers"),
        (["--max_attempts=0"], r"max_attempts must be >= 1"),
    ],
)
def test_finetune_ranges_name_the_key(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(RunConfig, ["--model=m", *argv], prog="test")


def _cli_exit(module: Any, argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> str:
    monkeypatch.setattr(sys, "argv", ["prog", *argv])
    assert module.cli() == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    return err


def test_every_command_exits_2_on_nan(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import benchmarks.train_step
    import finetune.report
    import finetune.run
    import finetune.schedule
    import pretrain.analysis.cli

    for module, argv in [
        (finetune.run, ["--model=m", "--recipe.max_grad_norm", "nan"]),
        (finetune.run, ["--model=m", "--lrs=[.nan]"]),
        (finetune.schedule, ["--runs=[r]", "--recipe.adam_eps=nan"]),
        (finetune.schedule, ["status", "--max_attempts=nan"]),  # an int key: NaN is not an int either
        (finetune.report, ["--runs=[r]", "--target_loss=.inf"]),
        (pretrain.analysis.cli, ["ln-jacobian", "--eps=nan"]),
        (pretrain.analysis.cli, ["grid", "--lrs=[1e-3, .nan]"]),
        (benchmarks.train_step, ["--reps=.nan"]),
    ]:
        err = _cli_exit(module, argv, monkeypatch, capsys)
        assert "nan" in err or "inf" in err, err


def test_an_output_folder_that_cannot_be_written_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A folder under a file (as a typo'd or read-only path would be): exit 2 naming the option, before torch is
    imported; pretrain/run.py took it for a full disk at its first save and exited 0."""
    import finetune.run
    import finetune.schedule
    import pretrain.analysis.cli
    from tests.finetune_fixtures import write_snapshot

    under_a_file = tmp_path / "file" / "out"
    (tmp_path / "file").write_text("")
    snapshot = write_snapshot(tmp_path / "run", "pre_ln", "pre", 10)
    capsys.readouterr()  # what saving it printed
    err = _cli_exit(finetune.run, [f"--model={snapshot}", f"--results_dir={under_a_file}"], monkeypatch, capsys)
    assert f"results_dir={under_a_file}: cannot write there (Not a directory)" in err
    err = _cli_exit(finetune.schedule, [f"--runs=[{tmp_path}]", f"--results_dir={under_a_file}"], monkeypatch, capsys)
    assert f"results_dir={under_a_file}: cannot write there" in err
    err = _cli_exit(pretrain.analysis.cli, ["ln-jacobian", f"--out={under_a_file}"], monkeypatch, capsys)
    assert f"out={under_a_file}: cannot write there" in err
    result = subprocess.run(
        [sys.executable, "-X", "importtime", str(ROOT / "pretrain" / "run.py"), f"--train.output_dir={under_a_file}"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    assert f"error: train.output_dir={under_a_file}: cannot write there" in result.stderr
    assert "| torch" not in result.stderr
    # The data cache is written only when something is missing there (a prepared one may be read-only).
    from pretrain.prepare import main as prepare

    with pytest.raises(ConfigError, match=f"data.cache_dir={under_a_file}: cannot write there"):
        prepare([f"--data.cache_dir={under_a_file}"])


def test_a_writable_folder_is_made_and_a_full_disk_is_left_to_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import tempfile

    from pretrain.common.cli import writable_folder

    writable_folder(tmp_path / "new" / "run", "train.output_dir")
    assert (tmp_path / "new" / "run").is_dir() and not list((tmp_path / "new" / "run").iterdir())

    def full(**_: Any) -> Any:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(tempfile, "TemporaryFile", full)
    writable_folder(tmp_path / "new" / "run", "train.output_dir")  # the run's own handling stops and resumes


def test_a_full_disk_ends_a_command_with_the_file_it_was_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Every file is written whole, so a command that meets a full disk or a spent quota says where, and that the same
    command goes on once there is room (exit 2); any other error of the system keeps its traceback."""
    import errno

    from pretrain.common import atomic
    from pretrain.common.cli import run_cli

    write = Path.write_bytes

    def full(self: Path, data: bytes) -> None:  # the quota is spent half-way through the temporary file
        write(self, data[: len(data) // 2])
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))  # what write() raises: no file named

    monkeypatch.setattr(Path, "write_bytes", full)
    assert run_cli(lambda: atomic.write_json(tmp_path / "results.json", {"a": 1}) or 0) == 2
    assert f"writing {tmp_path / 'results.json'}: make room on that disk and run the same command" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # no temporary file left

    def wrapped() -> int:  # a Rust library's error (safetensors, tokenizers): its words, no errno
        raise RuntimeError("I/O error: No space left on device (os error 28)")

    assert run_cli(wrapped) == 2
    assert "(os error 28): make room on that disk" in capsys.readouterr().err

    def denied() -> int:
        raise PermissionError(errno.EACCES, "Permission denied")

    with pytest.raises(PermissionError):
        run_cli(denied)


def test_malformed_yaml_names_the_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import finetune.run

    bad = tmp_path / "bad.yaml"
    bad.write_text("results_dir: x.d\nrecipe:\n  epochs: 2\n  batch_size: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml, line \d+, column \d+: not valid YAML"):
        parse(RunConfig, ["--model=m", "--config", str(bad)], prog="test")
    err = _cli_exit(finetune.run, ["--model=m", f"--config={bad}"], monkeypatch, capsys)
    assert f"{bad}, line" in err
    tabs = tmp_path / "tabs.yaml"
    tabs.write_text("model:\n\thidden_size: 8\n")
    with pytest.raises(ConfigError, match=r"tabs\.yaml, line 2, column 1: not valid YAML"):
        parse(PretrainConfig, ["--config", str(tabs)], prog="test")


@pytest.mark.slow
def test_pretrain_run_exits_2_on_bad_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  max_steps: 10\n  seed: {\n")
    done = subprocess.run(
        [sys.executable, "pretrain/run.py", f"--config={bad}", "--optim.lr=1e-3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert f"{bad}, line 4, column 1: not valid YAML" in done.stderr and "Traceback" not in done.stderr


# An option spelled in a help text; "#SBATCH --partition" and quoted sbatch options are not ours.
SPELLED = r"(?<![\w'-])(?<!#SBATCH )--([A-Za-z][\w.-]*)"


def _help(cls: type, capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit) as exit_info:
        parse(cls, ["--help"], prog="test", description=cls.__doc__ or "")
    assert exit_info.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("cls", sorted({c for c, _ in CASES}, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_help_shows_exactly_what_the_parser_accepts(cls: type, capsys: pytest.CaptureFixture) -> None:
    text = _help(cls, capsys)
    for key in _leaf_keys(cls):
        assert re.search(rf"^  --{re.escape(key)}[ \n]", text, re.M), key
    syntax = {"config", "help", "print_config", "key", "section.key", "flag", "SECTION.help", "LIST.help"}
    for spelled in set(re.findall(SPELLED, text)) - syntax:
        field_type(cls, spelled.removesuffix(".help"))  # raises for a spelling the parser does not accept


def test_module_docstrings_show_accepted_spellings() -> None:
    """The usage examples at the top of each command (shown by --help) use only keys its parser accepts."""
    import benchmarks.data_path
    import benchmarks.finetune_throughput
    import benchmarks.train_step
    import finetune.report
    import finetune.run
    import finetune.schedule

    for module, cls in [
        (finetune.run, RunConfig),
        (finetune.schedule, ScheduleConfig),
        (finetune.report, ReportConfig),
        (benchmarks.train_step, TrainStepConfig),
        (benchmarks.data_path, DataPathConfig),
        (benchmarks.finetune_throughput, FinetuneThroughputConfig),
    ]:
        doc = module.__doc__ or ""
        for spelled in set(re.findall(SPELLED, doc)) - {"config", "help"}:
            field_type(cls, spelled)


def test_a_section_file_is_read_and_its_keys_checked(tmp_path: Path) -> None:
    section = tmp_path / "model.yaml"
    section.write_text("norm_placement: pre\n")
    assert parse(PretrainConfig, [f"--model={section}"], prog="test").model.norm_placement == "pre"
    section.write_text("norm_placment: pre\n")
    with pytest.raises(ConfigError, match=r"unknown key 'model\.norm_placment'; did you mean 'model\.norm_placement'\?"):
        parse(PretrainConfig, [f"--model={section}"], prog="test")
    with pytest.raises(ConfigError, match=r"^--model=\S*nothere\.yaml: not a YAML file of model's keys; fix the path"):
        parse(PretrainConfig, [f"--model={tmp_path / 'nothere.yaml'}"], prog="test")


def test_bare_flags_lists_and_order() -> None:
    cfg = parse(ReportConfig, ["--runs", "[a, b]", "--wandb", "--target_loss", "2"], prog="test")
    assert (cfg.runs, cfg.wandb, cfg.target_loss) == (["a", "b"], True, 2.0)
    assert parse(ReportConfig, ["--runs=[a]", "--wandb", "--wandb=false"], prog="test").wandb is False
    assert parse(ReportConfig, ["--runs=[a]", "--target_loss=2", "--target_loss=null"], prog="test").target_loss is None
    assert math.isclose(parse(RunConfig, ["--model=m", "--lrs=[1e-4]"], prog="test").lrs[0], 1e-4)


# --------------------------------------------------------------------------------------------------
# YAML 1.1 words (no, off, on, yes, null) in string-valued fields
# --------------------------------------------------------------------------------------------------

# The schemas with the arguments they need (their required keys).
SCHEMAS = {cls: argv for cls, argv in CASES if "--config" not in argv} | {DataPrepConfig: ["--corpus=c"]}
# Words YAML 1.1 reads as booleans, null or a number when they are typed without quotes; the command line reads YAML
# 1.2 (the first six are text) and gives a text field the text typed.
YAML_WORDS = ("no", "off", "on", "yes", "n", "y", "true", "False", "null", "~", "1", "1e3")
YAML_11_WORDS = YAML_WORDS[:6]


def _string_fields(cls: type, prefix: str = "") -> list[tuple[str, Any]]:
    """(key, type) of every field that holds strings, in sections and in the items of lists of sections."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp, key = hints[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            out += _string_fields(tp, f"{key}.")
            continue
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if typing.get_origin(tp) is list and args and dataclasses.is_dataclass(args[0]):
            out += _string_fields(args[0], f"{key}[0].")
        elif _holds_strings(tp):
            out.append((key, tp))
    return out


def _holds_strings(tp: Any) -> bool:
    if tp is str:
        return True
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return all(isinstance(a, str) for a in args)
    return any(_holds_strings(a) for a in args if a is not type(None))


STRING_FIELDS = [(cls, key, tp) for cls in SCHEMAS for key, tp in _string_fields(cls)]


def test_the_schemas_have_string_fields_of_every_kind() -> None:
    kinds = {typing.get_origin(tp) or tp for _, _, tp in STRING_FIELDS}
    assert {str, typing.Literal, list} <= kinds and len(STRING_FIELDS) > 40


def _read(cls: type, key: str, raw: str) -> Any:
    """The value the command line reads for ``--key=raw`` (``a[0].b``: an item's key), before the schema's checks."""
    items, _, item_key = key.partition("[0].")
    arg = f"--{items}=[{{{item_key}: {raw}}}]" if item_key else f"--{key}={raw}"
    namespace = parser(cls, prog="test").parse_args([*SCHEMAS[cls], arg])
    return namespace[items][0][item_key] if item_key else namespace[key]


@pytest.mark.parametrize(("cls", "key", "tp"), STRING_FIELDS, ids=[f"{c.__name__}-{k}" for c, k, _ in STRING_FIELDS])
def test_string_fields_take_yaml_words_as_typed(cls: type, key: str, tp: Any) -> None:
    optional = type(None) in typing.get_args(tp)
    in_a_list = typing.get_origin(_without_none(tp)) is list or "[0]." in key
    item = _without_none(typing.get_args(_without_none(tp))[0] if typing.get_origin(_without_none(tp)) is list else tp)
    choices = list(typing.get_args(item)) if typing.get_origin(item) is typing.Literal else []
    # A value in a list is YAML: there, true, null and numbers are what YAML says (quote them to make text).
    for word in YAML_11_WORDS if in_a_list else YAML_WORDS:
        raw = f"[{word}]" if typing.get_origin(_without_none(tp)) is list else word
        expected: Any = [word] if raw != word else word
        if optional and not in_a_list and word in ("null", "~"):
            expected = None  # null clears an optional value
        if choices and word not in choices and expected is not None:
            with pytest.raises(ConfigError, match=re.escape(f"got {word!r}")):  # the word, not False or None
                parse(cls, [*SCHEMAS[cls], f"--{key}={raw}"], prog="test")
            continue
        assert _read(cls, key, raw) == expected, (key, word)


def _without_none(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if type(None) in typing.get_args(tp) and len(args) == 1 else tp


def test_mixed_precision_no_from_the_command_line_and_a_preset(tmp_path: Path) -> None:
    # YAML 1.1 reads a plain `no` as False: the documented value must still be the string.
    assert parse(PretrainConfig, ["--train.mixed_precision=no"], prog="test").train.mixed_precision == "no"
    assert parse(RunConfig, ["--model=m", "--recipe.mixed_precision=no"], prog="test").recipe.mixed_precision == "no"
    preset = tmp_path / "p.yaml"
    preset.write_text("train:\n  mixed_precision: no\n  run_name: off\n  max_steps: 10\n  on: 1\n")
    with pytest.raises(ConfigError, match=r"unknown key 'train\.on'"):  # a key is taken as typed too, not as True
        parse(PretrainConfig, ["--config", str(preset)], prog="test")
    preset.write_text("train:\n  mixed_precision: no\n  run_name: off\n  max_steps: 10\n")
    config = parse(PretrainConfig, ["--config", str(preset), "--tracking.project=yes"], prog="test")
    assert (config.train.mixed_precision, config.train.run_name, config.tracking.project) == ("no", "off", "yes")
    assert config.train.max_steps == 10  # numbers and booleans of other fields are read as before
    assert parse(ReportConfig, ["--runs=[a]", "--wandb=yes"], prog="test").wandb is True


@pytest.mark.parametrize(
    ("typed", "meant"),
    [("preln", "pre"), ("Pre-LN", "pre"), ("pre-ln", "pre"), ("prenorm", "pre"), ("postln", "post"),
     ("Post_LayerNorm", "post"), ("sandwhich", "sandwich")],
)  # fmt: skip
def test_a_wrong_choice_gets_a_suggestion(typed: str, meant: str) -> None:
    """The literature's spellings of the two original placements name them, not the closest string ('deepnorm')."""
    with pytest.raises(ConfigError, match=rf"norm_placement must be one of .*got '{typed}'; did you mean '{meant}'\?"):
        parse(PretrainConfig, [f"--model.norm_placement={typed}"], prog="test")


def test_a_missing_preset_suggests_the_one_meant() -> None:
    with pytest.raises(ConfigError, match=r"small_preln.yaml not found; did you mean .*small_pre_ln.yaml\?"):
        parse(PretrainConfig, ["--config", str(ROOT / "configs/pretrain/small_preln.yaml")], prog="test")


def test_an_unknown_key_in_a_preset_names_the_file(tmp_path: Path) -> None:
    preset = tmp_path / "mine.yaml"
    preset.write_text("train:\n  max_steps: 5\nmodel:\n  norm_placment: pre\n")
    with pytest.raises(ConfigError, match=r"mine.yaml: unknown key 'model.norm_placment'; did you mean 'model.norm_placement'"):
        parse(PretrainConfig, ["--config", str(preset)], prog="test")


def test_a_wrong_corpus_path_is_named_before_torch_and_before_the_run_folder(tmp_path: Path) -> None:
    """In a folder that holds a run, a mistyped corpus path is named as such (not as 'a different run')."""
    (tmp_path / "empty.jsonl").write_text("")
    cases = [(script, path, message) for script in ("run.py", "prepare.py")
             for path, message in (("missing.jsonl", "no such file or folder"), ("empty.jsonl", "empty corpus"))]  # fmt: skip
    for script, path, message in cases:
        result = subprocess.run(
            [sys.executable, "-X", "importtime", str(ROOT / "pretrain" / script),
             f"--data.sources=[{{kind: json, path: {tmp_path / path}}}]", f"--train.output_dir={tmp_path}"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 2
        assert f"data.sources[0].path='{tmp_path / path}': {message}" in result.stderr
        assert "import time:" in result.stderr and "| torch" not in result.stderr


def test_commands_let_idle_cpu_threads_sleep_unless_the_user_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spinning OpenMP threads made the default run 1.6-1.8x slower beside a busy job; a policy the user set stays."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert run_cli(lambda: 0) == 0 and os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert run_cli(lambda: 0) == 0 and os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_help_of_a_command_with_subcommands_shows_the_default_ones_options(capsys: pytest.CaptureFixture) -> None:
    from finetune.schedule import main as schedule_main

    with pytest.raises(SystemExit):
        schedule_main(["--help"])
    text = capsys.readouterr().out
    assert "python -m finetune.schedule status" in text and re.search(r"--runs .*\n\s+Pretraining run folders", text)
    # Plain keys come before the sections: --wandb is not listed under the slurm section.
    assert text.index("  --wandb ") < text.index("\nThe fine-tuning recipe of every job:") < text.index("\nSettings of")


def test_a_mistyped_subcommand_is_named_also_where_a_default_one_exists() -> None:
    from finetune.schedule import main as schedule_main

    with pytest.raises(ConfigError, match=r"unknown subcommand 'statsu'; did you mean 'status'\? \(subcommands: run"):
        schedule_main(["statsu", "--max_attempts=2"])
    with pytest.raises(ConfigError, match=r"unknown subcommand 'ingest' \(subcommands: run, status\)"):
        schedule_main(["ingest"])


def test_run_cli_takes_ctrl_c_even_when_started_with_sigint_ignored() -> None:
    """A script's `command &` starts with SIGINT ignored (bash): inside run_cli Ctrl-C raises KeyboardInterrupt,
    and the handler the process had is back afterwards."""
    import signal

    seen = []
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert run_cli(lambda: seen.append(signal.getsignal(signal.SIGINT)) or 0) == 0
        assert seen == [signal.default_int_handler]
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_fp16_without_a_gpu_is_refused_before_torch() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU for certain, on any machine
    result = subprocess.run(
        [sys.executable, "-X", "importtime", str(ROOT / "pretrain" / "run.py"), "--train.mixed_precision=fp16"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert result.returncode == 2
    assert "train.mixed_precision=fp16 needs a GPU" in result.stderr and "| torch" not in result.stderr
