"""One vocabulary for a whole run: every process holds the same token ids, a resumed run the ones it was trained
with, and the data position of a checkpoint is only reused for the same sequence of batches."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.utils import gather_object

from pretrain.common.cli import ConfigError, to_dict
from pretrain.common.roles import not_keyed_in
from pretrain.config import PretrainConfig
from pretrain.data.config import DataConfig
from pretrain.data.instance_cache import PARTS, read_summary
from pretrain.data.tokenizer import vocab_hash
from pretrain.run_folder.layout import TOKENIZER_DIR, run_folder_of


def with_trained_vocabulary(data: DataConfig, resume_from: Path | None) -> tuple[DataConfig, list[str]]:
    """``data``, except that a resumed run whose WordPiece tokenizer was trained loads it from the checkpoint's
    run folder, as if ``data.tokenizer`` named it; and the command-line override that says so (for the data
    preparation a run with several processes may ask for).

    WordPiece training is not bit-reproducible, so the checkpoint's vocabulary is the run's own, whatever
    ``data.cache_dir`` holds now (a copied corpus has new mtimes, a new key; a shared cache perhaps another run's).
    ``data.tokenizer`` is in no key, so the instances' cache key and the data fingerprint are unchanged."""
    saved = None if resume_from is None else run_folder_of(resume_from) / TOKENIZER_DIR
    if data.tokenizer is not None or saved is None or not (saved / "tokenizer.json").is_file():
        return data, []
    return dataclasses.replace(data, tokenizer=str(saved)), [f"--data.tokenizer={saved}"]


def check_one_vocabulary(accelerator: Accelerator, tokenizer: Any) -> None:
    """Every process must train with the same token ids: a node that trained or prepared its own WordPiece
    tokenizer (not bit-reproducible) would average gradients over another vocabulary without any error."""
    if accelerator.num_processes == 1:
        return
    hashes = gather_object([vocab_hash(tokenizer)])
    if len(set(hashes)) > 1:
        raise ConfigError(
            f"the processes of this run hold different vocabularies ({len(set(hashes))} distinct over "
            f"{len(hashes)} processes): a node prepared its own data.cache_dir with a tokenizer trained there. "
            "Prepare the data once and give every node the same cache (copy data.cache_dir), or train the "
            "tokenizer once and pass --data.tokenizer=FOLDER on every node"
        )


def data_fingerprint(cfg: PretrainConfig, tokenizer: Any, instances: Path | None) -> str:
    """What fixes the order of the training sequences: data config, vocabulary, seed (a position is only meaningful
    for the same order; the batch is not in it, as the position counts sequences), and the prepared ``instances``'
    checksums: a corpus file changed in place since (the same config and path) makes other instances. The checksums
    are the shards', whose grouping follows data.num_proc: instances made again (after damage) with another num_proc
    read as other data too, and the data starts over, said, rather than continue on data it cannot vouch for. The
    vocabulary counts, not the tokenizer's name or folder."""
    mechanics = not_keyed_in(type(cfg.data), "batches")  # pretrain/data/config.py: keyed_in
    data = {k: v for k, v in to_dict(cfg.data).items() if k not in mechanics}
    summary = read_summary(instances) if instances is not None else None  # streamed: no prepared instances
    checksums = summary and [[r["sha256"] for _, r in sorted(summary[part]["shards"].items())] for part in PARTS]
    key = [data, vocab_hash(tokenizer), cfg.train.seed, checksums]
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
