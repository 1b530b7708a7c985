"""Preparing the presets' corpus: the BERT-base presets' data path on local files shaped like their two Hub sources.

    python -m benchmarks.data_prep --corpus=PATH/TO/corpus --sizes_mchars='[75, 300]' --num_procs='[1, 2]'

1. Files: ``SIZE`` million characters of ``CORPUS/wiki.jsonl`` (articles) and ``CORPUS/books.jsonl`` (whole books),
   repeated as needed, in the presets' mixture (2.5 : 0.8 words): ``wiki.jsonl`` one article a row
   (wikimedia/wikipedia's shape), ``books.jsonl`` one sentence a row in book order (bookcorpus/bookcorpus's shape).
   Written once per size under ``work_dir`` (git-ignored), streamed, never held in memory.
2. Preparation: the preset's ``data`` section (``weight_by: words``, ``rows_per_document: 256`` for the books,
   128-token NSP instances) on these files with a local 30,522-token uncased WordPiece (bert-base-uncased is not
   downloadable here; the same size and normalisation), each ``data.num_proc`` in a fresh process and cache: time
   per phase (reading into Arrow, grouping the book rows, mixing, splitting; making the instances), corpus tokens
   per second, peak resident memory of the main process and of the largest worker (``resource.getrusage``), disk
   of the prepared instances and of datasets' own cache.
3. Time to the first training batch from the prepared cache (a fresh process: find the cache, build the DataLoader
   of pretrain/run.py), and in streaming mode (``data.streaming``: hold out the validation documents, fill the
   shuffle buffer, make the first instances), with the streamed throughput and memory over ``stream_batches``.
4. What grows with the number of documents and rows rather than characters: reading, grouping, mixing and splitting
   two sources of ``scaling_rows`` short rows each (one a document, and 256 rows a document) at two sizes, peak
   memory and time; the slope is the cost per row at the presets' 6.4M articles and 74M BookCorpus rows.

Results go to a JSON file; the table printed at the end is the one in BENCHMARKS.md ("Preparing the corpus").
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import resource
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import write_results
from pretrain.common.atomic import writing
from pretrain.common.cli import parse, require, run_cli
from pretrain.common.reporting import format_table

# The presets' mixture: 2.5B words of Wikipedia to 0.8B of BookCorpus (original BERT's corpus).
WIKI_SHARE = 2.5 / 3.3


@dataclass(kw_only=True)
class DataPrepConfig:
    """The BERT-base presets' data path on local files shaped like their Hub sources (see the module docstring)."""

    corpus: str
    """Folder with wiki.jsonl (articles) and books.jsonl (whole books), {"text": ...} per line."""
    preset: str = "configs/pretrain/bert_base_post_ln.yaml"
    """Pretraining preset whose data section is measured (its sources are replaced by the local files)."""
    sizes_mchars: list[float] = field(default_factory=lambda: [75.0, 300.0])
    """Corpus sizes to measure, in millions of characters of text."""
    num_procs: list[int] = field(default_factory=lambda: [1, 2])
    """data.num_proc settings to measure at every size."""
    tokenizer: str | None = None
    """Tokenizer folder; null: a 30,522-token uncased WordPiece trained once on the corpus (kept in work_dir)."""
    work_dir: str = "benchmarks/results/data_prep_work"
    """Where the files, the tokenizer and the caches go (git-ignored; caches are deleted after each size)."""
    batch: int = 32
    """Per-device batch (the presets': 32)."""
    stream_batches: int = 200
    """Batches read in streaming mode to measure its throughput."""
    first_batch: bool = True
    """Measure the time to the first batch (prepared and streamed) at every size."""
    scaling_rows: list[int] = field(default_factory=lambda: [1_000_000, 4_000_000])
    """Rows per source of the per-document memory check (4.): short one-line documents, so that what grows with
    the number of documents and rows (not characters) shows; [] skips it."""
    seed: int = 0
    """train.seed of the preparation."""
    out: str | None = None
    """JSON path; null: benchmarks/results/data_prep-<time>.json."""

    def __post_init__(self) -> None:
        require(bool(self.sizes_mchars) and min(self.sizes_mchars) > 0, "sizes_mchars", "must list sizes > 0")
        require(bool(self.num_procs) and min(self.num_procs) >= 1, "num_procs", "must list numbers >= 1")
        require(self.batch >= 1 and self.stream_batches >= 1, "batch", "and stream_batches must be >= 1")


