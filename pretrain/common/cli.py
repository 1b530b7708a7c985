"""One command-line loader for every command of the project: typed dataclasses, YAML presets, dotted overrides.

A command declares its options as a dataclass (nested dataclasses are sections; a docstring under each field
is its help). :func:`parse` reads

    [--config PRESET.yaml ...] [--key=VALUE | --key VALUE | --section.key=VALUE | --flag ...]

Presets are merged in the order given, then the overrides in the order given (later wins). Every value is
read as YAML, so ``--lrs='[1e-5, 3e-5]'``, ``--data.sources='[{kind: json, path: x.jsonl}]'`` and
``--target_loss=null`` work; lists are YAML lists only (a comma or space-separated list is an error that
says so). A bare ``--flag`` sets a boolean field to true. Keys are spelled as in the YAML presets
(underscores). An override changes only the key it names: a section that is not given keeps its default,
and a section given one key keeps the other values of its default (which may differ from the section
class's own defaults, e.g. ``PretrainConfig.data``).

A field whose type is a string (or a choice of strings) takes the text as typed: YAML 1.1 reads plain
``no``, ``off``, ``on``, ``yes``, ``null`` and ``123`` as booleans, null and numbers, so the loader keeps each
plain scalar's text beside its value (:class:`AsTyped`) and :func:`_convert` picks the one the field's type
takes (``--train.mixed_precision=no`` is the string ``no``; ``null`` still clears an optional field).

Every problem is a :class:`ConfigError` naming the key (with "did you mean" for typos, in keys and in
choices) or the preset file and line; :func:`run_cli` turns those into ``error: ...`` on stderr and exit code 2. Floats must be finite
everywhere; range checks live in each dataclass's ``__post_init__`` and name the key.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import functools
import inspect
import math
import operator
import os
import signal
import sys
import textwrap
import threading
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

from pretrain.common.device import passive_cpu_threads

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value or key is wrong; the message names the key (or file and line) and the fix."""


def require(ok: bool, key: str, message: str) -> None:
    """Raise ``ConfigError("<key> <message>")`` unless ``ok`` (for ``__post_init__`` checks)."""
    if not ok:
        raise ConfigError(f"{key} {message}")


# --------------------------------------------------------------------------------------------------
# YAML that keeps the text of plain scalars
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AsTyped:
    """A plain YAML scalar that YAML 1.1 reads as a boolean, null or number, with the text it was typed as:
    a string-valued field takes ``text``, every other field ``value`` (:func:`_convert`)."""

    value: Any
    text: str


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader whose plain (unquoted) booleans, nulls and numbers come as :class:`AsTyped`."""


def _keep_text(constructor: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def construct(loader: Any, node: Any) -> Any:
        value = constructor(loader, node)
        return AsTyped(value, node.value) if node.style is None else value

    return construct


for _tag, _constructor in (
    ("bool", yaml.constructor.SafeConstructor.construct_yaml_bool),
    ("null", yaml.constructor.SafeConstructor.construct_yaml_null),
    ("int", yaml.constructor.SafeConstructor.construct_yaml_int),
    ("float", yaml.constructor.SafeConstructor.construct_yaml_float),
):
    _ConfigLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _keep_text(_constructor))


def read_yaml(text: str) -> Any:
    """YAML as the config loader reads it: plain booleans, nulls and numbers keep their text (AsTyped)."""
    return yaml.load(text, Loader=_ConfigLoader)  # a SafeLoader: no arbitrary objects


def _takes_text(tp: Any, scalar: AsTyped) -> bool:
    """Whether a field of type ``tp`` takes the scalar's text rather than its YAML 1.1 value: a string, a
    choice of strings, or a union with a string that the value does not fit (``null`` clears an optional)."""
    if tp is str:
        return True
    origin = get_origin(tp)
    if origin is Literal:
        return all(isinstance(a, str) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if scalar.value is None and type(None) in args:
            return False
        if type(scalar.value) in args:  # an int field of int | str keeps its number
            return False
        return any(_takes_text(a, scalar) for a in args if a is not type(None))
    return False


# --------------------------------------------------------------------------------------------------
# Nested dict -> dataclasses, using the type hints
# --------------------------------------------------------------------------------------------------


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The resolved type hints of a dataclass (cached: resolving them is the loader's slowest step)."""
    return typing.get_type_hints(cls)


