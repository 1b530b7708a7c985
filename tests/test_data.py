"""The pretraining data pipeline: sources, tokenizer, BERT instances, validation split, cache, streaming, masking."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
from collections import Counter
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

import pretrain.data.instances
import pretrain.data.pipeline
import pretrain.data.tokenizer
from pretrain.data.collator import DamagedInstance, MaskingCollator
from pretrain.data.config import DataConfig, SourceConfig
from pretrain.data.corpus import check_utf8, load_documents, split_corpus, split_documents
from pretrain.data.instances import (
    _truncated_lengths,
    create_nsp_instances,
    make_instances,
    plain_backend,
    tokenize_documents,
)
from pretrain.data.pipeline import PreparationRequired, build_pretraining_data, is_prepared
from pretrain.data.tokenizer import SPECIAL_TOKENS, load_or_train_tokenizer, train_wordpiece_tokenizer

datasets.disable_progress_bars()

WORDS = [
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "it",
    "his",
    "her",
    "they",
    "which",
    "were",
    "an",
    "river",
    "city",
    "king",
    "army",
    "music",
    "school",
    "water",
    "light",
    "stone",
    "house",
    "garden",
    "winter",
    "summer",
    "north",
    "south",
    "early",
    "later",
    "small",
    "great",
    "old",
    "new",
    "people",
    "church",
    "bridge",
    "train",
    "island",
    "forest",
    "language",
    "story",
    "number",
    "field",
    "paper",
    "market",
    "table",
    "window",
    "mountain",
]


def make_documents(n: int, *, seed: int = 0, tag: str = "") -> list[str]:
    """English-looking documents: paragraphs on separate lines, sentences starting upper-case, ending with '.'."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        paragraphs = []
        for _ in range(rng.randint(1, 3)):
            sentences = []
            for _ in range(rng.randint(2, 5)):
                words = [rng.choice(WORDS) for _ in range(rng.randint(4, 12))]
                if tag:
                    words.insert(1, tag)
                sentences.append(" ".join(words).capitalize() + ".")
            paragraphs.append(" ".join(sentences))
        docs.append("\n".join(paragraphs))
    return docs


def write_jsonl(path: Path, texts: list[str], column: str = "text") -> Path:
    path.write_text(
        "".join(json.dumps({"id": str(i), column: t}) + "\n" for i, t in enumerate(texts)), encoding="utf-8"
    )
    return path


def tiny_config(tmp_path: Path, sources: list[SourceConfig], **overrides) -> DataConfig:
    kwargs = dict(
        sources=sources, vocab_size=300, max_seq_length=32, cache_dir=str(tmp_path / "cache"), validation_fraction=0.05
    )
    kwargs.update(overrides)
    return DataConfig(**kwargs)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", make_documents(120))


@pytest.fixture
def json_config(tmp_path: Path, corpus: Path) -> DataConfig:
    return tiny_config(tmp_path, [SourceConfig(kind="json", path=str(corpus))])


def check_nsp_instance(ex: dict, *, max_len: int, cls_id: int, sep_id: int) -> None:
    ids, types = ex["input_ids"], ex["token_type_ids"]
    assert len(ids) == len(types) <= max_len
    assert ids[0] == cls_id and ids[-1] == sep_id
    seps = [i for i, t in enumerate(ids) if t == sep_id]
    assert len(seps) == 2 and seps[0] >= 2 and seps[1] == len(ids) - 1 and seps[1] - seps[0] >= 2  # A, B non-empty
    assert types == [0] * (seps[0] + 1) + [1] * (len(ids) - seps[0] - 1)
    assert cls_id not in ids[1:]
    assert ex["next_sentence_label"] in (0, 1)


# ---------------------------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------------------------


def test_config_validation_names_key_and_choices() -> None:
    with pytest.raises(ValueError, match=r"data\.objective='bert'.*mlm_nsp, mlm"):
        DataConfig(objective="bert")
    with pytest.raises(
        ValueError, match=r"data\.sources\[\]\.kind='csv' is unknown.*hub, json, parquet, text, python_docs"
    ):
        SourceConfig(kind="csv", path="x.csv")
    with pytest.raises(ValueError, match=r"data\.sources\[\]\.path is required"):
        SourceConfig(kind="json")
    with pytest.raises(ValueError, match=r"data\.sources\[\]\.name/split only apply to kind 'hub'"):
        SourceConfig(kind="json", path="a.jsonl", split="validation")
    with pytest.raises(ValueError, match=r"data\.sources\[\]\.path='x' is not used by kind 'python_docs'"):
        SourceConfig(path="x")
    with pytest.raises(ValueError, match=r"data\.sources\[\]\.weight"):
        SourceConfig(weight=0)
    with pytest.raises(ValueError, match=r"data\.mlm_probability"):
        DataConfig(mlm_probability=1.5)
    with pytest.raises(ValueError, match=r"data\.max_documents=1"):
        DataConfig(max_documents=1)
    with pytest.raises(ValueError, match=r"data\.sources must list"):
        DataConfig(sources=[])
    cfg = DataConfig(sources=[{"kind": "json", "path": "a.jsonl", "weight": 2}])  # as run_config.json holds them
    assert cfg.sources == [SourceConfig(kind="json", path="a.jsonl", weight=2)]


