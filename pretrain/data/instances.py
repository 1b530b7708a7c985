"""BERT pretraining instances: documents -> sentences -> token ids -> instances, as in original BERT's
``create_pretraining_data.py``, cached on disk or made on the fly from a stream.

    documents, in chunks of DOCS_PER_CHUNK
      -> sentences (split_sentences) -> token ids (tokenize_documents, one batched call of the Rust tokenizer)
      -> "mlm_nsp": [CLS] A [SEP] B [SEP] with next-sentence labels (create_nsp_instances)
         "mlm":     full-length packed sequences, no NSP (create_packed_instances)
      -> columns input_ids, token_type_ids, next_sentence_label (mlm_nsp only), instance_id (unique)

The chunk is the unit of work of the batched ``datasets.map`` (so ``num_proc`` workers never change the result)
and the pool the random "next sentence" documents are drawn from. Validation documents go through the same code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import logging
import random
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import datasets
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from pretrain.data.config import DataConfig

logger = logging.getLogger(__name__)

# Documents per unit of instance creation (and pool for random next segments). Part of the cache key.
DOCS_PER_CHUNK = 256
# instance_id = chunk_index << ID_SHIFT | position in chunk; validation chunks are offset by VALIDATION_ID_OFFSET.
ID_SHIFT = 24
VALIDATION_ID_OFFSET = 1 << 60

# A sentence ends at . ! or ? (optionally followed by a closing quote or bracket) before whitespace and an
# upper-case letter, digit or opening quote/bracket. Crude, but sentence boundaries only need to be roughly right
# for NSP; original BERT's input was one sentence per line from a similar heuristic.
# The pattern starts with the punctuation (not a look-behind), so the regex engine can skip ahead: 3x faster.
_SENTENCE_END = re.compile(r"([.!?][\"')\]]?)\s+(?=[\"'(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Paragraphs (lines) split into sentences, in one regex pass; empty pieces dropped (whitespace-only ones
    tokenise to nothing)."""
    return [s for s in _SENTENCE_END.sub("\\1\n", text).split("\n") if s]


def tokenize_documents(texts: list[str], tokenizer: Tokenizer) -> list[list[list[int]]]:
    """Per document, its sentences as token ids (no special tokens), in one batched call of the Rust tokenizer;
    a document with no tokens is an empty list (callers drop it)."""
    per_doc = [split_sentences(t) for t in texts]
    flat = [s for sents in per_doc for s in sents]
    ids = [e.ids for e in tokenizer.encode_batch_fast(flat, add_special_tokens=False)] if flat else []
    out, pos = [], 0
    for sents in per_doc:
        out.append([s for s in ids[pos : pos + len(sents)] if s])
        pos += len(sents)
    return out


def _truncated_lengths(len_a: int, len_b: int, max_total: int) -> tuple[int, int]:
    """Lengths after BERT's truncate_seq_pair: it removes one token at a time from the longer segment (B on ties)."""
    excess = len_a + len_b - max_total
    if excess <= 0:
        return len_a, len_b
    gap = min(excess, abs(len_a - len_b))
    if len_a > len_b:
        len_a -= gap
    else:
        len_b -= gap
    excess -= gap
    # Equal lengths from here: removals alternate, starting with B.
    return len_a - excess // 2, len_b - (excess + 1) // 2


def _truncate(tokens: list[int], keep: int, rng: random.Random) -> list[int]:
    """Keep ``keep`` tokens; as BERT, each removed token comes from the front or the back with probability 1/2."""
    removed = len(tokens) - keep
    if removed <= 0:
        return tokens
    front = rng.getrandbits(removed).bit_count()  # Binomial(removed, 1/2): one fair coin per removed token
    return tokens[front : front + keep]