def _is_optional(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)


def type_name(tp: Any) -> str:
    """A short human name for a type hint, as shown by --help and in error messages."""
    origin = get_origin(tp)
    if origin is Literal:
        return "|".join(str(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join("null" if a is type(None) else type_name(a) for a in get_args(tp))
    if origin in (list, tuple):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in get_args(tp))}]"
    if dataclasses.is_dataclass(tp):
        return tp.__name__
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, key: str, base: Any = None) -> Any:
    """``value`` as type ``tp``; a ConfigError naming ``key`` when it does not fit. ``base``: the default a
    mapping for a dataclass section is applied to (keys it leaves out keep the base's values)."""
    if isinstance(value, AsTyped):
        value = value.text if _takes_text(tp, value) else value.value
    origin = get_origin(tp)

    def wrong() -> ConfigError:
        hint = f"; lists are YAML: --{key}='[a, b]'" if origin in (list, tuple) and isinstance(value, str) else ""
        return ConfigError(f"{key} expects {type_name(tp)}, got {value!r}{hint}")

    if _is_optional(tp):
        if value is None:
            return None
        inner = [a for a in get_args(tp) if a is not type(None)]
        return _convert(value, functools.reduce(operator.or_, inner), key, base)
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            close = closest_choice(str(value), [str(c) for c in choices])
            hint = f"; did you mean '{close}'?" if close else ""
            raise ConfigError(f"{key} must be one of {', '.join(map(str, choices))}; got {value!r}{hint}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise wrong()
        return from_dict(tp, value, prefix=key, base=base if isinstance(base, tp) else None)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise wrong()
        (item,) = get_args(tp)
        return [_convert(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:
        items = get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(items):
            raise wrong()
        return tuple(_convert(v, t, f"{key}[{i}]") for i, (v, t) in enumerate(zip(value, items, strict=True)))
    if tp is bool:
        if not isinstance(value, bool):
            raise wrong()
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            # 1e6 is a float in YAML; accept it when it is a whole number (max_steps: 1e6).
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise wrong()
        return value
    if tp is float:
        if isinstance(value, bool):
            raise wrong()
        if isinstance(value, str):  # PyYAML reads "1e-4" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise wrong() from None
        if not isinstance(value, (int, float)):
            raise wrong()
        if not math.isfinite(value):  # NaN disables clipping, compares false with every bound: never valid
            raise ConfigError(f"{key} must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise wrong()
        return value
    raise TypeError(f"{key}: unsupported config type {tp!r}")  # a schema bug, not a user error


def _bare(name: str) -> str:
    """A name without case, separators and a trailing "ln"/"norm"/"layernorm": ``Pre-LN``, ``pre_ln``, ``prenorm``
    and ``PreLayerNorm`` are all ``pre``, as the literature writes the placements."""
    bare = "".join(c for c in name.lower() if c.isalnum())
    for suffix in ("layernorm", "norm", "ln"):
        if bare.endswith(suffix) and len(bare) > len(suffix):
            return bare.removesuffix(suffix)
    return bare


def closest_choice(value: str, choices: list[str]) -> str | None:
    """The choice ``value`` most likely meant: the one that is the same name spelled otherwise (``_bare``), else the
    closest spelling; None when nothing is close."""
    same = [c for c in choices if _bare(c) == _bare(value)]
    if same:
        return same[0]
    close = difflib.get_close_matches(value, choices, n=1)
    return close[0] if close else None


def _unknown_key(key: str, prefix: str, valid: list[str]) -> ConfigError:
    full = f"{prefix}.{key}" if prefix else key
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f"; did you mean '{prefix + '.' if prefix else ''}{close[0]}'?" if close else ""
    return ConfigError(f"unknown key '{full}'{hint} (valid keys: {', '.join(valid)})")


def field_default(f: dataclasses.Field) -> Any:
    """The default of one field (a fresh one from its default_factory), or MISSING for a required field."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _kept_from_base(cls: type, base: Any) -> dict[str, Any]:
    """The fields of ``base`` that differ from ``cls``'s own defaults: what a partial mapping must keep."""
    kept = {}
    for f in dataclasses.fields(cls):
        if f.init and getattr(base, f.name) != field_default(f):
            kept[f.name] = getattr(base, f.name)
    return kept


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "", base: T | None = None) -> T:
    """Build dataclass ``cls`` from a nested dict: unknown keys and wrong types raise ConfigError.

    Keys the dict leaves out take the values of ``base`` if given, else the field defaults; a nested section
    given as a dict starts from the field's default value (its default_factory), not from the section class's
    defaults, so ``{"data": {"max_documents": 5}}`` changes that one key of the default ``data``."""
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = dict(_kept_from_base(cls, base)) if base is not None else {}
    for key, value in data.items():
        if isinstance(key, AsTyped):  # a key spelled like a YAML 1.1 word (on:, no:) is that word
            key = key.text
        if key not in fields:
            raise _unknown_key(key, prefix, list(fields))
        default = getattr(base, key) if base is not None else field_default(fields[key])
        kwargs[key] = _convert(value, hints[key], f"{prefix}.{key}" if prefix else key, default)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:  # checks written as ValueError, or a required field left out
        raise ConfigError(f"{prefix or cls.__name__}: {err}") from err


def to_dict(config: Any) -> dict[str, Any]:
    """The config as plain JSON/YAML values (tuples become lists)."""
    return _plain(dataclasses.asdict(config))


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"seed": 0}} -> {"train.seed": 0} (lists stay values)."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            flat.update(flatten(value, name))
        else:
            flat[name] = value
    return flat


# --------------------------------------------------------------------------------------------------
# Presets and overrides
# --------------------------------------------------------------------------------------------------


def load_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML preset as a dict; a missing file, bad YAML (with its line) or a non-mapping is a ConfigError."""
    path = Path(path)
    if not path.is_file():
        siblings = sorted(p.name for p in path.parent.glob("*.y*ml")) if path.parent.is_dir() else []
        close = closest_choice(path.name, siblings)
        hint = f"; did you mean {path.parent / close}?" if close else ""
        raise ConfigError(f"config file {path} not found{hint} (pass an existing YAML preset to --config)")
    try:
        loaded = read_yaml(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else str(path)
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(f"{where}: not valid YAML: {problem}; fix the file") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: a config file must be a mapping of keys to values")
    return loaded


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` over ``base``, recursively for mappings (a later preset changes only the keys it names)."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def field_type(cls: type, dotted: str) -> Any:
    """The type hint of ``dotted`` in ``cls``; an unknown key (with "did you mean") is a ConfigError."""
    parts = dotted.split(".")
    tp: Any = cls
    for depth, part in enumerate(parts):
        prefix = ".".join(parts[:depth])
        if not dataclasses.is_dataclass(tp):
            raise ConfigError(f"unknown key '{dotted}': '{prefix}' has no sub-keys")
        hints = _hints(tp)
        if part not in hints:
            raise _unknown_key(part, prefix, [f.name for f in dataclasses.fields(tp)])
        tp = hints[part]
    return tp


def check_keys(cls: type, tree: dict[str, Any], prefix: str = "") -> None:
    """Every key of ``tree`` (a preset) is a field of ``cls``, section by section: an unknown key is a ConfigError
    (the caller names the file)."""
    for key, value in tree.items():
        name = key.text if isinstance(key, AsTyped) else str(key)  # a key spelled like a YAML 1.1 word (on:)
        dotted = f"{prefix}.{name}" if prefix else name
        tp = field_type(cls, dotted)
        if dataclasses.is_dataclass(tp) and isinstance(value, dict):
            check_keys(cls, value, dotted)


def set_override(cls: type, tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Put ``value`` at ``dotted`` in ``tree``, checking the path against the schema ``cls``."""
    field_type(cls, dotted)
    *parents, leaf = dotted.split(".")
    node = tree
    for depth, part in enumerate(parents):
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"'{'.'.join(parents[: depth + 1])}' in the config file is not a mapping")
    node[leaf] = value


