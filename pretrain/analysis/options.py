"""The options of every analysis subcommand, one config dataclass each, and nothing heavier than the standard
library: ``python -m pretrain.analysis`` reads and checks them before it imports the measurement (torch and
transformers, seconds of CPU), so that a typo answers at once. Each measurement's module (``init_grads.py``, ...)
runs its config; ``cli.py`` maps the subcommands to both."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pretrain.analysis import outcomes
from pretrain.common.cli import field_type, require
from pretrain.config import STANDARD_LABEL, PretrainConfig, residual_scheme_fields
from pretrain.variants import (
    DEFAULTS,
    NORM_PLACEMENTS,
    InitScheme,
    NormPlacement,
    NormType,
    check_ngpt,
    check_residual_scheme,
    variant_name,
)

DEFAULT_OUT = Path("runs") / "analysis"


def _positive(config: Any, *keys: str) -> None:
    """Each of ``keys`` of ``config`` must be a positive integer (the message names the key)."""
    for key in keys:
        require(getattr(config, key) > 0, key, f"must be a positive integer; got {getattr(config, key)}")


def _each(config: Any, key: str, ok: Callable[[Any], bool], what: str) -> None:
    """``config.<key>`` must be a non-empty list of items that are all ``ok``; ``what`` they must be."""
    values = getattr(config, key)
    require(bool(values) and all(ok(v) for v in values), key, f"must be {what}; got {values}")


def _distinct(config: Any, *keys: str) -> None:
    """Each of ``keys`` of ``config`` must be a non-empty list without repeats."""
    for key in keys:
        values = getattr(config, key)
        require(bool(values) and len(set(values)) == len(values), key,
                f"must be a non-empty list without repeats; got {values}")  # fmt: skip


@dataclass(frozen=True)
class Model:
    """One model a measurement compares."""

    label: str
    """Its name as in run names: ``pre``, ``pre-rmsnorm``, ``pre-hc4``, ..."""
    placement: str
    """Its norm placement."""
    norm_type: str
    """Its norm type."""
    scheme: str = STANDARD_LABEL
    """Its residual scheme, by the label run names give it (``pretrain.config.residual_scheme_fields``)."""


def model_problem(placement: str, norm_type: str, scheme: str) -> str:
    """Why the model of ``placement``, ``norm_type`` and residual scheme label ``scheme`` cannot be built ("" when it
    can), as the model's own checks say."""
    fields = residual_scheme_fields(scheme)
    try:
        check_residual_scheme(placement, fields["residual_scheme"], fields["hc_streams"], DEFAULTS.mhc_sinkhorn_iters,
                              fields["mhc_bias_init"], fields["attn_res_block_size"])  # fmt: skip
        check_ngpt(placement, norm_type, DEFAULTS.qk_norm, DEFAULTS.embedding_layer_norm)
    except ValueError as err:
        return str(err)
    return ""


def models(placements: list[str], norm_types: list[str], residual_schemes: list[str]) -> list[Model]:
    """Every combination the model takes (``model_problem``), by norm type, then placement, then residual scheme."""
    return [Model(variant_name(p, t, **residual_scheme_fields(s)), p, t, s)
            for t, p, s in itertools.product(norm_types, placements, residual_schemes) if not model_problem(p, t, s)]


@dataclass(kw_only=True)
class ModelAxes:
    """The models a measurement compares: placement x norm type x residual scheme (``models``)."""

    placements: list[NormPlacement] = field(default_factory=lambda: list(NORM_PLACEMENTS))
    """Placements to compare (grid: one heat map each)."""
    norm_types: list[NormType] = field(default_factory=lambda: ["layernorm"])
    """Norm types, each with every placement (a model is named as in run names: pre, pre-rmsnorm, ...)."""
    residual_schemes: list[str] = field(default_factory=lambda: [STANDARD_LABEL])
    """Residual schemes by their label in run names: standard, hc4 (dynamic HC, 4 streams), shc4 (static), mhc4,
    mhc4-idres, attnres (Full AttnRes), attnres-b4 (Block, 4 sub-layers); each but standard adds a model on every
    placement that takes it (pre: pre-hc4, ...)."""

    def __post_init__(self) -> None:
        _distinct(self, "placements", "norm_types", "residual_schemes")
        try:
            for scheme in self.residual_schemes:
                residual_scheme_fields(scheme)
        except ValueError as err:
            require(False, "residual_schemes", f"item {err}")
        axes = (self.placements, self.norm_types, self.residual_schemes)
        problems = {combination: model_problem(*combination) for combination in itertools.product(*axes)}
        for position, key in enumerate(("placements", "norm_types", "residual_schemes")):
            for value in axes[position]:
                mine = [problem for combination, problem in problems.items() if combination[position] == value]
                require(not all(mine), key, f"item {value!r} is in no model the other axes allow: {mine[0]}")

    @property
    def models(self) -> dict[str, Model]:
        """Each model compared (``models``) by its name, in their order."""
        return {model.label: model for model in models(self.placements, self.norm_types, self.residual_schemes)}