def create_nsp_instances(documents: list[list[list[int]]], cfg: DataConfig, rng: random.Random, *, cls_id: int,
                         sep_id: int) -> list[tuple[list[int], int, int, int]]:  # fmt: skip
    """BERT's create_instances_from_document over a pool of documents (each a list of token-id sentences).

    Returns (input_ids, length of "[CLS] A [SEP]", is_random_next, index of A's document) per instance. Sentences
    accumulate up to a target length (max_seq_length - 3, or with probability short_seq_prob a random shorter one);
    A is a random prefix of the accumulated chunk; B is the rest (label 0) or, with probability nsp_random_prob, a
    segment of another document in the pool (label 1), in which case the unused sentences are put back.
    """
    max_tokens = cfg.max_seq_length - 3
    instances = []
    for d, doc in enumerate(documents):
        target = max_tokens
        if rng.random() < cfg.short_seq_prob:
            target = rng.randint(2, max_tokens)
        chunk: list[list[int]] = []
        length, i = 0, 0
        while i < len(doc):
            chunk.append(doc[i])
            length += len(doc[i])
            if i == len(doc) - 1 or length >= target:
                if len(chunk) == 1 and len(chunk[0]) >= 2:
                    # One over-long sentence: split it at a random token. (BERT forces a random next here, which
                    # skews the labels towards 1 on corpora with long sentences.)
                    cut = rng.randrange(1, len(chunk[0]))
                    chunk, a_end, unused = [chunk[0][:cut], chunk[0][cut:]], 1, 0
                else:
                    a_end = rng.randrange(1, len(chunk)) if len(chunk) >= 2 else 1
                    unused = len(chunk) - a_end
                tokens_a = list(chain.from_iterable(chunk[:a_end]))
                random_next = len(documents) > 1 and (len(chunk) == 1 or rng.random() < cfg.nsp_random_prob)
                if random_next:
                    other = rng.randrange(len(documents) - 1)
                    other += other >= d  # any document but this one
                    pool = documents[other]
                    start = rng.randrange(len(pool))
                    tokens_b: list[int] = []
                    for sentence in pool[start:]:
                        tokens_b.extend(sentence)
                        if len(tokens_b) >= target - len(tokens_a):
                            break
                    i -= unused  # put the unused sentences back (the rest of a split sentence is dropped)
                else:
                    tokens_b = list(chain.from_iterable(chunk[a_end:]))
                if tokens_b:  # empty only for a one-sentence chunk with no other document to draw from
                    len_a, len_b = _truncated_lengths(len(tokens_a), len(tokens_b), max_tokens)
                    tokens_a, tokens_b = _truncate(tokens_a, len_a, rng), _truncate(tokens_b, len_b, rng)
                    ids = [cls_id, *tokens_a, sep_id, *tokens_b, sep_id]
                    instances.append((ids, len_a + 2, int(random_next), d))
                chunk, length = [], 0
            i += 1
    return instances


def create_packed_instances(documents: list[list[list[int]]], cfg: DataConfig, *, cls_id: int,
                            sep_id: int) -> list[list[int]]:  # fmt: skip
    """The "mlm" objective: documents joined with [SEP] and cut into full-length [CLS] ... [SEP] sequences
    (the last one of the pool may be shorter)."""
    stream = list(chain.from_iterable(chain(chain.from_iterable(doc), (sep_id,)) for doc in documents))
    body = cfg.max_seq_length - 2
    return [[cls_id, *stream[k : k + body], sep_id] for k in range(0, len(stream), body)]


