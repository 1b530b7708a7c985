"""The options of every analysis subcommand, one config dataclass each, and nothing heavier than the standard
library: ``python -m pretrain.analysis`` reads and checks them before it imports the measurement (torch and
transformers, seconds of CPU), so that a typo answers at once. Each measurement's module (``init_grads.py``, ...)
runs its config; ``cli.py`` maps the subcommands to both."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from pretrain.analysis import outcomes
from pretrain.common.cli import ConfigError, field_type, require
from pretrain.common.formats import STUDY_FORMAT, FormatVersionError, check_format
from pretrain.config import STANDARD_LABEL, PretrainConfig, residual_scheme_fields
from pretrain.variants import (
    DEFAULTS,
    DESIGN_LABELS,
    NORM_PLACEMENTS,
    AttentionGate,
    InitScheme,
    NormPlacement,
    NormType,
    ValueResidual,
    design_problem,
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
    options: tuple[tuple[str, Any], ...] = ()
    """Its options inside the layer (``pretrain.variants.DESIGN_LABELS``, and qk_norm) that are not at their defaults,
    (key, value)."""


def model_problem(placement: str, norm_type: str, scheme: str, **options: Any) -> str:
    """Why the model of ``placement``, ``norm_type``, residual scheme label ``scheme`` and ``options`` cannot be built
    ("" when it can), as the model's own checks say."""
    return design_problem(placement, norm_type, residual_scheme_fields(scheme), **options)


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
class CellRecipe:
    """What every cell of a grid or a study shares: a short run of pretrain/run.py (``grid.run_cell``) and its outcome."""

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
    """Run nothing: report the cells under --out that have a run folder, the rest as not run."""
    jobs: int = 1
    """Cells run at once, each its own process; on a CPU, set OMP_NUM_THREADS to cores / jobs."""
    seconds_per_cell: float | None = None
    """The cost estimate per cell while none has ended under out (then: the mean of those that have); null: the
    time follows as cells end."""

    def __post_init__(self) -> None:
        _positive(self, "max_steps", "num_heads", "jobs", "probe_batch_size")
        ok = self.seconds_per_cell is None or self.seconds_per_cell > 0
        require(ok, "seconds_per_cell", f"must be > 0, or null; got {self.seconds_per_cell}")
        require(self.probe_steps >= 0, "probe_steps", f"must be >= 0; got {self.probe_steps}")
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
    def run_overrides(self) -> list[str]:
        """The pretrain/run.py overrides every cell gets after the cell's own settings."""
        return self.overrides

    @property
    def rules(self) -> outcomes.Rules:
        return outcomes.Rules(trained_margin=self.trained_margin, blowup_margin=self.blowup_margin)


@dataclass(kw_only=True)
class GridConfig(ModelAxes, CellRecipe):
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
    report_only: bool = False
    """Run nothing: report the cells under --out that have a run folder, the rest as '-' (one report over grids
    that ran different parts of a map into the same --out)."""
    out: str = str(DEFAULT_OUT / "grid")
    """Output folder (runs/, logs/, table.txt, results.json, grid.png, boundary.png)."""

    def __post_init__(self) -> None:
        ModelAxes.__post_init__(self)
        CellRecipe.__post_init__(self)
        require(self.boundary_seeds >= 0, "boundary_seeds", f"must be >= 0; got {self.boundary_seeds}")
        _distinct(self, "depths", "hidden_sizes", "warmup_steps", "lrs", "seeds")
        _each(self, "depths", lambda d: d > 0, "positive")
        _each(self, "warmup_steps", lambda w: w >= 0, ">= 0")
        require(max(self.warmup_steps) <= self.max_steps, "warmup_steps", f"must be <= max_steps={self.max_steps}")
        _each(self, "lrs", lambda lr: lr > 0, "> 0")
        _each(self, "hidden_sizes", lambda h: h > 0 and h % self.num_heads == 0,
              f"positive multiples of num_heads={self.num_heads}")  # fmt: skip

    def model(self, label: str) -> Model:
        """The model a cell of this grid names (``Cell.placement``)."""
        return self.models[label]

    @property
    def axes(self) -> list[list[Any]]:
        """The axes of a setting, in the order of ``Cell.setting``; numbers sorted (tables go by size)."""
        return [self.variants, *(sorted(v) for v in (self.hidden_sizes, self.depths, self.warmup_steps, self.lrs))]

    @property
    def variants(self) -> list[str]:
        """The models' names, the first axis of a setting (``Cell.placement``)."""
        return list(self.models)


