"""Typed configuration for fine-tuning, and a small CLI that parses a YAML preset plus overrides into it.

Every dataclass here documents each field with a docstring under it; those docstrings are also the
``--help`` text. One channel of configuration: a preset file (``--config configs/finetune/x.yaml``) and
``--key value`` / ``--section.key value`` overrides both end in the same dataclass, whose ``__post_init__``
rejects bad values with a message naming the key.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import textwrap
import types
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

Device = Literal["auto", "cpu", "cuda"]
DEVICES: tuple[str, ...] = get_args(Device)


@dataclass(kw_only=True)
class FinetuneConfig:
    """The recipe of one fine-tuning job: original BERT's GLUE recipe (Devlin et al. 2019, appendix A.3)."""

    batch_size: int = 32
    """Training sequences per optimizer step (original BERT: 32)."""
    epochs: int = 3
    """Passes over the training set (original BERT: 3)."""
    warmup_ratio: float = 0.1
    """Fraction of the optimizer steps with linear warm-up from 0; then linear decay to 0 (BERT: 10%)."""
    max_length: int = 128
    """Longest tokenized pair, in tokens; longer pairs are truncated longest-first (BERT: 128)."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay, applied to all weights except biases and normalisation layers."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    adam_eps: float = 1e-6
    """AdamW epsilon (original BERT's optimizer used 1e-6)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this value (BERT: 1.0); 0 disables clipping."""
    mixed_precision: Literal["no", "bf16"] = "no"
    """Autocast the forward pass to bf16 ("bf16": about 1.6x faster on a CPU with AVX512-BF16 and on any
    recent GPU; weights, gradients and the optimizer stay fp32) or train in fp32 ("no"). Part of the
    recipe: results of the two are stored apart."""
    eval_batch_size: int = 64
    """Sequences per batch when evaluating on the dev set (does not change results)."""
    random_init: bool = False
    """Ignore the model's weights and fine-tune its architecture from random initialisation (the baseline
    without pretraining); the tokenizer is still the model's."""
    max_train_examples: int | None = None
    """Use only the first N training examples (quick checks); None uses them all."""
    max_eval_examples: int | None = None
    """Use only the first N dev examples (quick checks); None uses them all."""
    torch_threads: int = 0
    """Intra-op CPU threads for this process (workers share the CPU); 0 leaves torch's default."""
    device: str = "auto"
    """Where to train: auto (cuda when available), cpu or cuda."""
    progress: bool = True
    """Show a tqdm progress bar over the optimizer steps."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "epochs", "max_length", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"recipe.{name}={getattr(self, name)} must be at least 1")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ValueError(f"recipe.warmup_ratio={self.warmup_ratio} must lie in [0, 1)")
        if self.weight_decay < 0 or self.max_grad_norm < 0 or self.adam_eps <= 0:
            raise ValueError("recipe.weight_decay and recipe.max_grad_norm must be >= 0 and recipe.adam_eps > 0")
        for name in ("max_train_examples", "max_eval_examples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"recipe.{name}={value} must be at least 1, or null to use every example")
        if self.mixed_precision not in ("no", "bf16"):
            raise ValueError(f"recipe.mixed_precision={self.mixed_precision!r} must be 'no' or 'bf16'")
        if self.torch_threads < 0:
            raise ValueError(f"recipe.torch_threads={self.torch_threads} must be >= 0 (0: torch's default)")
        if self.device not in DEVICES:
            raise ValueError(f"recipe.device={self.device!r} is not valid; valid choices: {', '.join(DEVICES)}")

    def result_key(self) -> dict[str, Any]:
        """The fields that change the numbers a job produces (what the results store keys a recipe by)."""
        ignored = {"eval_batch_size", "torch_threads", "device", "progress"}
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ignored}


DEFAULT_LRS: tuple[float, ...] = (2e-5, 3e-5, 5e-5)
# The paper fine-tunes every checkpoint with 6 random seeds per point.
DEFAULT_SEEDS: tuple[int, ...] = (0, 1, 2, 3, 4, 5)


def validate_grid(lrs: list[float], seeds: list[int]) -> None:
    if not lrs or any(lr <= 0 for lr in lrs):
        raise ValueError(f"lrs={lrs} must be a non-empty list of positive learning rates")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds={seeds} must be a non-empty list of distinct integers")


# --------------------------------------------------------------------------------------------------
# Field docstrings and the CLI
# --------------------------------------------------------------------------------------------------


@cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of a dataclass (read from its source)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, following in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Coerce a YAML or command-line value to the field's annotated type, naming the key on failure."""
    inner, optional = _strip_optional(tp)
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        raise ValueError(f"{key} must not be null")
    if dataclasses.is_dataclass(inner):
        if not isinstance(value, dict):
            raise ValueError(f"{key} must be a mapping of {inner.__name__} fields, got {value!r}")
        return build(inner, value, prefix=f"{key}.")
    origin = get_origin(inner)
    try:
        if origin in (list, tuple):
            (item_tp, *_) = get_args(inner)
            if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
                value = value[0]  # one command-line word: a comma-separated or YAML list
            if isinstance(value, str) and value.strip().startswith("["):
                value = yaml.safe_load(value)  # --lrs='[2e-5, 3e-5]' as in pretrain's YAML-valued options
            items = value.split(",") if isinstance(value, str) else list(value)
            return [_convert(item, item_tp, key) for item in items if item != ""]
        if inner is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("true", "1", "yes"):
                return True
            if str(value).lower() in ("false", "0", "no"):
                return False
            raise ValueError(value)
        if inner is float:
            return float(value)
        if inner is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if inner is str:
            return str(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key}={value!r} is not a valid {getattr(inner, '__name__', inner)}") from None
    return value


def build(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a (nested) mapping; unknown keys are rejected with the valid ones."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ValueError(
            f"unknown config key(s) {', '.join(prefix + k for k in unknown)}; valid keys: {', '.join(names)}"
        )
    kwargs = {name: _convert(value, hints[name], prefix + name) for name, value in values.items()}
    try:
        return cls(**kwargs)
    except TypeError as err:  # a required field is missing
        raise ValueError(f"{cls.__name__}: {err}; set it in the config file or with --{prefix}<key>") from None


def _flat_fields(cls: type, prefix: str = "") -> list[tuple[str, Any, dataclasses.Field, type]]:
    """(dotted name, type, field, owning class) for every leaf field, nested dataclasses flattened."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += _flat_fields(tp, prefix + f.name + ".")
        else:
            out.append((prefix + f.name, tp, f, cls))
    return out


def _default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return repr(f.default_factory())
    return "required"


def make_parser(cls: type, prog: str | None = None, description: str | None = None) -> argparse.ArgumentParser:
    """An argparse parser with ``--config FILE`` and one ``--dotted.name`` option per leaf field of ``cls``."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description or inspect.getdoc(cls),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Values come from the built-in defaults, then --config, then the options given here. "
        "Lists: --lrs 2e-5 3e-5, --lrs 2e-5,3e-5 or --lrs='[2e-5, 3e-5]'; 'null' clears an optional value.",
    )
    parser.add_argument("--config", type=Path, help="YAML preset (e.g. configs/finetune/bert_glue.yaml)")
    for name, tp, f, owner in _flat_fields(cls):
        inner, _ = _strip_optional(tp)
        choices = ""
        if get_origin(inner) is Literal:
            choices = f" Choices: {', '.join(map(str, get_args(inner)))}."
        help_text = f"{field_docs(owner).get(f.name, '')}{choices} (default: {_default_text(f)})"
        help_text = help_text.replace("%", "%%")  # argparse formats help with %
        # A bare boolean flag (--wandb) means true; --wandb false still works. Lists take several values.
        flag: dict[str, Any] = dict(nargs="?", const="true") if inner is bool else {}
        if get_origin(inner) in (list, tuple):
            flag = dict(nargs="+")
        metavar = name.split(".")[-1].upper()
        parser.add_argument(f"--{name}", dest=name, default=None, metavar=metavar, help=help_text, **flag)
        if "_" in name:  # accept --data-dir as well as --data_dir
            parser.add_argument(f"--{name.replace('_', '-')}", dest=name, default=None, help=argparse.SUPPRESS, **flag)
    return parser


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[leaf] = value


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist (see configs/finetune/ for presets)")
    values = yaml.safe_load(path.read_text()) or {}
    if not isinstance(values, dict):
        raise ValueError(f"config file {path} must hold a mapping of keys to values")
    return values


def parse_config(
    cls: type, argv: list[str] | None = None, prog: str | None = None, description: str | None = None
) -> Any:
    """Defaults < ``--config`` file < command-line options, parsed into ``cls``."""
    args = make_parser(cls, prog=prog, description=description).parse_args(argv)
    values = load_yaml(args.config) if args.config else {}
    for name, *_ in _flat_fields(cls):
        if getattr(args, name) is not None:
            _set_dotted(values, name, getattr(args, name))
    return build(cls, values)


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


__all__ = [
    "DEFAULT_LRS",
    "DEFAULT_SEEDS",
    "FinetuneConfig",
    "build",
    "field_docs",
    "load_yaml",
    "make_parser",
    "parse_config",
    "to_dict",
]
