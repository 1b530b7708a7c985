"""The command line of every command, on jsonargparse (docs/configuration.md says why): a command's options are a
dataclass (nested dataclasses are sections; the docstring under each field is its help), filled from ``--config
PRESET.yaml`` presets (repeatable, merged in order) and ``--section.key=VALUE`` overrides, whose values are YAML.

What jsonargparse does not do is here, small: YAML 1.2's booleans and floats (``no`` and ``off`` are text, ``1e-4``
a number), the presets before the overrides wherever they stand, a bare ``--flag`` for a boolean, finite floats, a
bad preset named with its file and line, and every problem as one line naming the key and the nearest valid key or
value (:class:`ConfigError`; :func:`run_cli` prints it as ``error: ...`` and exits with code 2).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import functools
import inspect
import math
import os
import re
import signal
import sys
import tempfile
import threading
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml
from jsonargparse import (
    ActionConfigFile,
    ArgumentError,
    ArgumentParser,
    DefaultHelpFormatter,
    Namespace,
    set_loader,
    set_parsing_settings,
)

from pretrain.common.atomic import no_room
from pretrain.common.device import passive_cpu_threads

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value or key is wrong; the message names the key (or file and line) and the fix."""


def require(ok: bool, key: str, message: str) -> None:
    """Raise ``ConfigError("<key> <message>")`` unless ``ok`` (for ``__post_init__`` checks)."""
    if not ok:
        raise ConfigError(f"{key} {message}")


def writable_folder(path: str | Path, key: str) -> None:
    """Make the folder ``path`` (the option ``key``) if needed and create a file in it, or raise ConfigError naming the
    option: a folder under a file, a read-only mount or a colleague's folder answers before any work. A full disk is
    left to the command, whose own handling stops and resumes (it may still have room for what it must write)."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        if no_room(err):
            return
        raise ConfigError(f"{key}={path}: cannot write there ({err.strerror}); pass a folder you can write") from None


# YAML with YAML 1.2's booleans and floats: PyYAML's YAML 1.1 reads `mixed_precision: no` as False and `lr: 1e-4` as
# text. No dates either: `--until=2026-12-01T06:00` stays the text typed.


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml where PyYAML has it (the resolvers stay)
    pass


_BOOL, _FLOAT = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:float"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL, _FLOAT, "tag:yaml.org,2002:timestamp")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver(
    _FLOAT,
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+.0123456789"),
)  # fmt: skip


def read_yaml(text: str) -> Any:
    """YAML as the command line reads it (presets and values): a SafeLoader with YAML 1.2's booleans and floats."""
    return yaml.load(text, Loader=_Loader)


set_loader("yaml", read_yaml, exceptions=(yaml.YAMLError,))
set_parsing_settings(docstring_parse_attribute_docstrings=True)  # the docstring under each field is its --help


# The schema: a dataclass's fields, by dotted key


def type_name(tp: Any) -> str:
    """A short human name for a type hint, as error messages show it."""
    origin = get_origin(tp)
    if origin is Literal:
        return "|".join(str(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join("null" if a is type(None) else type_name(a) for a in get_args(tp))
    if origin in (list, tuple):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in get_args(tp))}]"
    return getattr(tp, "__name__", str(tp))


def _item(tp: Any) -> Any:
    """The dataclass of the items of ``list[Dataclass]``, else ``tp``."""
    args = get_args(tp)
    return args[0] if get_origin(tp) is list and args and dataclasses.is_dataclass(args[0]) else tp


def field_type(cls: type, dotted: str) -> Any:
    """The type hint of ``dotted`` in ``cls`` (``data.sources.path``: of the items of a list of sections); an unknown
    key is a ConfigError with the nearest valid one."""
    tp: Any = cls
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        prefix = ".".join(parts[:depth])
        tp = _item(tp)
        if not dataclasses.is_dataclass(tp):
            raise ConfigError(f"unknown key '{dotted}': '{prefix}' has no sub-keys")
        hints = typing.get_type_hints(tp)
        if part not in hints:
            close = difflib.get_close_matches(part, list(hints), n=1)
            hint = f"; did you mean '{prefix + '.' if prefix else ''}{close[0]}'?" if close else ""
            raise ConfigError(f"unknown key '{'.'.join(parts[: depth + 1])}'{hint} (valid keys: {', '.join(hints)})")
        tp = hints[part]
    return tp


