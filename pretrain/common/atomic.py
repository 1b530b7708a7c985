"""Atomic writes, the project's one implementation: a reader, a kill or a full disk never leaves half a file or half
a folder where the finished one belongs, and what is written gets the permissions the umask gives (0666 or 0777
less the umask), so colleagues on a cluster can read it.

A file goes through a uniquely named temporary file beside it (``.NAME.XXXXXXXX.tmp``, from mkstemp), which is
written, fsync'ed, given the umask's mode and renamed over the target (hard-linked, for create-once): atomic on
local file systems, NFS and Lustre. A failure removes the temporary file and leaves the target as it was.
Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_NO_ROOM_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # a full disk, a spent quota
# How a library that wraps the OSError (safetensors, Rust's std::io) words it.
_NO_ROOM_WORDS = ("No space left on device", "Disk quota exceeded", "os error 28", "os error 122")


def no_room(err: BaseException) -> BaseException | None:
    """The error of ``err``'s chain (itself, then what caused it) that says a write found no room: an OSError with
    ENOSPC or EDQUOT, or a library's error that wraps one in its words; None when none does."""
    seen: BaseException | None = err
    while seen is not None:
        said = any(word in str(seen) for word in _NO_ROOM_WORDS)
        if said or (isinstance(seen, OSError) and seen.errno in _NO_ROOM_ERRNOS):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def is_damage(err: BaseException) -> bool:
    """Whether a failed read of files written whole (by this module) says they were damaged or removed since, not
    that the system refused the read (EIO, ESTALE, EACCES: nothing to remove or make again)."""
    return not isinstance(err, OSError) or err.errno in (None, errno.ENOENT)


def current_umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it; put it back at once
    os.umask(mask)
    return mask


def follow_umask(folder: str | Path) -> None:
    """The umask's mode for every file under ``folder`` (mkstemp, as in save_pretrained, makes 0600 files)."""
    mode = 0o666 & ~current_umask()
    for path in Path(folder).rglob("*"):
        if path.is_file():
            path.chmod(mode)


@contextlib.contextmanager
def _temporary(path: Path) -> Iterator[Path]:
    """An empty temporary file beside ``path``, removed when the block ends (if it is still there)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def _seal(tmp: Path) -> None:
    """The umask's mode (mkstemp creates 0600) and the bytes on disk before the file takes its name."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` for the block to write by any means; when the block ends without an error it is
    fsync'ed, given the umask's mode and renamed to ``path``, else removed."""
    path = Path(path)
    with _temporary(path) as tmp:
        try:
            yield tmp
            _seal(tmp)
        except OSError as err:
            if err.filename is None and no_room(err):  # a write() names no file: name what it was for
                err.filename = str(path)
            raise
        os.replace(tmp, path)


def write_bytes(path: str | Path, data: bytes) -> None:
    """Replace ``path`` atomically: readers see the old file or the new one, never half of one."""
    with writing(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | Path, text: str) -> None:
    """Replace ``path`` atomically with ``text`` (UTF-8)."""
    write_bytes(path, text.encode("utf-8"))


def json_bytes(payload: Any, *, indent: int = 2, sort_keys: bool = True, default: Callable | None = str) -> bytes:
    """``payload`` as the JSON files of the project hold it (``json.dumps``' ``indent``, ``sort_keys``, ``default``)."""
    return json.dumps(payload, indent=indent, sort_keys=sort_keys, default=default).encode("utf-8")


def write_json(path: str | Path, payload: Any, *, indent: int = 2, sort_keys: bool = True,
               default: Callable | None = str) -> None:  # fmt: skip
    """Replace ``path`` atomically with ``payload`` as JSON (``json_bytes``)."""
    write_bytes(path, json_bytes(payload, indent=indent, sort_keys=sort_keys, default=default))


def write_once(path: str | Path, data: str | bytes) -> bool:
    """Create ``path`` with ``data`` unless it exists; False (and nothing written) if it already did. A hard link from
    the finished temporary file fails if ``path`` exists, atomically on NFS and Lustre too: of two writers exactly one
    wins. Without hard links, a rename after a check (a rare race there lets the second copy replace the first)."""
    path = Path(path)
    with _temporary(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
        _seal(tmp)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        except OSError:
            if path.exists():
                return False
            os.replace(tmp, path)
            return True


def publish_dir(tmp: str | Path, final: str | Path, *, replace: bool = False) -> bool:
    """Rename the finished folder ``tmp`` to ``final`` (one atomic step: readers see no folder or all of it). When
    ``final`` exists, ``replace=True`` swaps it out (via a hidden ``.FINAL.old`` sibling, left for the caller's clean-up
    by a kill in between); ``replace=False`` keeps it (another process finished first) and returns False."""
    tmp, final = Path(tmp), Path(final)
    if replace and final.exists():
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
        return True
    try:
        os.replace(tmp, final)  # onto an existing folder that is not empty, this fails: the first one stays
    except OSError:
        if not final.exists():
            raise
        return False
    return True


@contextlib.contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """A temporary sibling folder (``FINAL.tmp-XXXXXXXX``) for the block to write ``final`` in; when the block ends
    without an error its files get the umask's mode and it is renamed to ``final`` (readers never see half a folder; a
    kill leaves none). If ``final`` appeared meanwhile (another process finished first), it stays."""
    final = Path(final)
    tmp = final.with_name(f"{final.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True)
    try:
        yield tmp
        follow_umask(tmp)
        publish_dir(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
