"""Measurements behind the claims of Xiong et al. 2020, "On Layer Normalization in the Transformer
Architecture", one subcommand each. Every subcommand prints a table, writes it (``table.txt``) and the
raw numbers (``results.json``) into ``--out`` and draws a PNG there.

    python -m pretrain.analysis ln-jacobian   # ||J_LN(x)||_2 = sqrt(d)/||x - mean(x)||  (paper, Sec. 3)
    python -m pretrain.analysis init-scale    # E||x_l||^2/d at init: Post-LN 1.5, Pre-LN in [1+l/2, 1+3l/2]
    python -m pretrain.analysis init-grads    # FFN gradient norms at init per layer and vs depth (Figure 3)
    python -m pretrain.analysis init-perturb  # output change from a small random weight change vs depth (Admin)
    python -m pretrain.analysis grid          # placement x depth x lr x warm-up map of short pretraining runs

``python -m pretrain.analysis SUBCOMMAND --help`` lists each one's options (``--key=VALUE``, lists as YAML:
``--dims='[8, 24]'``). One module per subcommand (its config dataclass, measurement, table and figure);
``common.py`` holds what they share, ``cli.py`` the command line.
"""

from pretrain.analysis.cli import COMMANDS, main, parse_args
from pretrain.analysis.common import DEFAULT_OUT, ModelSize, mean_and_sem, model_config, write_outputs
from pretrain.analysis.grid import Cell, GridConfig, cell_overrides, describe_setting, grid_cells, read_cell, run_cell
from pretrain.analysis.init_grads import (
    InitGradsConfig,
    ffn_gradient_norms,
    load_mlm_data,
    measure_init_grads,
    mlm_batch,
)
from pretrain.analysis.init_scale import InitScaleConfig, model_stream_scale, paper_bounds, simplified_stream_scale
from pretrain.analysis.ln_jacobian import LnJacobianConfig, layer_norm_jacobian_norm, ln_jacobian_rows
from pretrain.analysis.perturb import InitPerturbConfig, output_change

__all__ = [
    "COMMANDS",
    "DEFAULT_OUT",
    "Cell",
    "GridConfig",
    "InitGradsConfig",
    "InitPerturbConfig",
    "InitScaleConfig",
    "LnJacobianConfig",
    "ModelSize",
    "cell_overrides",
    "describe_setting",
    "ffn_gradient_norms",
    "grid_cells",
    "layer_norm_jacobian_norm",
    "ln_jacobian_rows",
    "load_mlm_data",
    "main",
    "mean_and_sem",
    "measure_init_grads",
    "mlm_batch",
    "model_config",
    "model_stream_scale",
    "output_change",
    "paper_bounds",
    "parse_args",
    "read_cell",
    "run_cell",
    "simplified_stream_scale",
    "write_outputs",
]
