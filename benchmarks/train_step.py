"""Training-step throughput of our BERT against Hugging Face ``BertForPreTraining``, interleaved in one process.

One step = forward + backward + AdamW step on a random batch with 15% MLM labels and NSP labels. Every variant
sees the same batches, shapes, precision and optimizer; the variants take turns (rotated order) within each
repetition, so a slow spell on the shared machine hits all of them, and the ratio ours/HF is taken per repetition
(paired) before the median. The GEMM peak is measured in the same run, so MFU is against this machine's limit
(on a known GPU, against the data sheet).

    python -m benchmarks.train_step                                   # BERT-base + small, fp32 + bf16
    python -m benchmarks.train_step --shapes='[small]' --reps=5       # a quick look (~1 minute on 2 cores)
    python -m benchmarks.train_step --variants='[hf, post, post+dense, post+compile]' --shapes='[small]'
    python -m benchmarks.train_step --profile='[post]' --shapes='[base]' --precisions='[bf16]' --reps=3
    python -m benchmarks.train_step --threads=1 ...     # on a shared, busy CPU: read the CPU-time columns
    python -m benchmarks.train_step --help              # every option (lists are YAML lists)

On a busy shared CPU wall-clock times swing by 50-100% (two OpenMP threads wait for each other whenever one is
descheduled): with ``--threads=1`` read the steady CPU-time columns ("x baseline (CPU time)", "tok/CPU-s", "MFU exec
(CPU time)", against the GEMM's FLOPs per CPU-second); on an idle machine or a GPU, the wall-clock ones.

Variants are ``MODEL[+MOD...]``: MODEL is ``hf`` or a norm placement (``pretrain.variants.NORM_PLACEMENTS``:
``post``, ``pre``, ``sandwich``, ``deepnorm``, ``normformer``, ...); MODs: ``dense`` (ours: MLM head on every position,
as Hugging Face), ``eager`` (eager attention instead of SDPA), ``compile`` (``torch.compile`` the model; compile
time reported as the first step), ``compile-layers`` (``torch.compile`` each encoder layer, regional compilation as
torchtitan's per block), an optimizer (``fused``, ``foreach``, ``loop``: overrides ``--optimizer``), ours' fast-path
switches from ``FAST_PATH_MODS``, a residual scheme by its label in run names (``pre+hc4``: dynamic
Hyper-Connections with 4 streams; ``pre+shc4`` static, ``pre+mhc4``, ``pre+mhc4-idres``, ``pre+attnres`` Full
AttnRes, ``pre+attnres-b2`` Block AttnRes with blocks of 2 sub-layers, ``pre+mhclite4`` mHC-lite, ``pre+frac4``
dynamic Frac-Connections with 4 fractions (``pre+sfrac4`` static), ``pre+denseformer`` (``pre+denseformer-2x3``:
dilation 2, period 3); ``pretrain.config.residual_scheme_fields``), and any model option as ``KEY=VALUE``
(``pre+norm_type=derf``, ``pre+gpas=true``, ``pre+attention_gate=elementwise``, ``pre+value_residual=identity``;
``pretrain.variants.LNBertOptions``).
With ``pre+compile-layers`` among them, the residual schemes are measured against the faster Pre-LN (the
``extra time, peak`` column; BENCHMARKS.md section 10):

    python -m benchmarks.train_step --variants='[pre, pre+compile-layers, pre+shc4, pre+hc4, pre+mhc4, pre+attnres,
        pre+attnres-b2]' --baseline=pre --shapes='[small]' --precisions='[fp32, bf16]' --profile='[pre+hc4]'
    python -m benchmarks.train_step --variants='[pre, pre+norm_type=derf, pre+norm_type=seednorm, pre+gpas=true,
        pre+attention_gate=elementwise, pre+value_residual=identity]' --baseline=pre --precisions='[fp32]'

A profiled variant other than the baseline gets a second table, where its extra time goes: per operator and input
shapes, its self time minus the baseline's (medians of ``PROFILE_STEPS`` profiled steps of each, interleaved).

FLOPs per token = 6N + 12·L·H·T (``pretrain.flops.flops_per_token``, as the logged ``train/mfu``; N: matmul weights
a token passes through, 6 per weight forward+backward; 12·L·H·T: attention scores and weighted sum). The MLM head
counts for every token ("dense-head") or for the masked 15% only ("sparse-head", what our default executes).
``exec`` FLOP/s uses what the variant executes; ``tok/s`` is the headline, comparable across variants.

Every batch has one padded position (``--padded_batches``), so that every variant passes a mask to SDPA and takes
the same attention kernel, compiled or not; the "attention kernel" column says which one each ran (read from the
profiler's operators). "peak MiB" is the highest memory of one step: on CUDA the allocator's peak; on a CPU the
parameters and optimizer state plus the highest sum of the tensors the step's operators allocated and had not
freed yet (torch.profiler's memory records, operator by operator: a transient inside one operator is missed).
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

import torch
import yaml
from torch import nn
from torch.profiler import ProfilerActivity, profile
from transformers import BertConfig, BertForPreTraining

from benchmarks import common
from pretrain.common.cli import ConfigError, parse, require
from pretrain.common.reporting import format_table
from pretrain.config import residual_scheme_fields
from pretrain.flops import flops_per_token
from pretrain.modeling import LNBertConfig, LNBertForPreTraining
from pretrain.optim import build_adamw
from pretrain.variants import DEFAULTS, NORM_PLACEMENTS, LNBertOptions, check_choice, design_problem, option_choices

# Named shapes: (layers, hidden, heads, seq, vocab, batch). The small one is the CPU pretraining size.
SHAPES: dict[str, dict[str, int]] = {
    "base": dict(layers=12, hidden=768, heads=12, seq=128, vocab=30522, batch=8),
    "small": dict(layers=4, hidden=256, heads=4, seq=128, vocab=30522, batch=8),
    # configs/pretrain/small_*.yaml: 4 x 128, a trained 8192-token vocabulary, batch 32.
    "preset": dict(layers=4, hidden=128, heads=4, seq=128, vocab=8192, batch=32),
    "tiny": dict(layers=2, hidden=32, heads=4, seq=16, vocab=99, batch=2),  # for tests only
    # a depth-12 cell of the depth map (docs/results.md sections 6-7): 12 x 128, 2 heads, the default run's 2048-token
    # WordPiece, batch 16 x 64
    "grid": dict(layers=12, hidden=128, heads=2, seq=64, vocab=2048, batch=16),
}
ShapeName = Literal["base", "small", "preset", "tiny", "grid"]
Precision = Literal["fp32", "bf16"]
Optimizer = Literal["fused", "foreach", "loop"]
assert set(get_args(ShapeName)) == set(SHAPES)
MODELS = ("hf", *NORM_PLACEMENTS)
# AdamW as BERT pretraining uses it; variants pick the kernel (OPTIMIZERS: name -> build_adamw's implementation).
ADAMW: dict[str, Any] = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
OPTIMIZERS: dict[str, str] = {"fused": "fused", "foreach": "foreach", "loop": "for_loop"}
assert set(get_args(Optimizer)) == set(OPTIMIZERS)
# Fast-path switches of LNBertConfig, as variant MODs: name -> config overrides (ours only).
FAST_PATH_MODS: dict[str, dict[str, Any]] = {"dense": {"sparse_mlm_head": False}, "qkv": {"fused_qkv": True}}
# The other MODs: name -> fields of the Variant they set.
VARIANT_MODS: dict[str, dict[str, Any]] = {
    "eager": {"attn_implementation": "eager"}, "compile": {"compile": True}, "compile-layers": {"compile_layers": True},
    **{o: {"optimizer": o} for o in OPTIMIZERS},
}  # fmt: skip
MLM_FRACTION = 0.15
PROFILE_STEPS = 5  # profiled steps of a variant and of the baseline, for the difference of their operators
MASK_TOKEN_ID = 103  # [MASK] in the bert-base-uncased vocabulary; any id works for timing
PADDED_POSITIONS = 1  # padding at the end of the last row of every batch: one SDPA kernel for all (random_batch)
# The aten operators behind F.scaled_dot_product_attention, by the kernel each runs (forward; the backward ops
# end in "_backward"). A row whose step ran none of them used eager attention (or a compiler's kernel of its own).
SDPA_KERNELS: dict[str, str] = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "aten::_scaled_dot_product_efficient_attention": "memory-efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cuDNN",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "fused (overrideable)",
}
NO_SDPA_KERNEL = "none (no SDPA operator ran: eager attention or a compiled kernel)"


@dataclass
class Variant:
    """One model/option combination, parsed from ``MODEL[+MOD...]``."""

    spec: str
    model: str
    config_overrides: dict[str, Any] = field(default_factory=dict)
    attn_implementation: str = "sdpa"
    compile: bool = False  # torch.compile the model
    compile_layers: bool = False  # torch.compile each encoder layer
    optimizer: str | None = None  # None: --optimizer

    @property
    def is_hf(self) -> bool:
        return self.model == "hf"

    @property
    def sparse_head(self) -> bool:
        return not self.is_hf and self.config_overrides.get("sparse_mlm_head", True)


def parse_variant(spec: str) -> Variant:
    model, *mods = spec.strip().split("+")
    if model not in MODELS:
        raise ValueError(f"variant {spec!r}: model {model!r} is not one of {', '.join(MODELS)}")
    variant = Variant(spec=spec.strip(), model=model)
    for mod in mods:
        if mod in FAST_PATH_MODS:
            if variant.is_hf:
                raise ValueError(f"variant {spec!r}: {mod!r} is a switch of our model; Hugging Face has no such switch")
            variant.config_overrides.update(FAST_PATH_MODS[mod])
        elif mod in VARIANT_MODS:
            variant = replace(variant, **VARIANT_MODS[mod])
        elif "=" in mod:
            variant.config_overrides.update([model_option(spec, mod, variant)])
        else:
            try:
                fields = residual_scheme_fields(mod)
            except ValueError as err:
                valid = ", ".join([*FAST_PATH_MODS, *VARIANT_MODS])
                raise ValueError(
                    f"variant {spec!r}: unknown modifier {mod!r}; valid modifiers: {valid}, or a residual scheme: {err}"
                ) from None
            if variant.is_hf or "residual_scheme" in variant.config_overrides:
                raise ValueError(f"variant {spec!r}: {mod!r} is a residual scheme; give one, to one of our models")
            variant.config_overrides.update(fields)
    options = dict(variant.config_overrides)
    if not variant.is_hf and (problem := design_problem(variant.model, options.pop("norm_type", DEFAULTS.norm_type),
                                                         {}, **options)):  # fmt: skip
        raise ValueError(f"variant {spec!r}: {problem}")
    return variant


def model_option(spec: str, mod: str, variant: Variant) -> tuple[str, Any]:
    """A ``KEY=VALUE`` modifier: one of our model's options (``LNBertOptions``), its value read as YAML."""
    key, _, text = mod.partition("=")
    names = [f.name for f in dataclasses.fields(LNBertOptions)]
    if variant.is_hf:
        raise ValueError(f"variant {spec!r}: {mod!r} sets an option of our model; Hugging Face BERT has none")
    if key not in names:
        raise ValueError(f"variant {spec!r}: {key!r} is not an option of our model (one of {', '.join(names)})")
    value = yaml.safe_load(text)
    if key in option_choices():
        check_choice(f"variant {spec!r}: {key}", value, option_choices()[key])
    return key, value


