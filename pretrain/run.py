r"""Pretrain BERT (MLM + NSP) with a chosen LayerNorm placement, under Accelerate.

    accelerate launch --quiet pretrain/run.py                # built-in tiny default, offline, on CPU or one GPU
    python pretrain/run.py                                   # the same in this process
    python pretrain/run.py --config configs/pretrain/small_pre_ln.yaml --data.sources='[...]'
    accelerate launch --config_file configs/accelerate/8gpu.yaml pretrain/run.py \
        --config configs/pretrain/bert_base_pre_ln.yaml
    python pretrain/run.py --help                            # every config key with its type, default and doc

This module reads and checks the options; the training itself (pretrain/training.py: torch, transformers,
Accelerate, about 9 s of CPU) is imported after them, so that a typo answers at once. What a run writes:
docs/run_layout.md. Exit codes: 0 finished, diverged (an experimental outcome, in status.json) or preempted
(SIGTERM/SIGINT/RUN/STOP at any stage, train.stop_at_step: checkpoint saved; a full disk, before a save or by a write;
continue with --train.resume=auto; docs/faults.md says why 0); 2 bad configuration or input (message on stderr,
nothing trained); 1 an unexpected error (status failed); 3 hung, stopped by its watchdog (no step for
train.hang_timeout_s; status hung, every thread's stack on stderr). The same command run again continues the run in
train.output_dir, or reports it finished.
"""

from __future__ import annotations

import signal
import sys

from pretrain.run_folder.status import StopRequest  # light (no torch, no config): imported and installed first

if __name__ == "__main__":
    # From the process's first line, SIGTERM or Ctrl-C is a stop request, never a death by the signal (which a job
    # script would not requeue): the imports below take a while, longer on a loaded machine, and start-up answers the
    # request at its next stage.
    FIRST_LINE_STOP = StopRequest()
    FIRST_LINE_STOP.catch()

import os
from contextlib import nullcontext
from pathlib import Path

from pretrain.common.cli import ConfigError, run_cli, to_dict, writable_folder
from pretrain.common.device import FP16_NEEDS_A_GPU, surely_no_cuda
from pretrain.config import parse_args
from pretrain.run_folder.lock import StoppedWaiting, run_folder_lock
from pretrain.run_folder.repair import restore_from_snapshots
from pretrain.run_folder.same_run import check_settings
from pretrain.tracking.wandb_logging import check_credentials, wandb_mode


def main(argv: list[str] | None = None, stop: StopRequest | None = None) -> int:
    """Parse the arguments and run; bad configuration raises ConfigError/ValueError/FileNotFoundError. SIGTERM or
    Ctrl-C (``stop``: the one the process caught from its first line) is a request to stop, answered at the next safe
    point (a stage of start-up or a step boundary) as preempted, exit code 0."""
    with (stop or StopRequest()).installed() as stop:
        return parse_and_run(argv, stop)


def parse_and_run(argv: list[str] | None, stop: StopRequest) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = parse_args(argv, description=__doc__ or "")
    # Answered now, before torch's seconds of import: the corpus files (their first lines), the settings of a run
    # already in the folder, the precision, W&B's credentials and that the folder can be written.
    for line in cfg.data.check_local_files():
        if os.environ.get("RANK", "0") == "0":  # once, not once per process
            print(line, flush=True)
    restore_from_snapshots(cfg.train.output_dir)  # a damaged run_config.json, run_id or tokenizer, from a snapshot
    check_settings(Path(cfg.train.output_dir), to_dict(cfg), cfg.train.resume)
    if cfg.train.mixed_precision == "fp16" and surely_no_cuda():
        raise ConfigError(FP16_NEEDS_A_GPU)
    if cfg.tracking.backend == "wandb":
        check_credentials(wandb_mode(cfg.tracking.wandb_mode), cfg.train.output_dir)
    writable_folder(cfg.train.output_dir, "train.output_dir")  # last: a refused command leaves no folder
    main_process = os.environ.get("RANK", "0") == "0"  # one holder per command: its main process
    try:
        with run_folder_lock(cfg.train.output_dir, lambda: stop.reason(False)) if main_process else nullcontext():
            from pretrain.training import run

            run(cfg, argv, stop)
    except StoppedWaiting as stopped:  # a stop request, not an error: exit 0, and the other command's folder untouched
        print(stopped, file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        code = run_cli(lambda: main(stop=FIRST_LINE_STOP))  # bad input: the message on stderr and exit code 2
    finally:
        # The run has ended and written its status, while the process may take seconds to exit (torch's teardown),
        # where a Python handler no longer runs: SIGTERM is ignored from here.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(code)
