"""What a run reports while it runs, and where.

    metrics.py        Accelerate trackers (W&B, TensorBoard), RUN/metrics.jsonl, gradient norms, throughput, MFU
    wandb_logging.py  the W&B conventions of every run type: identity, groups, config, outcome summary, artifacts

This package took the place of a module of the same name, whose names (``init_trackers``, ``log_metrics``, ...) are
still read from it, lazily: ``metrics.py`` (torch, accelerate) is imported when one of them is asked for.
"""

from pretrain._moved import reexport

__getattr__, __dir__ = reexport(__name__, "pretrain.tracking.metrics")
