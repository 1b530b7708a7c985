"""Data preparation as its own step (pretrain/prepare.py): documents from consecutive rows, the mixture weighted by
words, the per-source next-sentence check, resumable shard-wise preparation, and the refusal to prepare a large
corpus while other processes wait at a barrier. Tiny local files in the two Hub shapes: articles (one document a
row) and a book corpus stored one sentence per row in reading order."""

from __future__ import annotations

import json
import os
import random
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import datasets
import numpy as np
import pytest

import pretrain.data.instance_cache
import pretrain.data.tokenizer
from pretrain.config import parse_args
from pretrain.data.config import DataConfig, SourceConfig
from pretrain.data.corpus import load_documents
from pretrain.data.instance_cache import SUMMARY_FILE, prepared_dir, read_summary
from pretrain.data.pipeline import PreparationRequired, build_pretraining_data, is_prepared
from pretrain.data.vocabulary import with_trained_vocabulary
from pretrain.prepare import format_report, prepare_command, source_checks
from pretrain.prepare import main as prepare_main
from pretrain.run import main as run_main
from pretrain.run_folder.checkpointing import latest_checkpoint
from pretrain.run_folder.layout import read_status
from tests.pretrain_helpers import accelerate_launch, tiny_args
from tests.test_data import WORDS, make_documents, tiny_config, write_jsonl

datasets.disable_progress_bars()
ROOT = Path(__file__).resolve().parents[1]


def write_books(path: Path, n_books: int, sentences_per_book: int, *, seed: int = 0) -> list[list[str]]:
    """A sentence-per-row book corpus in reading order (bookcorpus/bookcorpus's shape): one JSON row per sentence,
    sentence k of book b reads "Book b line k ..." so that its place can be read back."""
    rng = random.Random(seed)
    books = []
    for b in range(n_books):
        books.append(
            [
                f"Book {b} line {k} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))) + "."
                for k in range(sentences_per_book)
            ]
        )
    write_jsonl(path, [s for book in books for s in book])
    return books


def test_rows_per_document_joins_consecutive_rows(tmp_path: Path) -> None:
    rows = [f"Sentence {k} is here." for k in range(10)]
    rows[5] = " "  # an empty row is left out of its group
    path = write_jsonl(tmp_path / "books.jsonl", rows)
    for streaming in (False, True):
        cfg = tiny_config(
            tmp_path, [SourceConfig(kind="json", path=str(path), rows_per_document=4)], streaming=streaming
        )
        docs = list(load_documents(cfg, seed=0))
        groups = [rows[0:4], [rows[4], *rows[6:8]], rows[8:10]]  # rows 4k to 4k + 3
        assert [d["text"] for d in docs] == ["\n".join(group) for group in groups]
        assert {d["source"] for d in docs} == {0}
    # max_documents counts documents (of max_documents * rows_per_document rows at most), not rows.
    cfg = tiny_config(tmp_path, [SourceConfig(kind="json", path=str(path), rows_per_document=3)], max_documents=2)
    capped = load_documents(cfg, seed=0)["text"]
    assert capped[0] == "Sentence 0 is here.\nSentence 1 is here.\nSentence 2 is here." and len(capped) == 2
    with pytest.raises(ValueError, match="rows_per_document=0 must be >= 1"):
        SourceConfig(kind="json", path="x.jsonl", rows_per_document=0)


def _word_share(docs: datasets.Dataset, source: int) -> float:
    words = Counter()
    for row in docs:
        words[row["source"]] += len(row["text"].split())
    return words[source] / sum(words.values())


def test_weight_by_words_gives_each_source_its_share_of_words(tmp_path: Path) -> None:
    rng = random.Random(0)
    long_docs = [" ".join(rng.choice(WORDS) for _ in range(200)) + "." for _ in range(400)]
    short_docs = [" ".join(rng.choice(WORDS) for _ in range(20)) + "." for _ in range(4000)]
    sources = [
        SourceConfig(kind="json", path=str(write_jsonl(tmp_path / "long.jsonl", long_docs)), weight=3.0),
        SourceConfig(kind="json", path=str(write_jsonl(tmp_path / "short.jsonl", short_docs)), weight=1.0),
    ]
    by_words = load_documents(tiny_config(tmp_path, sources, weight_by="words"), seed=0)
    assert _word_share(by_words, 0) == pytest.approx(0.75, abs=0.03)
    by_documents = load_documents(tiny_config(tmp_path, sources), seed=0)
    assert Counter(by_documents["source"])[0] / len(by_documents) == pytest.approx(0.75, abs=0.03)
    assert _word_share(by_documents, 0) > 0.95  # the same weights counted in documents: long documents dominate
    with pytest.raises(ValueError, match=r"data.weight_by='tokens' must be one of documents, words"):
        DataConfig(weight_by="tokens")


