"""A live run's status.json as the main process writes it (its readers: pretrain/run_folder/layout.py), the heartbeat
that tells a live run from a dead one, and the stop requests (SIGTERM/SIGINT) the loop answers with a checkpoint."""

from __future__ import annotations

import contextlib
import datetime
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pretrain.common.atomic import write_json
from pretrain.config import PretrainConfig
from pretrain.run_folder.layout import HEARTBEAT_EVERY_S, STATUS_FILE


def write_status(
    cfg: PretrainConfig, status: str, step: int, message: str = "", diverged_at: int | None = None
) -> None:
    """RUN/status.json (docs/run_layout.md); the main process calls it."""
    updated = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    write_json(Path(cfg.train.output_dir) / STATUS_FILE, {
        "status": status, "step": step, "run_name": cfg.train.run_name, "norm_placement": cfg.model.norm_placement,
        "variant": cfg.model.variant, "updated": updated, "diverged_at_step": diverged_at, "message": message,
    })  # fmt: skip


@dataclass
class StopRequest:
    """Set by SIGTERM/SIGINT; the loop checks it at each step boundary (all processes agree via a reduce)."""

    signal_name: str = ""

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopRequest]:
        previous = {}
        with contextlib.suppress(ValueError):  # not in the main thread (e.g. a worker thread): no handlers
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._handle)
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal_name and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now, without a checkpoint
        self.signal_name = signal.Signals(signum).name


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
