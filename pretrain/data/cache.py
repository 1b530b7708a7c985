"""The data cache under ``data.cache_dir`` (trained tokenizers, prepared instances): folders named by a hash of
their inputs, written atomically (``pretrain.common.atomic.atomic_dir``), and the lock that keeps two processes from
making the same one at once."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Bump when the instance format or algorithm changes, so stale caches are never reused.
CACHE_FORMAT_VERSION = 5


def content_hash(obj: Any) -> str:
    """A short hash of a JSON-able description of a cache entry's inputs."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:20]


@contextlib.contextmanager
def exclusive_lock(path: Path, on_wait: Callable[[], None] | None = None,
                   stop: threading.Event | None = None) -> Iterator[None]:  # fmt: skip
    """An exclusive advisory lock (flock) on ``path``, held for the block: work that two processes must not do at
    once (the same cache entry, the same grid cell) is done by the first while the second waits, then finds it
    done. ``on_wait`` is called once if another process holds it; a wait ends with InterruptedError when ``stop``
    is set. The lock goes with its process, so a killed holder blocks nobody."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        if not _try_lock(f):
            if on_wait is not None:
                on_wait()
            if stop is None:
                fcntl.flock(f, fcntl.LOCK_EX)
            while stop is not None and not _try_lock(f):
                if stop.wait(1.0):
                    raise InterruptedError(f"stopped while waiting for the lock {path}")
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _try_lock(f: Any) -> bool:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
