"""Fine-tuning pretraining snapshots on GLUE (MRPC, RTE), the scheduler that runs it for every snapshot of a
pretraining run, and the Figure 5 report.

    finetune/glue.py      GLUE TSV / Hub loading, tokenizing with dynamic padding, metrics
    finetune/config.py    the fine-tuning recipe (typed dataclass) and the YAML + CLI loader
    finetune/train.py     fine-tuning one job: one model, one task, one (lr, seed), scored on dev
    finetune/worker.py    a model's jobs (their key), and one task of a manifest: ``python -m finetune.worker``
    finetune/manifest.py  the results folder, the one record of the jobs: manifests in, one result file per job out
    finetune/run.py       one model x one task x (lr, seed) grid: ``python -m finetune.run``
    finetune/schedule.py  every COMPLETE snapshot -> jobs -> manifests; resubmits what ended without a result
    finetune/backends.py  where a manifest's tasks run: in-process, local worker processes, a SLURM job array
    finetune/report.py    the Figure 5 report: ``python -m finetune.report``; its numbers (report_numbers.py), its
                          pictures (report_figures.py), its summary.md (report_summary.py)
"""
