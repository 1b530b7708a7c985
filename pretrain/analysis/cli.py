"""The command line of the analyses: ``python -m pretrain.analysis SUBCOMMAND [--config PRESET.yaml] [--key=VALUE
...]``. The first word picks the measurement; its options are the fields of that measurement's config dataclass
(``--help`` lists them)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from pretrain.analysis import grid, init_grads, init_scale, ln_jacobian, perturb
from pretrain.common.cli import parse_command, run_cli

# subcommand -> (config dataclass, the function that runs it)
COMMANDS: dict[str, tuple[type, Callable[[Any], int]]] = {
    "ln-jacobian": (ln_jacobian.LnJacobianConfig, ln_jacobian.run),
    "init-scale": (init_scale.InitScaleConfig, init_scale.run),
    "init-grads": (init_grads.InitGradsConfig, init_grads.run),
    "init-perturb": (perturb.InitPerturbConfig, perturb.run),
    "grid": (grid.GridConfig, grid.run),
}


def parse_args(argv: list[str] | None = None) -> tuple[str, Any]:
    """(subcommand, its validated config) from ``argv``."""
    doc = sys.modules["pretrain.analysis"].__doc__ or ""
    schemas = {name: schema for name, (schema, _) in COMMANDS.items()}
    return parse_command(schemas, argv, prog="python -m pretrain.analysis", description=doc)


def main(argv: list[str] | None = None) -> int:
    command, config = parse_args(argv)
    return COMMANDS[command][1](config)


def cli() -> int:
    """``main`` for the command line: bad input ends with its message and exit code 2, not a traceback."""
    return run_cli(main)