def _is_bool(tp: Any) -> bool:
    return tp is bool or (_is_optional(tp) and bool in get_args(tp))


def read_tree(cls: type, argv: list[str]) -> dict[str, Any]:
    """``[--config FILE ...] [--key=value ...]`` as one nested dict (presets merged in order, then overrides)."""
    tree: dict[str, Any] = {}
    overrides: list[tuple[str, Any]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or arg == "--":
            raise ConfigError(
                f"unexpected argument {arg!r}; options look like --key=VALUE, and lists are YAML: --key='[a, b]'"
            )
        name, eq, raw = arg[2:].partition("=")
        i += 1
        if not eq:
            tp = None if name == "config" else field_type(cls, name)
            if tp is not None and _is_bool(tp) and (i >= len(argv) or argv[i].startswith("--")):
                raw = "true"  # a bare --flag
            elif i >= len(argv):
                raise ConfigError(f"--{name} needs a value (--{name}=VALUE)")
            else:
                raw = argv[i]
                i += 1
        if name == "config":
            preset = load_yaml(raw)
            try:
                check_keys(cls, preset)
            except ConfigError as err:
                raise ConfigError(f"{raw}: {err}") from None
            tree = merge(tree, preset)
            continue
        try:
            value = read_yaml(raw) if raw != "" else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"--{name}: cannot read {raw!r} as a YAML value ({err})") from None
        overrides.append((name, value))
    for name, value in overrides:
        set_override(cls, tree, name, value)
    return tree


