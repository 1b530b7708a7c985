"""The pretraining configuration: typed dataclasses, one source of truth.

A YAML preset (``--config FILE``) and dotted overrides (``--train.max_steps=100``) become a :class:`PretrainConfig`
through jsonargparse (pretrain/common/cli.py), which also makes ``--help`` from the docstring under every field. Every
check lives in a ``__post_init__`` and names the key to change. No ``from __future__ import annotations`` here:
jsonargparse would then resolve the annotations and run the imports of this module's ``TYPE_CHECKING`` block (torch).
"""

import difflib
import functools
import importlib.util
import itertools
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pretrain.common.cli import ConfigError, parse, to_dict
from pretrain.common.cli import require as _require
from pretrain.common.roles import keys_where, resolved_keys, role
from pretrain.data.config import DataConfig
from pretrain.residual_schemes import SCHEMES
from pretrain.variants import (
    DEFAULTS,
    RESIDUAL_SCHEME_FIELDS,
    RESIDUAL_SCHEMES,
    LNBertOptions,
    check_options,
    option_choices,
    residual_scheme_label,
    variant_of,
)

if TYPE_CHECKING:
    from pretrain.modeling import LNBertConfig


# The schema


@dataclass(kw_only=True)
class ModelConfig(LNBertOptions):
    """The BERT encoder and its norm placement (an ``LNBertConfig`` by :meth:`to_lnbert`): the model's own options
    (``LNBertOptions``, pretrain/variants.py) and BERT's sizes, here the built-in default's tiny model, not BERT's."""

    hidden_size: int = role("recipe", default=64)
    """Width of the residual stream (BERT-base: 768)."""
    num_hidden_layers: int = role("recipe", default=2)
    """Number of Transformer layers (BERT-base: 12)."""
    num_attention_heads: int = role("recipe", default=4)
    """Attention heads per layer; must divide hidden_size (BERT-base: 12)."""
    intermediate_size: int = role("recipe", default=256)
    """Inner width of the feed-forward sub-layer (BERT-base: 3072)."""
    vocab_size: int | None = role("recipe", resolved=True, default=None)
    """Rows of the word-embedding table; null: the tokenizer's size. Must be >= the tokenizer's size."""
    max_position_embeddings: int = role("recipe", default=128)
    """Longest sequence the position embeddings cover (BERT-base: 512); must be >= data.max_seq_length."""
    hidden_dropout_prob: float = role("recipe", default=0.1)
    """Dropout on embeddings and sub-layer outputs (BERT: 0.1)."""
    attention_probs_dropout_prob: float = role("recipe", default=0.1)
    """Dropout on attention probabilities (BERT: 0.1)."""
    attn_implementation: Literal["sdpa", "eager"] = role("recipe", default="sdpa")
    """Attention kernel: sdpa (scaled_dot_product_attention) or eager (faster under bf16 on CPU; BENCHMARKS.md)."""

    def __post_init__(self) -> None:
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
            _require(getattr(self, key) > 0, f"model.{key}", "must be a positive integer")
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            _require(0.0 <= getattr(self, key) < 1.0, f"model.{key}", "must be in [0, 1)")
        _require(self.vocab_size is None or self.vocab_size > 0, "model.vocab_size", "must be positive or null")
        try:
            check_options(self, prefix="model.")
        except ValueError as err:
            raise ConfigError(str(err)) from None

    @property
    def variant(self) -> str:
        """The model's label in run names, W&B groups and reports (``pre``, ``pre-rmsnorm``, ``pre-hc4``, ...)."""
        return variant_of(self)

    def to_lnbert(self, vocab_size: int) -> "LNBertConfig":
        """The model config; ``vocab_size`` is the resolved one (``self.vocab_size`` or the tokenizer's)."""
        from pretrain.modeling import LNBertConfig  # torch and transformers: imported once the options are read

        # Every field but the attention kernel is an LNBertConfig field of the same name and meaning.
        fields = {k: v for k, v in to_dict(self).items() if k not in ("vocab_size", "attn_implementation")}
        config = LNBertConfig(vocab_size=vocab_size, **fields)
        config._attn_implementation = self.attn_implementation
        return config


