"""The prepared-instance cache under ``data.cache_dir``: one folder per cache key (a hash of everything the
instances depend on), made shard by shard by several processes, resumable after a kill, one preparation at a time
per key (a lock), published atomically. The instances themselves are made by pretrain/data/instances.py.

    cached_instances -> prepared_dir (data_cache_key) -> prepare_instances -> shards -> summary.json -> shards loaded

Arrow files carry no checksum, so summary.json records each shard's size, modification time and SHA-256: a shard
whose size or time changed since is checked against its checksum before it is used (a copy that kept no times is
checked at each start; one whose bytes changed is damaged, and made again).
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import datasets
import pyarrow.compute as pc
from datasets.arrow_writer import ArrowWriter
from tokenizers import Tokenizer
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerFast

from pretrain.common.atomic import is_damage, publish_dir, write_json, writing
from pretrain.common.roles import not_keyed_in
from pretrain.data.cache import CACHE_FORMAT_VERSION, content_hash, exclusive_lock
from pretrain.data.config import DataConfig
from pretrain.data.corpus import source_fingerprint
from pretrain.data.instances import (
    DOCS_PER_CHUNK,
    SourceStats,
    add_chunk_instances,
    empty_columns,
    instance_features,
    plain_backend,
)
from pretrain.data.tokenizer import pipeline_hash
from pretrain.run_folder.manifest import sha256_file

# DataConfig fields that do not change the instances (not keyed_in "instances"): those acting on batches, the
# mechanics, ``streaming`` (never cached) and the tokenizer's name (it enters the key by content, pipeline_hash).
_FIELDS_NOT_IN_KEY = not_keyed_in(DataConfig, "instances")
# Chunks per shard at most: the unit of resumption, of the work handed to each process and of the progress bar.
# 64 chunks = 16,384 documents, about 10M tokens of Wikipedia, a minute for one core (BENCHMARKS.md). Not part of
# the cache key: the instances do not depend on it, only their grouping into files.
SHARD_CHUNKS = 64
SUMMARY_FILE = "summary.json"
PARTS = ("train", "validation")


def data_cache_key(cfg: DataConfig, tokenizer: PreTrainedTokenizerFast, *, seed: int) -> str:
    """Hash of everything the instances depend on: sources' content ids, the tokenizer, the config, the seed."""
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in _FIELDS_NOT_IN_KEY}
    fields["sources"] = [source_fingerprint(s, i) for i, s in enumerate(cfg.sources)]
    tokenizer_id = pipeline_hash(tokenizer)
    return content_hash({"version": CACHE_FORMAT_VERSION, "docs_per_chunk": DOCS_PER_CHUNK, "config": fields,
                         "tokenizer": tokenizer_id, "seed": seed})  # fmt: skip


def prepared_dir(cfg: DataConfig, tokenizer: PreTrainedTokenizerFast, *, seed: int) -> Path:
    """The folder the prepared instances of this config live in (complete once it holds SUMMARY_FILE)."""
    return Path(cfg.cache_dir) / f"instances-{data_cache_key(cfg, tokenizer, seed=seed)}"


def cached_instances(documents: Callable[[], tuple[datasets.Dataset, datasets.Dataset]],
                     tokenizer: PreTrainedTokenizerFast, cfg: DataConfig, *, seed: int, folder: Path,
                     progress: bool = False) -> tuple[datasets.Dataset, datasets.Dataset]:  # fmt: skip
    """(train, validation) instances from ``folder`` (``prepared_dir`` of these arguments); on a miss they are made
    first from ``documents()`` (the training and validation documents, read only then), shard by shard, for every
    later call."""
    prepare = partial(prepare_instances, documents, tokenizer, cfg, seed=seed, folder=folder, progress=progress)
    if not (folder / SUMMARY_FILE).is_file():
        # One preparation at a time per cache key: runs started side by side (the analysis grid) wait for the
        # first and reuse its result. The lock goes with its process, so a killed preparation blocks nobody.
        with exclusive_lock(_lock_path(folder)):
            if not (folder / SUMMARY_FILE).is_file():
                if folder.exists():  # published whole, with its summary: one without it was damaged since
                    _set_aside(folder, DamagedEntry(folder, FileNotFoundError(f"no {SUMMARY_FILE}")))
                prepare()
    try:
        return _load(folder)
    except DamagedEntry:
        # Under the lock, so that one process makes it again and the others reuse it.
        with exclusive_lock(_lock_path(folder)):
            try:
                return _load(folder)
            except DamagedEntry as err:
                _set_aside(folder, err)
                prepare()
        return _load(folder)