# ---------------------------------------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["json", "parquet", "text", "json-folder", "json-glob", "hub-local"])
def test_local_formats_load_documents(tmp_path: Path, kind: str) -> None:
    texts = make_documents(7)
    folder = tmp_path / "corpus"
    folder.mkdir()
    if kind == "parquet":
        pq.write_table(pa.table({"body": texts, "n": list(range(7))}), folder / "part-0.parquet")
        source = SourceConfig(kind="parquet", path=str(folder / "part-0.parquet"), text_column="body")
    elif kind == "text":
        # Original BERT's input format: documents separated by blank lines, one paragraph per line.
        (folder / "a.txt").write_text("\n\n".join(texts) + "\n", encoding="utf-8")
        source = SourceConfig(kind="text", path=str(folder / "a.txt"))
    else:
        write_jsonl(folder / "part-0.jsonl", texts[:4])
        write_jsonl(folder / "part-1.jsonl", texts[4:])
        path = {
            "json": folder / "part-0.jsonl",
            "json-folder": folder,
            "json-glob": folder / "part-*.jsonl",
            "hub-local": folder,
        }[kind]
        texts = texts[:4] if kind == "json" else texts
        # A Hub dataset is read by datasets.load_dataset(path, name, split=...); a local folder in the Hub's
        # layout takes the same code path without network.
        source = SourceConfig(kind="hub" if kind == "hub-local" else "json", path=str(path))
    docs = load_documents(tiny_config(tmp_path, [source]), seed=0)
    assert docs.column_names == ["text", "source"]
    assert [t.strip() for t in docs["text"]] == texts
    # A source read from several files says how many, before any is read (the commands print it before torch).
    found = tiny_config(tmp_path, [source]).check_local_files()
    if kind in ("json-folder", "json-glob"):
        assert found == [f"data.sources[0] (json {str(path)!r}): 2 json files, read as one source: "
                         f"{folder / 'part-0.jsonl'}, ..."]  # fmt: skip
    elif kind != "hub-local":
        assert found == []