# Residual schemes by the label they have in run names

STANDARD_LABEL = "standard"
"""The label of the plain residual sum, which run names leave out (``residual_scheme_label`` gives "")."""
LABEL_SIZES = range(1, 65)
"""The stream counts, block sizes, fractions, dilations and periods a label is read for (``residual_scheme_fields``)."""


@functools.cache
def _scheme_labels() -> dict[str, dict[str, Any]]:
    """Every label ``residual_scheme_label`` gives for sizes up to 64 (``LABEL_SIZES``), with the fields that give
    it. Each field's values (by its type: a choice, a flag, a size or null) are tried default first, so a
    field the label does not depend on keeps its default: reading a label back is a lookup in what the one function
    that writes labels wrote."""
    types = typing.get_type_hints(LNBertOptions)
    choices = {**option_choices(), **{key: (True, False) for key in RESIDUAL_SCHEME_FIELDS if types[key] is bool}}
    values = {key: choices.get(key, (None, *LABEL_SIZES) if types[key] == int | None else LABEL_SIZES)
              for key in RESIDUAL_SCHEME_FIELDS}  # fmt: skip
    defaults = {key: getattr(DEFAULTS, key) for key in RESIDUAL_SCHEME_FIELDS}
    labels: dict[str, dict[str, Any]] = {}
    for scheme, entry in SCHEMES.items():  # each over the options its label names, the others at their defaults
        ordered = [sorted(values[k], key=lambda v, k=k: v != defaults[k]) for k in entry.options]
        for combination in itertools.product(*ordered):
            fields = {**defaults, "residual_scheme": scheme, **dict(zip(entry.options, combination, strict=True))}
            labels.setdefault(residual_scheme_label(**fields) or STANDARD_LABEL, fields)
    return labels


def residual_scheme_fields(label: str) -> dict[str, Any]:
    """The model fields (``RESIDUAL_SCHEME_FIELDS``) of the residual scheme a variant's label names, the others at their
    defaults: ``standard``, ``hc4`` (dynamic HC, 4 streams), ``shc4`` (static), ``mhc4``, ``mhc4-idres`` (identity bias
    init), ``attnres``, ``attnres-b4`` (blocks of 4 sub-layers), ``mhclite4``, ``frac4``, ``sfrac4``, ``denseformer``,
    ``denseformer-2x1`` (dilation 2, period 1); up to 64. A ValueError names the closest label."""
    labels = _scheme_labels()
    if label not in labels:
        # A scheme's own name means its label with the default options (hc: hc4), not the closest string (hc9).
        own_name = label in RESIDUAL_SCHEMES[1:]
        close = [residual_scheme_label(residual_scheme=label)] if own_name else difflib.get_close_matches(str(label), labels, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"{label!r} is not a residual scheme's label{hint} (labels as in run names: standard, hc4, shc4, mhc4, "
            "mhc4-idres, attnres, attnres-b4, mhclite4, frac4, sfrac4, denseformer, denseformer-2x1; any stream "
            "count, block size, fraction count, dilation or period up to 64)"
        )
    return dict(labels[label])


# Schedules every supported transformers has: a config that names one is checked without importing transformers
# (about 4 s of CPU before the options are read); any other name is checked against transformers' SchedulerType.
COMMON_SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup", "polynomial")


