"""One vocabulary for a whole run: every process holds the same token ids, a resumed run the ones it was trained
with, and the data position of a checkpoint is only reused for the same sequence of batches."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.utils import gather_object
from tokenizers import Tokenizer

from pretrain.common.roles import not_keyed_in
from pretrain.config import ConfigError, PretrainConfig, to_dict
from pretrain.data.tokenizer import vocab_hash


def check_same_trained_tokenizer(tokenizer: Any, saved_dir: Path) -> None:
    """A resumed run must see the vocabulary it was trained with. When data.cache_dir has no tokenizer for the
    config, the run takes in its own (training.trained_vocabulary); one that holds another (trained there by
    another run: WordPiece training is not bit-reproducible) is refused."""
    saved = saved_dir / "tokenizer.json"
    if saved.is_file() and vocab_hash(Tokenizer.from_file(str(saved))) != vocab_hash(tokenizer):
        raise ValueError(
            f"the WordPiece tokenizer trained now differs from the one the checkpoint was trained with ({saved_dir}); "
            f"data.cache_dir holds another one for this config (tokenizer training is not bit-reproducible). Resume with "
            f"--data.tokenizer={saved_dir}"
        )


def check_one_vocabulary(accelerator: Accelerator, tokenizer: Any) -> None:
    """Every process must train with the same token ids: a node that trained or prepared its own WordPiece
    tokenizer (not bit-reproducible) would average gradients over another vocabulary without any error."""
    if accelerator.num_processes == 1:
        return
    vocab = vocab_hash(tokenizer)
    hashes = gather_object([vocab])
    if len(set(hashes)) > 1:
        raise ConfigError(
            f"the processes of this run hold different vocabularies ({len(set(hashes))} distinct over "
            f"{len(hashes)} processes): a node prepared its own data.cache_dir with a tokenizer trained there. "
            "Prepare the data once and give every node the same cache (copy data.cache_dir), or train the "
            "tokenizer once and pass --data.tokenizer=FOLDER on every node"
        )


def data_fingerprint(cfg: PretrainConfig, num_processes: int, tokenizer: Any) -> str:
    """What fixes the sequence of batches: data config, vocabulary, seed, batch size, processes (a position is
    only meaningful for the same sequence). The vocabulary counts, not the tokenizer's name or folder."""
    mechanics = not_keyed_in(type(cfg.data), "batches")  # pretrain/data/config.py: keyed_in
    data = {k: v for k, v in to_dict(cfg.data).items() if k not in mechanics}
    vocab = vocab_hash(tokenizer)
    key = [data, vocab, cfg.train.seed, cfg.train.per_device_batch_size, num_processes]
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