def hf_config_kwargs(shape: dict[str, int]) -> dict[str, Any]:
    return dict(vocab_size=shape["vocab"], hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
                num_attention_heads=shape["heads"], intermediate_size=4 * shape["hidden"],
                max_position_embeddings=max(512, shape["seq"]), tie_word_embeddings=True)  # fmt: skip


def build_model(variant: Variant, shape: dict[str, int], seed: int) -> nn.Module:
    """Hugging Face ``BertForPreTraining`` or our ``LNBertForPreTraining``; same seed, same init scheme (only the
    shapes are relied on, though our Post-LN and Hugging Face built from one seed have the same weights)."""
    torch.manual_seed(seed)
    if variant.is_hf:
        model_cls, config = BertForPreTraining, BertConfig(**hf_config_kwargs(shape))
    else:
        model_cls = LNBertForPreTraining
        config = LNBertConfig(**hf_config_kwargs(shape), norm_placement=variant.model, **variant.config_overrides)
    return model_cls._from_config(config, attn_implementation=variant.attn_implementation)


def random_batch(shape: dict[str, int], device: torch.device, generator: torch.Generator,
                 padded: bool = True) -> dict[str, torch.Tensor]:  # fmt: skip
    """Token ids, a sentence-pair segment split, exactly round(15% · T) MLM targets per row (never [CLS], never
    padding), and (``padded``) the last ``PADDED_POSITIONS`` of the last row padded.

    The padding is for the attention kernel: with an all-ones mask transformers passes no mask to SDPA eagerly but
    builds a (B, 1, T, T) one while dynamo traces (``is_tracing`` in ``masking_utils``), which sends a ``+compile``
    variant to another kernel. With one padded position every variant takes the kernel the training loop's padded
    batches take. ``padded=False``: the all-ones mask of BENCHMARKS.md sections 1-4's CPU figures.
    """
    batch, seq, vocab = shape["batch"], shape["seq"], shape["vocab"]
    low = min(1000, vocab // 2)  # above the special tokens of a BERT vocabulary
    input_ids = torch.randint(low, vocab, (batch, seq), generator=generator)
    input_ids[:, 0] = 101 % vocab
    token_type_ids = torch.zeros(batch, seq, dtype=torch.long)
    token_type_ids[:, seq // 2 :] = 1
    attention_mask = torch.ones(batch, seq, dtype=torch.long)
    if padded:
        attention_mask[-1, seq - PADDED_POSITIONS :] = 0
    input_ids[attention_mask == 0] = 0  # [PAD]
    token_type_ids[attention_mask == 0] = 0
    n_masked = max(1, round(MLM_FRACTION * seq))
    labels = torch.full((batch, seq), -100, dtype=torch.long)
    for row in range(batch):
        real = int(attention_mask[row].sum())
        positions = 1 + torch.randperm(real - 1, generator=generator)[:n_masked]
        labels[row, positions] = input_ids[row, positions]
        input_ids[row, positions] = MASK_TOKEN_ID % vocab
    nsp_labels = torch.randint(0, 2, (batch,), generator=generator)
    tensors = dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, labels=labels,
                   next_sentence_label=nsp_labels)  # fmt: skip
    return {k: v.to(device) for k, v in tensors.items()}


@dataclass
class Runner:
    """A model, its optimizer, a one-step closure, and what its steps measured."""

    variant: Variant
    model: nn.Module
    optimizer: torch.optim.Optimizer
    step: Callable[[dict[str, torch.Tensor]], torch.Tensor]
    first_step_s: float = 0.0
    attention_kernel: str = ""
    peak_bytes: int = 0  # the memory a step needs at its highest (inspect_step)
    times: list[float] = field(default_factory=list)  # wall-clock seconds of each timed step
    cpu_times: list[float] = field(default_factory=list)  # process CPU seconds (all threads) of each timed step
    loss: float | None = None  # of the last timed step

    def timed_step(self, batch: dict[str, torch.Tensor], device: torch.device) -> None:
        """One training step, with its wall-clock and CPU seconds and its loss recorded."""
        losses: list[torch.Tensor] = []
        seconds, cpu_seconds = common.timed_with_cpu(lambda: losses.append(self.step(batch)), device)
        self.times.append(seconds)
        self.cpu_times.append(cpu_seconds)
        self.loss = float(losses[0])


def make_runner(variant: Variant, shape: dict[str, int], precision: str, optimizer: str, device: torch.device,
                seed: int) -> Runner:  # fmt: skip
    model = build_model(variant, shape, seed).to(device).train()
    opt = build_adamw(model, **ADAMW, implementation=OPTIMIZERS[variant.optimizer or optimizer])
    forward = torch.compile(model) if variant.compile else model
    if variant.compile_layers:  # regional compilation, as torchtitan compiles each transformer block
        for layer in model.bert.encoder.layer:
            layer.compile()
        # One graph serves every layer, except under AttnRes, whose layers each read another number of sources.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, shape["layers"] + 1)

    def step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = forward(**batch).loss
        loss.backward()
        opt.step()
        if not variant.is_hf:
            model.after_optimizer_step()  # nGPT re-normalises its matrices, part of its step; a no-op otherwise
        return loss.detach()

    return Runner(variant, model, opt, step)


def measure_group(variants: list[Variant], shape: dict[str, int], precision: str, args: TrainStepConfig,
                  device: torch.device) -> dict[str, Any]:  # fmt: skip
    """All variants of one (shape, precision): warm-up, then ``reps`` interleaved timed steps each."""
    generator = torch.Generator().manual_seed(args.seed)
    padded = getattr(args, "padded_batches", True)
    batches = [random_batch(shape, device, generator, padded) for _ in range(2)]
    runners = [make_runner(v, shape, precision, args.optimizer, device, args.seed) for v in variants]
    for runner in runners:  # the first step includes compilation / kernel selection: reported, not timed
        runner.first_step_s = common.timed(lambda r=runner: r.step(batches[0]), device)
        for _ in range(args.warmup - 1):
            runner.step(batches[0])
        runner.attention_kernel, runner.peak_bytes = inspect_step(runner, batches[0], device)
    for rep in range(args.reps):
        shift = rep % len(runners)
        for runner in runners[shift:] + runners[:shift]:  # rotate who goes first
            runner.timed_step(batches[rep % len(batches)], device)
    baseline = fastest_baseline(runners, args.baseline, device)
    profiled = [r for r in runners if r.variant.spec in args.profile]
    top_ops = {r.variant.spec: profile_step(r, batches[0], device, args.profile_rows) for r in profiled}
    extra_ops = {r.variant.spec: profile_difference(r, baseline, batches[0], device, args.profile_rows)
                 for r in profiled if baseline is not None and r is not baseline}  # fmt: skip
    result = summarise(runners, shape, precision, baseline, device)
    result.update(profile=top_ops, profile_difference=extra_ops, device=device.type)
    del runners, baseline, profiled
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def inspect_step(runner: Runner, batch: dict[str, torch.Tensor], device: torch.device) -> tuple[str, int]:
    """The SDPA kernel(s) one untimed step of ``runner`` ran, read from the profiler's operators (the choice depends
    on mask, dtype, head size and tracing), and its peak bytes (CUDA's allocator peak; on a CPU, the parameters and
    optimizer state plus ``step_peak_bytes``)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    # The aten operators are recorded on the host; on a CPU, with the bytes each allocates and frees.
    with profile(activities=[ProfilerActivity.CPU], profile_memory=device.type == "cpu") as prof:
        runner.step(batch)
        common.synchronize(device)
    names = {event.key for event in prof.key_averages()}
    kernel = " + ".join(sorted({kernel for op, kernel in SDPA_KERNELS.items() if op in names})) or NO_SDPA_KERNEL
    if device.type == "cuda":
        return kernel, torch.cuda.max_memory_allocated(device)
    # What lives across steps: parameters and optimizer state (zero_grad(set_to_none=True) frees the gradients at
    # each step's start, so they count in the step's own peak).
    state = [t for s in runner.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    persistent = sum(t.numel() * t.element_size() for t in [*runner.model.parameters(), *state])
    return kernel, persistent + step_peak_bytes(prof.events())


def step_peak_bytes(events: Any) -> int:
    """The highest running sum, over a step's top-level operators in the order they ran, of the bytes each
    allocated less those it freed (``FunctionEvent.cpu_memory_usage``, its children included): the step's own
    peak above what existed before it. Frees of tensors from before the profile (the previous step's gradients)
    are not recorded, so they never lower the sum."""
    held = peak = 0
    for event in sorted((e for e in events if e.cpu_parent is None), key=lambda e: e.time_range.start):
        held += event.cpu_memory_usage
        peak = max(peak, held)
    return peak


def profile_step(runner: Runner, batch: dict[str, torch.Tensor], device: torch.device, rows: int) -> str:
    """Top ops of one step by self time (the table that shows where the time goes)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=False) as prof:
        runner.step(batch)
        common.synchronize(device)
    sort_by = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=sort_by, row_limit=rows, max_name_column_width=60)


