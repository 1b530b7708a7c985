"""Measurements behind the claims of Xiong et al. 2020, "On Layer Normalization in the Transformer
Architecture", one subcommand each. Every subcommand prints a table, writes it (``table.txt``) and the
raw numbers (``results.json``) into ``--out`` and draws a PNG there.

    python -m pretrain.analysis ln-jacobian   # ||J_LN(x)||_2 = sqrt(d)/||x - mean(x)||  (paper, Sec. 3)
    python -m pretrain.analysis init-scale    # E||x_l||^2/d at init: Post-LN 1.5, Pre-LN in [1+l/2, 1+3l/2]
    python -m pretrain.analysis init-grads    # FFN gradient norms at init per layer and vs depth (Figure 3)
    python -m pretrain.analysis init-perturb  # output change from a small random weight change vs depth (Admin)
    python -m pretrain.analysis grid          # placement x depth x lr x warm-up map of short pretraining runs
    python -m pretrain.analysis compare       # models each at its own lr, over seeds, paired tests (a study)

``python -m pretrain.analysis SUBCOMMAND --help`` lists each one's options (``--key=VALUE``, lists as YAML:
``--dims='[8, 24]'``). One module per subcommand (its measurement, table and figure);
``options.py`` holds their config dataclasses (read before torch is imported), ``common.py`` what they share,
``cli.py`` the command line.
"""
