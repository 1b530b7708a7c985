"""Pretraining data: ``build_pretraining_data``, which runs the stages of this package (listed in __init__.py), and
whether the cache already holds what a config needs (``prepared``, ``is_prepared``)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import datasets
from transformers import PreTrainedTokenizerFast

from pretrain.common.cli import writable_folder
from pretrain.data.config import DataConfig
from pretrain.data.corpus import corpus_bytes, document_texts, split_corpus
from pretrain.data.instance_cache import cached_instances, is_finished, prepared_dir
from pretrain.data.instances import make_instances, stream_instances
from pretrain.data.tokenizer import cached_tokenizer, load_or_train_tokenizer


class PretrainingData(NamedTuple):
    train: datasets.Dataset | datasets.IterableDataset
    """input_ids, token_type_ids, next_sentence_label (mlm_nsp only), instance_id (unique)."""
    validation: datasets.Dataset
    """Same columns, from held-out documents; always materialised."""
    tokenizer: PreTrainedTokenizerFast
    instances: Path | None
    """The prepared instances' folder under data.cache_dir (``prepared_dir``); None when streaming."""


class PreparationRequired(ValueError):
    """Several processes would wait at a barrier while one prepares a large corpus; the message names the command
    that prepares it first."""


class Prepared(NamedTuple):
    """What ``cfg.cache_dir`` already holds for a config, found without training or reading the corpus."""

    tokenizer: PreTrainedTokenizerFast | None
    """The named tokenizer, or the trained one from the cache; None: it is still to be trained."""
    instances: Path | None
    """The prepared instances' folder (``prepared_dir``); None when streaming or while the tokenizer is untrained."""
    ready: bool
    """Nothing is left to train or prepare (streaming: the tokenizer is there); damaged instances are not ready."""


def prepared(cfg: DataConfig, *, seed: int) -> Prepared:
    """What the cache holds for ``cfg``: the tokenizer loaded (when nothing is to be trained), the instances' folder,
    and whether they are ready (their files read once, here)."""
    tokenizer = cached_tokenizer(cfg, seed=seed)
    instances = None if tokenizer is None or cfg.streaming else prepared_dir(cfg, tokenizer, seed=seed)
    return Prepared(tokenizer, instances, tokenizer is not None and (instances is None or is_finished(instances)))


def is_prepared(cfg: DataConfig, *, seed: int) -> bool:
    """Whether ``cfg.cache_dir`` holds all the training needs: the tokenizer and, unless streaming, the instances."""
    return prepared(cfg, seed=seed).ready


def check_prepared_for_distributed(cfg: DataConfig, *, ready: bool, num_processes: int, prepare_command: str,
                                   barrier_timeout_s: float | None) -> None:  # fmt: skip
    """Raise PreparationRequired when ``num_processes`` > 1 and a corpus too large to prepare under a barrier is
    not prepared yet (``ready``); ``barrier_timeout_s``: how long the others would wait (train.collective_timeout_s)."""
    if num_processes <= 1 or ready:
        return
    size = corpus_bytes(cfg)
    if size is not None and size <= cfg.max_inline_preparation_mb * 2**20:
        return
    what = "a Hugging Face Hub dataset" if size is None else f"{size / 2**20:,.0f} MiB of files"
    raise PreparationRequired(
        f"the data is not prepared: data.cache_dir={cfg.cache_dir} holds no prepared instances for this config (or "
        f"damaged ones), and the corpus ({what}) is too large to prepare while {num_processes - 1} other process(es) "
        f"wait at a barrier (data.max_inline_preparation_mb={cfg.max_inline_preparation_mb:g}; the barrier gives up "
        f"after train.collective_timeout_s{'' if barrier_timeout_s is None else f'={barrier_timeout_s:g} s'}). "
        f"Prepare it once, on any machine that sees data.cache_dir (a CPU node will do), with the same arguments:\n"
        f"    {prepare_command}\nthen start the training again"
    )


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """``datasets``' own progress bars off (a bar per file read, per filter: a screen of them before training): the
    instances' bar (``progress``) says how the preparation goes."""
    shown = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if shown:
            datasets.enable_progress_bars()


def build_pretraining_data(
    cfg: DataConfig, *, seed: int, save_tokenizer_to: Path | None = None, model_vocab_size: int | None = None,
    main_process_first: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    num_processes: int = 1, prepare_command: str = "python -m pretrain.prepare [the same arguments]",
    progress: bool = False, trained_tokenizer: Path | None = None, barrier_timeout_s: float | None = None,
) -> PretrainingData:
    """Tokenizer, training and validation instances; built once (inside ``main_process_first()``), then reused
    from ``cfg.cache_dir`` by every later call with the same inputs (streaming: only the validation instances are
    materialised). The corpus is read only when something is not cached, and then once.

    With several processes (``num_processes``) a large corpus must have been prepared by ``pretrain/prepare.py``
    (``prepare_command``): otherwise PreparationRequired is raised before any process waits at a barrier (which gives
    up after ``barrier_timeout_s``, named in the message).
    ``trained_tokenizer``: where the main process saved the tokenizer it trained (another node's cache lacks it)."""
    # Loaded and keyed once, before any process waits at the barrier: the readiness check and the preparation need both.
    found = prepared(cfg, seed=seed)
    check_prepared_for_distributed(cfg, ready=found.ready, num_processes=num_processes, prepare_command=prepare_command,
                                   barrier_timeout_s=barrier_timeout_s)  # fmt: skip
    if not found.ready:  # what is missing is made under cache_dir: a folder that cannot be written answers now
        writable_folder(cfg.cache_dir, "data.cache_dir")

    @functools.cache
    def documents() -> tuple[datasets.Dataset | datasets.IterableDataset, datasets.Dataset]:
        return split_corpus(cfg, seed=seed)

    with main_process_first(), quiet_datasets():
        elsewhere = trained_tokenizer if trained_tokenizer is not None and trained_tokenizer.is_dir() else None
        tokenizer = load_or_train_tokenizer(
            cfg, save_dir=save_tokenizer_to, model_vocab_size=model_vocab_size, seed=seed, trained_elsewhere=elsewhere,
            training_texts=lambda: document_texts(documents()[0]), loaded=found.tokenizer,
        )  # fmt: skip
        folder = None
        if cfg.streaming:
            train_docs, val_docs = documents()
            validation = make_instances(val_docs, tokenizer, cfg, seed=seed, validation=True)
            train = stream_instances(train_docs, tokenizer, cfg, seed=seed)
        else:
            folder = found.instances or prepared_dir(cfg, tokenizer, seed=seed)  # None there: the tokenizer was new
            train, validation = cached_instances(documents, tokenizer, cfg, seed=seed, progress=progress, folder=folder)
    return PretrainingData(train=train, validation=validation, tokenizer=tokenizer, instances=folder)

