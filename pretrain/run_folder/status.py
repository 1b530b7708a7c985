"""A live run's status.json as the main process writes it (its readers: pretrain/run_folder/layout.py), the heartbeat
that tells a live run from a dead one, and the stop requests (SIGTERM, SIGINT, RUN/STOP) the loop answers with a
checkpoint (docs/cluster.md, "Preemption")."""

from __future__ import annotations

import contextlib
import datetime
import signal
import time
from collections.abc import Iterator
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
    """RUN/status.json (docs/run_layout.md); the main process calls it."""
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
    """Says when status.json is due again: every HEARTBEAT_EVERY_S, so readers tell a live run from a dead one."""

    last: float = field(default_factory=time.monotonic)
    """When it was last due (time.monotonic)."""

    def due(self) -> bool:
        if time.monotonic() - self.last < HEARTBEAT_EVERY_S:
            return False
        self.last = time.monotonic()
        return True