def profile_difference(target: Runner, baseline: Runner, batch: dict[str, torch.Tensor], device: torch.device,
                       rows: int) -> str:  # fmt: skip
    """Where ``target``'s extra time goes: per operator and input shapes, the median over ``PROFILE_STEPS``
    profiled steps of its self time (device time on CUDA) minus the baseline's, the steps interleaved so that a
    busy spell hits both; the largest differences first, and their calls."""
    attribute = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    samples: dict[tuple[str, str, str], list[float]] = defaultdict(list)  # (variant, op, shapes) -> ms per step
    calls: dict[tuple[str, str, str], int] = {}
    for _ in range(PROFILE_STEPS):
        for runner in (baseline, target):
            with profile(activities=activities, record_shapes=True) as prof:
                runner.step(batch)
                common.synchronize(device)
            for event in prof.key_averages(group_by_input_shape=True):
                key = (runner.variant.spec, event.key, str(event.input_shapes))
                samples[key].append(getattr(event, attribute) / 1e3)
                calls[key] = event.count

    def median(key: tuple[str, str, str]) -> float:
        return statistics.median(samples[key] + [0.0] * (PROFILE_STEPS - len(samples[key])))  # absent: 0 ms

    new, old = target.variant.spec, baseline.variant.spec
    ops = {key[1:] for key in samples}
    extra = {op: median((new, *op)) - median((old, *op)) for op in ops}
    more_calls = {op: calls.get((new, *op), 0) - calls.get((old, *op), 0) for op in ops}
    largest = sorted(ops, key=lambda op: -abs(extra[op]))[:rows]
    table = [
        [name, shapes[:70], f"{extra[name, shapes]:+.2f}", f"{more_calls[name, shapes]:+d}"] for name, shapes in largest
    ]
    # The operators whose calls differ are the variant's own; the others' differences are mostly noise.
    own = sum(ms for op, ms in extra.items() if more_calls[op])
    total = (f"{sum(extra.values()):+.1f} ms per step in all, {own:+.1f} ms in the operators whose calls differ "
             f"({PROFILE_STEPS} profiled steps each, medians)")  # fmt: skip
    return f"{total}\n" + format_table(["operator", "input shapes", "ms per step", "calls"], table, style="markdown")