def parse(cls: type[T], argv: list[str] | None = None, *, prog: str, description: str = "", usage: str = "") -> T:
    """Presets and overrides in ``argv`` (default: sys.argv[1:]) -> a validated ``cls``; ``--help`` prints the
    help generated from ``cls`` and exits 0."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(help_text(cls, prog=prog, description=description, usage=usage))
        raise SystemExit(0)
    return from_dict(cls, read_tree(cls, argv))


def parse_command(
    commands: dict[str, type], argv: list[str] | None = None, *, prog: str, description: str = "", default: str = ""
) -> tuple[str, Any]:
    """``SUBCOMMAND [options]``: the first word picks the schema in ``commands`` (``default`` when it is left
    out); returns (subcommand, config). ``--help`` before a subcommand lists them."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in commands:
        command = argv.pop(0)
    elif default and argv and argv[0] in ("-h", "--help"):
        # The default subcommand is what a bare command runs: show its options, after the list of subcommands.
        print(_subcommand_list(commands, prog, description))
        print(f"\noptions of {prog} (the subcommand {default!r}, also {prog} {default} --help):\n")
        print(help_text(commands[default], prog=f"{prog} [{default}]", description=""))
        raise SystemExit(0)
    elif default:
        command = default
    else:
        if argv and argv[0] not in ("-h", "--help"):
            close = difflib.get_close_matches(argv[0], list(commands), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"unknown subcommand {argv[0]!r}{hint} (subcommands: {', '.join(commands)})")
        if argv:
            print(_subcommand_list(commands, prog, description))
            raise SystemExit(0)
        raise ConfigError(f"missing subcommand; one of {', '.join(commands)} (see {prog} --help)")
    return command, parse(
        commands[command], argv, prog=f"{prog} {command}", description=inspect.getdoc(commands[command]) or ""
    )


def _subcommand_list(commands: dict[str, type], prog: str, description: str) -> str:
    lines = [f"usage: {prog} SUBCOMMAND [--config PRESET.yaml ...] [--key=VALUE ...]", "", description.strip()]
    lines += ["", "subcommands:"]
    lines += [f"  {name:<14}{_first_line(cls)}" for name, cls in commands.items()]
    lines += ["", f"{prog} SUBCOMMAND --help lists each one's options."]
    return "\n".join(lines)