def _check_keys(cls: type, tree: dict[str, Any], prefix: str = "") -> None:
    """Every key of the preset ``tree`` is a field of ``cls``, in sections and in the items of lists of sections."""
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        tp = field_type(cls, re.sub(r"\[\d+\]", "", dotted))
        if isinstance(value, dict) and dataclasses.is_dataclass(tp):
            _check_keys(cls, value, dotted)
        elif isinstance(value, list) and _item(tp) is not tp:
            for i, item in enumerate(value):
                _check_keys(cls, item if isinstance(item, dict) else {}, f"{dotted}[{i}]")


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


def _wrong_value(cls: type, key: str, typed: str) -> str:
    """The message for a value of ``key`` that does not fit its type: the choices and the nearest, or the type."""
    tp = field_type(cls, key)
    inner = get_args(tp)[0] if get_origin(tp) in (Union, types.UnionType) and get_args(tp)[1:] == (type(None),) else tp
    item = get_args(inner)[0] if get_origin(inner) is list else None
    if get_origin(item) is Literal:  # a list of choices: name the item that is none of them
        with contextlib.suppress(yaml.YAMLError):
            given = read_yaml(typed)
            wrong = [(i, v) for i, v in enumerate(given) if v not in get_args(item)] if isinstance(given, list) else []
            if wrong:
                key, typed, inner = f"{key}[{wrong[0][0]}]", str(wrong[0][1]), item
    if get_origin(inner) is Literal:
        choices = [str(c) for c in get_args(inner)]
        close = closest_choice(typed, choices)
        hint = f"; did you mean '{close}'?" if close else ""
        return f"{key} must be one of {', '.join(choices)}; got {typed!r}{hint}"
    hint = f"; lists are YAML: --{key}='[a, b]'" if get_origin(inner) in (list, tuple) else ""
    return f"{key} expects {type_name(tp)}, got {typed!r}{hint}"


def _explain(cls: type, err: ArgumentError, argv: list[str]) -> str:
    """jsonargparse's message for ``err`` (from ``argv``) as one line naming the key and the fix."""
    message = str(err)
    if found := re.search(r"unrecognized arguments: (\S+)", message):
        arg = found[1]
        if not arg.startswith("--"):
            return f"unexpected argument {arg!r}; options look like --key=VALUE, and lists are YAML: --key='[a, b]'"
        field_type(cls, arg[2:].partition("=")[0])  # raises with the nearest valid key
    if found := re.search(r"argument (--\S+): expected one argument", message):
        return f"{found[1]} needs a value ({found[1]}=VALUE)"
    if found := re.search(r"the following arguments are required: ([^,\s]+)", message):
        return f"{found[1]} is required: pass --{found[1]}=VALUE"
    if found := re.search(r"Group '([\w.]+)' does not accept option '(\w+)'", message):  # from --SECTION=FILE.yaml
        field_type(cls, f"{found[1]}.{found[2]}")
    if found := re.match(r'Parser key "([^"]+)":\s*(.*)', message, re.S):
        key, detail = found[1], found[2]
        if file := re.search(r"Unable to load config '([^']+)'", detail):
            return f"--{key}={file[1]}: not a YAML file of {key}'s keys; fix the path or the file"
        if option := re.search(r"Option '(\w+)' is not accepted", detail):
            field_type(cls, f"{key}.{option[1]}")
        typed = [arg.partition("=")[2] for arg in argv if arg.startswith(f"--{key}=")]
        if typed or (typed := re.findall(r"(?:Given|Got) value: (.*)", detail)):
            return _wrong_value(cls, key, typed[-1].strip())
    return " ".join(message.split())