def fastest_baseline(runners: list[Runner], spec: str, device: torch.device) -> Runner | None:
    """The runner of ``spec`` or, where the variants hold it compiled too (``+compile``, ``+compile-layers``), the
    fastest of these: the median step's CPU time on a CPU (the steady measure with ``--threads=1``), else its wall
    clock. A design compiled against an eager baseline that compiling slows down (or the reverse) would flatter it."""
    compiled = {f"{spec}+compile", f"{spec}+compile-layers"}
    candidates = [r for r in runners if r.variant.spec == spec or r.variant.spec in compiled]
    clock = "cpu_times" if device.type == "cpu" else "times"
    return min(candidates, key=lambda r: statistics.median(getattr(r, clock)), default=None)


def summarise(runners: list[Runner], shape: dict[str, int], precision: str, baseline: Runner | None,
              device: torch.device) -> dict[str, Any]:  # fmt: skip
    tokens = shape["batch"] * shape["seq"]
    masked = max(1, round(MLM_FRACTION * shape["seq"])) / shape["seq"]
    # The plain BERT count: the dense-count columns, one yardstick for every variant (a scale of tok/s).
    config = BertConfig(**hf_config_kwargs(shape))
    dense_fpt = flops_per_token(config, shape["seq"])
    sparse_fpt = flops_per_token(config, shape["seq"], mlm_head_share=masked)
    rows = []
    for runner in runners:
        variant, t, cpu_t = runner.variant, runner.times, runner.cpu_times
        stats = common.spread(t)
        # What this variant executes: its own model's count (a residual scheme's mixing included).
        fpt = flops_per_token(runner.model.config, shape["seq"], mlm_head_share=masked if variant.sparse_head else 1.0)
        row: dict[str, Any] = {
            "variant": variant.spec, "step_s": stats, "step_cpu_s": common.spread(cpu_t),
            "tokens_per_cpu_s": tokens / statistics.median(cpu_t), "tokens_per_s": tokens / stats["median"],
            "exec_flops_per_token": fpt, "exec_tflops": fpt * tokens / stats["median"] / 1e12,
            "dense_count_tflops": dense_fpt * tokens / stats["median"] / 1e12, "first_step_s": runner.first_step_s,
            "attention_kernel": runner.attention_kernel, "peak_mib": runner.peak_bytes / 2**20, "loss": runner.loss,
        }  # fmt: skip
        if baseline is not None:
            row["speedup_vs_baseline"] = common.paired_speedup(t, baseline.times)
            row["cpu_time_speedup_vs_baseline"] = common.paired_speedup(cpu_t, baseline.cpu_times)
            # The extra time (CPU time on a CPU, as the baseline's choice) and peak memory over the baseline's.
            paired = row["cpu_time_speedup_vs_baseline" if device.type == "cpu" else "speedup_vs_baseline"]
            row["extra_vs_baseline"] = {"time": 1 / paired["median"] - 1, "time_iqr": paired["iqr_rel"],
                                        "peak": runner.peak_bytes / baseline.peak_bytes - 1}  # fmt: skip
        rows.append(row)
    return {"shape": shape, "precision": precision, "tokens_per_step": tokens, "masked_fraction": masked,
            "flops_per_token": {"dense_head": dense_fpt, "sparse_head": sparse_fpt},
            "baseline": baseline.variant.spec if baseline else None, "rows": rows}  # fmt: skip


