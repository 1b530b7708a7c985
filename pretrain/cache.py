"""The data cache under ``data.cache_dir``: folders named by a hash of their inputs, written atomically.

Trained tokenizers (pretrain/tokenizer.py) and tokenised instances (pretrain/instances.py) are cached here, so a
second run with the same inputs, or the other processes of a distributed run, reuse them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Bump when the instance format or algorithm changes, so stale caches are never reused.
CACHE_FORMAT_VERSION = 3


def content_hash(obj: Any) -> str:
    """A short hash of a JSON-able description of a cache entry's inputs."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:20]


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Write into a temporary sibling folder and rename it into place, so readers never see a half-written cache."""
    tmp = final.with_name(f"{final.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if final.exists():  # another process finished first; its result is identical
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