@dataclass(kw_only=True)
class ModelSize(ModelAxes):
    """The models and size of the LNBertModel a measurement initialises (subclasses set their own defaults)."""

    init_schemes: list[InitScheme] = field(default_factory=lambda: ["xavier", "bert"])
    """xavier: the paper's (and Admin's) analysis setting; bert: normal(0, 0.02)."""
    hidden_size: int = 256
    """Hidden size d."""
    num_heads: int = 4
    """Attention heads."""
    intermediate_size: int | None = None
    """FFN width; null: 4 * hidden_size."""
    vocab_size: int = 30522
    """Vocabulary size."""
    seq_len: int = 128
    """Tokens per sequence."""
    batch_size: int = 8
    """Sequences per batch."""
    seed: int = 0
    """Seed of the first draw (draw s uses seed + s)."""
    out: str = str(DEFAULT_OUT)
    """Output folder for table.txt, results.json and the PNG."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive(self, "hidden_size", "num_heads", "vocab_size", "seq_len", "batch_size")
        require(self.intermediate_size is None or self.intermediate_size > 0, "intermediate_size",
                f"must be a positive integer or null; got {self.intermediate_size}")  # fmt: skip


@dataclass(kw_only=True)
class LnJacobianConfig:
    """Spectral norm of the LayerNorm Jacobian vs sqrt(d)/||x - mean(x)||.

    Compute the Jacobian of the model's own LayerNorm (gamma 1, beta 0, float64) with autograd at
    x = s (z + 3), z ~ N(0, I_d), take its spectral norm and compare with the paper's sqrt(d)/||y||,
    y = x - mean(x), over scales s and dimensions d. The identity holds up to LayerNorm's eps: the exact value
    is sqrt(d)/sqrt(||y||^2 + d eps), also reported. Writes table.txt, results.json, ln_jacobian.png."""

    dims: list[int] = field(default_factory=lambda: [16, 64, 256, 1024])
    """Dimensions d."""
    scales: list[float] = field(default_factory=lambda: [1e-2, 1e-1, 1.0, 1e1, 1e2])
    """Input scales s."""
    eps: float = 1e-12  # BertConfig's layer_norm_eps, written out to spare the import (tests/test_analysis.py)
    """LayerNorm eps (default: the model's layer_norm_eps)."""
    seed: int = 0
    """Seed of z."""
    out: str = str(DEFAULT_OUT / "ln_jacobian")
    """Output folder for table.txt, results.json and ln_jacobian.png."""

    def __post_init__(self) -> None:
        _each(self, "dims", lambda d: d > 0, "positive integers")
        _each(self, "scales", lambda s: s > 0, "> 0")
        require(self.eps >= 0, "eps", f"must be >= 0; got {self.eps}")


@dataclass(kw_only=True)
class InitScaleConfig(ModelSize):
    """E||x_l||^2/d at init: Post-LN about 1.5, Pre-LN within (1 + l/2, 1 + 3l/2).

    (i) The paper's simplified Transformer (Lemma 2): single head with W_Q = W_K = 0 (uniform attention),
    Xavier-normal d x d weights, zero biases, ReLU FFN of width d, inputs x_0 ~ N(0, I_d). Post-LN:
    E||x_post5||^2/d, the FFN output added to its normalised input (paper: 1.5 at every layer). Pre-LN:
    E||x_l||^2/d of the residual stream after l layers against the bounds 1 + l/2 and 1 + 3l/2. Averaged over
    seeds weight draws x paper_sequences sequences. (ii) The same quantities on LNBertModel at its real
    initialisation (GELU, FFN 4d, BERT 0.02 or Xavier), read with forward hooks, dropout off; its size is
    hidden_size, num_heads, ... below. Writes table.txt, results.json, init_scale.png."""

    num_layers: int = 12
    """Layers L."""
    paper_hidden_size: int = 256
    """d of (i)."""
    paper_seq_len: int = 8
    """Tokens per sequence in (i); uniform attention averages over them."""
    paper_sequences: int = 4
    """Sequences per weight draw in (i)."""
    seeds: int = 200
    """Weight draws in (i)."""
    model_seeds: int = 3
    """Model initialisations in (ii)."""
    init_schemes: list[InitScheme] = field(default_factory=lambda: ["bert", "xavier"])
    out: str = str(DEFAULT_OUT / "init_scale")

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive(self, "num_layers", "paper_hidden_size", "paper_seq_len", "paper_sequences", "seeds", "model_seeds")


@dataclass(kw_only=True)
class InitGradsConfig(ModelSize):
    """FFN W1/W2 gradient norms at init per layer and per depth (paper's Figure 3).

    For each init scheme and placement, initialise LNBertForMaskedLM under seeds seeds, take the MLM loss of
    one real masked batch per seed (the pretraining data pipeline: Python's documentation by default, or
    --data=FILE.jsonl) with dropout off, and record ||dL/dW1||_F and ||dL/dW2||_F of every layer's FFN
    (intermediate.dense.weight, output.dense.weight). Reports the per-layer profile at num_layers and the last
    layer's W2 gradient against depths. Paper: Post-LN's last-layer gradient does not depend on depth and
    per-layer gradients grow toward the output; Pre-LN's shrink like 1/sqrt(L) and are nearly uniform across
    layers. Writes table.txt, results.json, init_grads.png."""

    num_layers: int = 12
    """Depth of the per-layer profile."""
    depths: list[int] = field(default_factory=lambda: [6, 8, 10, 12, 14])
    """Depths for the last-layer W2 curve."""
    seeds: int = 10
    """Model initialisations and batches to average."""
    data: str | None = None
    """JSON Lines file with a 'text' field; null: Python's own documentation (no download)."""
    tokenizer: str | None = None
    """Tokenizer name or folder; null: train a WordPiece of vocab_size on the data."""
    max_documents: int = 400
    """Documents read."""
    cache_dir: str = str(Path("runs") / ".cache" / "data")
    """Data cache, shared with pretraining."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to compute: auto (cuda when available), cpu or cuda."""
    hidden_size: int = 128
    num_heads: int = 2
    vocab_size: int = 8000
    out: str = str(DEFAULT_OUT / "init_grads")

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive(self, "num_layers", "seeds", "max_documents")
        _each(self, "depths", lambda d: d > 0, "positive")


@dataclass(kw_only=True)
class InitPerturbConfig(ModelSize):
    """Output change from a small random weight change at init against depth (Liu et al. 2020, Admin).

    For each init scheme, model and depth, under seeds seeds: initialise LNBertModel (dropout off), compute the
    encoder output f(x, W) (last_hidden_state: after the last norm or the final norm) on random token ids, add
    to every weight matrix of the encoder layers (2-D parameters: Q, K, V, attention output, FFN, and a residual
    scheme's mixing matrices; not the embeddings, norms, gates or scales) delta = epsilon * rms(W) * N(0, 1)
    elementwise, and report E||f(x, W) - f(x, W + delta)||^2 / E||f(x, W)||^2 over the tokens. Admin's claim:
    this grows like O(N) with the number of sub-layers N for Post-LN, like O(log N) for Admin and Pre-LN. Writes
    table.txt, results.json, init_perturb.png."""

    placements: list[NormPlacement] = field(default_factory=lambda: ["post", "admin", "deepnorm", "pre"])
    depths: list[int] = field(default_factory=lambda: [3, 6, 12, 24, 48])
    """Numbers of layers L (N = 2L sub-layers)."""
    epsilon: float = 1e-2
    """Size of the perturbation relative to each weight matrix's root mean square."""
    seeds: int = 5
    """Model initialisations (each with its own perturbation and token ids)."""
    hidden_size: int = 128
    num_heads: int = 2
    vocab_size: int = 2048
    seq_len: int = 64
    out: str = str(DEFAULT_OUT / "init_perturb")

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive(self, "seeds")
        require(self.epsilon >= 0, "epsilon", f"must be >= 0; got {self.epsilon}")
        _each(self, "depths", lambda d: d > 0, "positive")


@dataclass(kw_only=True)
class GridConfig(ModelAxes):
    """Where training breaks: a grid of short pretraining runs over model x depth x width x warm-up x peak lr (a
    model: placement x norm type x residual scheme).

    Each cell (one setting, one seed) is a run of python -m pretrain.run in a subprocess (jobs at once), logging
    every step, with weights-only snapshots at steps 0..probe_steps and one evaluation at the end. Its outcome:
    diverged (the step), blew up, failed to train, or trained (final validation loss), by the rules of outcomes.py.
    Settings next to a change of outcome (along any axis) are repeated with more seeds up to boundary_seeds; for
    the cells in boundary.png the table gives the per-layer gradient norms of the first steps and the relative
    output change by the first updates (Liu et al. 2020; probes.py). Runs live in OUT/runs/<cell>, logs in
    OUT/logs. The same command continues a stopped grid: ended cells are read, interrupted ones resume from their
    last checkpoint. Cells run in the order of the axes as given, placements innermost. Anything else of
    pretrain/run.py goes through preset and overrides. Writes table.txt, results.json, grid.png, boundary.png."""

    depths: list[int] = field(default_factory=lambda: [6, 12, 24, 48])
    """Numbers of layers."""
    hidden_sizes: list[int] = field(default_factory=lambda: [128])
    """Widths (hidden size); the FFN is intermediate_size or 4 x this."""
    warmup_steps: list[int] = field(default_factory=lambda: [0, 30])
    """Linear warm-up steps."""
    lrs: list[float] = field(default_factory=lambda: [3e-4, 1e-3, 3e-3, 1e-2, 3e-2])
    """Peak learning rates, the columns of the heat maps."""
    seeds: list[int] = field(default_factory=lambda: [0])
    """train.seed values every setting runs with."""
    boundary_seeds: int = 2
    """Settings on the boundary are repeated with further seeds (max(seeds)+1, ...) until they have this many."""
    max_steps: int = 150
    """Steps per run (linear decay to 0 over them, after the warm-up)."""
    num_heads: int = 2
    """Attention heads (must divide every hidden size)."""
    intermediate_size: int | None = None
    """FFN width; null: 4 x hidden size."""
    probe_steps: int = 4
    """The first steps whose gradient norms and output changes are reported (snapshots at steps 0..this)."""
    probe_batch_size: int = 16
    """Validation instances in the fixed batch the output change is measured on."""
    trained_margin: float = 0.1
    """Trained: final validation loss at least this many nats below the validation unigram cross-entropy."""
    blowup_margin: float = 1.0
    """Blew up: the last tenth of the loss curve stays this many nats above the unigram entropy and the run's best."""
    preset: str | None = None
    """A pretrain/run.py preset YAML applied to every cell first."""
    overrides: list[str] = field(default_factory=list)
    """Extra pretrain/run.py overrides for every cell (they win), e.g. '[train.per_device_batch_size=16]'."""
    report_only: bool = False
    """Run nothing: report the cells under --out that have a run folder, the rest as '-' (one report over grids
    that ran different parts of a map into the same --out)."""
    jobs: int = 1
    """Cells run at once, each its own process; on a CPU, set OMP_NUM_THREADS to cores / jobs."""
    out: str = str(DEFAULT_OUT / "grid")
    """Output folder (runs/, logs/, table.txt, results.json, grid.png, boundary.png)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive(self, "max_steps", "num_heads", "jobs", "probe_batch_size")
        require(self.probe_steps >= 0 and self.boundary_seeds >= 0, "probe_steps", "and boundary_seeds must be >= 0")
        _distinct(self, "depths", "hidden_sizes", "warmup_steps", "lrs", "seeds")
        _each(self, "depths", lambda d: d > 0, "positive")
        _each(self, "warmup_steps", lambda w: w >= 0, ">= 0")
        require(max(self.warmup_steps) <= self.max_steps, "warmup_steps", f"must be <= max_steps={self.max_steps}")
        _each(self, "lrs", lambda lr: lr > 0, "> 0")
        _each(self, "hidden_sizes", lambda h: h > 0 and h % self.num_heads == 0,
              f"positive multiples of num_heads={self.num_heads}")  # fmt: skip
        require(self.intermediate_size is None or self.intermediate_size > 0, "intermediate_size",
                "must be > 0 or null")  # fmt: skip
        require(self.trained_margin >= 0 and self.blowup_margin > 0, "trained_margin",
                "must be >= 0 (blowup_margin > 0)")  # fmt: skip
        for item in self.overrides:
            key, eq, _ = item.removeprefix("--").partition("=")
            message = f"item {item!r} is not KEY=VALUE with a dotted key, e.g. train.per_device_batch_size=16"
            require(bool(eq) and "." in key, "overrides", message)
            field_type(PretrainConfig, key)  # a typo fails now, not in every cell

    @property
    def axes(self) -> list[list[Any]]:
        """The axes of a setting, in the order of ``Cell.setting``; numbers sorted (tables go by size)."""
        return [self.variants, *(sorted(v) for v in (self.hidden_sizes, self.depths, self.warmup_steps, self.lrs))]

    @property
    def variants(self) -> list[str]:
        """The models' names, the first axis of a setting (``Cell.placement``)."""
        return list(self.models)

    @property
    def rules(self) -> outcomes.Rules:
        return outcomes.Rules(trained_margin=self.trained_margin, blowup_margin=self.blowup_margin)


@dataclass(kw_only=True)
class RankingConfig:
    """Rank the models of one or more grids by their final validation loss over seeds, with ties, and show each
    model's trainable learning rates.

    Reads the results.json of each grid (``grid --report_only`` writes it without running anything) and, from
    ``recorded``, results kept elsewhere (a JSON list of cells: model, depth, width, warmup, lr, seed, outcome,
    gap). A model's score is its gap (final validation MLM loss minus the validation unigram cross-entropy of the
    seed's own split), per seed and as a mean. Verdict over seeds: "trains" when every seed trained, "fails" when
    none did, else "mixed". Two models tie when their means differ by no more than the larger of their seed ranges
    and ``tie_floor``. A second table gives what the residual designs' papers claim, per model: the similarity of
    consecutive sub-layers' inputs and the last over the first sub-layer output norm (probes.sublayer_io), the
    spread of per-layer FFN gradient norms, HC's and mHC's composite gain, and the steps to ``target``'s final
    training loss. Writes table.txt, results.json and ranking.png to ``out``."""

    grids: list[str]
    """Grid output folders (each with its results.json)."""
    recorded: str = ""
    """A JSON file of results recorded elsewhere (a list of cells as above); empty: none."""
    depth: int = 12
    """The ranked setting's depth."""
    width: int = 128
    """Its width."""
    warmup: int = 0
    """Its warm-up steps."""
    lr: float = 1e-3
    """Its peak learning rate."""
    lrs: list[float] = field(default_factory=lambda: [3e-4, 1e-3, 3e-3])
    """The learning rates of the trainable-range panel (same depth, width and warm-up)."""
    target: str = "pre"
    """The model whose final training loss the others' "steps to target" is measured against; empty: none."""
    smoothing: int = 100
    """Steps of the trailing mean over the training MLM loss before it is compared with the target's: a batch-16
    curve jumps by more than the gaps between models, and a short window finds the same easy batches in every run."""
    tie_floor: float = 0.055
    """Nats below which two means tie: the same seed's gap moved 0.055 nats between two CPUs (results.md, sec. 8)."""
    out: str = str(DEFAULT_OUT / "ranking")
    """Output folder."""

    def __post_init__(self) -> None:
        require(bool(self.grids), "grids", "must name at least one grid folder")
        _positive(self, "smoothing")
        require(self.tie_floor >= 0, "tie_floor", f"must be >= 0; got {self.tie_floor}")
        _each(self, "lrs", lambda lr: lr > 0, "positive")