def add_mfu(group: dict[str, Any], peaks: dict[str, Any]) -> None:
    """MFU of each row against the reference peak of the group's precision (executed and dense-count FLOPs)."""
    peak = peaks["reference_tflops"][group["precision"]]
    peak_cpu = peaks["measured_tflop_per_cpu_s"][group["precision"]]
    for row in group["rows"]:
        row["mfu_exec"] = row["exec_tflops"] / peak
        row["mfu_dense_count"] = row["dense_count_tflops"] / peak
        # FLOPs per CPU-second of the step against the GEMM's: insensitive to other processes; CPU only.
        cpu_rate = row["exec_flops_per_token"] * group["tokens_per_step"] / row["step_cpu_s"]["median"] / 1e12
        row["mfu_exec_cpu_time"] = cpu_rate / peak_cpu if group["device"] == "cpu" else None


def print_group(group: dict[str, Any], shape_name: str) -> None:
    fpt, base = group["flops_per_token"], group["baseline"]
    print(f"\n## {shape_name} {group['shape']} — {group['precision']}; FLOPs/token: dense-head "
          f"{fpt['dense_head'] / 1e6:.1f} M, sparse-head {fpt['sparse_head'] / 1e6:.1f} M")  # fmt: skip
    headers = ["variant", "step s (median)", "noise IQR", "tok/s", f"x {base} (wall, min-max)", f"x {base} (CPU time)",
               "CPU s/step", "tok/CPU-s", "exec TFLOP/s", "MFU exec", "MFU dense-count", "MFU exec (CPU time)",
               "peak MiB", f"extra time (IQR), peak vs {base}", "1st step s", "attention kernel"]  # fmt: skip
    rows = []
    for r in group["rows"]:
        speed, cpu_speed = r.get("speedup_vs_baseline"), r.get("cpu_time_speedup_vs_baseline")
        mfu_cpu = r["mfu_exec_cpu_time"]
        rows.append([
            r["variant"], f"{r['step_s']['median']:.4f}", f"{100 * r['step_s']['iqr_rel']:.1f}%",
            f"{r['tokens_per_s']:.0f}",
            f"{speed['median']:.2f} ({speed['min']:.2f}-{speed['max']:.2f})" if speed else "-",
            f"{cpu_speed['median']:.2f} (IQR {100 * cpu_speed['iqr_rel']:.0f}%)" if cpu_speed else "-",
            f"{r['step_cpu_s']['median']:.3f}", f"{r['tokens_per_cpu_s']:.0f}", f"{r['exec_tflops']:.3f}",
            f"{100 * r['mfu_exec']:.1f}%", f"{100 * r['mfu_dense_count']:.1f}%",
            f"{100 * mfu_cpu:.1f}%" if mfu_cpu is not None else "-", f"{r['peak_mib']:.0f}",
            _extra(r.get("extra_vs_baseline")),
            f"{r['first_step_s']:.2f}", r.get("attention_kernel", "-"),
        ])  # fmt: skip
    print(format_table(headers, rows, style="markdown"))
    for spec, table in (group.get("profile") or {}).items():
        print(f"\nprofile of one step of {spec} (top ops by self time):\n{table}")
    for spec, table in (group.get("profile_difference") or {}).items():
        print(f"\nwhere {spec}'s extra time goes, against {base}:\n{table}")