def _rows(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


def _write_repeated(out: Path, rows: Any, target_chars: int) -> dict[str, int]:
    """Rows from ``rows()`` (a fresh iterator per pass) written as {"text": ...} lines until ``target_chars``."""
    chars = words = n = passes = 0
    with writing(out) as tmp, tmp.open("w", encoding="utf-8") as f:
        while chars < target_chars:
            passes += 1
            for text in rows():
                f.write(json.dumps({"text": text}) + "\n")
                chars += len(text)
                words += len(text.split())
                n += 1
                if chars >= target_chars:
                    break
    return {"rows": n, "chars": chars, "words": words, "passes": passes}


def build_files(corpus: Path, folder: Path, mchars: float) -> dict[str, Any]:
    """wiki.jsonl (an article a row) and books.jsonl (a sentence a row, book order) of ``mchars`` million
    characters in the presets' word mixture, written once per size."""
    from pretrain.data.instances import split_sentences

    folder.mkdir(parents=True, exist_ok=True)
    info_path = folder / "files.json"
    if info_path.is_file():
        return json.loads(info_path.read_text())
    total = int(mchars * 1e6)

    def sentences() -> Any:
        for book in _rows(corpus / "books.jsonl"):
            for line in book.split("\n"):
                yield from split_sentences(line)

    info = {
        "wiki": _write_repeated(folder / "wiki.jsonl", lambda: _rows(corpus / "wiki.jsonl"), int(WIKI_SHARE * total)),
        "books": _write_repeated(folder / "books.jsonl", sentences, total - int(WIKI_SHARE * total)),
    }
    info["bytes"] = sum((folder / f).stat().st_size for f in ("wiki.jsonl", "books.jsonl"))
    info_path.write_text(json.dumps(info))
    return info


def train_tokenizer(corpus: Path, folder: Path) -> str:
    """A bert-base-uncased-sized WordPiece (30,522, lowercase, accents stripped) trained on the corpus, once."""
    from pretrain.data.tokenizer import train_wordpiece_tokenizer

    if not (folder / "tokenizer.json").is_file():
        texts = (t for name in ("wiki.jsonl", "books.jsonl") for t in _rows(corpus / name))
        train_wordpiece_tokenizer(texts, vocab_size=30522, lowercase=True).save_pretrained(folder)
    return str(folder)


def _config(preset: str, files: Path, tokenizer: str, cache: Path, num_proc: int, *extra: str) -> Any:
    from pretrain.config import parse_args

    wiki, books = parse_args(["--config", preset]).data.sources  # with their weights and rows_per_document
    sources = [
        {"kind": "json", "path": str(files / "wiki.jsonl"), "weight": wiki.weight},
        {"kind": "json", "path": str(files / "books.jsonl"), "weight": books.weight,
         "rows_per_document": books.rows_per_document},
    ]  # fmt: skip
    return parse_args(
        ["--config", preset, f"--data.sources={json.dumps(sources)}", f"--data.tokenizer={tokenizer}",
         f"--data.num_proc={num_proc}", f"--data.cache_dir={cache}", *extra]
    )  # fmt: skip


def _peak_mb() -> dict[str, float]:
    """Peak resident memory (MiB) of this process and of its largest finished child (the pool's workers), and the
    CPU seconds (user + system) of this process and of all its finished children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"main_peak_mb": own.ru_maxrss / 1024, "worker_peak_mb": children.ru_maxrss / 1024,
            "main_cpu_s": own.ru_utime + own.ru_stime, "workers_cpu_s": children.ru_utime + children.ru_stime}


def _anon_mb(process: psutil.Process) -> float:
    """Anonymous resident MiB (RssAnon: resident less file-backed and shared pages); 0 once the process ended."""
    with contextlib.suppress(psutil.Error):
        memory = process.memory_info()
        return (memory.rss - memory.shared) / 2**20
    return 0.0


@contextlib.contextmanager
def anonymous_memory() -> Iterator[dict[str, float]]:
    """Peak anonymous resident memory (MiB) of this process ("main") and of its largest child ("worker"), sampled
    every 0.2 s. Unlike the peak RSS it leaves out the pages of memory-mapped files (the Arrow caches), which the
    kernel drops when memory is short: it is what a process holds."""
    peaks, stop, me = {"main": 0.0, "worker": 0.0}, threading.Event(), psutil.Process()

    def sample() -> None:
        while not stop.wait(0.2):
            peaks["main"] = max(peaks["main"], _anon_mb(me))
            peaks["worker"] = max([peaks["worker"], *map(_anon_mb, me.children(recursive=True))])

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peaks
    finally:
        stop.set()
        thread.join()


def _disk(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def measure_preparation(preset: str, files: str, tokenizer: str, cache: str, num_proc: int, seed: int) -> dict:
    """One preparation, phase by phase (runs in a fresh process)."""
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    from pretrain.data.corpus import load_documents, split_documents
    from pretrain.data.instance_cache import prepare_instances, prepared_dir
    from pretrain.data.tokenizer import load_or_train_tokenizer

    cfg = _config(preset, Path(files), tokenizer, Path(cache), num_proc).data
    after_imports = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with anonymous_memory() as anon:
        t0 = time.perf_counter()
        docs = load_documents(cfg, seed=seed)
        t1 = time.perf_counter()
        train, val = split_documents(docs, cfg, seed=seed)
        t2 = time.perf_counter()
        tok = load_or_train_tokenizer(cfg, seed=seed)
        folder = prepared_dir(cfg, tok, seed=seed)
        t3 = time.perf_counter()
        before = _peak_mb()
        summary = prepare_instances(lambda: (train, val), tok, cfg, seed=seed, folder=folder)
        t4 = time.perf_counter()
        after = _peak_mb()
    # CPU seconds of the instance phase, all processes (the pool's workers have exited: they are counted).
    instances_cpu_s = sum(after[k] - before[k] for k in ("main_cpu_s", "workers_cpu_s"))
    splits = ("train", "validation")
    return {
        "num_proc": num_proc, "documents": len(docs),
        "load_mix_s": t1 - t0, "split_s": t2 - t1, "instances_s": t4 - t3, "instances_cpu_s": instances_cpu_s,
        "total_s": t4 - t0,
        "corpus_tokens": sum(s["document_tokens"] for p in splits for s in summary[p]["by_source"].values()),
        "instances": sum(summary[p]["instances"] for p in splits),
        "real_tokens": sum(summary[p]["real_tokens"] for p in splits),
        "padding_fraction": summary["train"]["padding_fraction"], "by_source": summary["train"]["by_source"],
        "instances_bytes": _disk(folder), "hf_cache_bytes": _disk(Path(cache) / "hf"),
        "main_anon_peak_mb": anon["main"], "worker_anon_peak_mb": anon["worker"],
        "rss_start_mb": baseline, "rss_after_imports_mb": after_imports, **_peak_mb(),
    }  # fmt: skip


def measure_first_batch(preset: str, files: str, tokenizer: str, cache: str, batch: int, streaming: bool,
                        stream_batches: int, seed: int) -> dict:  # fmt: skip
    """Time to the first training batch (fresh process), from the prepared cache or streamed; in streaming mode
    also the throughput over ``stream_batches`` batches."""
    from pretrain.data.loaders import build_dataloaders
    from pretrain.data.pipeline import build_pretraining_data

    extra = [f"--train.per_device_batch_size={batch}", "--train.num_workers=0", f"--train.seed={seed}",
             *(["--data.streaming=true"] if streaming else [])]  # fmt: skip
    cfg = _config(preset, Path(files), tokenizer, Path(cache), 1, *extra)
    t0 = time.perf_counter()
    data = build_pretraining_data(cfg.data, seed=seed)
    t1 = time.perf_counter()
    batches = iter(build_dataloaders(cfg, data, 1).train)
    first = next(batches)
    t2 = time.perf_counter()
    result = {"streaming": streaming, "data_s": t1 - t0, "first_batch_s": t2 - t0,
              "batch_shape": list(first["input_ids"].shape)}  # fmt: skip
    if streaming:
        tokens, start = 0, time.perf_counter()
        for b in islice(batches, stream_batches):
            tokens += int(b["attention_mask"].sum())
        seconds = time.perf_counter() - start
        result.update({"stream_batches": stream_batches, "stream_s": seconds, "stream_instances_per_s":
                       stream_batches * batch / seconds, "stream_real_tokens_per_s": tokens / seconds})  # fmt: skip
    result.update(_peak_mb())
    return result


def measure_rows(folder: str, rows: int, seed: int) -> dict:
    """Read, group, mix and split two sources of ``rows`` short rows each (fresh process): peak memory and times."""
    from pretrain.data.config import DataConfig, SourceConfig
    from pretrain.data.corpus import load_documents, load_source, split_documents

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    paths = [Path(folder) / f"{name}-{rows}.jsonl" for name in ("articles", "sentences")]
    for path in paths:
        if not path.is_file():
            with path.open("w") as f:
                f.writelines(f'{{"text": "Row {k} of the file is a short sentence."}}\n' for k in range(rows))
    sources = [SourceConfig(kind="json", path=str(paths[0]), weight=2.5),
               SourceConfig(kind="json", path=str(paths[1]), weight=0.8, rows_per_document=256)]  # fmt: skip
    cfg = DataConfig(sources=sources, weight_by="words", cache_dir=str(Path(folder) / f"cache-{rows}"))
    with anonymous_memory() as anon:
        t0 = time.perf_counter()
        articles = load_source(sources[0], 0, cfg)
        t1 = time.perf_counter()
        books = load_source(sources[1], 1, cfg)
        t2 = time.perf_counter()
        docs = load_documents(cfg, seed=seed)  # the sources again (from datasets' cache), then the mixture
        split_documents(docs, cfg, seed=seed)
        t3 = time.perf_counter()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    shutil.rmtree(cfg.cache_dir, ignore_errors=True)
    return {"rows_per_source": rows, "articles": len(articles), "book_documents": len(books),
            "mixed_documents": len(docs), "read_articles_s": t1 - t0, "read_group_books_s": t2 - t1,
            "mix_split_s": t3 - t2, "rss_after_imports_mb": base, "peak_mb": peak,
            "anon_peak_mb": anon["main"]}  # fmt: skip


def in_fresh_process(fn: Any, *args: Any) -> dict:
    """``fn(*args)`` in a spawned process (its own peak memory, nothing cached in memory from before)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:  # may start its own
        return pool.submit(fn, *args).result()


def main(cfg: DataPrepConfig) -> dict[str, Any]:
    work, corpus = Path(cfg.work_dir), Path(cfg.corpus)
    found = all((corpus / name).is_file() for name in ("wiki.jsonl", "books.jsonl"))
    require(found, "corpus", f"must be a folder with wiki.jsonl and books.jsonl ({corpus})")
    start = time.perf_counter()
    tokenizer = cfg.tokenizer or train_tokenizer(corpus, work / "tokenizer")
    results: dict[str, Any] = {"config": vars(cfg), "tokenizer_s": time.perf_counter() - start, "sizes": []}
    out = cfg.out
    for mchars in cfg.sizes_mchars:
        files = work / f"files-{mchars:g}M"
        size: dict[str, Any] = {"mchars": mchars, "files": build_files(corpus, files, mchars), "prepare": []}
        results["sizes"].append(size)
        for num_proc in cfg.num_procs:
            cache = work / f"cache-{mchars:g}M-{num_proc}"
            shutil.rmtree(cache, ignore_errors=True)
            run = in_fresh_process(measure_preparation, cfg.preset, str(files), tokenizer, str(cache), num_proc,
                                   cfg.seed)  # fmt: skip
            size["prepare"].append(run)
            print(json.dumps(run)[:600], flush=True)
            if cfg.first_batch and num_proc == cfg.num_procs[-1]:  # keep the last cache for the first-batch measurement
                stream_cache = work / f"cache-{mchars:g}M-stream"
                for key, folder, streaming in (("first_batch", cache, False), ("stream", stream_cache, True)):
                    size[key] = in_fresh_process(measure_first_batch, cfg.preset, str(files), tokenizer, str(folder),
                                                 cfg.batch, streaming, cfg.stream_batches, cfg.seed)  # fmt: skip
                print(json.dumps(size["first_batch"]), json.dumps(size["stream"]), flush=True)
                shutil.rmtree(stream_cache, ignore_errors=True)
            shutil.rmtree(cache, ignore_errors=True)
        results["path"] = str(write_results("data_prep", results, out))
        out = results["path"]  # one file, rewritten after every size
    if cfg.scaling_rows:
        (work / "rows").mkdir(parents=True, exist_ok=True)
        results["rows"] = [in_fresh_process(measure_rows, str(work / "rows"), n, cfg.seed) for n in cfg.scaling_rows]
        results["path"] = str(write_results("data_prep", results, out))
    print(report(results))
    return results


def report(results: dict[str, Any]) -> str:
    rows = [[
        f"{size['mchars']:g}M chars", run["num_proc"], f"{run['corpus_tokens'] / 1e6:.1f}M", f"{run['load_mix_s']:.0f}",
        f"{run['instances_s']:.0f}", f"{run['total_s']:.0f}",
        f"{run['corpus_tokens'] / run['instances_s'] / run['num_proc'] / 1e3:.0f}k",
        f"{run['corpus_tokens'] / run['instances_cpu_s'] / 1e3:.0f}k",
        f"{run['main_peak_mb']:.0f} ({run['main_anon_peak_mb']:.0f})",
        f"{run['worker_peak_mb']:.0f} ({run['worker_anon_peak_mb']:.0f})" if run["num_proc"] > 1 else "-",
        f"{run['instances_bytes'] / run['real_tokens'] * 1e9 / 2**30:.1f}",
    ] for size in results["sizes"] for run in size["prepare"]]  # fmt: skip
    table = format_table(
        ["corpus", "num_proc", "corpus tokens", "read+mix s", "instances s", "total s", "tok/s per process",
         "tok per CPU-s", "main peak MiB (anon)", "worker peak MiB (anon)", "GiB per 1B tokens"], rows,
        style="markdown",
    )  # fmt: skip
    lines = [table, ""]
    for size in results["sizes"]:
        fb, st = size.get("first_batch"), size.get("stream")
        if fb and st:
            lines.append(
                f"{size['mchars']:g}M chars: first batch from the prepared cache {fb['first_batch_s']:.1f} s (peak "
                f"{fb['main_peak_mb']:.0f} MiB); streaming: first batch {st['first_batch_s']:.1f} s, then "
                f"{st['stream_real_tokens_per_s'] / 1e3:.0f}k real tokens/s ({st['stream_instances_per_s']:.0f} "
                f"instances/s), peak {st['main_peak_mb']:.0f} MiB"
            )
    for r in results.get("rows", []):
        lines.append(
            f"{r['rows_per_source']:,} rows a source -> {r['mixed_documents']:,} mixed documents: read "
            f"{r['read_articles_s']:.0f} s, read + group 256 {r['read_group_books_s']:.0f} s, mix + split "
            f"{r['mix_split_s']:.0f} s, peak {r['peak_mb']:.0f} MiB (after imports {r['rss_after_imports_mb']:.0f}), "
            f"anonymous {r['anon_peak_mb']:.0f} MiB"
        )
    return "\n".join(lines)


def cli(argv: list[str] | None = None) -> int:
    main(parse(DataPrepConfig, argv, prog="python -m benchmarks.data_prep", description=__doc__ or ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(cli))
