"""``python -m pretrain.analysis SUBCOMMAND ...`` (the command line is pretrain/analysis/cli.py)."""

from pretrain.analysis.cli import cli

raise SystemExit(cli())
