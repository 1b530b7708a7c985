"""What a run reports while it runs, and where.

    metrics.py        Accelerate's trackers, RUN/metrics.jsonl, gradient norms, throughput, MFU
    wandb_logging.py  every W&B run (pretraining, a fine-tuning job, the report) and their conventions
"""
