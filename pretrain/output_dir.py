"""Print the run folder (``train.output_dir``) that a pretraining command line names, without importing torch:
launch/slurm_pretrain.sbatch reads it at every start to decide whether a requeued job resumes. Importing the
package from ``python -c`` would register the model (about 9 s of CPU) first.

    python -m pretrain.output_dir --config configs/pretrain/bert_base_pre_ln.yaml [overrides...]
"""

from __future__ import annotations

import sys

from pretrain.common.cli import run_cli
from pretrain.config import parse_args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    print(parse_args(argv, prog="python -m pretrain.output_dir", description=__doc__ or "").train.output_dir)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))  # bad input: the message on stderr and exit code 2
