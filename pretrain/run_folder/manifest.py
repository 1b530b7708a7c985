"""Manifests: the list of a checkpoint's or snapshot's files with their sizes and SHA-256 checksums.

Written after every other file, before the folder is marked complete (the checkpoint's rename, the snapshot's
COMPLETE marker), and checked before the folder is used: a file missing, truncated or overwritten is found instead of
resuming or fine-tuning from garbage. It carries the run folder's ``format_version`` (pretrain/common/formats.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pretrain.common.atomic import write_json
from pretrain.common.formats import RUN_FORMAT, FormatVersionError, check_format, stamped
from pretrain.run_folder.layout import MANIFEST_FILE, SNAPSHOT_MARKER

_CHUNK = 1 << 24


# What the user of a snapshot of another format version can do (fine-tuning and export read snapshots).
SNAPSHOT_FIX = (
    "use it with the checkout that wrote it, or re-save its weights with this one as a plain model folder "
    "(LNBertForPreTraining.from_pretrained(SNAPSHOT).save_pretrained(NEW), and its tokenizer) and pass NEW"
)


class ManifestError(ValueError):
    """A folder that does not match its manifest (the message names the folder and the file)."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: Path) -> None:
    """Record every file of ``folder`` (relative path, size, sha256) in ``folder/manifest.json``, but the manifest,
    the completion marker written after it and hidden files."""
    folder = Path(folder)
    listed = sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in (MANIFEST_FILE, SNAPSHOT_MARKER)
                    and not p.name.startswith("."))  # fmt: skip
    files = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in listed}
    write_json(folder / MANIFEST_FILE, stamped({"files": files}, RUN_FORMAT))


def verify_manifest(folder: Path, fix: str = SNAPSHOT_FIX) -> None:
    """Raise ManifestError naming ``folder`` and the first file that is missing, of the wrong size or whose
    checksum differs; also when the manifest itself is missing or unreadable. A manifest of another format
    version raises FormatVersionError with ``fix`` (what the reader's user can do) before any file is compared."""
    folder = Path(folder)
    path = folder / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text())
        check_format(manifest, path, RUN_FORMAT, fix)
        files = dict(manifest["files"])
    except FileNotFoundError:
        raise ManifestError(f"{folder}: no {MANIFEST_FILE} (an incomplete folder)") from None
    except FormatVersionError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ManifestError(f"{folder}: {MANIFEST_FILE} is unreadable ({err})") from None
    for name, expected in sorted(files.items()):
        file = folder / name
        if not file.is_file():
            raise ManifestError(f"{folder}: file {name} is missing")
        size = file.stat().st_size
        if size != expected["size"]:
            raise ManifestError(f"{folder}: file {name} has {size} bytes, the manifest says {expected['size']}")
        if sha256_file(file) != expected["sha256"]:
            raise ManifestError(f"{folder}: file {name} does not match its checksum (its bytes were changed)")


def listed_files(folder: Path) -> dict[str, dict]:
    """The files ``folder``'s manifest lists, each with its "size" and "sha256", as the manifest says (not verified;
    {} where there is none or it cannot be read)."""
    try:
        files = json.loads((Path(folder) / MANIFEST_FILE).read_text())["files"]
        return {name: entry for name, entry in files.items() if isinstance(entry, dict)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def folder_size(folder: Path) -> int:
    """Bytes of the files listed in ``folder``'s manifest (0 when it has none): the expected size of the next one."""
    return sum(int(entry.get("size", 0)) for entry in listed_files(folder).values())
