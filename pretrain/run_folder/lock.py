"""One command at a time in a run folder: the main process holds an exclusive flock on RUN/lock while it trains, so a
second command on the same folder (a job submitted twice, a requeued job whose first copy still runs) is refused
with the holder's name instead of resuming from the first one's checkpoints while it writes more. Without torch:
pretrain/run.py takes it before it imports the training.

The lock goes with its process: a killed run blocks nobody for long. On NFS a crashed node's lock lasts until its
lease ends (about 90 s), so a busy lock is waited for WAIT_S before the command is refused. A file system without
flock (Lustre mounted without ``-o flock``) gets a warning, and the run goes on unguarded."""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from pretrain.common.cli import ConfigError
from pretrain.run_folder.layout import LOCK_FILE, STOP_FILE

WAIT_S = 180.0
"""How long a command waits for a busy run folder before it is refused (longer than an NFS lease)."""


class StoppedWaiting(Exception):
    """A stop request (SIGTERM, Ctrl-C) came while the command waited for a busy folder: it did nothing."""


@contextlib.contextmanager
def run_folder_lock(run_dir: str | Path, stopped: Callable[[], str] = lambda: "") -> Iterator[None]:
    """Hold RUN/lock for the block, naming this process in it; a busy folder raises ConfigError naming the holder
    after WAIT_S, or StoppedWaiting as soon as ``stopped`` names a stop request."""
    path = Path(run_dir) / LOCK_FILE
    with open(path, "a+") as f:
        if not _lock(f, path, stopped):
            yield
            return
        try:
            f.truncate(0)  # "a+": the write goes to the (new) end
            since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
            f.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": since, "command": sys.argv}))
            f.flush()
            yield
        finally:
            f.truncate(0)  # a released lock names nobody
            fcntl.flock(f, fcntl.LOCK_UN)


def _lock(f: IO[str], path: Path, stopped: Callable[[], str]) -> bool:
    """Take the lock (True), waiting up to WAIT_S for a holder; False where the file system has no flock."""
    deadline, told = time.monotonic() + WAIT_S, False
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        except OSError as err:
            print(f"warning: cannot lock {path} ({err.strerror}): this file system has no flock (Lustre: mount it with "
                  "-o flock), so a second command on this run folder would not be refused", file=sys.stderr)  # fmt: skip
            return False
        if reason := stopped():
            raise StoppedWaiting(f"stopped ({reason}) while waiting for {path}: nothing was done")
        if time.monotonic() > deadline:
            raise ConfigError(_busy_message(path, _holder(f)))
        if not told:
            print(f"{path.parent} is in use ({_holder(f) or 'a process that has just started'}); waiting up to "
                  f"{WAIT_S:.0f} s for it", file=sys.stderr, flush=True)  # fmt: skip
            told = True
        time.sleep(1.0)


def _holder(f: IO[str]) -> str:
    """Who holds the lock, as its file says ("" while a holder that took it this instant has not written it)."""
    f.seek(0)
    try:
        holder = json.loads(f.read())
        return f"pid {holder['pid']} on {holder['host']}, running since {holder['since']}"
    except (ValueError, KeyError, TypeError):
        return ""


def _busy_message(path: Path, holder: str) -> str:
    who = holder or "a process that has just started"
    return (
        f"train.output_dir={str(path.parent)!r} is in use by another command ({who}; lock file {path}). Two commands "
        f"in one run folder would write the same checkpoints. Let that one finish, or stop it (touch "
        f"{path.parent / STOP_FILE}: it saves a checkpoint) and run this command again, or start a new run in another "
        "directory with --train.output_dir=NEW_DIR."
    )