def _first_line(cls: type) -> str:
    return (inspect.getdoc(cls) or "").strip().splitlines()[0] if inspect.getdoc(cls) else ""


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt in the block even when a script started this process in the background:
    bash starts a script's ``command &`` with SIGINT ignored, and Python then installs no handler, so the command
    would run on after the script and its other processes stopped (launch/reproduce_cpu.sh: the scheduler followed
    runs that had saved their checkpoints). The previous handler is put back after the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_cli(main: Callable[[], int], errors: tuple[type[BaseException], ...] = ()) -> int:
    """Run a command-line ``main``: bad input (ConfigError, ValueError, FileNotFoundError and ``errors``) ends
    with its message on stderr and exit code 2, not a traceback (LNBERT_TRACEBACK=1 shows it). Ctrl-C reaches it
    however it was started (``interruptible``). Idle CPU threads sleep (``device.passive_cpu_threads``)."""
    passive_cpu_threads()
    try:
        with interruptible():
            return main()
    except (ValueError, FileNotFoundError, *errors) as err:  # ConfigError is a ValueError
        if os.environ.get("LNBERT_TRACEBACK"):
            raise
        print(f"error: {err}\n(set LNBERT_TRACEBACK=1 to see the traceback)", file=sys.stderr)
        return 2


# --------------------------------------------------------------------------------------------------
# --help, generated from the dataclasses and the docstrings under their fields
# --------------------------------------------------------------------------------------------------


def field_docs(cls: type) -> dict[str, str]:
    """Per-field documentation: ``metadata["help"]``, a docstring under the field, or ``#:`` comments above it;
    a field a subclass redeclares without a docstring (to change its default) keeps its base class's."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_field_docs(klass))
    return docs


@functools.cache
def _own_field_docs(cls: type) -> dict[str, str]:
    docs: dict[str, str] = {}
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        source = ""
    if source:
        lines = source.splitlines()
        body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
        for node, after in zip(body, [*body[1:], None], strict=True):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            name = node.target.id
            if (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[name] = " ".join(inspect.cleandoc(after.value.value).split())
                continue
            comments = []
            for line in reversed(lines[: node.lineno - 1]):
                if not line.strip().startswith("#:"):
                    break
                comments.insert(0, line.strip()[2:].strip())
            if comments:
                docs[name] = " ".join(comments)
    for f in dataclasses.fields(cls):
        if "help" in f.metadata and f.name in inspect.get_annotations(cls):
            docs[f.name] = str(f.metadata["help"])
    return docs


def _yaml_value(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "required"
    text = yaml.safe_dump(_plain(value), default_flow_style=True, width=1000).strip()
    return text.removesuffix("...").strip()


def help_text(cls: type, *, prog: str, description: str = "", usage: str = "", defaults: Any = None) -> str:
    """The --help text: usage, ``description``, the syntax, then every key with its type, default and doc."""
    out = [usage.strip() or f"usage: {prog} [--config PRESET.yaml ...] [--key=VALUE ...]"]
    if description.strip():
        out += ["", description.strip()]
    out += [
        "",
        "Options are --key=VALUE (or --key VALUE), --section.key=VALUE in a section; keys are spelled as in the",
        "YAML presets. Values are YAML: lists --key='[1e-5, 3e-5]', null clears an optional value, and a bare",
        "--flag sets a boolean to true. --config PRESET.yaml is repeatable; presets merge in order, then the",
        "options in order (later wins).",
        "",
    ]
    out += _help_section(cls, "", defaults)
    return "\n".join(out)


def _help_section(cls: type, prefix: str, defaults: Any) -> list[str]:
    out: list[str] = []
    hints = _hints(cls)
    docs = field_docs(cls)
    # A section's keys are listed after the plain keys of its level: a key listed after a section would read as
    # one of that section's (--wandb under "slurm:").
    fields = sorted(
        (f for f in dataclasses.fields(cls) if f.init), key=lambda f: dataclasses.is_dataclass(hints[f.name])
    )
    for f in fields:
        key = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        default = getattr(defaults, f.name) if defaults is not None else field_default(f)
        if dataclasses.is_dataclass(tp):
            out += ["", f"{key}: {docs.get(f.name, '')}"]
            out += _help_section(tp, key, default)
            continue
        out.append(f"  --{key}  ({type_name(tp)}, default: {_yaml_value(default)})")
        out += ["      " + line for line in textwrap.wrap(docs.get(f.name, ""), 100)]
        item = get_args(tp)[0] if get_origin(tp) is list and get_args(tp) else None
        if item is not None and dataclasses.is_dataclass(item):
            out.append(f"      each item ({item.__name__}):")
            out += ["    " + line for line in _help_section(item, f"{key}[]", item())]
    return out