# Presets, overrides and parsing


def _read_preset(cls: type, path: str) -> None:
    """A missing preset (with the one likely meant), bad YAML (its line) or an unknown key (its file): ConfigError."""
    file = Path(path)
    if not file.is_file():
        siblings = sorted(p.name for p in file.parent.glob("*.y*ml")) if file.parent.is_dir() else []
        close = closest_choice(file.name, siblings)
        hint = f"; did you mean {file.parent / close}?" if close else ""
        raise ConfigError(f"config file {file} not found{hint} (pass an existing YAML preset to --config)")
    try:
        tree = read_yaml(file.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{file}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else str(file)
        raise ConfigError(f"{where}: not valid YAML: {getattr(err, 'problem', None) or err}; fix the file") from None
    if not isinstance(tree, dict | None):
        raise ConfigError(f"{file}: a config file must be a mapping of keys to values")
    try:
        _check_keys(cls, tree or {})
    except ConfigError as err:
        raise ConfigError(f"{file}: {err}") from None


def _arrange(cls: type, argv: list[str]) -> list[str]:
    """``argv`` as ``--key=VALUE`` options, the presets first (each checked: later options win over every preset,
    wherever they stand), and a bare ``--flag`` of a boolean as ``--flag=true``."""
    presets: list[str] = []
    options: list[str] = []
    i = 0
    while i < len(argv):
        arg, i = argv[i], i + 1
        if arg.startswith("--") and "=" not in arg:
            with contextlib.suppress(ConfigError):  # not a key (--help, an unknown one): jsonargparse's to read
                tp = str if arg == "--config" else field_type(cls, arg[2:])
                if i < len(argv) and not argv[i].startswith("--"):
                    arg, i = f"{arg}={argv[i]}", i + 1
                elif tp in (bool, bool | None):
                    arg += "=true"
        name, _, value = arg.partition("=")
        if name == "--config":
            require(bool(value), "--config", "needs a value (--config=PRESET.yaml)")
            _read_preset(cls, value)
            presets.append(arg)
        else:
            options.append(arg)
    return presets + options


class _Formatter(DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """jsonargparse's help (type and default of each key) with the description's own line breaks."""


SYNTAX = """\
Options are --key=VALUE (or --key VALUE), --section.key=VALUE in a section; keys are spelled as in the YAML presets.
Values are YAML: lists --key='[1e-5, 3e-5]', null clears an optional value, a bare --flag sets a boolean to true, and
a text value is taken as typed (no, off). --config PRESET.yaml is repeatable: the presets merge in order, then the
options apply in order (later wins). --SECTION.help or --LIST.help CLASS shows the keys of a list's items."""


@functools.cache  # building one takes a tenth of a second; the analyses parse many cells' options
def parser(cls: type, *, prog: str, description: str = "", usage: str = "") -> ArgumentParser:
    """The jsonargparse parser of ``cls``: ``--config`` presets and a key per field, documented by its docstring."""
    usage = usage.strip() or f"{prog} [--config PRESET.yaml ...] [--key=VALUE ...]"
    parser = ArgumentParser(prog=prog, usage=usage.removeprefix("usage: "), description=description.strip(),
                            epilog=SYNTAX, formatter_class=_Formatter, exit_on_error=False,
                            allow_abbrev=False)  # fmt: skip
    parser.add_argument("--config", action=ActionConfigFile, help="A YAML preset (repeatable; merged in order).")
    parser.add_class_arguments(cls, as_group=False)
    return parser


def _check_finite(value: Any, key: str) -> None:
    """NaN and infinity fail every bound (NaN would disable clipping): never a valid option."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number, got {value!r}")
    if isinstance(value, Namespace):
        for name, item in vars(value).items():
            _check_finite(item, f"{key}.{name}".lstrip("."))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_finite(item, f"{key}[{i}]")


def parse(cls: type[T], argv: list[str] | None = None, *, prog: str, description: str = "", usage: str = "") -> T:
    """Presets and overrides in ``argv`` (default: sys.argv[1:]) -> a validated ``cls``; ``--help`` prints its help
    and exits 0; bad input raises ConfigError (or the ValueError of a ``__post_init__``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    the_parser = parser(cls, prog=prog, description=description, usage=usage)
    try:
        namespace = the_parser.parse_args(argv := _arrange(cls, argv))
    except ArgumentError as err:
        raise ConfigError(_explain(cls, err, argv)) from None
    namespace.pop("config", None)
    _check_finite(namespace, "")
    try:
        return cls(**vars(the_parser.instantiate(namespace)))
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:  # a check written as ValueError
        raise ConfigError(str(err)) from err


def parse_command(commands: dict[str, type], argv: list[str] | None = None, *, prog: str, description: str = "",
                  default: str = "") -> tuple[str, Any]:  # fmt: skip
    """``SUBCOMMAND [options]``: the first word picks the schema in ``commands`` (``default`` when it is left out,
    also for ``--help``); returns (subcommand, config). Without a default, ``--help`` lists the subcommands."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in commands:
        command = argv.pop(0)
    elif default and not (argv and not argv[0].startswith("-")):
        command = default
    elif argv and argv[0] in ("-h", "--help"):
        print(f"usage: {prog} SUBCOMMAND [--config PRESET.yaml ...] [--key=VALUE ...]\n\n{description.strip()}\n")
        print("subcommands:")
        for name, cls in commands.items():
            print(f"  {name:<14}{(inspect.getdoc(cls) or '').partition(chr(10))[0]}")
        print(f"\n{prog} SUBCOMMAND --help lists each one's options.")
        raise SystemExit(0)
    elif argv:
        close = difflib.get_close_matches(argv[0], list(commands), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"unknown subcommand {argv[0]!r}{hint} (subcommands: {', '.join(commands)})")
    else:
        raise ConfigError(f"missing subcommand; one of {', '.join(commands)} (see {prog} --help)")
    doc = description if command == default else inspect.getdoc(commands[command]) or ""
    return command, parse(commands[command], argv, prog=f"{prog} {command}", description=doc)


def to_dict(value: Any) -> Any:
    """A config (a dataclass) as plain JSON/YAML values (tuples become lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {k: to_dict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_dict(v) for v in value]
    return value


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"seed": 0}} -> {"train.seed": 0} (lists stay values)."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else key
        flat.update(flatten(value, name) if isinstance(value, dict) else {name: value})
    return flat


# Running a command


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
    """Run a command-line ``main``: bad input (ValueError, FileNotFoundError, ``errors``) and a full disk end with
    their message on stderr and exit code 2 (LNBERT_TRACEBACK=1: the traceback); Ctrl-C always reaches it; idle
    threads sleep."""
    passive_cpu_threads()
    try:
        with interruptible():
            return main()
    except Exception as err:
        message = _message(err, (ValueError, FileNotFoundError, *errors))  # ConfigError is a ValueError
        if message is None or os.environ.get("LNBERT_TRACEBACK"):
            raise
        print(f"error: {message}\n(set LNBERT_TRACEBACK=1 to see the traceback)", file=sys.stderr)
        return 2


def _message(err: Exception, said: tuple[type[BaseException], ...]) -> str | None:
    """The line a command ends with for ``err`` (run_cli): its message for the errors it ``said``, and for a full disk
    where it was writing (every file is written whole: pretrain/common/atomic.py, so what was written is intact);
    None for any other error, which keeps its traceback."""
    if isinstance(err, said):
        return str(err)
    if (seen := no_room(err)) is None:
        return None
    where = f" writing {seen.filename}" if getattr(seen, "filename", None) else ""  # a library may name no file
    return f"{getattr(seen, 'strerror', None) or seen}{where}: make room on that disk and run the same command to go on"
