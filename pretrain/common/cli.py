"""One command-line loader for every command of the project: typed dataclasses, YAML presets, dotted overrides.

A command declares its options as a dataclass (nested dataclasses are sections; the docstring under each field is
its help). Presets merge in order, then the overrides (later wins); every value is YAML, and an override changes only
the key it names (the rest of its section keeps the default, which may differ from the section class's own).
A string-valued field takes the text as typed, not YAML 1.1's boolean or number for ``no`` or ``123`` (AsTyped).
Every problem is a :class:`ConfigError` naming the key or the preset file and line; :func:`run_cli` turns it into
``error: ...`` on stderr and exit code 2.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import functools
import inspect
import itertools
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


# YAML that keeps the text of plain scalars


@dataclasses.dataclass(frozen=True)
class AsTyped:
    """A plain YAML 1.1 boolean, null or number with the text it was typed as (a string-valued field takes the text)."""

    value: Any
    text: str


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader whose plain (unquoted) booleans, nulls and numbers come as :class:`AsTyped`."""


def _keep_text(constructor: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def construct(loader: Any, node: Any) -> Any:
        value = constructor(loader, node)
        return AsTyped(value, node.value) if node.style is None else value

    return construct


for _tag in ("bool", "null", "int", "float"):
    _constructor = getattr(yaml.constructor.SafeConstructor, f"construct_yaml_{_tag}")
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
        if type(scalar.value) in args:  # null clears an optional; an int field of int | str keeps its number
            return False
        return any(_takes_text(a, scalar) for a in args if a is not type(None))
    return False


# Nested dict -> dataclasses, using the type hints


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
    if tp in (bool, str):
        if not isinstance(value, tp):
            raise wrong()
        return value
    if tp is int:
        if isinstance(value, float) and value.is_integer():  # 1e6 is a float in YAML (max_steps: 1e6)
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong()
        return value
    if tp is float:
        if isinstance(value, str):  # PyYAML reads "1e-4" (no dot) as a string
            with contextlib.suppress(ValueError):
                value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong()
        if not math.isfinite(value):  # NaN disables clipping, compares false with every bound: never valid
            raise ConfigError(f"{key} must be a finite number, got {value!r}")
        return float(value)
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
    """The choice ``value`` most likely meant: the same name spelled otherwise (``_bare``), else the closest; None."""
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
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "", base: T | None = None) -> T:
    """Build dataclass ``cls`` from a nested dict (unknown keys and wrong types raise ConfigError); keys left out take
    the values of ``base`` if given, else the field defaults (a section's default_factory)."""
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    # A partial mapping keeps the fields of ``base`` that differ from ``cls``'s own defaults.
    kept = fields.items() if base is not None else ()
    kwargs = {k: getattr(base, k) for k, f in kept if getattr(base, k) != field_default(f)}
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


def to_dict(value: Any) -> Any:
    """A config (a dataclass) as plain JSON/YAML values (tuples become lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {k: to_dict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_dict(v) for v in value]
    return value


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"seed": 0}} -> {"train.seed": 0} (lists stay values)."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else key
        flat.update(flatten(value, name) if isinstance(value, dict) else {name: value})
    return flat


# Presets and overrides


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
        both = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = merge(merged[key], value) if both else value
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
    """Every key of the preset ``tree`` is a field of ``cls``, section by section (else a ConfigError)."""
    for key, value in tree.items():
        name = key.text if isinstance(key, AsTyped) else str(key)  # a key spelled like a YAML 1.1 word (on:)
        dotted = f"{prefix}.{name}" if prefix else name
        tp = field_type(cls, dotted)
        if dataclasses.is_dataclass(tp) and isinstance(value, dict):
            check_keys(cls, value, dotted)


def read_tree(cls: type, argv: list[str]) -> dict[str, Any]:
    """``[--config FILE ...] [--key=value ...]`` as one nested dict (presets merged in order, then overrides)."""
    tree: dict[str, Any] = {}
    overrides: list[tuple[str, Any]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or arg == "--":
            hint = "options look like --key=VALUE, and lists are YAML: --key='[a, b]'"
            raise ConfigError(f"unexpected argument {arg!r}; {hint}")
        name, eq, raw = arg[2:].partition("=")
        i += 1
        if not eq:
            tp = None if name == "config" else field_type(cls, name)
            is_bool = tp is bool or (_is_optional(tp) and bool in get_args(tp))
            if is_bool and (i >= len(argv) or argv[i].startswith("--")):
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
    for dotted, value in overrides:
        field_type(cls, dotted)
        *parents, leaf = dotted.split(".")
        node = tree
        for depth, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"'{'.'.join(parents[: depth + 1])}' in the config file is not a mapping")
        node[leaf] = value
    return tree


def parse(cls: type[T], argv: list[str] | None = None, *, prog: str, description: str = "", usage: str = "") -> T:
    """Presets and overrides in ``argv`` (default: sys.argv[1:]) -> a validated ``cls``; ``--help`` prints its help."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(help_text(cls, prog=prog, description=description, usage=usage))
        raise SystemExit(0)
    return from_dict(cls, read_tree(cls, argv))


