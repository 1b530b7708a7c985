"""Dynamic masking: the collate function that turns a list of instances into a padded, masked-LM batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase


class DamagedInstance(ValueError):
    """An instance whose token ids its tokenizer cannot have written."""


class MaskingCollator:
    """Pads a list of instances to the batch's longest (rounded up to a multiple of pad_to_multiple_of) and
    applies BERT's dynamic masking: mlm_probability of the non-special, non-padding tokens (rounded, at least
    one, as original BERT) are chosen; 80% -> [MASK], 10% -> a random non-special token, 10% unchanged; labels
    are -100 elsewhere. Masks are a pure function of (seed, epoch, instance_id), so a resumed run (and any
    number of DataLoader workers) reproduces exactly the same masks; set_epoch gives each epoch new ones."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, *, mlm_probability: float = 0.15, seed: int = 0,
                 pad_to_multiple_of: int | None = 8, prepared: Path | None = None,
                 max_length: int | None = None) -> None:  # fmt: skip
        if not 0.0 < mlm_probability < 1.0:
            raise ValueError(f"mlm_probability={mlm_probability} must be in (0, 1) (BERT: 0.15)")
        if tokenizer.mask_token_id is None or tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer needs [MASK] and [PAD] tokens for masked-LM pretraining")
        self.mlm_probability, self.seed, self.pad_to_multiple_of = mlm_probability, seed, pad_to_multiple_of
        self.epoch, self.mask_id, self.pad_id = 0, tokenizer.mask_token_id, tokenizer.pad_token_id
        self.special_ids = np.array(sorted(set(tokenizer.all_special_ids)), dtype=np.int64)
        self.random_ids = np.setdiff1d(np.arange(len(tokenizer), dtype=np.int64), self.special_ids)
        self.vocab_size, self.prepared = len(tokenizer), prepared  # prepared: the instances' folder, for errors
        self.max_length = max_length  # what the instances were made for (data.max_seq_length): none is longer

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    # An instance its tokenizer cannot have written (token ids outside the vocabulary, segment ids other than 0 and 1
    # or not one per token, more tokens than data.max_seq_length, an NSP label other than 0 and 1) has bytes damaged
    # since it was prepared: the model would fail indexing an embedding, on a GPU with a device-side assert that names
    # nothing. Two reductions per instance for the token ids, two per batch for the labels: 2.3% of collating 256 x 128
    # tokens (measured before the length check, one comparison per instance, joined them).

    def check_tokens(self, examples: list[dict], original_ids: list[np.ndarray]) -> None:
        for example, ids in zip(examples, original_ids, strict=True):
            if len(ids) and (ids.min() < 0 or ids.max() >= self.vocab_size):
                bad = ids[(ids < 0) | (ids >= self.vocab_size)][:4].tolist()
                self._refuse(example, f"token ids outside the tokenizer's vocabulary (0-{self.vocab_size - 1}): {bad}")
            if len(example["token_type_ids"]) != len(ids):
                self._refuse(example, f"{len(example['token_type_ids'])} segment ids for {len(ids)} tokens")
            if self.max_length is not None and len(ids) > self.max_length:
                self._refuse(example, f"{len(ids)} tokens, more than the {self.max_length} it was made for")

    def check_labels(self, examples: list[dict], batch: dict[str, np.ndarray]) -> None:
        for name, what in (("token_type_ids", "segment ids"), ("next_sentence_label", "next-sentence labels")):
            values = batch.get(name)
            if values is not None and (values.min() < 0 or values.max() > 1):
                row = int(np.flatnonzero(((values < 0) | (values > 1)).reshape(len(examples), -1).any(axis=1))[0])
                self._refuse(examples[row], f"{what} other than 0 and 1")

    def _refuse(self, example: dict, problem: str) -> None:
        said = f"instance {int(example['instance_id'])} holds {problem}"
        if self.prepared is None:  # made here from the corpus by the tokenizer: no file to blame
            raise DamagedInstance(f"{said}, which its tokenizer cannot have made")
        raise DamagedInstance(f"{said}: the prepared instances in {self.prepared} were damaged since they were made. "
                              "Remove that folder and start again: the instances are made again from the corpus (or "
                              "the run says how to prepare them)")  # fmt: skip

    def mask(self, input_ids: np.ndarray, instance_id: int) -> tuple[np.ndarray, np.ndarray]:
        """(masked input_ids, labels) for one unpadded instance."""
        rng = np.random.default_rng([self.seed, self.epoch, int(instance_id)])
        labels = np.full(input_ids.shape, -100, dtype=np.int64)
        candidates = np.flatnonzero(~np.isin(input_ids, self.special_ids))
        if len(candidates) == 0:
            return input_ids, labels
        n_chosen = max(1, round(self.mlm_probability * len(candidates)))
        chosen = rng.choice(candidates, size=n_chosen, replace=False)
        labels[chosen] = input_ids[chosen]
        masked = input_ids.copy()
        action = rng.random(n_chosen)
        masked[chosen[action < 0.8]] = self.mask_id
        to_random = chosen[(action >= 0.8) & (action < 0.9)]
        masked[to_random] = rng.choice(self.random_ids, size=len(to_random))
        return masked, labels

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        width = max(len(e["input_ids"]) for e in examples)
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        shape = (len(examples), width)  # (B, T)
        batch = {
            "input_ids": np.full(shape, self.pad_id, dtype=np.int64),
            "attention_mask": np.zeros(shape, dtype=np.int64),
            "token_type_ids": np.zeros(shape, dtype=np.int64),
            "labels": np.full(shape, -100, dtype=np.int64),
        }
        original_ids = [np.asarray(example["input_ids"], dtype=np.int64) for example in examples]
        self.check_tokens(examples, original_ids)
        if "next_sentence_label" in examples[0]:
            batch["next_sentence_label"] = np.array([int(e["next_sentence_label"]) for e in examples], dtype=np.int64)
        for row, (example, ids) in enumerate(zip(examples, original_ids, strict=True)):
            n = len(ids)
            batch["input_ids"][row, :n], batch["labels"][row, :n] = self.mask(ids, int(example["instance_id"]))
            batch["token_type_ids"][row, :n] = example["token_type_ids"]
            batch["attention_mask"][row, :n] = 1
        self.check_labels(examples, batch)
        return {name: torch.from_numpy(column) for name, column in batch.items()}
