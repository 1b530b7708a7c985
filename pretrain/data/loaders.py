"""The pretraining data loaders: an epoch-seeded sampler (a resumed run sees the same order) and the train and
validation loaders with their masking collators. Used by pretrain/run.py (and benchmarks/data_prep.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Sampler

from pretrain.common.device import accelerate_uses_cpu
from pretrain.config import PretrainConfig
from pretrain.data.collator import MaskingCollator
from pretrain.data.pipeline import PretrainingData
from pretrain.run_folder.status import ignore_stop_signals


def copies_asynchronously() -> bool:
    """Batches go to a GPU: pinned by the loaders and copied with Accelerate's non_blocking (False by default). Both
    or neither: without pinned memory a non-blocking copy is synchronous anyway."""
    return not accelerate_uses_cpu()


class EpochSampler(Sampler[int]):
    """A fresh permutation per epoch from ``seed + epoch`` alone, so an epoch's order is reproducible on resume.
    ``epoch`` is set by the training loop: no ``set_epoch`` method, which Accelerate's data loaders would call with
    their own counter (it restarts at 0 for a resumed, batch-skipping loader)."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        # Converted to Python ints a slice at a time: the whole permutation as a list costs ~36 bytes an instance
        # (1.6 GB a process for the presets' ~45M instances; BENCHMARKS.md "Preparing the corpus").
        for chunk in torch.randperm(self.size, generator=generator).split(1 << 16):
            yield from chunk.tolist()


@dataclass
class Loaders:
    train: DataLoader
    validation: DataLoader
    train_collator: MaskingCollator
    sampler: EpochSampler | None
    train_sample: DataLoader | None = None
    """As many training instances as an evaluation's validation ones, the first of the split, masked as validation
    is: the fit a validation loss is compared with. None for a streamed training split."""


def build_dataloaders(cfg: PretrainConfig, data: PretrainingData, num_processes: int) -> Loaders:
    train_cfg = cfg.train
    batch = train_cfg.per_device_batch_size
    options = dict(mlm_probability=cfg.data.mlm_probability, seed=train_cfg.seed, prepared=data.instances,
                   max_length=cfg.data.max_seq_length)  # fmt: skip
    collator = MaskingCollator(data.tokenizer, **options)
    # Validation masks are fixed (epoch 0 of their own collator), so every evaluation sees the same task.
    val_collator = MaskingCollator(data.tokenizer, **options)
    # Own generators: creating a loader iterator then draws no number from the global RNG, which dropout uses.
    generator = torch.Generator().manual_seed(train_cfg.seed)
    common = dict(num_workers=train_cfg.num_workers, generator=generator, pin_memory=copies_asynchronously(),
                  worker_init_fn=ignore_stop_signals)
    sampler = None  # a streamed training split comes in its own order
    if not isinstance(data.train, torch.utils.data.IterableDataset) and hasattr(data.train, "__len__"):
        if len(data.train) < batch * num_processes:
            raise ValueError(
                f"the training split has {len(data.train)} instances, fewer than one global micro-batch "
                f"({batch} x {num_processes} processes); add documents or lower train.per_device_batch_size"
            )
        sampler = EpochSampler(len(data.train), train_cfg.seed)
    train = DataLoader(data.train, batch_size=batch, sampler=sampler, collate_fn=collator, drop_last=True, **common)
    validation = data.validation
    if train_cfg.eval_batches:
        # A fixed subset iterated to the end (breaking out of a prepared loader confuses Accelerate's state).
        validation = validation.select(range(min(len(validation), train_cfg.eval_batches * batch * num_processes)))
    val_loader = DataLoader(validation, batch_size=batch, collate_fn=val_collator, **common)
    sample = None
    if sampler is not None and hasattr(validation, "__len__"):
        fit = data.train.select(range(min(len(validation), len(data.train))))
        sample = DataLoader(fit, batch_size=batch, collate_fn=val_collator, **common)
    return Loaders(train=train, validation=val_loader, train_collator=collator, sampler=sampler, train_sample=sample)