@dataclass(kw_only=True)
class OptimConfig:
    """AdamW and the learning-rate schedule (weight decay never applies to LayerNorm parameters or biases)."""

    lr: float = role("recipe", default=1e-3)
    """Peak learning rate (paper: Post-LN 1e-4, Pre-LN 3e-4 for BERT-base)."""
    warmup_steps: int | None = role("recipe", default=None)
    """Linear warm-up length in optimizer steps; null: use warmup_fraction. Paper: Post-LN 10000, Pre-LN 0."""
    warmup_fraction: float = role("recipe", default=0.0)
    """Warm-up as a fraction of train.max_steps, used when warmup_steps is null."""
    scheduler: str = role("recipe", default="linear")
    """Any transformers.get_scheduler name: linear, cosine, constant_with_warmup, inverse_sqrt, ..."""
    betas: tuple[float, float] = role("recipe", default=(0.9, 0.999))
    """AdamW (beta1, beta2) (BERT: 0.9, 0.999)."""
    eps: float = role("recipe", default=1e-6)
    """AdamW epsilon (BERT: 1e-6)."""
    weight_decay: float = role("recipe", default=0.01)
    """Decoupled weight decay on weight matrices and embeddings (BERT: 0.01)."""
    max_grad_norm: float = role("recipe", default=1.0)
    """Clip the total gradient norm to this value; 0 disables clipping (the norm is still logged)."""
    implementation: Literal["auto", "fused", "foreach", "for_loop"] = role("split", default="auto")
    """AdamW kernel: auto (fused on CUDA, for_loop on CPU), fused (the fastest on both, BENCHMARKS.md), foreach."""

    def __post_init__(self) -> None:
        _require(self.lr > 0, "optim.lr", "must be > 0")
        _require(self.warmup_steps is None or self.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0 or null")
        _require(0.0 <= self.warmup_fraction < 1.0, "optim.warmup_fraction", "must be in [0, 1)")
        _require(all(0.0 <= b < 1.0 for b in self.betas), "optim.betas", "must both be in [0, 1), e.g. [0.9, 0.999]")
        _require(self.eps > 0, "optim.eps", "must be > 0")
        _require(self.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
        _require(self.max_grad_norm >= 0, "optim.max_grad_norm", "must be >= 0 (0 disables clipping)")
        if self.scheduler not in COMMON_SCHEDULERS:
            from transformers.trainer_utils import SchedulerType

            names = [s.value for s in SchedulerType]
            _require(self.scheduler in names, "optim.scheduler", f"must be one of {', '.join(names)}")

    def resolved_warmup_steps(self, max_steps: int) -> int:
        return self.warmup_steps if self.warmup_steps is not None else math.ceil(self.warmup_fraction * max_steps)


@dataclass(kw_only=True)
class TrainConfig:
    """The loop: steps, batch, precision, evaluation, checkpoints, snapshots, resume."""

    output_dir: str = role("mechanics", default="")
    """Run directory (layout: docs/run_layout.md); empty: runs/<run_name>."""
    run_name: str = role("run", default="")
    """Name in status.json, snapshots and trackers; empty: lnbert-<the model's variant> (lnbert-pre-rmsnorm, ...)."""
    seed: int = role("run", default=0)
    """Seed for initialisation, data order, masking and dropout."""
    max_steps: int = role("limit", default=300)
    """Optimizer steps in the whole run; the LR schedule spans exactly these steps (BERT: 1000000)."""
    stop_at_step: int | None = role("cadence", default=None)
    """Stop cleanly (checkpoint, status preempted) at this step, schedule unchanged, to split a run into jobs."""
    per_device_batch_size: int = role("split", default=32)
    """Sequences per device per micro-batch. Global batch = this x processes x gradient_accumulation_steps."""
    gradient_accumulation_steps: int = role("split", default=1)
    """Micro-batches per optimizer step (through accelerator.accumulate)."""
    mixed_precision: Literal["no", "bf16", "fp16", "auto"] = role("recipe", default="no")
    """Autocast precision; fp16 needs a GPU; auto: bf16 where the GPU or CPU computes it natively, else no (fp32)."""
    max_skipped_steps: int = role("limit", default=25)
    """fp16: overflowing steps in a row the loss scaler may skip before the run diverged (a NaN loss: at once)."""
    eval_every: int = role("cadence", default=100)
    """Evaluate on the validation split every this many steps (and at the end); 0: only at the end."""
    eval_batches: int = role("cadence", default=10)
    """Validation batches per evaluation (per process); 0: the whole validation split."""
    log_every: int = role("cadence", default=10)
    """Log training metrics (incl. per-layer gradient norms) every this many steps."""
    checkpoint_every: int = role("cadence", default=100)
    """Save a full resumable checkpoint every this many steps (and at the end); 0: only at the end."""
    keep_last_checkpoints: int = role("cadence", default=2)
    """Number of full checkpoints kept (oldest deleted first); at least 1."""
    snapshot_every: int = role("cadence", default=0)
    """Save a weights-only snapshot every this many steps; 0: none on a fixed interval."""
    snapshot_steps: list[int] = role("cadence", default_factory=list)
    """Extra steps at which to save weights-only snapshots, e.g. log-spaced [1000, 3000, 10000, ...]."""
    snapshot_at_start: bool = role("cadence", default=True)
    """Save a snapshot of the initial weights (step 0)."""
    snapshot_at_end: bool = role("cadence", default=True)
    """Save a snapshot of the final weights when the run finishes."""
    num_workers: int = role("mechanics", default=0)
    """DataLoader worker processes (0: load in the main process)."""
    compile: bool = role("split", default=False)
    """torch.compile the model (inductor, through Accelerate, after the DDP wrap); not with DeepSpeed."""
    gradient_checkpointing: bool = role("mechanics", default=False)
    """Recompute each layer's activations in the backward pass instead of keeping them (transformers' activation
    checkpointing): less memory for one more forward of the layers per step, the same gradients."""
    resume: str = role("mechanics", default="")
    """Empty: start a new run (output_dir must not hold another one); auto: continue from the latest complete
    checkpoint in output_dir; or a path to a checkpoint folder (e.g. of a shorter-sequence phase)."""
    collective_timeout_s: int = role("limit", default=1800)
    """Seconds a process waits at a collective before the run fails naming this key; covers data prep and saves."""
    hang_timeout_s: int = role("mechanics", default=1200)
    """Seconds without a finished step (its evaluation and saves included) after which a process is stopped as hung:
    it prints every thread's stack, status.json says hung, exit code 3, and the same command continues from the last
    checkpoint; 0: never. Below collective_timeout_s, so that a multi-process run is stopped as hung, not failed."""
    peak_flops_per_device: float | None = role("mechanics", resolved=True, default=None)
    """Peak FLOP/s of a device for train/mfu; 0 disables MFU; null: the GPU's data-sheet figure (common/hardware.py)."""

    def __post_init__(self) -> None:
        _require(self.max_steps > 0, "train.max_steps", "must be > 0")
        _require(self.stop_at_step is None or 0 < self.stop_at_step <= self.max_steps, "train.stop_at_step",
                 f"must be in [1, train.max_steps={self.max_steps}] or null")
        for key in ("per_device_batch_size", "gradient_accumulation_steps", "log_every", "keep_last_checkpoints",
                    "collective_timeout_s"):
            _require(getattr(self, key) > 0, f"train.{key}", "must be a positive integer")
        for key in ("eval_every", "eval_batches", "checkpoint_every", "snapshot_every", "num_workers",
                    "max_skipped_steps", "hang_timeout_s"):
            _require(getattr(self, key) >= 0, f"train.{key}", "must be >= 0")
        _require(all(s >= 0 for s in self.snapshot_steps), "train.snapshot_steps", "steps must be >= 0")
        peak = self.peak_flops_per_device
        _require(peak is None or peak >= 0, "train.peak_flops_per_device",
                 "must be >= 0 (0 disables MFU) or null (look the device up)")

    def micro_batch_size(self, num_processes: int) -> int:
        """Sequences per micro-batch, over all processes: the step a data position moves by."""
        return self.per_device_batch_size * num_processes

    def global_batch_size(self, num_processes: int) -> int:
        """Sequences per optimizer step, over all processes."""
        return self.micro_batch_size(num_processes) * self.gradient_accumulation_steps


@dataclass(kw_only=True)
class TrackingConfig:
    """Experiment tracking through Accelerate's trackers; RUN/metrics.jsonl is always written as well."""

    backend: Literal["none", "wandb", "tensorboard"] = role("tracking", default="none")
    """Tracker: wandb, tensorboard (into RUN/tensorboard) or none (metrics.jsonl only)."""
    project: str = role("tracking", default="lnbert")
    """W&B project / TensorBoard run group."""
    run_name: str = role("tracking", default="")
    """Name shown in the tracker; empty: train.run_name."""
    comparison: str = role("tracking", default="")
    """The comparison this run belongs to (e.g. bert-base-placements), the same for all its placements and seeds:
    a W&B tag and the config key the dashboard (python -m finetune.dashboard) filters on."""
    group: str = role("tracking", default="")
    """W&B group; empty (recommended): {comparison}-{placement}-{recipe hash}: never two placements in one group."""
    tags: list[str] = role("tracking", default_factory=list)
    """Extra W&B tags; the norm placement and the comparison are always added."""
    wandb_mode: Literal["online", "offline", "disabled"] = role("tracking", default="online")
    """W&B mode; offline writes RUN/wandb/offline-run-* for `wandb sync` later (the WANDB_MODE env var wins)."""

    def __post_init__(self) -> None:
        # TensorBoard is an optional extra: say so now rather than from inside Accelerate once training started.
        installed = self.backend != "tensorboard" or importlib.util.find_spec("tensorboard") is not None
        _require(installed, "tracking.backend",
                 "is tensorboard, which is not installed: pip install -e '.[tensorboard]' (or choose wandb or none)")


@dataclass(kw_only=True)
class PretrainConfig:
    """Everything a pretraining run reads. Written resolved to RUN/run_config.json."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The encoder and its norm placement."""
    # 3% of python_docs' ~460 documents: 14 held out, the fewest that pretrain.prepare does not warn about are 10.
    data: DataConfig = field(
        default_factory=lambda: DataConfig(vocab_size=2048, max_seq_length=64, validation_fraction=0.03))
    """Corpus, tokenizer, NSP/MLM instances (pretrain/data/config.py; the pipeline: pretrain/data/pipeline.py)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and learning-rate schedule."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The training loop, checkpoints and snapshots."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """Experiment tracking."""

    def __post_init__(self) -> None:
        train, optim = self.train, self.optim
        if not train.run_name:
            train.run_name = f"lnbert-{self.model.variant}"
        if not train.output_dir:
            train.output_dir = str(Path("runs") / train.run_name)
        warmup = optim.resolved_warmup_steps(train.max_steps)
        _require(warmup <= train.max_steps, "optim.warmup_steps",
                 f"= {warmup} exceeds train.max_steps={train.max_steps}; lower it or raise train.max_steps")
        model, data = self.model, self.data
        _require(model.max_position_embeddings >= data.max_seq_length, "model.max_position_embeddings",
                 f"= {model.max_position_embeddings} is smaller than data.max_seq_length={data.max_seq_length}; "
                 "raise it (BERT-base: 512) or lower data.max_seq_length")
        if data.tokenizer is None and model.vocab_size is not None:
            _require(data.vocab_size <= model.vocab_size, "data.vocab_size",
                     f"= {data.vocab_size} (the WordPiece vocabulary to train) exceeds model.vocab_size="
                     f"{model.vocab_size}; lower data.vocab_size or set model.vocab_size to null")


# Derived from each field's role (pretrain/common/roles.py): the keys a resumed run may change without being another
# run, and the fields whose null the run decides at its start (run_config.json holds the decided value).
RESUMABLE_CHANGES = keys_where(PretrainConfig, lambda rules: rules.resumable)
RESOLVED_AT_START = resolved_keys(PretrainConfig)


def resolved_config(cfg: PretrainConfig, decided: dict[str, Any]) -> dict[str, Any]:
    """What run_config.json holds: ``cfg`` with the values the run decided at its start (``decided``: every dotted
    key of RESOLVED_AT_START -> value) in place of its nulls; a key left undecided is an error, never a null saved."""
    if set(decided) != RESOLVED_AT_START:
        raise KeyError(f"decided {sorted(decided)}; the run decides exactly RESOLVED_AT_START: "
                       f"{sorted(RESOLVED_AT_START)}")
    out = to_dict(cfg)
    for key, value in decided.items():
        section, name = key.split(".")
        out[section][name] = value
    return out


# Command line (every command's: pretrain/common/cli.py)


def parse_args(argv: list[str], *, prog: str = "python pretrain/run.py", description: str = "") -> PretrainConfig:
    """``[--config FILE ...] [--section.key=value | --section.key value ...]`` -> a validated PretrainConfig; ``--help``
    prints ``description`` and every key with its type, default (the built-in default run's) and doc, and exits 0."""
    return parse(PretrainConfig, argv, prog=prog, description=description)
