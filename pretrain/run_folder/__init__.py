"""A run's files on disk: the contract that fine-tuning and the analyses read (docs/run_layout.md).

    layout.py         the run folder's file names and their readers (status, metrics, snapshots, heartbeat age)
    identity.py       the run's id, written once into RUN/run_id, which fine-tuning results are keyed by
    manifest.py       a checkpoint's or snapshot's files with their sizes and SHA-256 checksums
    status.py         a live run's status.json as the main process writes it, its heartbeat, the stop requests
    lock.py           RUN/lock: one command at a time in a run folder, the holder named to the next
    same_run.py       whether a command's config is the run its folder holds (the resume checks, without torch)
    checkpointing.py  full-state checkpoints (resumable) and weights-only snapshots, written atomically; the resume

Keep this file free of imports: ``checkpointing.py`` imports torch and accelerate, the others do not.
"""
