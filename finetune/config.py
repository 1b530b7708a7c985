"""The fine-tuning recipe and the options the commands share: typed dataclasses, read by the command line
(pretrain/common/cli.py: ``--config`` presets and ``--key=value`` overrides), whose ``__post_init__`` rejects bad
values naming the key.

Each recipe field declares its role once (pretrain/common/roles.py): ``recipe`` fields change the numbers a job
produces and are part of its key (``FinetuneConfig.result_key``); ``mechanics`` fields say how a worker runs and
reach the tasks beside the key (``FinetuneConfig.runtime``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from finetune.glue import get_task
from pretrain.common.cli import ConfigError, require
from pretrain.common.roles import keys_where, role

Device = Literal["auto", "cpu", "cuda"]
RESULTS_DIR = "outputs/finetune/results.d"


@dataclass(kw_only=True)
class FinetuneConfig:
    """The recipe of one fine-tuning job: original BERT's GLUE recipe (Devlin et al. 2019, appendix A.3)."""

    batch_size: int = role("recipe", default=32)
    """Training sequences per optimizer step (original BERT: 32)."""
    epochs: int = role("recipe", default=3)
    """Passes over the training set (original BERT: 3)."""
    warmup_ratio: float = role("recipe", default=0.1)
    """Fraction of the optimizer steps with linear warm-up from 0; then linear decay to 0 (BERT: 10%)."""
    max_length: int = role("recipe", default=128)
    """Longest tokenized pair, in tokens; longer pairs are truncated longest-first (BERT: 128)."""
    weight_decay: float = role("recipe", default=0.01)
    """AdamW decoupled weight decay, applied to all weights except biases and normalisation layers."""
    adam_beta1: float = role("recipe", default=0.9)
    """AdamW beta1."""
    adam_beta2: float = role("recipe", default=0.999)
    """AdamW beta2."""
    adam_eps: float = role("recipe", default=1e-6)
    """AdamW epsilon (original BERT's optimizer used 1e-6)."""
    max_grad_norm: float = role("recipe", default=1.0)
    """Clip the global gradient norm to this value (BERT: 1.0); 0 disables clipping."""
    mixed_precision: Literal["no", "bf16"] = role("recipe", default="no")
    """Autocast the forward pass to bf16 (about 1.6x faster on a CPU with AVX512-BF16 and on any recent GPU;
    weights, gradients and the optimizer stay fp32) or train in fp32 ("no"); results of the two are filed apart."""
    eval_batch_size: int = role("mechanics", default=64)
    """Sequences per batch when evaluating on the dev set (does not change results)."""
    random_init: bool = role("recipe", default=False)
    """Fine-tune the model's architecture from random initialisation (the baseline without pretraining)."""
    max_train_examples: int | None = role("recipe", default=None)
    """Use only the first N training examples (quick checks); None uses them all."""
    max_eval_examples: int | None = role("recipe", default=None)
    """Use only the first N dev examples (quick checks); None uses them all."""
    torch_threads: int = role("mechanics", default=0)
    """Intra-op CPU threads for this process (workers share the CPU); 0 leaves torch's default."""
    device: Device = role("mechanics", default="auto")
    """Where to train: auto (cuda when available), cpu or cuda."""
    progress: bool = role("mechanics", default=True)
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
        check(self.torch_threads >= 0, "torch_threads", "must be >= 0 (0: torch's default)")

    def check_fits(self, positions: int | None, model: str) -> None:
        """Refuse a max_length beyond the model's ``positions`` (max_position_embeddings; None: unknown), where the
        forward pass of only the jobs with pairs that long would fail; not capped, which would not be the recipe the
        results are filed under."""
        if positions is not None and self.max_length > positions:
            raise ConfigError(
                f"recipe.max_length={self.max_length} exceeds the max_position_embeddings={positions} of {model}: "
                f"longer inputs do not fit its position embeddings; set --recipe.max_length={positions} (or lower)"
            )

    def result_key(self) -> dict[str, Any]:
        """The fields that change the numbers a job produces (role ``recipe``): part of every job's key."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k in RECIPE_FIELDS}

    def runtime(self) -> dict[str, Any]:
        """The fields that say how a worker runs (role ``mechanics``), taken from the command that submits."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in RECIPE_FIELDS}


RECIPE_FIELDS = keys_where(FinetuneConfig, lambda rules: rules.recipe)


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


@dataclass(kw_only=True)
class ResultsOption:
    """The results folder option of the commands that read or write it (run, schedule, status, report)."""

    results_dir: str = RESULTS_DIR
    """The results folder: manifests, and one result file per finished job (docs/finetune_files.md); the only
    record of the jobs. On a cluster, on the shared file system: the tasks write into it."""


@dataclass(kw_only=True)
class GridOptions(ResultsOption):
    """The options finetune.run and finetune.schedule share: the data, the (lr, seed) grid, the recipe and W&B."""

    data_dir: str | None = None
    """Folder in the original GLUE layout (MRPC/train.tsv, RTE/dev.tsv, ...); unset: nyu-mll/glue from the Hub."""
    lrs: list[float] = field(default_factory=lambda: list(DEFAULT_LRS))
    """Peak learning rates, one job each per seed (the report picks the best per snapshot by mean dev accuracy)."""
    seeds: list[int] = field(default_factory=lambda: list(DEFAULT_SEEDS))
    """Random seeds (classifier init, dropout, data order) per model, task and lr; the paper uses 6."""
    retry_failed: bool = False
    """Queue the jobs that failed for good again, after fixing the cause (e.g. a missing --data_dir)."""
    recipe: FinetuneConfig = field(default_factory=FinetuneConfig)
    """The fine-tuning recipe of every job."""
    wandb: bool = False
    """Log one W&B run per job (job_type finetune; WANDB_MODE=offline logs locally, beside the results folder)."""
    wandb_project: str | None = None
    """W&B project of the job runs; unset: the pretraining run's tracking.project (else lnbert)."""

    def __post_init__(self) -> None:
        ok = bool(self.lrs) and all(lr > 0 for lr in self.lrs) and len(set(self.lrs)) == len(self.lrs)
        require(ok, "lrs", f"must be a non-empty list of distinct positive learning rates; got {self.lrs}")
        ok = bool(self.seeds) and all(s >= 0 for s in self.seeds) and len(set(self.seeds)) == len(self.seeds)
        require(ok, "seeds", f"must be a non-empty list of distinct integers >= 0; got {self.seeds}")