def _stable_hash63(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def _instances_from_chunks(batch: dict[str, list], indices: list[int], *, tokenizer: Tokenizer, cfg: DataConfig,
                           seed: int, part: str) -> dict[str, list]:  # fmt: skip
    """Batched map function: each input row is a chunk of documents (column "text": list[str]); outputs instances."""
    out = empty_columns(cfg.objective)
    sources = batch.get("source", [None] * len(batch["text"]))
    for texts, chunk_sources, chunk_index in zip(batch["text"], sources, indices, strict=True):
        add_chunk_instances(out, texts, chunk_index, tokenizer=tokenizer, cfg=cfg, seed=seed, part=part,
                            sources=chunk_sources)  # fmt: skip
    return out


def instance_features(objective: str) -> datasets.Features:
    features = {
        "input_ids": datasets.List(datasets.Value("int32")),
        "token_type_ids": datasets.List(datasets.Value("int8")),
        "instance_id": datasets.Value("int64"),
    }
    if objective == "mlm_nsp":
        features["next_sentence_label"] = datasets.Value("int8")
    return datasets.Features(features)


def empty_columns(objective: str) -> dict[str, list]:
    return {name: [] for name in instance_features(objective)}


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: the millions of small acyclic lists made here would otherwise trigger
    collections that cost ~8% of the preprocessing time. Nothing made here forms a reference cycle."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass
class SourceStats:
    """What one source contributed to a set of instances (summed over shards for the preparation summary)."""

    documents: int = 0
    """Documents with at least one token."""
    single_sentence_documents: int = 0
    """Documents of one sentence: their only "true next" pairs are two halves of that sentence."""
    sentences: int = 0
    document_tokens: int = 0
    """Corpus tokens (no special tokens), the unit of the throughput figures."""
    instances: int = 0
    """Instances whose segment A comes from this source (mlm_nsp; packed "mlm" instances are not attributed)."""
    true_next: int = 0
    """Of those, instances whose segment B is the true continuation of A (next_sentence_label 0)."""
    real_tokens: int = 0
    """Tokens of those instances, [CLS] and [SEP] included (padding excluded)."""

    def add(self, other: SourceStats) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def _instance_id(part: str, chunk_key: int, k: int) -> int:
    """Materialised: chunk index << ID_SHIFT | position, validation offset by VALIDATION_ID_OFFSET. Streamed: a hash
    of the chunk's content, because stream positions restart in every DataLoader worker that reads a shard."""
    if part == "stream":
        return _stable_hash63(f"{chunk_key}/{k}")
    return (VALIDATION_ID_OFFSET if part == "validation" else 0) + (chunk_key << ID_SHIFT) + k


@gc_paused()
def add_chunk_instances(out: dict[str, list], texts: list[str], chunk_index: int, *, tokenizer: Tokenizer,
                        cfg: DataConfig, seed: int, part: str, sources: list[int] | None = None,
                        stats: dict[int, SourceStats] | None = None) -> None:  # fmt: skip
    """Append the instances of one chunk of documents to the columns in ``out``; count what each source
    (``sources``: one per text) contributed into ``stats`` when given. ``part``: "train", "validation" or "stream"
    (ids and randomness keyed by the chunk's content)."""
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenized = tokenize_documents(texts, tokenizer)
    kept = [k for k, doc in enumerate(tokenized) if doc]
    documents = [tokenized[k] for k in kept]
    doc_sources = [sources[k] if sources is not None else 0 for k in kept]
    if stats is not None:
        for doc, source in zip(documents, doc_sources, strict=True):
            counts = stats.setdefault(source, SourceStats())
            counts.documents += 1
            counts.single_sentence_documents += len(doc) == 1
            counts.sentences += len(doc)
            counts.document_tokens += sum(map(len, doc))
    if not documents:
        return
    chunk_key = _stable_hash63(f"{len(texts)}/{texts[0]}") if part == "stream" else chunk_index
    if cfg.objective == "mlm":
        for k, ids in enumerate(create_packed_instances(documents, cfg, cls_id=cls_id, sep_id=sep_id)):
            out["input_ids"].append(ids)
            out["token_type_ids"].append([0] * len(ids))
            out["instance_id"].append(_instance_id(part, chunk_key, k))
        return
    if len(documents) == 1:
        logger.warning("a chunk of %s documents has a single document: its next-sentence labels are all 0", part)
    # Python's generator: scalar draws cost ~0.1 us against ~2 us for numpy's. String seeds are stable.
    rng = random.Random(f"{seed}/{part}/{chunk_key}")
    instances = create_nsp_instances(documents, cfg, rng, cls_id=cls_id, sep_id=sep_id)
    for k, (ids, len_cls_a_sep, label, d) in enumerate(instances):
        out["input_ids"].append(ids)
        out["token_type_ids"].append([0] * len_cls_a_sep + [1] * (len(ids) - len_cls_a_sep))
        out["next_sentence_label"].append(label)
        out["instance_id"].append(_instance_id(part, chunk_key, k))
        if stats is not None:
            counts = stats[doc_sources[d]]
            counts.instances += 1
            counts.true_next += label == 0
            counts.real_tokens += len(ids)


def plain_backend(tokenizer: PreTrainedTokenizerFast) -> Tokenizer:
    """A copy of the Rust tokenizer with truncation and padding off (a loaded tokenizer.json may enable them)."""
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    return backend


def make_instances(docs: datasets.Dataset, tokenizer: PreTrainedTokenizerFast, cfg: DataConfig, *, seed: int,
                   validation: bool, work_dir: Path | None = None) -> datasets.Dataset:  # fmt: skip
    """Instances from materialised documents, in chunks of DOCS_PER_CHUNK documents, num_proc workers."""
    chunks = docs.batch(batch_size=DOCS_PER_CHUNK)
    name = "validation" if validation else "train"
    fn_kwargs = {"tokenizer": plain_backend(tokenizer), "cfg": cfg, "seed": seed, "part": name}
    # Our own cache key decides reuse: no function hashing by datasets, and its files in our work dir.
    return chunks.map(_instances_from_chunks, batched=True, batch_size=1, with_indices=True,
                      remove_columns=chunks.column_names, features=instance_features(cfg.objective),
                      fn_kwargs=fn_kwargs, num_proc=min(cfg.num_proc, len(chunks)) if cfg.num_proc > 1 else None,
                      new_fingerprint=f"lnbert-{name}-{uuid.uuid4().hex}",
                      cache_file_name=str(work_dir / f"{name}.arrow") if work_dir is not None else None,
                      desc=f"Tokenising and making {name} instances")  # fmt: skip


def stream_instances(
    docs: datasets.IterableDataset, tokenizer: PreTrainedTokenizerFast, cfg: DataConfig, *, seed: int
) -> datasets.IterableDataset:
    """Training instances made on the fly from a document stream (shuffled with a buffer; set_epoch reshuffles)."""
    chunks = docs.shuffle(seed=seed, buffer_size=cfg.shuffle_buffer_size).batch(batch_size=DOCS_PER_CHUNK)
    fn_kwargs = {"tokenizer": plain_backend(tokenizer), "cfg": cfg, "seed": seed, "part": "stream"}
    return chunks.map(
        _instances_from_chunks, batched=True, batch_size=1, with_indices=True, remove_columns=["text", "source"],
        features=instance_features(cfg.objective), fn_kwargs=fn_kwargs,
    )
