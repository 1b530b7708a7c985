"""Fine-tuning pretraining snapshots on GLUE (MRPC, RTE), the scheduler that runs it for every snapshot of a
pretraining run, and the Figure 5 report.

    finetune/glue.py      GLUE TSV / Hub loading, tokenizing with dynamic padding, metrics
    finetune/config.py    the fine-tuning recipe (typed dataclass) and the YAML + CLI loader
    finetune/train.py     fine-tuning one job: one model, one task, one (lr, seed), scored on dev
    finetune/worker.py    a model's jobs (their key in the store) and the worker that claims and runs them
    finetune/run.py       one model x one task x (lr, seed) grid: ``python -m finetune.run``
    finetune/store.py     the SQLite results store, which is also the job queue (leases, retries)
    finetune/schedule.py  every COMPLETE snapshot -> jobs; local worker pool or SLURM array
    finetune/report.py    Figure 5 panels, steps-to-loss table, summary.md, W&B
"""
