"""What a run reports while it runs, and where.

    metrics.py        Accelerate trackers (W&B, TensorBoard), RUN/metrics.jsonl, gradient norms, throughput, MFU
    wandb_logging.py  the W&B conventions of every run type: identity, groups, config, outcome summary, artifacts
"""
