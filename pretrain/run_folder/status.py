"""A live run's status.json as the main process writes it (its readers: pretrain/run_folder/layout.py), the heartbeat
that tells a live run from a dead one, the watchdog that stops a process whose heartbeat stopped, and the stop requests
(SIGTERM, SIGINT, RUN/STOP) the loop answers with a checkpoint (docs/cluster.md, "Preemption")."""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pretrain.common.atomic import write_json
from pretrain.run_folder.layout import HEARTBEAT_EVERY_S, STATUS_FILE

if TYPE_CHECKING:  # no torch or config at run time: pretrain/run.py imports this module before anything heavy
    from pretrain.config import PretrainConfig


def write_status(
    cfg: PretrainConfig, status: str, step: int, message: str = "", diverged_at: int | None = None
) -> None:
    """RUN/status.json (docs/run_layout.md); the main process calls it, every process for a stop the main process
    may be unable to record (``training.record_stop``)."""
    updated = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    write_json(Path(cfg.train.output_dir) / STATUS_FILE, {
        "status": status, "step": step, "run_name": cfg.train.run_name, "norm_placement": cfg.model.norm_placement,
        "variant": cfg.model.variant, "updated": updated, "diverged_at_step": diverged_at, "message": message,
    })  # fmt: skip


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass
class StopRequest:
    """A request to stop at the next step boundary with a checkpoint: SIGTERM or SIGINT, or the file RUN/STOP (what
    launch/slurm_pretrain.sbatch writes on SLURM's warning signal, which reaches the batch shell alone). Every
    process's request counts: the loop shares them in its per-step reduce, start-up in ``training.stop_reason``."""

    signal_name: str = ""
    file: Path | None = None
    """RUN/STOP, set once the run folder is known; the main process looks for it."""

    def catch(self) -> dict[int, Any]:
        """Take SIGTERM and SIGINT as this request from now on; returns the handlers they had."""
        previous = {}
        with contextlib.suppress(ValueError):  # not in the main thread (e.g. a worker thread): no handlers
            for sig in STOP_SIGNALS:
                previous[sig] = signal.signal(sig, self._handle)
        return previous

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopRequest]:
        previous = self.catch()
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal_name and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now, without a checkpoint
        self.signal_name = signal.Signals(signum).name

    def reason(self, look_for_file: bool) -> str:
        """What asked this process to stop ("" for nothing): a signal's name, or the stop file's path."""
        if self.signal_name:
            return self.signal_name
        return str(self.file) if look_for_file and self.file is not None and self.file.exists() else ""

    def served(self) -> None:
        """The run stopped: a stop file is used up (a request that came as the run ended would stop the next start)."""
        if self.file is not None:
            self.file.unlink(missing_ok=True)


def ignore_stop_signals(worker_id: int) -> None:
    """A DataLoader worker's ``worker_init_fn``: stopping is the training process's business. SIGTERM and SIGINT reach
    the workers too (torchrun signals each worker's process group, a terminal's Ctrl-C the foreground group, SLURM
    every process of the job step, accelerate's launcher every descendant); a worker killed by one would make the
    trainer fail on "DataLoader worker exited unexpectedly" instead of saving its checkpoint. A worker still ends
    with its parent (torch's watchdog) and by SIGKILL."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


@dataclass
class Heartbeat:
    """The loop's pulse, one ``beat`` a step: says when status.json is due again (every HEARTBEAT_EVERY_S, so readers
    tell a live run from a dead one), and is what ``watchdog`` watches."""

    last: float = field(default_factory=time.monotonic)
    """When status.json was last due (time.monotonic)."""
    step: int = 0
    """The step of the last beat: each beat's is higher (``watchdog`` looks for a change)."""

    def beat(self, step: int) -> bool:
        """Step ``step`` is done, its evaluation and saves included; True when status.json is due."""
        self.step = step
        if time.monotonic() - self.last < HEARTBEAT_EVERY_S:
            return False
        self.last = time.monotonic()
        return True


def fault_point(name: str, step: int) -> None:
    """Fault injection for the tests and tests/faults/kill_trials.py: ``LNBERT_KILL_AT=name:step`` SIGKILLs this
    process there, ``LNBERT_HANG_AT=name:step`` makes it hang there (a sleep that never ends)."""
    if os.environ.get("LNBERT_KILL_AT") == f"{name}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)
    while os.environ.get("LNBERT_HANG_AT") == f"{name}:{step}":
        time.sleep(60)


EXIT_HUNG = 3
"""The exit code of a process its watchdog stopped: pretrain/run.py (status hung), a fine-tuning worker or scheduler."""
HUNG_WRITE_WAIT_S = 60.0
"""How long a hung process waits for its status write before it exits all the same (the file system may have hung)."""


@contextlib.contextmanager
def watchdog(heartbeat: Heartbeat, timeout_s: float, message: Callable[[int], str],
             on_hang: Callable[[str], None]) -> Iterator[None]:  # fmt: skip
    """Stop this process when ``heartbeat`` has not beaten for ``timeout_s`` (0: never) during the block: a data read,
    file system or collective that hangs would otherwise hold the job, and its GPUs, until the time limit, and end it
    with nothing to requeue. It prints ``message(last step)`` and every thread's stack, calls ``on_hang(message)``
    (pretraining: status hung; fine-tuning: the job's failed attempt), and exits with EXIT_HUNG."""
    if timeout_s <= 0:
        yield
        return
    done = threading.Event()
    watching = (heartbeat, timeout_s, message, on_hang, done)
    threading.Thread(target=_watch, args=watching, name="hang watchdog", daemon=True).start()
    try:
        yield
    finally:
        done.set()


def _watch(heartbeat: Heartbeat, timeout_s: float, message: Callable[[int], str], on_hang: Callable[[str], None],
           done: threading.Event) -> None:  # fmt: skip
    look = min(10.0, timeout_s / 10)
    seen, quiet, last = heartbeat.step, 0.0, time.monotonic()
    while not done.wait(look):
        now = time.monotonic()
        # A look that comes late counts as two: time the process spent suspended (SIGSTOP, SLURM's suspend) is no hang.
        quiet = 0.0 if heartbeat.step != seen else quiet + min(now - last, 2 * look)
        seen, last = heartbeat.step, now
        if quiet >= timeout_s:
            stop_hung(message(heartbeat.step), on_hang)


def stop_hung(message: str, on_hang: Callable[[str], None]) -> None:
    """Say why with every thread's stack, record it (``on_hang``, waited for HUNG_WRITE_WAIT_S at most), exit."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        print(f"\n{message}. The stack of every thread:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(all_threads=True)
    writer = threading.Thread(target=on_hang, args=(message,), name="hung status", daemon=True)
    writer.start()
    writer.join(HUNG_WRITE_WAIT_S)
    os._exit(EXIT_HUNG)  # the main thread is stuck: no exception reaches it
