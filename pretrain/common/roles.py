"""What each config field is for, declared once beside the field; every list of fields is derived from it::

    seed: int = role("run", default=0)
    max_seq_length: int = role("recipe", keyed_in=("instances", "batches"), default=128)

| role        | in the W&B recipe hash | may differ on resume (``--train.resume=auto``) | may differ on a plain rerun |
|-------------|------------------------|------------------------------------------------|-----------------------------|
| ``recipe``    | yes | no  | no  |
| ``run``       | no  | no  | no  |
| ``split``     | no  | yes (the global batch checked) | no |
| ``limit``     | yes | yes | no  |
| ``cadence``   | no  | yes | no  |
| ``mechanics`` | no  | yes | yes |
| ``tracking``  | the whole ``tracking`` section is outside the run: never compared, never hashed |

- recipe: what is learned (the model, the data, the optimizer, the precision).
- run: this run of a recipe (name, seed): same W&B group.
- split: how the run's work is divided over devices and computed (per-device batch, accumulation, compile, AdamW's
  kernels): a run may continue on another number of processes, at the same global batch (checkpointing.py checks it).
- limit: a bound a continued run may move (its length, the fp16 skips tolerated, a timeout, the inline corpus size).
- cadence: how often a run evaluates, logs and saves, how many saves it keeps, and where it stops.
- mechanics: where files go and how many workers do the work; never what is computed.

Data fields also say which keys hold their value (``keyed_in``): the trained tokenizer's cache key (``tokenizer``),
the prepared instances' cache key (``instances``) and the fingerprint of the batch sequence a resume checks
(``batches``). ``resolved=True`` marks a field whose null the run decides at its start, once the data is prepared
(the model's vocabulary); run_config.json holds the decided value, and a null request matches it.

    config.RESUMABLE_CHANGES              rules.resumable        same_run.config_differences on resume
    same_run.IDENTICAL_RUN_IGNORES        rules.rerun            the same command run again
    wandb_logging._NOT_RECIPE             not rules.recipe       the W&B recipe hash (the group)
    config.RESOLVED_AT_START              resolved               same_run.config_differences: a null asked
    tokenizer._TOKENIZER_KEY_FIELDS       keyed_in "tokenizer"   the trained tokenizer's cache folder
    instance_cache._FIELDS_NOT_IN_KEY     not keyed_in "instances" the prepared instances' cache folder
    vocabulary.data_fingerprint           not keyed_in "batches" the data position a resume checks

tests/test_roles.py fails for a field declared without a role (or a data field without ``keyed_in``) and pins the
lists and the keys computed from them. This module imports nothing of the project.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import MISSING, dataclass
from typing import Any, Literal, get_args

Role = Literal["recipe", "run", "split", "limit", "cadence", "mechanics", "tracking"]
DataKey = Literal["tokenizer", "instances", "batches"]


@dataclass(frozen=True)
class Rules:
    """How a run treats the fields of one role."""

    recipe: bool
    """Part of the W&B recipe hash (wandb_logging.recipe)."""
    resumable: bool
    """May differ when the run is continued with --train.resume=auto (config.RESUMABLE_CHANGES)."""
    rerun: bool
    """May differ when the same command is run again in the same folder (same_run.IDENTICAL_RUN_IGNORES)."""


RULES: dict[str, Rules] = {
    "recipe": Rules(recipe=True, resumable=False, rerun=False),
    "run": Rules(recipe=False, resumable=False, rerun=False),
    "split": Rules(recipe=False, resumable=True, rerun=False),
    "limit": Rules(recipe=True, resumable=True, rerun=False),
    "cadence": Rules(recipe=False, resumable=True, rerun=False),
    "mechanics": Rules(recipe=False, resumable=True, rerun=True),
}
ROLES: tuple[str, ...] = get_args(Role)
DATA_KEYS: tuple[str, ...] = get_args(DataKey)


def role(name: Role, *, keyed_in: Iterable[DataKey] | None = None, resolved: bool = False, default: Any = MISSING,
         default_factory: Any = MISSING) -> Any:  # fmt: skip
    """A dataclass field with its role (and, for a data field, the keys that hold its value)."""
    if name not in ROLES:
        raise ValueError(f"unknown role {name!r}; one of {', '.join(ROLES)}")
    metadata: dict[str, Any] = {"role": name, "resolved": resolved}
    if keyed_in is not None:
        keys = frozenset(keyed_in)
        if not keys <= set(DATA_KEYS):
            raise ValueError(f"keyed_in={sorted(keys)} names an unknown key; the keys are {', '.join(DATA_KEYS)}")
        metadata["keyed_in"] = keys
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def role_of(key: str, f: dataclasses.Field) -> str:
    """The role of field ``f`` (dotted ``key``); an error without one."""
    if "role" not in f.metadata:
        raise TypeError(f"config field {key} has no role: declare it with "
                        "pretrain.common.roles.role(ROLE, default=...)")
    return f.metadata["role"]


def leaf_fields(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field]]:
    """``(dotted key, field)`` of every field of ``cls`` and of its sections (fields whose type is a dataclass)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            yield from leaf_fields(hints[f.name], f"{key}.")
        else:
            yield key, f


def keys_where(cls: type, rule: Callable[[Rules], bool]) -> frozenset[str]:
    """Dotted keys of the fields (sections included) whose role's rules satisfy ``rule``; tracking fields never."""
    return frozenset(
        key for key, f in leaf_fields(cls) if role_of(key, f) != "tracking" and rule(RULES[role_of(key, f)])
    )


def by_section(keys: Iterable[str]) -> dict[str, frozenset[str]]:
    """``{"train.seed", "data.num_proc"}`` -> ``{"data": {"num_proc"}, "train": {"seed"}}``."""
    sections: dict[str, set[str]] = {}
    for key in keys:
        section, _, name = key.rpartition(".")
        sections.setdefault(section, set()).add(name)
    return {section: frozenset(names) for section, names in sorted(sections.items())}


def resolved_keys(cls: type) -> frozenset[str]:
    """Dotted keys of the fields marked ``resolved`` (a null there is decided by the run at its start)."""
    return frozenset(key for key, f in leaf_fields(cls) if role_of(key, f) and f.metadata["resolved"])


def keyed_in(cls: type, key: DataKey) -> frozenset[str]:
    """The fields of the data config ``cls`` whose value the key ``key`` holds."""
    for f in dataclasses.fields(cls):
        if "keyed_in" not in f.metadata:
            raise TypeError(f"data field {f.name} does not say which keys hold it: declare role(..., keyed_in=(...))")
    return frozenset(f.name for f in dataclasses.fields(cls) if key in f.metadata["keyed_in"])


def not_keyed_in(cls: type, key: DataKey) -> frozenset[str]:
    """The fields of the data config ``cls`` that the key ``key`` leaves out."""
    return frozenset(f.name for f in dataclasses.fields(cls)) - keyed_in(cls, key)
