"""Where a grid or study cell comes from, so that cells which cannot be compared are never compared silently.

Every sitting that runs or resumes a cell records its environment in RUN/provenance.json first: the commit, the code
it ran (the git tree of ``pretrain/``, which committing results or docs leaves unchanged, with a hash of any
uncommitted change), the machine (the CPU's model and generation with the vector instructions torch's kernels use, the
threads a cell computes with, the GPU) and the torch, transformers and Python versions. Once the run has ended, the
same file gets its inputs by content: the tokenizer (the hash the data cache keys on, of the run's saved
RUN/tokenizer) and the data (the sha256 of every corpus file and the data settings that shape instances and batches;
the seed apart, since each seed draws its own split).
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import subprocess
from pathlib import Path
from typing import Any

from pretrain.common.atomic import write_json
from pretrain.run_folder.layout import TOKENIZER_DIR, read_json_file, read_run_config

PROVENANCE_FILE = "provenance.json"
"""Written into a cell's run folder by the grid's cell runner (``grid.run_cell``)."""
CELL_FIX = "remove the cell's folder under OUT/runs to run it again with this checkout"
"""What to do with a cell whose files cannot be used."""
REPOSITORY = Path(__file__).resolve().parents[2]
CODE_DIR = "pretrain"
"""The code a cell runs: pretrain/run.py and everything it imports live here."""
ENVIRONMENT_KEYS = ("code", "machine", "torch", "transformers", "python")
"""What must match for two cells to compare without ``mixed_provenance`` (the commit is informative: a later
commit that changes nothing under pretrain/ runs the same code)."""
INPUT_KEYS = ("tokenizer", "data")
"""What must match for two cells to compare at all."""


def _git(*args: str) -> str:
    """git's output in the repository of this code; "" when git or the repository is not there."""
    try:
        found = subprocess.run(["git", "-C", str(REPOSITORY), *args], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return ""
    return found.stdout.strip()


def code_identity() -> str:
    """The git tree of pretrain/ at HEAD, plus ``+uncommitted-HASH`` for changed or new files under it (HASH: of the
    diff and the new files' contents); "unknown" outside a git checkout."""
    tree = _git("rev-parse", f"HEAD:{CODE_DIR}")
    if not tree:
        return "unknown"
    changed = _git("status", "--porcelain", "--untracked-files=all", "--", CODE_DIR)
    if not changed:
        return tree[:12]
    digest = hashlib.sha256(_git("diff", "HEAD", "--", CODE_DIR).encode())
    for line in changed.splitlines():
        if line.startswith("??"):  # a new file: its content, which no diff against HEAD shows
            digest.update((REPOSITORY / line[3:]).read_bytes())
    return f"{tree[:12]}+uncommitted-{digest.hexdigest()[:8]}"


@functools.cache
def environment() -> dict[str, Any]:
    """This process's environment, as a cell it starts runs in (the same interpreter, PYTHONPATH and variables)."""
    import torch
    import transformers

    from pretrain.common.device import choose_cpu_threads
    from pretrain.common.hardware import device_name

    # pretrain/run.py's own rule sizes torch's thread pool here as in the cell (the probes then use the same).
    choose_cpu_threads()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "commit": _git("rev-parse", "HEAD") or "unknown",
        "code": code_identity(),
        # The CPU with the kernels torch dispatches to there (AVX2, AVX512, ...): the same code and seed on another
        # CPU generation trains to other digits (docs/results.md, the headline study's rerun).
        "machine": {"cpu": device_name(torch.device("cpu")), "threads": torch.get_num_threads(), "gpu": gpu},
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def read(run_dir: Path) -> dict[str, Any]:
    """RUN/provenance.json: ``sittings`` (the environment of each sitting that ran the cell) and, once the run ended
    and was read, ``inputs``; empty for a cell run before provenance was recorded."""
    try:
        return read_json_file(Path(run_dir) / PROVENANCE_FILE) or {"sittings": []}
    except ValueError as err:  # a record of where the cell ran: not to be guessed
        raise ValueError(f"{err}: restore it from a copy, or remove it (the cell then has no provenance recorded and "
                         f"is compared only with --mixed_provenance=true), or {CELL_FIX}") from None


def record_sitting(run_dir: Path) -> None:
    """Add this process's environment to the cell's sittings, unless it is the last one there (a resume here)."""
    found = read(run_dir)
    if found["sittings"][-1:] != [environment()]:
        write_json(Path(run_dir) / PROVENANCE_FILE, {**found, "sittings": [*found["sittings"], environment()]})


def with_inputs(run_dir: Path) -> dict[str, Any]:
    """The cell's provenance with its inputs, which are measured once and stored (the ended run no longer changes)."""
    found = read(run_dir)
    if "inputs" not in found:
        resolved = read_run_config(run_dir, CELL_FIX)
        found["inputs"] = {"tokenizer": tokenizer_hash(Path(run_dir) / TOKENIZER_DIR), "data": data_hash(resolved["data"])}
        write_json(Path(run_dir) / PROVENANCE_FILE, found)
    return found


def tokenizer_hash(folder: Path | str) -> str:
    """The tokenizer's identity by content (``pipeline_hash``: what the prepared instances are keyed on)."""
    from transformers import AutoTokenizer

    from pretrain.data.tokenizer import pipeline_hash

    if not Path(folder).is_dir():
        raise FileNotFoundError(f"tokenizer {str(folder)!r}: no such folder; name the folder save_pretrained wrote "
                                "(tokenizer.json, tokenizer_config.json), e.g. configs/analysis/wordpiece_2048")  # fmt: skip
    return pipeline_hash(AutoTokenizer.from_pretrained(str(folder)))[:16]


@functools.lru_cache(maxsize=64)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def data_hash(data: dict[str, Any]) -> str:
    """The data's identity by content, seed apart: the data settings a run's batches depend on (not the cache's
    place, not the tokenizer's name: its content has its own hash) with each source's files by their sha256 rather
    than their path (the built-in python_docs: by the Python version whose documentation it reads)."""
    from pretrain.common.roles import not_keyed_in
    from pretrain.data.config import LOCAL_SUFFIXES, DataConfig, SourceConfig

    kept = {k: v for k, v in data.items() if k not in not_keyed_in(DataConfig, "batches")}
    sources = []
    for index, fields in enumerate(data["sources"]):
        source = SourceConfig(**fields)
        if source.kind in LOCAL_SUFFIXES:
            files = [_file_sha256(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns)
                     for p in source.local_files(index)]  # fmt: skip
            fields = {**fields, "path": files}
        elif source.kind == "python_docs":
            fields = {**fields, "python": platform.python_version()}
        sources.append(fields)
    return hashlib.sha256(json.dumps({**kept, "sources": sources}, sort_keys=True).encode()).hexdigest()[:16]


def differences(home: dict[str, Any], other: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    """``key: home's value vs other's`` for each of ``keys`` (and each machine field) on which they differ."""
    flat = [(k, home.get(k), other.get(k)) for k in keys if k != "machine"]
    if "machine" in keys:
        machines = home.get("machine") or {}, other.get("machine") or {}
        flat += [(f"machine.{k}", machines[0].get(k), machines[1].get(k)) for k in sorted({*machines[0], *machines[1]})]
    return [f"{key}: {a} vs {b}" for key, a, b in flat if a != b]

