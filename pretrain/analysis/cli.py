"""The command line of the analyses: ``python -m pretrain.analysis SUBCOMMAND [--config PRESET.yaml] [--key=VALUE
...]``. The first word picks the measurement; its options are the fields of that measurement's config dataclass
(``--help`` lists them). The options are read and checked first (``options.py``), the measurement's module (torch,
transformers) imported after."""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any

from pretrain.analysis import options
from pretrain.common.cli import parse_command, run_cli, writable_folder

# subcommand -> (config dataclass, the module whose ``run`` measures it)
COMMANDS: dict[str, tuple[type, str]] = {
    "ln-jacobian": (options.LnJacobianConfig, "pretrain.analysis.ln_jacobian"),
    "init-scale": (options.InitScaleConfig, "pretrain.analysis.init_scale"),
    "init-grads": (options.InitGradsConfig, "pretrain.analysis.init_grads"),
    "init-perturb": (options.InitPerturbConfig, "pretrain.analysis.perturb"),
    "grid": (options.GridConfig, "pretrain.analysis.grid"),
    "compare": (options.CompareConfig, "pretrain.analysis.compare"),
}


def parse_args(argv: list[str] | None = None) -> tuple[str, Any]:
    """(subcommand, its validated config) from ``argv``."""
    doc = sys.modules["pretrain.analysis"].__doc__ or ""
    schemas = {name: schema for name, (schema, _) in COMMANDS.items()}
    return parse_command(schemas, argv, prog="python -m pretrain.analysis", description=doc)


def main(argv: list[str] | None = None) -> int:
    command, config = parse_args(argv)
    writable_folder(config.out, "out")  # before minutes of measurement, not when its figures are written
    return importlib.import_module(COMMANDS[command][1]).run(config)


cli = functools.partial(run_cli, main)  # bad input: its message and exit code 2, not a traceback