def parse_command(commands: dict[str, type], argv: list[str] | None = None, *, prog: str, description: str = "",
                  default: str = "") -> tuple[str, Any]:  # fmt: skip
    """``SUBCOMMAND [options]``: the first word picks the schema in ``commands`` (``default`` when it is left
    out); returns (subcommand, config). ``--help`` before a subcommand lists them."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in commands:
        command = argv.pop(0)
    elif argv and argv[0] in ("-h", "--help"):
        print(f"usage: {prog} SUBCOMMAND [--config PRESET.yaml ...] [--key=VALUE ...]\n\n{description.strip()}\n")
        print("subcommands:")
        for name, cls in commands.items():
            first_line = (inspect.getdoc(cls) or "").partition("\n")[0]
            print(f"  {name:<14}{first_line}")
        print(f"\n{prog} SUBCOMMAND --help lists each one's options.")
        if default:  # what a bare command runs: its options after the list of subcommands
            print(f"\noptions of {prog} (the subcommand {default!r}, also {prog} {default} --help):\n")
            print(help_text(commands[default], prog=f"{prog} [{default}]", description=""))
        raise SystemExit(0)
    elif default:
        command = default
    elif argv:
        close = difflib.get_close_matches(argv[0], list(commands), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"unknown subcommand {argv[0]!r}{hint} (subcommands: {', '.join(commands)})")
    else:
        raise ConfigError(f"missing subcommand; one of {', '.join(commands)} (see {prog} --help)")
    return command, parse(commands[command], argv, prog=f"{prog} {command}",
                          description=inspect.getdoc(commands[command]) or "")


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt in the block even when a script started this process in the background with
    SIGINT ignored (launch/reproduce_cpu.sh); the previous handler is put back after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_cli(main: Callable[[], int], errors: tuple[type[BaseException], ...] = ()) -> int:
    """Run a command-line ``main``: bad input (ValueError, FileNotFoundError, ``errors``) ends with its message on
    stderr and exit code 2 (LNBERT_TRACEBACK=1: the traceback); Ctrl-C always reaches it; idle threads sleep."""
    passive_cpu_threads()
    try:
        with interruptible():
            return main()
    except (ValueError, FileNotFoundError, *errors) as err:  # ConfigError is a ValueError
        if os.environ.get("LNBERT_TRACEBACK"):
            raise
        print(f"error: {err}\n(set LNBERT_TRACEBACK=1 to see the traceback)", file=sys.stderr)
        return 2


# --help, generated from the dataclasses and the docstrings under their fields


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field; a subclass's redeclared field without one keeps its base class's."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_field_docs(klass))
    return docs


@functools.cache
def _own_field_docs(cls: type) -> dict[str, str]:
    try:
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body  # type: ignore[attr-defined]
    except (OSError, TypeError):
        return {}
    return {
        node.target.id: " ".join(inspect.cleandoc(after.value.value).split())
        for node, after in itertools.pairwise(body)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)
    }  # fmt: skip


def _yaml_value(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "required"
    text = yaml.safe_dump(to_dict(value), default_flow_style=True, width=1000).strip()
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
    init_fields = [f for f in dataclasses.fields(cls) if f.init]
    for f in sorted(init_fields, key=lambda f: dataclasses.is_dataclass(hints[f.name])):
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
