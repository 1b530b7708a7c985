"""The fine-tuning recipe: a typed dataclass with a docstring under each field (also its ``--help`` text).

The commands (finetune.run, finetune.schedule, finetune.report) read it through the project's one loader,
pretrain/common/cli.py: a preset (``--config configs/finetune/x.yaml``) and ``--key=value`` / ``--recipe.key=value``
overrides end in the same dataclasses, whose ``__post_init__`` rejects bad values with a message naming the key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, get_args

from finetune.glue import get_task
from pretrain.common.cli import ConfigError, require

Device = Literal["auto", "cpu", "cuda"]
DEVICES: tuple[str, ...] = get_args(Device)


@dataclass(kw_only=True)
class FinetuneConfig:
    """The recipe of one fine-tuning job: original BERT's GLUE recipe (Devlin et al. 2019, appendix A.3)."""

    batch_size: int = 32
    """Training sequences per optimizer step (original BERT: 32)."""
    epochs: int = 3
    """Passes over the training set (original BERT: 3)."""
    warmup_ratio: float = 0.1
    """Fraction of the optimizer steps with linear warm-up from 0; then linear decay to 0 (BERT: 10%)."""
    max_length: int = 128
    """Longest tokenized pair, in tokens; longer pairs are truncated longest-first (BERT: 128)."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay, applied to all weights except biases and normalisation layers."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    adam_eps: float = 1e-6
    """AdamW epsilon (original BERT's optimizer used 1e-6)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this value (BERT: 1.0); 0 disables clipping."""
    mixed_precision: Literal["no", "bf16"] = "no"
    """Autocast the forward pass to bf16 ("bf16": about 1.6x faster on a CPU with AVX512-BF16 and on any
    recent GPU; weights, gradients and the optimizer stay fp32) or train in fp32 ("no"). Part of the
    recipe: results of the two are stored apart."""
    eval_batch_size: int = 64
    """Sequences per batch when evaluating on the dev set (does not change results)."""
    random_init: bool = False
    """Ignore the model's weights and fine-tune its architecture from random initialisation (the baseline
    without pretraining); the tokenizer is still the model's."""
    max_train_examples: int | None = None
    """Use only the first N training examples (quick checks); None uses them all."""
    max_eval_examples: int | None = None
    """Use only the first N dev examples (quick checks); None uses them all."""
    torch_threads: int = 0
    """Intra-op CPU threads for this process (workers share the CPU); 0 leaves torch's default."""
    device: Device = "auto"
    """Where to train: auto (cuda when available), cpu or cuda."""
    progress: bool = True
    """Show a tqdm progress bar over the optimizer steps."""

    def __post_init__(self) -> None:
        def check(ok: bool, name: str, rule: str) -> None:
            require(ok, f"recipe.{name}", f"{rule}; got {getattr(self, name)!r}")

        for name in ("batch_size", "epochs", "max_length", "eval_batch_size"):
            check(getattr(self, name) >= 1, name, "must be at least 1")
        check(0.0 <= self.warmup_ratio < 1.0, "warmup_ratio", "must lie in [0, 1)")
        check(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        for name in ("adam_beta1", "adam_beta2"):
            check(0.0 <= getattr(self, name) < 1.0, name, "must lie in [0, 1)")
        check(self.adam_eps > 0, "adam_eps", "must be > 0")
        check(self.max_grad_norm >= 0, "max_grad_norm", "must be >= 0 (0 disables clipping)")
        for name in ("max_train_examples", "max_eval_examples"):
            check(getattr(self, name) is None or getattr(self, name) >= 1, name, "must be at least 1, or null for all")
        check(self.mixed_precision in ("no", "bf16"), "mixed_precision", "must be 'no' or 'bf16'")
        check(self.torch_threads >= 0, "torch_threads", "must be >= 0 (0: torch's default)")
        check(self.device in DEVICES, "device", f"must be one of {', '.join(DEVICES)}")

    def result_key(self) -> dict[str, Any]:
        """The fields that change the numbers a job produces (what the results store keys a recipe by)."""
        ignored = {"eval_batch_size", "torch_threads", "device", "progress"}
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ignored}


DEFAULT_LRS: tuple[float, ...] = (2e-5, 3e-5, 5e-5)
# The paper fine-tunes every checkpoint with 6 random seeds per point.
DEFAULT_SEEDS: tuple[int, ...] = (0, 1, 2, 3, 4, 5)


def check_tasks(key: str, names: list[str]) -> None:
    """Every name in ``names`` is a GLUE task this project knows; the error names ``key``."""
    for name in names:
        try:
            get_task(name)
        except ValueError as err:
            raise ConfigError(f"{key}: {err}") from None


def validate_grid(lrs: list[float], seeds: list[int]) -> None:
    """The learning rates and seeds of a grid (``lrs`` and ``seeds`` keys of run and schedule)."""
    require(
        bool(lrs) and all(lr > 0 for lr in lrs),
        "lrs",
        f"must be a non-empty list of positive learning rates; got {lrs}",
    )
    require(
        bool(seeds) and all(s >= 0 for s in seeds) and len(set(seeds)) == len(seeds),
        "seeds",
        f"must be a non-empty list of distinct integers >= 0; got {seeds}",
    )


__all__ = ["DEFAULT_LRS", "DEFAULT_SEEDS", "DEVICES", "FinetuneConfig", "check_tasks", "validate_grid"]