def _set_aside(folder: Path, err: DamagedEntry) -> None:
    """A damaged entry is kept beside the one made again: derived data, made again as it was made (the instances do
    not depend on processes or shards)."""
    aside = folder.with_name(f"{folder.name}.damaged-{time.time_ns()}")
    folder.rename(aside)
    print(f"warning: {err}: moved to {aside}; the instances are made again from the corpus", flush=True)


def is_finished(folder: Path) -> bool:
    """Whether ``folder`` holds a finished entry whose files can be read (a damaged one is made again)."""
    try:
        _load(folder)
    except (DamagedEntry, FileNotFoundError):
        return False
    return True


def _lock_path(folder: Path) -> Path:
    return folder.with_name(f"{folder.name}.lock")


def _load(folder: Path) -> tuple[datasets.Dataset, datasets.Dataset]:
    """The (train, validation) shard files of a finished entry, memory-mapped, in order; DamagedEntry if they
    cannot be read."""
    summary = read_summary(folder)
    loaded = []
    try:
        for name in PARTS:
            _check_shards(folder / name, summary[name]["shards"])
            shards = [datasets.Dataset.from_file(str(folder / name / f)) for f in summary[name]["shards"]]
            for shard in shards:
                # Arrow's offsets, checked (over rows, not bytes: 6 ms for a 656 MB shard of 1M instances): a flipped
                # bit among them, unseen by _check_shards where the time was kept, sends reads out of the mapped file.
                shard.data.table.validate(full=True)
            loaded.append(shards[0] if len(shards) == 1 else datasets.concatenate_datasets(shards))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        if not is_damage(err):
            raise
        raise DamagedEntry(folder, err) from None
    return loaded[0], loaded[1]


def _shard_record(path: Path) -> dict[str, Any]:
    """A shard's "size" and "sha256", as a manifest lists a file (pretrain/run_folder/manifest.py), and its time."""
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256_file(path)}


def _check_shards(part_dir: Path, records: dict[str, dict[str, Any]]) -> None:
    """ValueError naming the first shard of ``part_dir`` whose bytes are not those ``records`` (the summary's) holds.
    A shard with the size and modification time it was made with is not read: hashing a large cache at every start
    of every process would cost minutes; one overwritten in place has a new time."""
    changed = {}
    for name, record in records.items():
        stat = (part_dir / name).stat()
        if stat.st_size != record["size"]:
            raise ValueError(f"shard {part_dir.name}/{name} has {stat.st_size} bytes, it was made with {record['size']}")
        if stat.st_mtime_ns != record["mtime_ns"]:
            changed[name] = (str(part_dir / name), stat.st_size, stat.st_mtime_ns)
    if new := [name for name, key in changed.items() if key not in _digests]:
        print(f"checking {len(new)} shard(s) of {part_dir} against their checksums: modified since they were made "
              "(or copied without their times: cp -p, rsync -t keep them)", flush=True)  # fmt: skip
    for name, key in changed.items():
        if key not in _digests:
            _digests[key] = sha256_file(part_dir / name)
        if _digests[key] != records[name]["sha256"]:
            raise ValueError(f"shard {part_dir.name}/{name} does not match its checksum (its bytes were changed)")


# The checksums this process computed, by (path, size, modification time): a shard is read once however often its
# entry is loaded (the readiness check, then the load).
_digests: dict[tuple[str, int, int], str] = {}