def test_mixing_follows_weights(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", make_documents(400, seed=1, tag="alpha"))
    b = write_jsonl(tmp_path / "b.jsonl", make_documents(400, seed=2, tag="beta"))
    cfg = tiny_config(
        tmp_path,
        [SourceConfig(kind="json", path=str(a), weight=3.0), SourceConfig(kind="json", path=str(b), weight=1.0)],
        max_documents=400,
    )
    texts = load_documents(cfg, seed=0)["text"]
    assert len(texts) == 400
    share_a = sum(" alpha " in t for t in texts) / len(texts)
    assert 0.68 < share_a < 0.82  # 0.75 expected; binomial sd ~0.02
    assert len(set(texts)) == len(texts)  # documents are drawn, never repeated


@pytest.mark.parametrize("streaming", [False, True])
def test_max_documents_counts_documents_with_text(tmp_path: Path, streaming: bool) -> None:
    """Blank documents are dropped before the cap: 4 of a file with 2 blank ones among its first 4 are 4 good ones."""
    texts = ["", "first good document.", "  ", "second good document.", "third.", "fourth.", "fifth."]
    source = SourceConfig(kind="json", path=str(write_jsonl(tmp_path / "c.jsonl", texts)))
    cfg = tiny_config(tmp_path, [source], max_documents=4, validation_documents=2, streaming=streaming)
    docs = load_documents(cfg, seed=0)
    assert [d["text"] for d in docs] == ["first good document.", "second good document.", "third.", "fourth."]
    if not streaming:
        train, val = split_documents(docs, cfg, seed=0)
        assert (len(train), len(val)) == (2, 2)


def test_python_docs_source_is_nontrivial(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, [SourceConfig()], max_documents=100)
    texts = load_documents(cfg, seed=0)["text"]
    assert len(texts) == 100
    # 79 pydoc topics (the language reference) then standard-library module docstrings.
    assert sum(len(t) for t in texts) > 300_000
    assert any("for" in t and "loop" in t for t in texts[:79])
    assert "Abstract Base Classes" in "".join(texts[79:])  # the docstring of _collections_abc
    assert all(len(t) > 20 and "\n\n" not in t for t in texts)


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------------------------


def test_trained_tokenizer_is_bert_wordpiece_and_saved(tmp_path: Path, json_config: DataConfig) -> None:
    tok = load_or_train_tokenizer(json_config, save_dir=tmp_path / "tok", seed=0)
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert 100 <= len(tok) <= json_config.vocab_size
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert isinstance(reloaded, PreTrainedTokenizerFast)
    enc = reloaded("The River city.", "An old bridge")
    assert enc["input_ids"] == tok("The River city.", "An old bridge")["input_ids"]
    assert enc["input_ids"][0] == 2 and enc["input_ids"].count(3) == 2
    assert enc["token_type_ids"][-1] == 1
    assert reloaded.tokenize("RIVER") == ["river"]  # lowercase by default


def test_the_corpus_is_read_and_split_by_one_route(
    tmp_path: Path, json_config: DataConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tokenizer's training texts and the instances come from the same split (corpus.split_corpus), read once
    by build_pretraining_data; alone, the tokenizer takes its training documents from the same function."""
    calls = []

    def counted(cfg: DataConfig, *, seed: int):
        calls.append(seed)
        return split_corpus(cfg, seed=seed)

    monkeypatch.setattr(pretrain.data.pipeline, "split_corpus", counted)
    monkeypatch.setattr(pretrain.data.tokenizer, "split_corpus", counted)
    build_pretraining_data(json_config, seed=5)
    assert calls == [5]  # tokenizer training and instances: one read of the corpus
    load_or_train_tokenizer(tiny_config(tmp_path, json_config.sources, vocab_size=299), seed=6)
    assert calls == [5, 6]


def test_tokenizer_named_by_folder_and_model_vocab_check(tmp_path: Path, json_config: DataConfig) -> None:
    trained = load_or_train_tokenizer(json_config, save_dir=tmp_path / "tok", seed=0)
    cfg = tiny_config(tmp_path, json_config.sources, tokenizer=str(tmp_path / "tok"))
    assert load_or_train_tokenizer(cfg, model_vocab_size=len(trained)).get_vocab() == trained.get_vocab()
    with pytest.raises(
        ValueError, match=rf"has {len(trained)} tokens but the model's vocabulary has 120.*model\.vocab_size"
    ):
        load_or_train_tokenizer(cfg, model_vocab_size=120)


def test_tokenizer_not_found_is_named(tmp_path: Path, json_config: DataConfig) -> None:
    cfg = tiny_config(tmp_path, json_config.sources, tokenizer="no-such-org/no-such-tokenizer")
    with pytest.raises(ValueError, match=r"data\.tokenizer='no-such-org/no-such-tokenizer': tokenizer not found"):
        load_or_train_tokenizer(cfg)
    cfg = tiny_config(tmp_path, json_config.sources, tokenizer=str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match=r"no such tokenizer folder"):
        load_or_train_tokenizer(cfg)


def _save_word_level(folder: Path, words: list[str]) -> Path:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    special = {
        k: v
        for k, v in (
            ("unk_token", "[UNK]"),
            ("pad_token", "[PAD]"),
            ("cls_token", "[CLS]"),
            ("sep_token", "[SEP]"),
            ("mask_token", "[MASK]"),
        )
        if v in words
    }
    PreTrainedTokenizerFast(tokenizer_object=tok, **special).save_pretrained(folder)
    return folder


def test_implausible_tokenizers_are_rejected(tmp_path: Path, json_config: DataConfig) -> None:
    stub = _save_word_level(tmp_path / "stub", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    with pytest.raises(ValueError, match=r"has only 5 tokens; that is not a real vocabulary"):
        load_or_train_tokenizer(tiny_config(tmp_path, json_config.sources, tokenizer=str(stub)))
    no_mask = _save_word_level(tmp_path / "nomask", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS, *map(str, range(100))])
    with pytest.raises(ValueError, match=r"lacks BERT special tokens \['mask_token', '\[MASK\]'\]"):
        load_or_train_tokenizer(tiny_config(tmp_path, json_config.sources, tokenizer=str(no_mask)))


# ---------------------------------------------------------------------------------------------------------------------
# Instances
# ---------------------------------------------------------------------------------------------------------------------


def test_nsp_instances_structure(json_config: DataConfig) -> None:
    data = build_pretraining_data(json_config, seed=0)
    tok = data.tokenizer
    assert data.train.column_names == ["input_ids", "token_type_ids", "instance_id", "next_sentence_label"]
    assert len(data.train) > 200
    for ex in data.train:
        check_nsp_instance(ex, max_len=32, cls_id=tok.cls_token_id, sep_id=tok.sep_token_id)
    labels = data.train["next_sentence_label"]
    assert 0.4 < np.mean(labels) < 0.6
    assert max(len(x) for x in data.train["input_ids"]) == 32  # full-length targets dominate
    ids = list(data.train["instance_id"]) + list(data.validation["instance_id"])
    assert len(set(ids)) == len(ids)
    assert len(data.validation) > 0


def _synthetic_documents(n_docs: int, seed: int = 0) -> list[list[list[int]]]:
    """Document d's tokens are 1000*d + 10 + position: the document and order of every token can be read back."""
    rng = random.Random(seed)
    docs = []
    for d in range(n_docs):
        pos, doc = 0, []
        for _ in range(rng.randint(1, 12)):
            n = rng.randint(1, 15)
            doc.append([1000 * (d + 1) + pos + k for k in range(n)])
            pos += n
        docs.append(doc)
    return docs


def test_random_next_comes_from_another_document() -> None:
    cfg = DataConfig(max_seq_length=40)
    instances = create_nsp_instances(_synthetic_documents(60), cfg, random.Random(0), cls_id=2, sep_id=3)
    assert len(instances) > 100
    for ids, len_cls_a_sep, label, d in instances:
        assert len(ids) <= 40
        a, b = ids[1 : len_cls_a_sep - 1], ids[len_cls_a_sep:-1]
        assert a and b
        doc_a, doc_b = {t // 1000 for t in a}, {t // 1000 for t in b}
        assert len(doc_a) == len(doc_b) == 1  # each segment is a contiguous piece of one document
        assert doc_a == {d + 1}  # the instance names segment A's document (tokens of document d: 1000 * (d + 1) + ...)
        assert a == sorted(a) and b == sorted(b)
        if label == 1:
            assert doc_a != doc_b
        else:
            assert doc_a == doc_b and a[-1] < b[0]  # the actual continuation
    assert 0.4 < np.mean([label for _, _, label, _ in instances]) < 0.6


def test_truncation_matches_bert_truncate_seq_pair() -> None:
    def bert(len_a: int, len_b: int, max_total: int) -> tuple[int, int]:
        while len_a + len_b > max_total:
            if len_a > len_b:
                len_a -= 1
            else:
                len_b -= 1
        return len_a, len_b

    rng = random.Random(0)
    for _ in range(2000):
        la, lb, m = rng.randint(1, 80), rng.randint(1, 80), rng.randint(2, 100)
        assert _truncated_lengths(la, lb, m) == bert(la, lb, m)


def test_mlm_objective_packs_full_sequences(tmp_path: Path, corpus: Path) -> None:
    cfg = tiny_config(tmp_path, [SourceConfig(kind="json", path=str(corpus))], objective="mlm")
    data = build_pretraining_data(cfg, seed=0)
    assert "next_sentence_label" not in data.train.column_names
    rows = data.train["input_ids"]
    cls, sep = data.tokenizer.cls_token_id, data.tokenizer.sep_token_id
    assert all(r[0] == cls and r[-1] == sep for r in rows)
    assert all(len(r) == 32 for r in rows[:-1])  # one chunk of documents: only the last one may be short
    assert all(set(t) == {0} for t in data.train["token_type_ids"])
    # The bodies, joined, are the training documents' tokens with [SEP] between documents.
    train_docs, _ = split_corpus(cfg, seed=0)
    expected = []
    for doc in tokenize_documents(train_docs["text"], plain_backend(data.tokenizer)):
        expected += [t for sentence in doc for t in sentence] + [sep]
    assert [t for r in rows for t in r[1:-1]] == expected


def test_validation_split_is_by_document(tmp_path: Path, json_config: DataConfig) -> None:
    docs = load_documents(json_config, seed=0)
    train, val = split_documents(docs, json_config, seed=0)
    assert len(val) == round(0.05 * 120) and len(train) + len(val) == 120
    assert not set(train["text"]) & set(val["text"])
    assert sorted([*train["text"], *val["text"]]) == sorted(docs["text"])
    one = tiny_config(tmp_path, json_config.sources, validation_fraction=0.001)
    assert len(split_documents(docs, one, seed=0)[1]) == 1  # at least one document
    # The validation instances are made from the held-out documents only.
    data = build_pretraining_data(json_config, seed=0)
    only_val = make_instances(val, data.tokenizer, json_config, seed=0, validation=True)
    assert only_val["input_ids"] == data.validation["input_ids"]
    assert split_documents(docs, json_config, seed=1)[1]["text"] != val["text"]  # the seed picks them


def test_instances_are_deterministic_and_independent_of_num_proc(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "big.jsonl", make_documents(600))  # three chunks of documents
    cfg = tiny_config(tmp_path, [SourceConfig(kind="json", path=str(corpus))])
    tok = load_or_train_tokenizer(cfg, seed=0)
    train, _ = split_corpus(cfg, seed=0)
    one = make_instances(train, tok, cfg, seed=0, validation=False)
    two = make_instances(train, tok, tiny_config(tmp_path, cfg.sources, num_proc=2), seed=0, validation=False)
    assert one["input_ids"] == two["input_ids"] and one["instance_id"] == two["instance_id"]
    other_seed = make_instances(train, tok, cfg, seed=1, validation=False)
    assert other_seed["input_ids"] != one["input_ids"]


# ---------------------------------------------------------------------------------------------------------------------
# Cache and streaming
# ---------------------------------------------------------------------------------------------------------------------


def test_cache_hit_and_miss(tmp_path: Path, json_config: DataConfig, corpus: Path, monkeypatch) -> None:
    calls = Counter()
    tokenize, train_tok = tokenize_documents, train_wordpiece_tokenizer

    def counting_tokenize(*args, **kwargs):
        calls["tokenize"] += 1
        return tokenize(*args, **kwargs)

    def counting_train(*args, **kwargs):
        calls["train_tokenizer"] += 1
        return train_tok(*args, **kwargs)

    monkeypatch.setattr(pretrain.data.instances, "tokenize_documents", counting_tokenize)
    monkeypatch.setattr(pretrain.data.tokenizer, "train_wordpiece_tokenizer", counting_train)
    first = build_pretraining_data(json_config, seed=0, save_tokenizer_to=tmp_path / "run" / "tokenizer")
    assert calls == {"tokenize": 2, "train_tokenizer": 1}  # one chunk each of train and validation documents
    assert (tmp_path / "run" / "tokenizer" / "tokenizer.json").is_file()

    again = build_pretraining_data(json_config, seed=0)
    assert calls == {"tokenize": 2, "train_tokenizer": 1}  # cache hit: nothing tokenised or trained
    assert again.train["input_ids"] == first.train["input_ids"]

    build_pretraining_data(tiny_config(tmp_path, json_config.sources, mlm_probability=0.2, num_proc=2), seed=0)
    assert calls["tokenize"] == 2  # masking and mechanics are not part of the key

    saved = str(tmp_path / "run" / "tokenizer")
    build_pretraining_data(tiny_config(tmp_path, json_config.sources, tokenizer=saved), seed=0)
    assert calls == {"tokenize": 2, "train_tokenizer": 1}  # the same tokenizer by path: same instances

    build_pretraining_data(tiny_config(tmp_path, json_config.sources, max_seq_length=24), seed=0)
    assert calls == {"tokenize": 4, "train_tokenizer": 1}  # instance field changed: miss; tokenizer reused
    build_pretraining_data(json_config, seed=1)
    assert calls == {"tokenize": 6, "train_tokenizer": 2}  # seed changes the split: both rebuilt

    write_jsonl(corpus, make_documents(121))  # the file changed (size, mtime)
    build_pretraining_data(json_config, seed=0)
    assert calls == {"tokenize": 8, "train_tokenizer": 3}


def test_damaged_prepared_instances_are_set_aside_and_made_again(
    tmp_path: Path, json_config: DataConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    """Cache entries are written whole (atomically): prepared instances that cannot be read, or whose bytes differ
    from the checksums their summary recorded, were damaged since. They are derived data: moved aside (kept) with a
    warning naming them, and made again, the same instances as before."""
    first = build_pretraining_data(json_config, seed=0)
    ids = [part.to_dict()["input_ids"] for part in (first.train, first.validation)]  # read now: they are mapped
    (entry,) = (p for p in (tmp_path / "cache").glob("instances-*") if p.suffix != ".lock")
    shard = entry / "validation" / "shard-00000.arrow"

    def overwrite(path: Path) -> None:  # one byte near the end changed in place, the size kept
        data = bytearray(path.read_bytes())
        data[-200] ^= 0x01
        path.write_bytes(data)

    damages = {
        "ValueError: shard validation/shard-00000.arrow does not match its checksum": lambda: overwrite(shard),
        "ValueError: shard validation/shard-00000.arrow has": lambda: shard.write_bytes(shard.read_bytes()[:-8]),
        "UnicodeDecodeError": lambda: (entry / "summary.json").write_bytes(b"\xff{"),
    }
    large = dataclasses.replace(json_config, max_inline_preparation_mb=0)  # the same entry, too large to make inline
    for message, damage in damages.items():
        damage()
        assert not is_prepared(json_config, seed=0)
        with pytest.raises(PreparationRequired, match=r"holds no prepared instances for this config \(or damaged"):
            build_pretraining_data(large, seed=0, num_processes=2)  # not made again while the others wait
        again = build_pretraining_data(json_config, seed=0)
        out = capsys.readouterr().out
        assert f"warning: the prepared instances in {entry} cannot be read ({message}" in out, out
        assert "moved to" in out and "made again from the corpus" in out
        assert [part.to_dict()["input_ids"] for part in (again.train, again.validation)] == ids
    assert len(list((tmp_path / "cache").glob("instances-*.damaged-*"))) == len(damages)


def test_a_prepared_shard_copied_without_its_times_is_checked_and_used(
    tmp_path: Path, json_config: DataConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cache copied without its files' times (cp -r): every shard is checked against its checksum, said once per
    part, and used as it is, nothing made again."""
    build_pretraining_data(json_config, seed=0)
    (entry,) = (p for p in (tmp_path / "cache").glob("instances-*") if p.suffix != ".lock")
    capsys.readouterr()
    for shard in entry.rglob("*.arrow"):
        os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 1))
    build_pretraining_data(json_config, seed=0)
    out = capsys.readouterr().out
    assert out.count("against their checksums") == 2 and "made again" not in out, out


def test_a_damaged_tokenizer_folder_or_unreadable_cache_is_named_with_the_fix(
    tmp_path: Path, json_config: DataConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tokenizer folders are written whole (atomically): one that cannot be read was damaged since, and is named
    with what to do, not read as a bare JSON error. A file system refusing a read is its own error."""
    build_pretraining_data(json_config, seed=0, save_tokenizer_to=tmp_path / "run" / "tokenizer")
    def refused(*_: object, **__: object) -> None:
        raise OSError(5, "I/O error")

    with monkeypatch.context() as patch:  # the file system refusing a read (NFS): its error, not "remove the folder"
        patch.setattr(datasets.Dataset, "from_file", refused)
        with pytest.raises(OSError, match="I/O error"):
            build_pretraining_data(json_config, seed=0)
    folder = tmp_path / "run" / "tokenizer"
    (folder / "tokenizer.json").write_text('{"version": "1.0", "trunc')
    named = tiny_config(tmp_path, json_config.sources, tokenizer=str(folder))
    with pytest.raises(ValueError, match=rf"the tokenizer in {folder} cannot be read .*each of its snapshots holds one"):
        load_or_train_tokenizer(named)
    (cached,) = (tmp_path / "cache").glob("tokenizer-*")
    shutil.copytree(cached, tmp_path / "whole")
    (cached / "tokenizer.json").write_text("[]")
    with pytest.raises(ValueError, match=rf"the tokenizer in {cached} cannot be read .*remove that folder to train it"):
        load_or_train_tokenizer(json_config)
    # A file of it removed (transformers would build another tokenizer from what is left): the same fix.
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copytree(tmp_path / "whole", cached, dirs_exist_ok=True)
        (cached / name).unlink()
        with pytest.raises(ValueError, match=rf"the tokenizer in {cached} lacks {name} .*remove that folder to train"):
            load_or_train_tokenizer(json_config)


def test_streaming_yields_instances(tmp_path: Path, corpus: Path) -> None:
    cfg = tiny_config(
        tmp_path,
        [SourceConfig(kind="json", path=str(corpus))],
        streaming=True,
        max_documents=120,
        shuffle_buffer_size=50,
    )
    data = build_pretraining_data(cfg, seed=0)
    assert isinstance(data.train, datasets.IterableDataset)
    assert isinstance(data.validation, datasets.Dataset) and len(data.validation) > 0
    tok = data.tokenizer
    first = list(data.train.take(50))
    assert len(first) == 50
    for ex in first:
        check_nsp_instance(ex, max_len=32, cls_id=tok.cls_token_id, sep_id=tok.sep_token_id)
    assert [ex["input_ids"] for ex in data.train.take(50)] == [ex["input_ids"] for ex in first]  # deterministic
    assert len({ex["instance_id"] for ex in data.train}) == sum(1 for _ in data.train)
    # Streaming holds out the first documents of the stream (round(0.05 * 120) = 6).
    val_cfg = tiny_config(tmp_path, cfg.sources)
    held_out = load_documents(val_cfg, seed=0)["text"][:6]
    expected = make_instances(datasets.Dataset.from_dict({"text": held_out}), tok, cfg, seed=0, validation=True)
    assert data.validation["input_ids"] == expected["input_ids"]


# ---------------------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------------------


def test_missing_file_is_named(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, [SourceConfig(kind="json", path=str(tmp_path / "nope.jsonl"))])
    with pytest.raises(FileNotFoundError, match=r"data\.sources\[0\]\.path=.*nope\.jsonl.*no such file"):
        build_pretraining_data(cfg, seed=0)
    cfg = tiny_config(tmp_path, [SourceConfig(kind="parquet", path=str(tmp_path / "*.parquet"))])
    with pytest.raises(FileNotFoundError, match=r"no parquet files"):
        load_documents(cfg, seed=0)


def test_empty_corpus_names_source(tmp_path: Path, corpus: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    cfg = tiny_config(
        tmp_path, [SourceConfig(kind="json", path=str(corpus)), SourceConfig(kind="json", path=str(empty))]
    )
    with pytest.raises(ValueError, match=r"data\.sources\[1\]\.path=.*empty\.jsonl': empty corpus: .*holds no bytes"):
        load_documents(cfg, seed=0)
    blank = write_jsonl(tmp_path / "blank.jsonl", ["", "   \n "])
    cfg = tiny_config(tmp_path, [SourceConfig(kind="json", path=str(blank))])
    with pytest.raises(ValueError, match=r"data\.sources\[0\].*empty corpus, no document has text in column 'text'"):
        build_pretraining_data(cfg, seed=0)


def test_invalid_utf8_names_file_offset_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.jsonl"
    good = json.dumps({"text": "A fine line."}) + "\n"
    bad.write_bytes((good * 2).encode() + '{"text": "Caf\xe9 au lait."}\n'.encode("latin-1"))
    offset = len((good * 2).encode()) + len(b'{"text": "Caf')
    cfg = tiny_config(tmp_path, [SourceConfig(kind="json", path=str(bad))])
    with pytest.raises(
        ValueError, match=rf"latin1\.jsonl: invalid UTF-8 at byte offset {offset} \(line 3\).*re-encode"
    ):
        load_documents(cfg, seed=0)
    text = tmp_path / "bad.txt"
    text.write_bytes(b"Fine.\n\n\xff\xfeBroken.\n")
    with pytest.raises(ValueError, match=r"bad\.txt: invalid UTF-8 at byte offset 7 \(line 3\)"):
        load_documents(tiny_config(tmp_path, [SourceConfig(kind="text", path=str(text))]), seed=0)


def test_invalid_utf8_across_read_chunks(tmp_path: Path) -> None:
    path = tmp_path / "split.txt"
    path.write_bytes(b"ab\ncd" + "é".encode()[:1] + b"x\n")  # a broken two-byte sequence at offset 5
    with pytest.raises(ValueError, match=r"byte offset 5 \(line 2\)"):
        check_utf8(path, chunk_bytes=3)
    path.write_bytes("ab\ncé\né".encode())
    check_utf8(path, chunk_bytes=5)  # valid sequences split across reads are fine


def test_missing_text_column_names_existing_columns(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", make_documents(3), column="body")
    cfg = tiny_config(tmp_path, [SourceConfig(kind="json", path=str(path))])
    with pytest.raises(ValueError, match=r"text column 'text' not found; columns are \['id', 'body'\].*text_column"):
        load_documents(cfg, seed=0)


def test_unreachable_hub_dataset_names_source(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, [SourceConfig(kind="hub", path="no-such-org/no-such-dataset")])
    with pytest.raises(FileNotFoundError, match=r"data\.sources\[0\] \(hub 'no-such-org/no-such-dataset'\)"):
        load_documents(cfg, seed=0)


# ---------------------------------------------------------------------------------------------------------------------
# Masking
# ---------------------------------------------------------------------------------------------------------------------


def test_training_the_tokenizer_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    """The Rust trainer's progress bars (blank lines where the output is not a terminal) stay off the run's first
    screen: the instances' bar says how the preparation goes."""
    train_wordpiece_tokenizer(make_documents(50), vocab_size=120)
    assert capfd.readouterr() == ("", "")


@pytest.fixture(scope="module")
def mask_tokenizer(tmp_path_factory) -> PreTrainedTokenizerFast:
    return train_wordpiece_tokenizer(make_documents(200), vocab_size=300)


def _random_examples(n: int, vocab: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        a, b = (
            rng.integers(5, vocab, rng.integers(5, 40)).tolist(),
            rng.integers(5, vocab, rng.integers(5, 40)).tolist(),
        )
        out.append(
            {
                "input_ids": [2, *a, 3, *b, 3],
                "token_type_ids": [0] * (len(a) + 2) + [1] * (len(b) + 1),
                "next_sentence_label": i % 2,
                "instance_id": 1000 + 7 * i,
            }
        )
    return out


@pytest.mark.parametrize(
    ("column", "damage", "said"),
    [("input_ids", lambda v, vocab: [*v[:-1], vocab], r"token ids outside the tokenizer's vocabulary \(0-{top}\): \[{vocab}\]"),
     ("input_ids", lambda v, vocab: [-1, *v[1:]], r"token ids outside the tokenizer's vocabulary \(0-{top}\): \[-1\]"),
     ("token_type_ids", lambda v, vocab: [*v[:-1], 7], "segment ids other than 0 and 1"),
     ("token_type_ids", lambda v, vocab: v[:-1], r"{short} segment ids for {long} tokens"),
     ("next_sentence_label", lambda v, vocab: -3, "next-sentence labels other than 0 and 1"),
     ("input_ids", lambda v, vocab: v * 9, r"{nine} tokens, more than the 128 it was made for")],
)  # fmt: skip
def test_an_instance_its_tokenizer_cannot_have_written_is_named(mask_tokenizer, column, damage, said) -> None:
    """Damaged bytes of a prepared instance: named with the instance and where it was read from, before the model
    fails indexing an embedding (tests/test_crash_safety.py: through a run)."""
    vocab = len(mask_tokenizer)
    examples = _random_examples(4, vocab)
    long = len(examples[2]["input_ids"])
    said = said.format(top=vocab - 1, vocab=vocab, short=long - 1, long=long, nine=9 * long)
    examples[2][column] = damage(examples[2][column], vocab)
    if len(examples[2]["input_ids"]) > long:  # offsets damaged in range: a longer instance, segment ids as long
        examples[2]["token_type_ids"] = [0] * len(examples[2]["input_ids"])
    collator = MaskingCollator(mask_tokenizer, prepared=Path("CACHE/instances-KEY"), max_length=128)  # each <= 81
    with pytest.raises(DamagedInstance, match=rf"^instance {examples[2]['instance_id']} holds {said}: the prepared "
                                              "instances in CACHE/instances-KEY were damaged since"):  # fmt: skip
        collator(examples)
    assert collator(_random_examples(4, vocab))["input_ids"].shape[0] == 4  # intact ones pass


def test_masking_statistics_and_specials(mask_tokenizer: PreTrainedTokenizerFast) -> None:
    vocab = len(mask_tokenizer)
    examples = _random_examples(200, vocab)
    batch = MaskingCollator(mask_tokenizer, seed=3)(examples)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels", "next_sentence_label"}
    assert all(v.dtype == torch.long for v in batch.values())
    width = batch["input_ids"].shape[1]
    assert width % 8 == 0 and width >= max(len(e["input_ids"]) for e in examples)
    original = torch.zeros_like(batch["input_ids"])
    for row, e in enumerate(examples):
        original[row, : len(e["input_ids"])] = torch.tensor(e["input_ids"])
        assert batch["attention_mask"][row].sum() == len(e["input_ids"])
        assert batch["token_type_ids"][row, : len(e["input_ids"])].tolist() == e["token_type_ids"]
    special = (original == 2) | (original == 3) | (batch["attention_mask"] == 0)
    chosen = batch["labels"] != -100
    assert not (chosen & special).any()  # never [CLS], [SEP] or padding
    assert (batch["input_ids"][special] == original[special]).all()
    assert torch.equal(batch["labels"][chosen], original[chosen])
    candidates = (~special).sum().item()
    assert candidates > 5000
    assert abs(chosen.sum().item() / candidates - 0.15) < 0.01
    inputs, labels = batch["input_ids"][chosen], batch["labels"][chosen]
    masked = (inputs == mask_tokenizer.mask_token_id).float().mean().item()
    unchanged = (inputs == labels).float().mean().item()
    replaced = inputs[(inputs != labels) & (inputs != mask_tokenizer.mask_token_id)]
    assert abs(masked - 0.8) < 0.04
    assert abs(unchanged - 0.1 - 0.1 / vocab) < 0.03  # a random token equals the original with prob ~1/vocab
    assert abs(len(replaced) / len(inputs) - 0.1) < 0.03
    assert replaced.min() >= 5  # random replacements are never special tokens
    assert torch.equal(batch["next_sentence_label"], torch.tensor([i % 2 for i in range(200)]))
    assert torch.equal(batch["input_ids"][~chosen], original[~chosen])


def test_masking_is_a_function_of_seed_epoch_instance(mask_tokenizer: PreTrainedTokenizerFast) -> None:
    examples = _random_examples(16, len(mask_tokenizer))
    collator = MaskingCollator(mask_tokenizer, seed=0, pad_to_multiple_of=None)
    full = collator(examples)
    # Another batch composition and order (as with other DataLoader workers or after a resume): same masks.
    fresh = MaskingCollator(mask_tokenizer, seed=0, pad_to_multiple_of=None)
    part = fresh([examples[9], examples[3]])
    for row, i in enumerate((9, 3)):
        n = len(examples[i]["input_ids"])
        assert torch.equal(part["input_ids"][row, :n], full["input_ids"][i, :n])
        assert torch.equal(part["labels"][row, :n], full["labels"][i, :n])
    collator.set_epoch(1)
    assert not torch.equal(collator(examples)["labels"], full["labels"])  # a new epoch masks other tokens
    collator.set_epoch(0)
    assert torch.equal(collator(examples)["input_ids"], full["input_ids"])
    other_seed = MaskingCollator(mask_tokenizer, seed=1, pad_to_multiple_of=None)(examples)
    assert not torch.equal(other_seed["labels"], full["labels"])


def test_collator_feeds_built_instances(json_config: DataConfig) -> None:
    data = build_pretraining_data(json_config, seed=0)
    loader = torch.utils.data.DataLoader(data.train, batch_size=8, collate_fn=MaskingCollator(data.tokenizer))
    batch = next(iter(loader))
    assert batch["input_ids"].shape == batch["labels"].shape == batch["token_type_ids"].shape
    assert batch["input_ids"].shape[0] == 8 and batch["next_sentence_label"].shape == (8,)
    assert (batch["labels"] != -100).any()


# ---------------------------------------------------------------------------------------------------------------------
# Real corpus
# ---------------------------------------------------------------------------------------------------------------------


def test_shared_wiki_corpus_builds_instances(tmp_path: Path, shared_data: Path) -> None:
    source = SourceConfig(kind="json", path=str(shared_data / "corpus" / "wiki.jsonl"))
    cfg = tiny_config(tmp_path, [source], max_documents=12, max_seq_length=64, vocab_size=500, validation_documents=2)
    data = build_pretraining_data(cfg, seed=0)
    assert len(data.validation) > 0 and len(data.train) > 50
    tok = data.tokenizer
    for ex in data.train.select(range(50)):
        check_nsp_instance(ex, max_len=64, cls_id=tok.cls_token_id, sep_id=tok.sep_token_id)
    tokens = [t for ids in data.train["input_ids"] for t in ids]
    assert tokens.count(tok.unk_token_id) / len(tokens) < 0.01  # the trained vocabulary covers the text
