"""Measurements behind the claims of Xiong et al. 2020, "On Layer Normalization in the Transformer
Architecture", one subcommand each. Every subcommand prints a table, writes it (``table.txt``) and the
raw numbers (``results.json``) into ``--out`` and draws a PNG there.

    python -m pretrain.analysis ln-jacobian   # ||J_LN(x)||_2 = sqrt(d)/||x - mean(x)||  (paper, Sec. 3)
    python -m pretrain.analysis init-scale    # E||x_l||^2/d at init: Post-LN 1.5, Pre-LN in [1+l/2, 1+3l/2]
    python -m pretrain.analysis init-grads    # FFN gradient norms at init per layer and vs depth (Figure 3)
    python -m pretrain.analysis init-perturb  # output change from a small random weight change vs depth (Admin)
    python -m pretrain.analysis grid          # placement x depth x lr x warm-up map of short pretraining runs

``python -m pretrain.analysis SUBCOMMAND --help`` lists each one's options (``--key=VALUE``, lists as YAML:
``--dims='[8, 24]'``). One module per subcommand (its measurement, table and figure);
``options.py`` holds their config dataclasses (read before torch is imported), ``common.py`` what they share,
``cli.py`` the command line.
"""

from __future__ import annotations

import importlib
from typing import Any

# Each name below from its module, imported on first use: ``python -m pretrain.analysis`` imports this package
# before it reads its options, and the measurements import torch.
_HOMES = {
    "pretrain.analysis.cli": ("COMMANDS", "main", "parse_args"),
    "pretrain.analysis.options": (
        "DEFAULT_OUT", "GridConfig", "InitGradsConfig", "InitPerturbConfig", "InitScaleConfig", "LnJacobianConfig",
        "ModelSize",
    ),
    "pretrain.analysis.common": ("mean_and_sem", "model_config", "write_outputs"),
    "pretrain.analysis.grid": ("Cell", "cell_overrides", "describe_setting", "grid_cells", "read_cell", "run_cell"),
    "pretrain.analysis.init_grads": ("ffn_gradient_norms", "load_mlm_data", "measure_init_grads", "mlm_batch"),
    "pretrain.analysis.init_scale": ("model_stream_scale", "paper_bounds", "simplified_stream_scale"),
    "pretrain.analysis.ln_jacobian": ("layer_norm_jacobian_norm", "ln_jacobian_rows"),
    "pretrain.analysis.perturb": ("output_change",),
}  # fmt: skip
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    if name in _HOME_OF:
        return getattr(importlib.import_module(_HOME_OF[name]), name)
    raise AttributeError(f"module 'pretrain.analysis' has no attribute {name!r}")


__all__ = sorted(_HOME_OF)