def _extra(extra: dict[str, float] | None) -> str:
    return f"{extra['time']:+.0%} ({extra['time_iqr']:.0%}), {extra['peak']:+.0%}" if extra else "-"


@dataclass(kw_only=True)
class TrainStepConfig:
    """Training-step throughput of our BERT against Hugging Face's, interleaved (see the module docstring)."""

    shapes: list[ShapeName] = field(default_factory=lambda: ["base", "small"])
    """Named shapes to time (base, small, preset, tiny, grid)."""
    precisions: list[Precision] = field(default_factory=lambda: ["fp32", "bf16"])
    """fp32 (TF32 on CUDA) and/or bf16 (autocast)."""
    variants: list[str] = field(default_factory=lambda: ["hf", "post", "pre"])
    """Variants MODEL[+MOD...] (see above), e.g. '[hf, post, post+qkv]'."""
    baseline: str = "hf"
    """Variant the speed-ups are relative to (or, where the variants hold it compiled too, the fastest of these)."""
    optimizer: Optimizer = "fused"
    """AdamW implementation for every variant (fused is Hugging Face Trainer's default)."""
    batch: int | None = None
    """Override the shapes' batch size."""
    seq: int | None = None
    """Override the shapes' sequence length."""
    reps: int = 5
    """Timed steps per variant (interleaved)."""
    warmup: int = 2
    """Untimed steps per variant first (>= 1)."""
    device: str = "auto"
    """auto (CUDA when available), cpu or cuda."""
    threads: int | None = None
    """torch.set_num_threads (CPU); null: torch's choice."""
    gemm_size: int | None = None
    """Square matmul size for the peak; null: 2048 on CPU, 8192 on GPU."""
    profile: list[str] = field(default_factory=list)
    """Variants to profile per group: one step's top ops by self time, and the difference from the baseline's."""
    profile_rows: int = 25
    """Rows of the profile table."""
    seed: int = 0
    """Seed of the batches and the models."""
    padded_batches: bool = True
    """Pad the last position of each batch's last row, so that every variant (compiled too) passes the same mask to
    SDPA and takes the same kernel (reported per row); false: an all-ones mask (BENCHMARKS.md's CPU figures)."""
    out: str | None = None
    """JSON path; null: benchmarks/results/train_step-<time>.json."""
    variant_list: list[Variant] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        try:
            self.variant_list = [parse_variant(s) for s in self.variants]
        except ValueError as err:
            raise ConfigError(f"variants: {err}") from None
        specs = [v.spec for v in self.variant_list]
        require(bool(specs), "variants", "must name at least one variant")
        require(len(set(specs)) == len(specs), "variants", "names a variant twice")
        unknown = [spec for spec in self.profile if spec not in specs]
        require(not unknown, "profile", f"{unknown} not among the variants {specs}")
        require(bool(self.shapes) and bool(self.precisions), "shapes/precisions", "must not be empty")
        require(self.reps >= 1 and self.warmup >= 1, "reps/warmup", "must be >= 1")
        for key in ("batch", "seq", "threads", "gemm_size"):
            require(getattr(self, key) is None or getattr(self, key) >= 1, key, "must be >= 1 or null")
        least = PADDED_POSITIONS + 2  # [CLS], one token to mask, the padding
        require(self.seq is None or self.seq >= least, "seq", f"must be >= {least} or null")