def two_shapes(tmp_path: Path, *, rows_per_document: int, **overrides) -> DataConfig:
    """Articles (one a row) and a sentence-per-row book file, mixed 1:1 by words; 12 validation documents (the
    fewest that draw no warning, pretrain/prepare.py: MIN_VALIDATION_DOCUMENTS)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    articles = write_jsonl(tmp_path / "wiki.jsonl", make_documents(150, seed=1))
    books = tmp_path / "books.jsonl"
    write_books(books, n_books=6, sentences_per_book=150)
    sources = [
        SourceConfig(kind="json", path=str(articles)),
        SourceConfig(kind="json", path=str(books), rows_per_document=rows_per_document),
    ]
    overrides = {"validation_documents": 12, **overrides}
    return tiny_config(tmp_path, sources, weight_by="words", max_seq_length=64, **overrides)


def test_check_reports_true_next_fractions_and_warns_on_one_sentence_documents(tmp_path: Path) -> None:
    cfg = two_shapes(tmp_path, rows_per_document=1)
    data = build_pretraining_data(cfg, seed=0)
    summary = read_summary(prepared_dir(cfg, data.tokenizer, seed=0))
    # The per-source counts agree with the instances on disk.
    by_source = summary["train"]["by_source"]
    labels = np.array(data.train["next_sentence_label"])
    assert sum(s["instances"] for s in by_source.values()) == len(data.train) == summary["train"]["instances"]
    assert sum(s["true_next"] for s in by_source.values()) == int((labels == 0).sum())
    assert sum(s["real_tokens"] for s in by_source.values()) == sum(map(len, data.train["input_ids"]))
    rows, warnings = source_checks(summary, cfg)
    books = rows[1]
    assert books["single_sentence_documents"] == 1.0 and books["sentences_per_document"] == 1.0
    assert books["real_tokens_per_instance"] < 0.5 * cfg.max_seq_length
    assert any("1: json" in w and "one sentence" in w and "rows_per_document" in w for w in warnings)
    assert any("1: json" in w and "mostly padding" in w for w in warnings)
    assert not any(w.startswith("source 0:") for w in warnings)
    assert "true next" in format_report(summary, cfg, "X")

    grouped = two_shapes(tmp_path / "grouped", rows_per_document=16)
    data = build_pretraining_data(grouped, seed=0)
    summary = read_summary(prepared_dir(grouped, data.tokenizer, seed=0))
    rows, warnings = source_checks(summary, grouped)
    assert warnings == []
    for row in rows:
        assert row["single_sentence_documents"] == 0.0
        assert row["true_next"] == pytest.approx(0.5, abs=0.1)  # data.nsp_random_prob = 0.5
    assert rows[1]["real_tokens_per_instance"] > 0.7 * grouped.max_seq_length  # books: now long documents


def _summary(tokens: list[int], documents: list[int], validation_documents: int) -> dict:
    """A preparation summary with the per-source counts the mixture checks read."""
    source = {"sentences": 10, "single_sentence_documents": 0, "instances": 100, "true_next": 50, "real_tokens": 12_000}
    return {
        "train": {"instances": 200, "real_tokens": 24_000, "padding_fraction": 0.1,
                  "by_source": {str(i): {**source, "documents": d, "document_tokens": t}
                                for i, (t, d) in enumerate(zip(tokens, documents, strict=True))}},
        "validation": {"instances": 153, "real_tokens": 18_000, "padding_fraction": 0.1,
                       "by_source": {"0": {"documents": validation_documents}}},
        "disk_bytes": 0,
    }  # fmt: skip


def test_check_warns_when_the_mixture_is_not_the_weights_or_validation_is_tiny(tmp_path: Path) -> None:
    # Issue 25: wiki and books at equal weights by documents: 62 articles, 81 books, 97% of the tokens books'.
    sources = [SourceConfig(kind="json", path="wiki.jsonl"), SourceConfig(kind="json", path="books.jsonl")]
    cfg = DataConfig(sources=sources, validation_fraction=0.02)
    rows, warnings = source_checks(_summary([30_000, 970_000], [62, 81], validation_documents=3), cfg)
    assert [round(r["token_share"], 2) for r in rows] == [0.03, 0.97] and rows[1]["target_share"] == 0.5
    assert any(w.startswith("source 1: json books.jsonl: 97.0% of the training tokens against its weight's 50.0% "
                            "(mixed by documents); set data.weight_by=words") for w in warnings)  # fmt: skip
    assert any(w.startswith("the validation split is 3 document(s) (153 instances), fewer than 10") for w in warnings)
    assert "WARNING: the validation split" in format_report(_summary([1, 1], [1, 1], 3), cfg, "X")
    # By words, the shares are the weights' (within the sampling of the mixture), and 40 documents validate.
    by_words = DataConfig(sources=sources, weight_by="words")
    assert source_checks(_summary([480_000, 520_000], [2500, 12], validation_documents=40), by_words)[1] == []
    # A small source far from a small weight counts only past 5 points: 3% for a weight share of 1% is left alone.
    weighted = DataConfig(sources=[sources[0], SourceConfig(kind="json", path="books.jsonl", weight=1 / 99)])
    assert source_checks(_summary([970_000, 30_000], [2500, 12], validation_documents=40), weighted)[1] == []


class Killed(Exception):
    pass


def test_preparation_resumes_from_its_finished_shards(tmp_path: Path, monkeypatch) -> None:
    corpus = write_jsonl(tmp_path / "corpus.jsonl", make_documents(700))
    cfg = tiny_config(tmp_path, [SourceConfig(kind="json", path=str(corpus))])
    monkeypatch.setattr(pretrain.data.instance_cache, "SHARD_CHUNKS", 1)  # 3 training shards of one chunk (256 docs)
    written = []
    write_shard = pretrain.data.instance_cache._write_shard

    def dies_on_the_second_shard(docs, path, **kwargs):
        written.append(path.name)
        if written == ["shard-00000.arrow", "shard-00001.arrow"]:
            raise Killed  # as a kill in the middle of the preparation
        return write_shard(docs, path, **kwargs)

    monkeypatch.setattr(pretrain.data.instance_cache, "_write_shard", dies_on_the_second_shard)
    with pytest.raises(Killed):
        build_pretraining_data(cfg, seed=0)
    assert not is_prepared(cfg, seed=0)
    partial = list(Path(cfg.cache_dir).glob("instances-*.partial-*"))
    assert len(partial) == 1 and sorted(p.name for p in (partial[0] / "train").iterdir()) == ["shard-00000.arrow",
                                                                                      "shard-00000.json"]  # fmt: skip
    (partial[0] / "train" / ".shard-00001.arrow.0badf00d.tmp").write_bytes(b"half a shard")  # as after kill -9
    written.clear()
    (partial[0] / "train" / "shard-00000.json").write_text('{"0": {"docu')  # a finished shard's marker, damaged since

    def records(docs, path, **kwargs):
        written.append(path.name)
        return write_shard(docs, path, **kwargs)

    monkeypatch.setattr(pretrain.data.instance_cache, "_write_shard", records)
    data = build_pretraining_data(cfg, seed=0)
    assert written == ["shard-00000.arrow", "shard-00001.arrow", "shard-00002.arrow", "shard-00000.arrow"]  # then val
    assert is_prepared(cfg, seed=0) and not list(Path(cfg.cache_dir).glob("instances-*.partial-*"))
    assert not list(Path(cfg.cache_dir).glob("instances-*/*/.*.tmp"))

    # The same instances as a preparation in one go.
    monkeypatch.setattr(pretrain.data.instance_cache, "_write_shard", write_shard)
    data.tokenizer.save_pretrained(tmp_path / "tok")
    fresh = build_pretraining_data(
        tiny_config(tmp_path / "fresh", cfg.sources, tokenizer=str(tmp_path / "tok")), seed=0
    )
    assert (
        fresh.train["input_ids"] == data.train["input_ids"] and fresh.train["instance_id"] == data.train["instance_id"]
    )
    assert fresh.validation["input_ids"] == data.validation["input_ids"]


@pytest.mark.slow
def test_prepared_instances_do_not_depend_on_processes_or_shards(tmp_path: Path, monkeypatch) -> None:
    """data.num_proc=2 (spawned processes, one shard each at a time) and one-chunk shards give the instances of one
    process making one shard."""
    corpus = write_jsonl(tmp_path / "corpus.jsonl", make_documents(700))
    cfg = tiny_config(tmp_path, [SourceConfig(kind="json", path=str(corpus))])
    with monkeypatch.context() as m:
        m.setattr(pretrain.data.instance_cache, "shard_chunks", lambda *_: 64)  # one shard of all 3 chunks
        one = build_pretraining_data(cfg, seed=0)
    one.tokenizer.save_pretrained(tmp_path / "tok")
    assert pretrain.data.instance_cache.shard_chunks(700, 2) == 1  # a small corpus: shards of one chunk for 2 processes
    two = build_pretraining_data(
        tiny_config(tmp_path / "two", cfg.sources, num_proc=2, tokenizer=str(tmp_path / "tok")), seed=0
    )
    assert len(read_summary(prepared_dir(cfg, one.tokenizer, seed=0))["train"]["shards"]) == 1
    assert len(list((tmp_path / "two" / "cache").glob("instances-*/train/shard-*.arrow"))) == 3
    assert two.train["input_ids"] == one.train["input_ids"] and two.train["instance_id"] == one.train["instance_id"]
    assert two.validation["input_ids"] == one.validation["input_ids"]


def test_several_processes_refuse_to_prepare_a_large_corpus(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "corpus.jsonl", make_documents(120))
    large = tiny_config(tmp_path, [SourceConfig(kind="json", path=str(corpus))], max_inline_preparation_mb=0)
    # The message gives the run's own barrier timeout, not a default.
    with pytest.raises(PreparationRequired, match=r"(?s)too large to prepare while 1 other.*gives up after "
                       r"train\.collective_timeout_s=600 s\).*\n    python -m pretrain\.prepare --X"):  # fmt: skip
        build_pretraining_data(large, seed=0, num_processes=2, prepare_command="python -m pretrain.prepare --X",
                               barrier_timeout_s=600)  # fmt: skip
    assert not Path(large.cache_dir).exists()  # nothing was read or written
    hub = tiny_config(tmp_path, [SourceConfig(kind="hub", path="org/some-corpus")])
    with pytest.raises(PreparationRequired, match="a Hugging Face Hub dataset"):
        build_pretraining_data(hub, seed=0, num_processes=8)
    # A small corpus is prepared inline; one process always prepares; a prepared corpus is found.
    small = tiny_config(tmp_path / "small", large.sources)
    build_pretraining_data(small, seed=0, num_processes=2)
    build_pretraining_data(large, seed=0)
    assert is_prepared(large, seed=0)
    build_pretraining_data(large, seed=0, num_processes=2)
    # Streaming needs only the trained tokenizer prepared.
    streamed = tiny_config(
        tmp_path / "stream", large.sources, max_inline_preparation_mb=0, streaming=True, validation_documents=5
    )
    with pytest.raises(PreparationRequired):
        build_pretraining_data(streamed, seed=0, num_processes=2)
    assert not is_prepared(streamed, seed=0)
    build_pretraining_data(streamed, seed=0)
    assert is_prepared(streamed, seed=0)


def test_the_readiness_check_does_not_repeat_the_work(tmp_path: Path, monkeypatch) -> None:
    """With several processes, the check before the barrier loads the tokenizer and computes the instances' cache
    key that the preparation then uses: each happens once per call."""
    corpus = write_jsonl(tmp_path / "corpus.jsonl", make_documents(120))
    cfg = tiny_config(tmp_path, [SourceConfig(kind="json", path=str(corpus))])
    build_pretraining_data(cfg, seed=0)  # trains the tokenizer and prepares the instances
    loads, keys = [], []
    load, key = pretrain.data.tokenizer.AutoTokenizer.from_pretrained, pretrain.data.instance_cache.data_cache_key
    monkeypatch.setattr(pretrain.data.tokenizer.AutoTokenizer, "from_pretrained",
                        lambda *a, **k: loads.append(a) or load(*a, **k))  # fmt: skip
    monkeypatch.setattr(pretrain.data.instance_cache, "data_cache_key", lambda *a, **k: keys.append(a) or key(*a, **k))
    for processes in (1, 2):
        loads.clear(), keys.clear()
        build_pretraining_data(cfg, seed=0, num_processes=processes)
        assert (len(loads), len(keys)) == (1, 1), processes


def test_prepare_command_prints_summary_and_is_idempotent(tmp_path: Path, capsys) -> None:
    cfg = two_shapes(tmp_path, rows_per_document=16)
    args = [
        f"--data.sources={json.dumps([vars(s) for s in cfg.sources])}",
        "--data.weight_by=words", "--data.vocab_size=300", "--data.max_seq_length=64", "--data.validation_documents=12",
        f"--data.cache_dir={tmp_path / 'cache'}", "--model.max_position_embeddings=64",
    ]  # fmt: skip
    assert prepare_main(args) == 0
    first = capsys.readouterr()
    assert "prepared instances:" in first.out and "true next" in first.out and "WARNING" not in first.out
    assert "Preparing instances" in first.err  # the progress bar (tqdm: done/total, rate, remaining time)
    (folder,) = (tmp_path / "cache").glob("instances-*/")
    assert (folder / SUMMARY_FILE).is_file()
    assert prepare_main(args) == 0  # prepared: reported again, nothing made
    again = capsys.readouterr()
    assert "prepared instances:" in again.out and "Preparing instances" not in again.err
    assert [p.name for p in (tmp_path / "cache").glob("instances-*/")] == [folder.name]
    with pytest.raises(ValueError, match=r"unknown key 'data\.rows_per_doc'"):
        prepare_main([*args, "--data.rows_per_doc=3"])


def test_a_resumed_run_asks_to_prepare_its_data_with_its_own_tokenizer(tmp_path: Path) -> None:
    """The corpus copied again (new mtimes: nothing cached under the new key): a resumed run of several processes
    that must wait for prepared data prints a preparation command that makes the instances it will look for, with
    the run's own tokenizer. The run's arguments alone would train another tokenizer and prepare other instances."""
    corpus = write_jsonl(tmp_path / "corpus.jsonl", make_documents(60, seed=1))
    run = tmp_path / "run"
    argv = tiny_args(run, tmp_path / "cache", f"--data.sources=[{{kind: json, path: {corpus}}}]",
                     "--data.max_inline_preparation_mb=0")  # fmt: skip
    assert run_main([*argv, "--train.stop_at_step=3"]) == 0
    os.utime(corpus, ns=(corpus.stat().st_atime_ns, corpus.stat().st_mtime_ns + 10**9))
    cfg = parse_args(argv)
    data, overrides = with_trained_vocabulary(cfg.data, latest_checkpoint(run))
    with pytest.raises(PreparationRequired) as refused:
        build_pretraining_data(data, seed=cfg.train.seed, num_processes=2, prepare_command=prepare_command([*argv, *overrides]))
    printed = shlex.split(str(refused.value).split("\n    ")[1].split("\nthen")[0])
    assert printed[:3] == ["python", "-m", "pretrain.prepare"] and printed[3:] == [*argv, *overrides]
    assert prepare_main(argv) == 0 and not is_prepared(data, seed=cfg.train.seed)  # the run's arguments alone
    assert prepare_main(printed[3:]) == 0 and is_prepared(data, seed=cfg.train.seed)


@pytest.mark.slow
def test_two_process_training_refuses_then_finds_the_prepared_cache(tmp_path: Path) -> None:
    """`accelerate launch --multi_gpu --num_processes 2` (CPU): without prepared data it stops and prints the
    command; after that command it starts from the prepared cache without preparing anything, and trains to the
    end with both processes (their random states in the checkpoint). Resuming under two processes:
    test_multinode.py; a preemption of both: test_pretrain.py."""
    articles = write_jsonl(tmp_path / "wiki.jsonl", make_documents(60, seed=1))
    write_books(tmp_path / "books.jsonl", n_books=3, sentences_per_book=100)
    sources = (
        f"[{{kind: json, path: {articles}}}, {{kind: json, path: {tmp_path / 'books.jsonl'}, rows_per_document: 8}}]"
    )
    argv = tiny_args(tmp_path / "run", tmp_path / "cache", f"--data.sources={sources}", "--data.weight_by=words",
                     "--data.max_inline_preparation_mb=0", "--train.max_steps=2")  # fmt: skip
    refused = accelerate_launch(["--multi_gpu", "--num_processes", "2", "--main_process_port", "29527"], argv, tmp_path)
    assert refused.returncode != 0
    assert "python -m pretrain.prepare " in refused.stderr and "--data.max_inline_preparation_mb=0" in refused.stderr
    assert not list((tmp_path / "cache").glob("instances-*/"))
    prepared = subprocess.run([sys.executable, "-m", "pretrain.prepare", *argv], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    (folder,) = (tmp_path / "cache").glob("instances-*/")
    started = accelerate_launch(["--multi_gpu", "--num_processes", "2", "--main_process_port", "29528"], argv, tmp_path)
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
    assert "2 process(es), global batch 16" in started.stdout and read_status(tmp_path / "run")["status"] == "finished"
    checkpoint = latest_checkpoint(tmp_path / "run")
    assert {p.name for p in checkpoint.glob("random_states_*.pkl")} == {"random_states_0.pkl", "random_states_1.pkl"}
    assert "Preparing instances" not in started.stderr
    assert [p.name for p in (tmp_path / "cache").glob("instances-*/")] == [folder.name]  # nothing else prepared


def test_submit_script_chains_preparation_and_training(tmp_path: Path) -> None:
    """launch/submit_pretrain.sh: the preparation job, then the training with --dependency=afterok on it; both
    with the same preset and overrides. sbatch is a stand-in that records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "sbatch.log"
    (bin_dir / "sbatch").write_text(f'#!/bin/bash\necho "$*" >> {log}\necho "$((4000 + $(wc -l < {log})));cluster"\n')
    (bin_dir / "sbatch").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PRESET": "configs/pretrain/bert_base_post_ln.yaml",
           "TRAIN_SBATCH_ARGS": "--nodes=4 --partition=gpu"}  # fmt: skip
    result = subprocess.run(["bash", str(ROOT / "launch" / "submit_pretrain.sh"), "--train.output_dir=/shared/run"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    prepare, train = log.read_text().splitlines()
    assert prepare == "--parsable launch/slurm_prepare.sbatch --train.output_dir=/shared/run"
    assert train == (
        "--parsable --dependency=afterok:4001 --nodes=4 --partition=gpu launch/slurm_pretrain.sbatch "
        "--train.output_dir=/shared/run"
    )
    assert "preparation job 4001, then training job 4002 (starts when 4001 succeeds)" in result.stdout
    script = (ROOT / "launch" / "slurm_prepare.sbatch").read_text()
    assert 'python -m pretrain.prepare --config "$PRESET"' in script


def test_benchmark_files_have_the_two_hub_shapes(tmp_path: Path) -> None:
    """benchmarks/data_prep.py's files: articles one a row, books one sentence a row in book order, in the presets'
    word mixture (2.5 : 0.8), repeated up to the size asked for."""
    from benchmarks.data_prep import WIKI_SHARE, build_files

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_jsonl(corpus / "wiki.jsonl", make_documents(20, seed=1))
    books = ["First sentence of a book. Second one here!\nA new paragraph starts. It ends.", "Another book. Its end."]
    write_jsonl(corpus / "books.jsonl", books)
    info = build_files(corpus, tmp_path / "files", 0.01)  # 10,000 characters: several passes over each file
    wiki = [json.loads(line)["text"] for line in (tmp_path / "files" / "wiki.jsonl").open()]
    rows = [json.loads(line)["text"] for line in (tmp_path / "files" / "books.jsonl").open()]
    assert wiki[:20] == make_documents(20, seed=1) and info["wiki"]["passes"] > 1
    sentences = ["First sentence of a book.", "Second one here!", "A new paragraph starts.", "It ends.",
                 "Another book.", "Its end."]  # fmt: skip
    assert rows[:12] == sentences + sentences
    assert sum(map(len, wiki)) == info["wiki"]["chars"] >= WIKI_SHARE * 10_000
    assert sum(map(len, rows)) == info["books"]["chars"] >= (1 - WIKI_SHARE) * 10_000 - 1
    assert build_files(corpus, tmp_path / "files", 0.01) == info  # built once per size