def read_summary(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / SUMMARY_FILE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DamagedEntry(folder, err) from None


class DamagedEntry(ValueError):
    """A cache entry that cannot be read: it was published whole, atomically, so it was damaged since."""

    def __init__(self, folder: Path, err: Exception) -> None:
        super().__init__(f"the prepared instances in {folder} cannot be read ({type(err).__name__}: {err})")


def _write_shard(docs: datasets.Dataset, path: Path, *, first_chunk: int, tokenizer_json: str, cfg: DataConfig,
                 seed: int, part: str) -> dict[int, SourceStats]:  # fmt: skip
    """The instances of ``docs`` (consecutive chunks from ``first_chunk`` on) written to ``path`` (Arrow file),
    then their per-source counts to ``path.with_suffix(".json")``, the shard's completion marker. Both are
    written under temporary names and renamed, so a killed process leaves no shard that looks complete."""
    tokenizer = Tokenizer.from_str(tokenizer_json)  # plain_backend's: no truncation, no padding
    stats: dict[int, SourceStats] = {}
    with writing(path) as tmp, ArrowWriter(features=instance_features(cfg.objective), path=str(tmp)) as writer:
        for k, batch in enumerate(docs.iter(batch_size=DOCS_PER_CHUNK)):
            out = empty_columns(cfg.objective)
            add_chunk_instances(out, batch["text"], first_chunk + k, tokenizer=tokenizer, cfg=cfg, seed=seed,
                                part=part, sources=batch["source"], stats=stats)  # fmt: skip
            writer.write_batch(out)
        writer.finalize()
    write_json(path.with_suffix(".json"), {str(k): dataclasses.asdict(v) for k, v in sorted(stats.items())})
    return stats


def shard_chunks(train_documents: int, num_proc: int) -> int:
    """Chunks per shard: SHARD_CHUNKS, or fewer for a small corpus, so that every process gets a few shards."""
    chunks = -(-train_documents // DOCS_PER_CHUNK)
    return max(1, min(SHARD_CHUNKS, -(-chunks // (4 * num_proc))))


@dataclass(frozen=True)
class _ShardJob:
    part: str  # "train" or "validation"
    docs: datasets.Dataset
    path: Path  # the shard's Arrow file; path.with_suffix(".json") is its completion marker
    first_chunk: int


def prepare_instances(documents: Callable[[], tuple[datasets.Dataset, datasets.Dataset]],
                      tokenizer: PreTrainedTokenizerFast, cfg: DataConfig, *, seed: int, folder: Path,
                      progress: bool = False) -> dict[str, Any]:  # fmt: skip
    """Make the training and validation instances into ``folder`` and return the summary.

    The work goes to ``folder`` + ".partial-N", one shard (N chunks of documents, shard_chunks) per Arrow file, with
    ``data.num_proc`` processes; a rerun after a kill reuses the finished shards. When all are done the summary
    is written and the folder renamed into place. The result does not depend on num_proc or SHARD_CHUNKS.
    """
    train_docs, val_docs = documents()
    chunks_per_shard = shard_chunks(len(train_docs), cfg.num_proc)
    # The shard size is in the name: finished shards are only reused with the document ranges they were made for.
    partial_dir = folder.with_name(f"{folder.name}.partial-{chunks_per_shard}")
    step = chunks_per_shard * DOCS_PER_CHUNK
    jobs = []
    for name, docs in zip(PARTS, (train_docs, val_docs), strict=True):
        (partial_dir / name).mkdir(parents=True, exist_ok=True)
        for index, start in enumerate(range(0, len(docs), step)):
            rows = docs.select(range(start, min(start + step, len(docs))))
            jobs.append(_ShardJob(name, rows, partial_dir / name / f"shard-{index:05d}.arrow", start // DOCS_PER_CHUNK))
    stats = _make_shards(jobs, plain_backend(tokenizer).to_str(), cfg, seed=seed, progress=progress)
    for name in PARTS:
        if sum(s.document_tokens for s in stats[name].values()) == 0:
            raise ValueError(f"no {name} instances could be made: the {name} documents hold no tokens")
    for leftover in partial_dir.glob("*/.*.tmp"):  # temporary files of a killed attempt (every shard is finished now)
        leftover.unlink(missing_ok=True)
    made_for = {key: getattr(cfg, key) for key in ("max_seq_length", "objective", "weight_by")}
    summary = {
        "config": {**made_for, "sources": [dataclasses.asdict(s) for s in cfg.sources]},
        "seed": seed,
        **{name: _part_summary(partial_dir / name, stats[name], cfg.max_seq_length) for name in PARTS},
        "disk_bytes": sum(p.stat().st_size for p in partial_dir.rglob("*") if p.is_file()),
    }
    write_json(partial_dir / SUMMARY_FILE, summary)
    if not publish_dir(partial_dir, folder):  # another process (another node) finished it first; identical content
        if not (folder / SUMMARY_FILE).is_file():
            raise FileExistsError(f"{folder} holds no {SUMMARY_FILE}: not a finished preparation; remove it")
        shutil.rmtree(partial_dir, ignore_errors=True)
    return summary


def _make_shards(
    jobs: list[_ShardJob], tokenizer_json: str, cfg: DataConfig, *, seed: int, progress: bool
) -> dict[str, dict[int, SourceStats]]:
    """Make the shards not finished yet (``data.num_proc`` processes) and return the per-source counts of every
    shard, by part: the finished ones' read from their markers."""
    stats: dict[str, dict[int, SourceStats]] = {name: {} for name in PARTS}

    def collect(job: _ShardJob, shard_stats: dict[int, SourceStats]) -> None:
        for source, counts in shard_stats.items():
            stats[job.part].setdefault(source, SourceStats()).add(counts)

    todo = []
    for job in jobs:
        marker = job.path.with_suffix(".json")
        try:
            collect(job, {int(k): SourceStats(**v) for k, v in json.loads(marker.read_text()).items()})
        except FileNotFoundError:
            todo.append(job)
        except (ValueError, TypeError, AttributeError) as err:  # written whole after its shard: damaged since
            print(f"{marker} is damaged ({err}): its shard is made again", flush=True)
            todo.append(job)
    total = sum(len(job.docs) for job in jobs)
    initial = total - sum(len(job.docs) for job in todo)
    bar = tqdm(total=total, initial=initial, unit="doc", desc="Preparing instances", disable=not progress,
               dynamic_ncols=True)  # fmt: skip
    if len(todo) < len(jobs):
        done = len(jobs) - len(todo)
        bar.write(f"resuming: {done} of {len(jobs)} shards already made in {jobs[0].path.parent.parent}")
    write = partial(_write_shard, tokenizer_json=tokenizer_json, cfg=cfg, seed=seed)
    with bar:
        if cfg.num_proc == 1 or len(todo) <= 1:
            for job in todo:
                collect(job, write(job.docs, job.path, first_chunk=job.first_chunk, part=job.part))
                bar.update(len(job.docs))
            return stats
        # spawn, not fork: the parent may hold Rust tokenizer threads, which a forked child inherits locked.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(cfg.num_proc, len(todo)), mp_context=context) as pool:
            futures = {
                pool.submit(write, job.docs, job.path, first_chunk=job.first_chunk, part=job.part): job for job in todo
            }
            for future in as_completed(futures):
                collect(futures[future], future.result())
                bar.update(len(futures[future].docs))
    return stats


def _part_summary(part_dir: Path, stats: dict[int, SourceStats], max_seq_length: int) -> dict[str, Any]:
    """Shards (each with its size, time and checksum), instances, real tokens and padding (against
    max_seq_length-token rows) of one part, counted from its files (the offsets of the input_ids column only, not the
    tokens), and the per-source counts."""
    files = sorted(p.name for p in part_dir.glob("shard-*.arrow"))
    instances = real_tokens = 0
    for f in files:
        column = datasets.Dataset.from_file(str(part_dir / f)).data.column("input_ids")
        instances += len(column)
        real_tokens += sum(int(pc.sum(pc.list_value_length(c)).as_py() or 0) for c in column.chunks)
    return {
        "shards": {f: _shard_record(part_dir / f) for f in files},
        "instances": instances,
        "real_tokens": real_tokens,
        "padding_fraction": 1 - real_tokens / (instances * max_seq_length) if instances else 0.0,
        "by_source": {str(k): dataclasses.asdict(v) for k, v in sorted(stats.items())},
    }