def parse_args(argv: list[str] | None = None) -> TrainStepConfig:
    return parse(TrainStepConfig, argv, prog="python -m benchmarks.train_step", description=__doc__ or "")


def _per_precision(tflops: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.3f}" for name, value in tflops.items())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    device = common.start_device(args.device, args.threads, "bf16" in args.precisions, "--precisions='[fp32]'")
    info = common.machine_info(device)
    print(f"machine: {info}")
    start_peaks = common.gemm_peaks(device, args.gemm_size, precisions=args.precisions)
    print(f"GEMM per CPU-second: {_per_precision(start_peaks['measured_tflop_per_cpu_s'])} TFLOP per CPU-s "
          f"({torch.get_num_threads()} threads)")  # fmt: skip
    print(f"GEMM peak ({start_peaks['gemm_size']}^2, measured): {_per_precision(start_peaks['measured_tflops'])} "
          f"TFLOP/s; MFU reference: {start_peaks['reference']} {start_peaks['reference_tflops']}")  # fmt: skip
    groups = []
    for shape_name in args.shapes:
        named = SHAPES[shape_name]
        shape = dict(named, batch=args.batch or named["batch"], seq=args.seq or named["seq"])
        for precision in args.precisions:
            group = measure_group(args.variant_list, shape, precision, args, device)
            group["shape_name"] = shape_name
            add_mfu(group, start_peaks)
            print_group(group, shape_name)
            groups.append(group)
    # Measure the peak again and keep the best: a busy spell on a shared machine must not inflate MFU.
    peaks = common.gemm_peaks(device, args.gemm_size, earlier=start_peaks, precisions=args.precisions)
    print(f"\n# Summary (MFU against the best GEMM peak of start and end: {_per_precision(peaks['measured_tflops'])} "
          f"TFLOP/s measured; reference {peaks['reference']})")  # fmt: skip
    for group in groups:
        add_mfu(group, peaks)
        print_group({**group, "profile": None, "profile_difference": None}, group["shape_name"])
    options = {k: v for k, v in vars(args).items() if k != "variant_list"}
    payload = {"benchmark": "train_step", "machine": info, "peaks": peaks, "args": options, "groups": groups}
    print(f"\nwrote {common.write_results('train_step', payload, args.out)}")
    return payload


cli = common.command(main)

if __name__ == "__main__":
    raise SystemExit(cli())