@dataclass(kw_only=True)
class StudyModel:
    """One model of a study and its own recipe."""

    placement: NormPlacement = "pre"
    """Its norm placement."""
    norm_type: NormType = "layernorm"
    """Its norm type."""
    residual_scheme: str = STANDARD_LABEL
    """Its residual scheme, by its label in run names (hc4, attnres-b4, ...; ModelAxes.residual_schemes)."""
    gpas: bool = False
    """GPAS (the model option of the same name, ``pretrain.variants.LNBertOptions``; so are the next two)."""
    attention_gate: AttentionGate = "none"
    """Gated attention."""
    value_residual: ValueResidual = "none"
    """Value residual (ResFormer)."""
    qk_norm: bool = False
    """QK-norm: a norm on each head's queries and keys."""
    warmup: int = 0
    """Its linear warm-up steps (Post-LN's paper recipe has one, Pre-LN's none)."""
    lr: float | None = None
    """Its peak learning rate, fixed (no stage 1 for it); null: stage 1 picks it."""

    def __post_init__(self) -> None:
        try:
            residual_scheme_fields(self.residual_scheme)
        except ValueError as err:
            require(False, "residual_scheme", str(err))
        problem = model_problem(self.placement, self.norm_type, self.residual_scheme, **dict(self.model.options))
        require(not problem, "models", f"item {self.name!r} cannot be built: {problem}")
        require(self.warmup >= 0, "warmup", f"must be >= 0; got {self.warmup}")
        require(self.lr is None or self.lr > 0, "lr", f"must be > 0 or null; got {self.lr}")

    @property
    def model(self) -> Model:
        scheme = residual_scheme_fields(self.residual_scheme)
        options = {k: getattr(self, k) for k in (*DESIGN_LABELS, "qk_norm") if getattr(self, k) != getattr(DEFAULTS, k)}
        return Model(variant_name(self.placement, self.norm_type, **scheme, **options), self.placement, self.norm_type,
                     self.residual_scheme, tuple(options.items()))  # fmt: skip

    @property
    def name(self) -> str:
        """Its name in tables, contrasts and ``baseline``: the model's label, ``+wN`` with N warm-up steps."""
        return self.model.label + (f"+w{self.warmup}" if self.warmup else "")


