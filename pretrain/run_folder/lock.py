"""One command at a time in a run folder: the main process holds an exclusive flock on RUN/lock while it trains, so a
second command on the same folder (a job submitted twice, a requeued job whose first copy still runs) is refused
with the holder's name instead of resuming from the first one's checkpoints while it writes more. Without torch:
pretrain/run.py takes it before it imports the training.

The lock goes with its process: a killed run blocks nobody for long. On NFS a crashed node's lock lasts until its
lease ends (about 90 s), so a busy lock is waited for WAIT_S before the command is refused, and up to LEASE_WAIT_S
where the holder is on another host and its run shows no sign of life (a server that keeps leases longer). A file
system without flock (Lustre mounted without ``-o flock``) gets a warning, and the run goes on unguarded."""

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
from typing import IO, Any

from pretrain.common.atomic import no_room
from pretrain.common.cli import ConfigError
from pretrain.run_folder.layout import LOCK_FILE, STOP_FILE, is_dead, read_status

WAIT_S = 180.0
"""How long a command waits for a busy run folder before it is refused (longer than an NFS lease)."""
LEASE_WAIT_S = 900.0
"""How long in all it waits where the holder is on another host and its run shows no sign of life since WAIT_S: no
status "running" with a heartbeat that recent (``gone_elsewhere``). A live holder starting up is refused that late."""


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
            name_holder(f)
            yield
        finally:
            f.truncate(0)  # a released lock names nobody
            fcntl.flock(f, fcntl.LOCK_UN)


def name_holder(f: IO[str], **extra: Any) -> None:
    """Write into the lock file ``f`` (open "a+", locked) who holds it: host, pid, start, command, and ``extra``. In
    place: a rename would put a new file beside the locked one. Unbuffered, and a full disk leaves it naming nobody:
    the lock is held all the same, and the command's own handling of a full disk follows."""
    f.truncate(0)  # "a+": the write goes to the (new) end
    since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    named = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": since, "command": sys.argv, **extra})
    try:
        os.write(f.fileno(), named.encode())
    except OSError as err:
        if not no_room(err):
            raise
        f.truncate(0)


def holder(f: IO[str], wait_s: float = 2.0) -> dict[str, Any] | None:
    """Who holds the lock, as its file ``f`` names them; a holder that took it this instant writes its name right
    after, so a file that names nobody is read again for up to ``wait_s`` (then None)."""
    deadline = time.monotonic() + wait_s
    while True:
        f.seek(0)
        with contextlib.suppress(ValueError):
            named = json.loads(f.read())
            return named if isinstance(named, dict) else None
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def holder_text(named: dict[str, Any] | None) -> str:
    if named is None or not {"pid", "host", "since"} <= named.keys():
        return "a process that has just started"
    return f"pid {named['pid']} on {named['host']}, running since {named['since']}"


def _lock(f: IO[str], path: Path, stopped: Callable[[], str]) -> bool:
    """Take the lock (True), waiting up to WAIT_S for a holder; False where the file system has no flock."""
    deadline, told, extended = time.monotonic() + WAIT_S, False, False
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
            named = holder(f)
            if extended or not gone_elsewhere(named, path.parent):
                raise ConfigError(_busy_message(path, holder_text(named)))
            deadline, extended = deadline + LEASE_WAIT_S - WAIT_S, True
            print(f"{path.parent}: its holder ({holder_text(named)}) shows no sign of life; waiting up to "
                  f"{LEASE_WAIT_S:.0f} s in all for its lock's lease to end", file=sys.stderr, flush=True)  # fmt: skip
        if not told:
            print(f"{path.parent} is in use ({holder_text(holder(f))}); waiting up to {WAIT_S:.0f} s for it",
                  file=sys.stderr, flush=True)  # fmt: skip
            told = True
        time.sleep(1.0)


def gone_elsewhere(named: dict[str, Any] | None, run_dir: Path) -> bool:
    """The lock's holder is on another host, and the run shows no sign of life: no status "running" with a heartbeat
    younger than WAIT_S. A node that died holds its NFS lock until the server ends its lease."""
    if named is None or named.get("host") in (None, socket.gethostname()):
        return False
    status = read_status(run_dir)
    return status.get("status") != "running" or is_dead(status, after_s=WAIT_S)


def _busy_message(path: Path, who: str) -> str:
    return (
        f"train.output_dir={str(path.parent)!r} is in use by another command ({who}; lock file {path}). Two commands "
        f"in one run folder would write the same checkpoints. Let that one finish, or stop it (touch "
        f"{path.parent / STOP_FILE}: it saves a checkpoint) and run this command again, or start a new run in another "
        "directory with --train.output_dir=NEW_DIR."
    )