@dataclass(kw_only=True)
class CompareConfig(CellRecipe):
    """Compare models as a reviewer accepts: each at its own learning rate, enough seeds, paired tests.

    Stage 1 runs every model at depth x width at every lr of ``lrs`` with the seeds ``lr_seeds``, and picks each
    model's lr by the rule fixed before any run: the lowest mean gap (final validation MLM loss minus the seed's own
    validation unigram cross-entropy) over those seeds, among the lrs where every one of them ended with a validation
    loss (a diverged seed rules its lr out); equal means go to the lower lr. Stage 2 runs each model at its lr with
    every seed of ``seeds`` (a cell stage 1 ran is read, not run again). The report gives each model's mean gap with a
    95% interval, in order, and for each contrast (every model against ``baseline``, then ``pairs``) the paired
    difference of the gaps over the seeds both have (a seed fixes the data split and the batch order, so it pairs
    the two runs): its 95% interval and p-value (scipy.stats.ttest_rel), Holm's correction over the contrasts, the
    verdict "ahead", "behind" or "cannot tell at this n" (Holm-adjusted p < alpha), and the smallest difference this
    n detects with the stated power at alpha / contrasts. Every cell is a grid cell (grid.run_cell: a run of
    pretrain/run.py, resumed after a stop; an ended cell is read, never run again) with its provenance
    (provenance.py): cells of another tokenizer or data are refused, cells from another machine or other code only
    with mixed_provenance, and then marked. Prints the cost before it starts. Writes table.txt, results.json (small:
    the cells' gaps and provenance, the choices, the contrasts) and compare.png to out."""

    data: str
    """The corpus: a JSON Lines file, glob or folder of them (one document per line, a "text" field)."""
    tokenizer: str
    """The study's one tokenizer: a folder as save_pretrained writes it (configs/analysis/wordpiece_2048)."""
    models: list[StudyModel] = field(default_factory=list)
    """The models, each {placement, norm_type, residual_scheme, warmup}."""
    baseline: str = ""
    """The model every other is contrasted with, by its name (pre, post+w50, pre-hc4); empty: none."""
    pairs: list[tuple[str, str]] = field(default_factory=list)
    """Further contrasts [a, b]: a's gap minus b's."""
    depth: int = 12
    """Layers."""
    width: int = 128
    """Hidden size."""
    lrs: list[float] = field(default_factory=lambda: [3e-4, 1e-3, 3e-3])
    """Stage 1's peak learning rates."""
    lr_seeds: list[int] = field(default_factory=lambda: [0, 1])
    """Stage 1's seeds."""
    seeds: list[int] = field(default_factory=lambda: list(range(8)))
    """Stage 2's seeds at each model's lr, which the contrasts use (those also in lr_seeds helped pick the lr: each
    model's mean leans toward its best draw there; seeds apart from lr_seeds avoid it at the cost of more cells)."""
    follow: str = ""
    """A finished study's results.json: its ``top`` models at their lrs, its first-placed as the baseline (the same
    models longer: another max_steps and out). models and baseline stay unset: they come from the file."""
    top: int = 2
    """How many of the followed study's models, best first."""
    lr_only: bool = False
    """Stop after stage 1 and report the lrs it picked (a stage whose results can be committed on their own)."""
    alpha: float = 0.05
    """Level of the tests (two-sided), after Holm's correction."""
    power: float = 0.8
    """Power at which the smallest detectable difference is given."""
    smoothing: int = 100
    """Steps of the trailing mean of the training loss for "steps to the baseline's final training loss"."""
    mixed_provenance: bool = False
    """Compare cells from another machine, other code or other library versions than most of the study's (marked in
    every table and the figure); without it they are refused. Another tokenizer or data is refused always."""
    seconds_per_cell: float | None = 300.0
    max_steps: int = 500
    probe_steps: int = 0
    out: str = str(DEFAULT_OUT / "compare")
    """Output folder (runs/, logs/, table.txt, results.json, compare.png)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive(self, "depth", "width", "top", "smoothing")
        require(self.width % self.num_heads == 0, "width", f"must be a multiple of num_heads={self.num_heads}")
        require(bool(self.data) and bool(self.tokenizer), "data", "and tokenizer must be given (paths)")
        if self.follow:
            require(not self.models and not self.baseline, "follow", "takes models and baseline from the study it "
                    f"follows ({self.follow}): leave them unset")  # fmt: skip
            self.models, self.baseline = followed(self.follow, self.top)
        require(bool(self.models), "models", "must name at least one model (or follow a finished study)")
        _distinct(self, "lrs", "lr_seeds", "seeds")
        _each(self, "lrs", lambda lr: lr > 0, "> 0")
        require(0 < self.alpha < 1 and 0 < self.power < 1, "alpha", "and power must be in (0, 1)")
        names = [m.name for m in self.models]
        require(len(set(names)) == len(names), "models", f"must not repeat a model; got {names}")
        require(all(m.warmup <= self.max_steps for m in self.models), "models",
                f"warm-ups must be <= max_steps={self.max_steps}")  # fmt: skip
        named = [("baseline", self.baseline)] if self.baseline else []
        for key, name in named + [("pairs", name) for pair in self.pairs for name in pair]:
            require(name in names, key, f"names {name!r}, not a model of the study (one of {', '.join(names)})")

    def model(self, label: str) -> Model:
        """The model a cell of this study names (``Cell.placement``)."""
        return next(m.model for m in self.models if m.model.label == label)

    @property
    def run_overrides(self) -> list[str]:
        data = json.dumps(self.data)  # a JSON string is a YAML string, whatever the path holds
        return [f"data.sources=[{{kind: json, path: {data}}}]", f"data.tokenizer={self.tokenizer}", *self.overrides]


def followed(path: str, top: int) -> tuple[list[StudyModel], str]:
    """The ``top`` models of a study's results.json, best first, each at the lr it was compared at, and the first's name."""
    try:
        study = json.loads(Path(path).read_text())
        check_format(study, path, STUDY_FORMAT, "write it again with this code: the study's compare command with "
                     "--report_only (it reads the study's cells; nothing is trained)")  # fmt: skip
        ranked = [m for m in study["models"] if m["mean_gap"] is not None]
        keys = [f.name for f in fields(StudyModel)]
        found = [{k: m[k] for k in keys} for m in ranked[:top]]
    except FormatVersionError as err:
        raise ConfigError(f"follow={err}") from None
    except (OSError, ValueError, KeyError) as err:
        raise ConfigError(f"follow={path!r} is not a study's results.json ({err}): name the file compare wrote") from None
    require(len(ranked) >= top, "top", f"is {top}, but {path} ranks {len(ranked)} models")
    models = [StudyModel(**m) for m in found]
    return models, models[0].name
