"""Fast paths give the same numbers as the plain paths (within precision), and the benchmark harness runs.

Speed is never asserted here (the machine is shared); the figures are in BENCHMARKS.md.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import BertConfig

from benchmarks import common, train_step
from pretrain.common.device import pick_device
from pretrain.flops import flops_per_token, residual_scheme_flops
from pretrain.modeling import NORM_PLACEMENTS, LNBertConfig, LNBertForPreTraining
from tests.conftest import TINY


def _batch(vocab: int, batch: int = 3, seq: int = 11, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.full((batch, seq), -100)
    mask = torch.rand(batch, seq, generator=g) < 0.3
    mask[0, 1] = True  # at least one MLM target
    labels[mask] = torch.randint(0, vocab, (int(mask.sum()),), generator=g)
    attention_mask = torch.ones(batch, seq, dtype=torch.long)
    attention_mask[1, -3:] = 0  # padding in one row
    return dict(
        input_ids=torch.randint(0, vocab, (batch, seq), generator=g),
        attention_mask=attention_mask,
        token_type_ids=torch.randint(0, 2, (batch, seq), generator=g),
        labels=labels,
        next_sentence_label=torch.randint(0, 2, (batch,), generator=g),
    )


def _loss_and_grads(model: LNBertForPreTraining, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _pair(tiny_kwargs: dict, placement: str, **fast: object) -> tuple[LNBertForPreTraining, LNBertForPreTraining]:
    """The same weights twice: plain paths, and with the given fast-path switches. Dropout off to compare."""
    plain_cfg = LNBertConfig(
        **tiny_kwargs,
        norm_placement=placement,
        sparse_mlm_head=False,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    plain = LNBertForPreTraining(plain_cfg).train()
    fast_cfg = LNBertConfig(**{**plain_cfg.to_dict(), **fast})
    fast_model = LNBertForPreTraining(fast_cfg).train()
    fast_model.load_state_dict(plain.state_dict(), strict=True)
    return plain, fast_model


# --------------------------------------------------------------------------------------------------
# Fast paths: numerics
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("placement", NORM_PLACEMENTS)
def test_sparse_mlm_head_matches_dense_loss_and_gradients(tiny_kwargs: dict, placement: str) -> None:
    dense, sparse = _pair(tiny_kwargs, placement, sparse_mlm_head=True)
    batch = _batch(tiny_kwargs["vocab_size"])
    dense_loss, dense_grads = _loss_and_grads(dense, batch)
    sparse_loss, sparse_grads = _loss_and_grads(sparse, batch)
    torch.testing.assert_close(sparse_loss, dense_loss, rtol=1e-6, atol=1e-6)
    assert sparse_grads.keys() == dense_grads.keys()
    for name, grad in dense_grads.items():
        torch.testing.assert_close(sparse_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_sparse_mlm_head_logits_are_the_dense_logits_at_labelled_positions(tiny_kwargs: dict) -> None:
    dense, sparse = _pair(tiny_kwargs, "post", sparse_mlm_head=True)
    dense.eval()
    sparse.eval()
    batch = _batch(tiny_kwargs["vocab_size"])
    selected = batch["labels"] != -100
    with torch.no_grad():
        dense_logits = dense(**batch).prediction_logits
        sparse_logits = sparse(**batch).prediction_logits
    assert sparse_logits.shape == (int(selected.sum()), tiny_kwargs["vocab_size"])
    torch.testing.assert_close(sparse_logits, dense_logits[selected])


def _relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected.float()).norm() / expected.float().norm().clamp_min(1e-12))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("placement", ["post", "pre"])
def test_fused_qkv_matches_separate_projections_in_fp32(tiny_kwargs: dict, placement: str, attn: str) -> None:
    plain, fused = _pair(tiny_kwargs, placement, fused_qkv=True)
    for model in (plain, fused):
        model.config._attn_implementation = attn
    batch = _batch(tiny_kwargs["vocab_size"])
    plain_loss, plain_grads = _loss_and_grads(plain, batch)
    fused_loss, fused_grads = _loss_and_grads(fused, batch)
    torch.testing.assert_close(fused_loss, plain_loss)
    assert fused_grads.keys() == plain_grads.keys()  # Q, K and V each get their own gradient
    for name, grad in plain_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_fused_qkv_matches_separate_projections_under_bf16_autocast(tiny_kwargs: dict, placement: str) -> None:
    """Both bf16 paths round differently, so each is compared with the fp32 result: fused is no worse."""
    plain, fused = _pair(tiny_kwargs, placement, fused_qkv=True)
    batch = _batch(tiny_kwargs["vocab_size"])
    ref_loss, ref_grads = _loss_and_grads(plain, batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain_loss, plain_grads = _loss_and_grads(plain, batch)
        fused_loss, fused_grads = _loss_and_grads(fused, batch)
    assert abs(float(fused_loss - plain_loss)) < 2e-2 * float(ref_loss)
    for name, ref in ref_grads.items():
        if ref.norm() == 0:
            continue
        plain_err = _relative_error(plain_grads[name], ref)
        fused_err = _relative_error(fused_grads[name], ref)
        assert fused_err < max(2 * plain_err, 2e-2), f"{name}: fused {fused_err:.2e}, separate {plain_err:.2e}"


def test_fused_qkv_keeps_hugging_face_parameter_names(tiny_kwargs: dict) -> None:
    from transformers import BertConfig, BertForPreTraining

    torch.manual_seed(0)
    hf = BertForPreTraining(BertConfig(**tiny_kwargs)).eval()
    ours = LNBertForPreTraining(LNBertConfig(**tiny_kwargs, fused_qkv=True)).eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    batch = {k: v for k, v in _batch(tiny_kwargs["vocab_size"]).items() if k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch).prediction_logits, hf(**batch).prediction_logits)


# --------------------------------------------------------------------------------------------------
# Benchmark harness: the code paths a CPU can reach, and the GPU-only bits through monkeypatch
# --------------------------------------------------------------------------------------------------


def test_flops_per_token_matches_a_hand_count_for_a_tiny_config() -> None:
    # L=2, H=32, I=37, V=99, T=16: every matmul of the model, counted by hand.
    config = LNBertConfig(**TINY)
    per_layer = 4 * 32 * 32 + 2 * 32 * 37  # Q, K, V, attention output; FFN in and out
    mlm_head = 32 * 32 + 99 * 32  # transform dense, vocabulary decoder
    pooler_nsp = (32 * 32 + 32 * 2) / 16  # once per sequence of 16 tokens
    attention = 2 * (2 * 2 * 32 * 16) * 3  # 2 layers x (scores + weighted sum: 2 FLOPs x H x T each) x fwd+bwd
    dense = 6 * (2 * per_layer + mlm_head + pooler_nsp) + attention
    assert flops_per_token(config, 16) == pytest.approx(dense)
    sparse = 6 * (2 * per_layer + 0.15 * mlm_head + pooler_nsp) + attention
    assert flops_per_token(config, 16, mlm_head_share=0.15) == pytest.approx(sparse)
    # Hugging Face's BertConfig spells the shape the same way: the benchmarks count Hugging Face's model with it.
    hf = BertConfig(**TINY)
    assert flops_per_token(hf, 16) == flops_per_token(config, 16)


# L=2 (4 sub-layers), d=32: each scheme's mixing counted by hand, per sub-layer, forward.
SCHEME_FLOPS = {
    "shc": ({"residual_scheme": "hc", "hc_streams": 3, "hc_dynamic": False}, 4 * (2 * 4 * 3 * 32 + 2 * 3 * 32)),
    "dhc": ({"residual_scheme": "hc", "hc_streams": 3},
            4 * (2 * 4 * 3 * 32 + 2 * 3 * 32 + 2 * 3 * 32 * 4 + 2 * 3 * 32)),
    "mhc": ({"residual_scheme": "mhc", "hc_streams": 2, "mhc_sinkhorn_iters": 5},
            4 * (2 * 3 * 2 * 32 + 2 * 2 * 32 + 2 * 64 * (4 + 4) + 4 * 4 * 5)),  # phi: (n d) x (2n + n^2)
    # Full: sub-layers 0..3 read 1, 2, 3, 4 sources, the output 5; 4 K d each
    "attnres": ({"residual_scheme": "attn_res"}, 4 * 32 * (1 + 2 + 3 + 4 + 5)),
    # Block of 3: b0 | b0, partial | b0, partial | b0, b1 | the output: b0, b1, partial
    "attnres-b3": ({"residual_scheme": "attn_res", "attn_res_block_size": 3}, 4 * 32 * (1 + 2 + 2 + 2 + 3)),
    # mHC's mixing, phi (n d) x (2n + n!), H_res from the n! = 2 permutations: 2 n! n^2
    "mhclite": ({"residual_scheme": "mhc_lite", "hc_streams": 2},
                4 * (2 * 3 * 2 * 32 + 2 * 2 * 32 + 2 * 64 * (4 + 2) + 2 * 2 * 4)),
    # [Gamma; A] (2m x m) times m fractions of d/m, the write 2d; DFC's weights 2 m (d/m) 2m + 2 m (d/m)
    "sfrac": ({"residual_scheme": "frac", "frac_parts": 2, "hc_dynamic": False}, 4 * (2 * 4 * 2 * 16 + 2 * 32)),
    "dfrac": ({"residual_scheme": "frac", "frac_parts": 4}, 4 * (2 * 8 * 4 * 8 + 2 * 32 + 2 * 4 * 8 * 8 + 2 * 32)),
    # after layer 0 an average of X_0, X_1, after layer 1 of X_0, X_1, X_2 (2x1: of X_1, then of X_0, X_2)
    "denseformer": ({"residual_scheme": "denseformer"}, 2 * 32 * (2 + 3)),
    "denseformer-2x1": ({"residual_scheme": "denseformer", "dwa_dilation": 2}, 2 * 32 * (1 + 2)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(SCHEME_FLOPS))
def test_a_residual_schemes_flops_are_its_mixing_counted_by_hand(name: str) -> None:
    settings, forward = SCHEME_FLOPS[name]
    config = LNBertConfig(**TINY, norm_placement="pre", **settings)
    assert residual_scheme_flops(config) == forward
    plain = LNBertConfig(**TINY, norm_placement="pre")
    assert residual_scheme_flops(plain) == 0.0 and residual_scheme_flops(BertConfig(**TINY)) == 0.0
    assert flops_per_token(config, 16) == pytest.approx(flops_per_token(plain, 16) + 3 * forward)  # fwd + bwd


def test_flops_per_token_bert_base_is_the_familiar_6_x_110m() -> None:
    base = BertConfig()  # 12 x 768, vocabulary 30522
    assert 660e6 < flops_per_token(base, 128) < 670e6


def test_parse_variant_reads_model_and_modifiers() -> None:
    v = train_step.parse_variant("post+dense+compile+foreach")
    assert (v.model, v.compile, v.optimizer, v.sparse_head) == ("post", True, "foreach", False)
    assert train_step.parse_variant("pre").sparse_head
    assert not train_step.parse_variant("hf").sparse_head
    assert train_step.parse_variant("hf+eager").attn_implementation == "eager"


def test_parse_variant_reads_a_residual_scheme_by_its_label() -> None:
    v = train_step.parse_variant("pre+shc2+qkv")
    assert v.config_overrides == {"residual_scheme": "hc", "hc_streams": 2, "hc_dynamic": False, "mhc_bias_init": "zero",
                                  "attn_res_block_size": None, "frac_parts": 4, "dwa_dilation": 1, "dwa_period": 1,
                                  "fused_qkv": True}  # fmt: skip
    assert train_step.parse_variant("pre+attnres-b2").config_overrides["attn_res_block_size"] == 2
    assert train_step.parse_variant("pre+mhc4-idres").config_overrides["mhc_bias_init"] == "identity"
    overrides = {label: train_step.parse_variant(f"pre+{label}").config_overrides
                 for label in ("mhclite4", "sfrac2", "denseformer-2x3")}  # fmt: skip
    assert (overrides["mhclite4"]["residual_scheme"], overrides["mhclite4"]["hc_streams"]) == ("mhc_lite", 4)
    assert {k: overrides["sfrac2"][k] for k in ("residual_scheme", "frac_parts", "hc_dynamic")} == {
        "residual_scheme": "frac", "frac_parts": 2, "hc_dynamic": False}  # fmt: skip
    assert {k: overrides["denseformer-2x3"][k] for k in ("residual_scheme", "dwa_dilation", "dwa_period")} == {
        "residual_scheme": "denseformer", "dwa_dilation": 2, "dwa_period": 3}  # fmt: skip
    model = train_step.build_model(train_step.parse_variant("pre+hc4"), dict(train_step.SHAPES["tiny"]), seed=0)
    assert (model.config.residual_scheme, model.config.hc_streams, model.config.hc_dynamic) == ("hc", 4, True)


def test_parse_variant_reads_any_model_option_as_key_equals_value() -> None:
    v = train_step.parse_variant("pre+norm_type=derf+gpas=true+attention_gate=headwise+value_residual=learnable")
    assert v.config_overrides == {"norm_type": "derf", "gpas": True, "attention_gate": "headwise",
                                  "value_residual": "learnable"}  # fmt: skip
    for spec, match in [("post+gpas=true", r"variant 'post\+gpas=true': gpas=True is an option of norm_placement=pre"),
                        ("pre+gate=elementwise", r"'gate' is not an option of our model"),
                        ("pre+attention_gate=half", r"attention_gate='half' is not a valid choice"),
                        ("hf+norm_type=derf", r"Hugging Face BERT has none")]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            train_step.parse_variant(spec)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("pre+hc", r"unknown modifier 'hc'.*did you mean 'hc4'\?"),
        ("post+hc4", r"variant 'post\+hc4': residual_scheme='hc' needs norm_placement='pre'"),
        ("hf+attnres", r"'attnres' is a residual scheme; give one, to one of our models"),
        ("pre+hc4+mhc4", r"'mhc4' is a residual scheme; give one"),
    ],
)
def test_parse_variant_rejects_bad_schemes(spec: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        train_step.parse_variant(spec)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("gpt2", "model 'gpt2' is not one of"),
        ("post+turbo", "unknown modifier 'turbo'"),
        ("hf+dense", "switch of our model"),
    ],
)
def test_parse_variant_rejects_bad_specs(spec: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        train_step.parse_variant(spec)


def test_parse_args_rejects_unknown_shape_precision_and_variant() -> None:
    with pytest.raises(ValueError, match=r"shapes\[0\] must be one of base, small, preset, tiny, grid; got 'huge'"):
        train_step.parse_args(["--shapes=[huge]"])
    with pytest.raises(ValueError, match=r"precisions\[1\] must be one of fp32, bf16; got 'fp8'"):
        train_step.parse_args(["--precisions=[fp32, fp8]"])
    with pytest.raises(ValueError, match=r"shapes expects list.*lists are YAML"):
        train_step.parse_args(["--shapes=base,small"])
    with pytest.raises(ValueError, match=r"variants: variant 'post\+turbo': unknown modifier"):
        train_step.parse_args(["--variants=[post+turbo]"])


def test_random_batch_has_fifteen_percent_targets_at_mask_tokens() -> None:
    shape = dict(train_step.SHAPES["small"], batch=4)
    batch = train_step.random_batch(shape, torch.device("cpu"), torch.Generator().manual_seed(0))
    selected = batch["labels"] != -100
    assert (selected.sum(1) == round(0.15 * shape["seq"])).all()
    assert not selected[:, 0].any()
    assert (batch["input_ids"][selected] == train_step.MASK_TOKEN_ID).all()
    assert (batch["labels"][selected] >= 1000).all()


def sdpa_mask_of(batch: dict[str, torch.Tensor], tracing: bool, monkeypatch: pytest.MonkeyPatch) -> object:
    """The mask transformers hands SDPA for ``batch`` (as BertModel and ours build it), eagerly or as under dynamo."""
    from transformers import masking_utils

    monkeypatch.setattr(masking_utils, "is_tracing", lambda *args, **kwargs: tracing)
    config = BertConfig(**train_step.hf_config_kwargs(train_step.SHAPES["tiny"]))
    config._attn_implementation = "sdpa"
    embeds = torch.zeros(*batch["input_ids"].shape, config.hidden_size)
    return masking_utils.create_bidirectional_mask(
        config=config, inputs_embeds=embeds, attention_mask=batch["attention_mask"]
    )


def test_benchmark_batches_give_every_variant_the_same_sdpa_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    shape = dict(train_step.SHAPES["tiny"], batch=3)
    padded = train_step.random_batch(shape, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert int((padded["attention_mask"] == 0).sum()) == train_step.PADDED_POSITIONS
    assert (padded["labels"][padded["attention_mask"] == 0] == -100).all()  # no MLM target on padding
    # Padded: a (B, 1, T, T) mask whether or not dynamo traces, so eager and +compile variants take one kernel.
    for tracing in (False, True):
        mask = sdpa_mask_of(padded, tracing, monkeypatch)
        assert isinstance(mask, torch.Tensor) and mask.shape == (3, 1, shape["seq"], shape["seq"]), tracing
    # The all-ones mask (padded_batches=false) is what sent the compiled row to another kernel: none eagerly.
    ones = train_step.random_batch(shape, torch.device("cpu"), torch.Generator().manual_seed(0), padded=False)
    assert sdpa_mask_of(ones, False, monkeypatch) is None and sdpa_mask_of(ones, True, monkeypatch) is not None


def test_each_benchmark_row_says_which_attention_kernel_it_ran() -> None:
    from argparse import Namespace

    args = Namespace(seed=0, optimizer="fused", warmup=1, reps=1, profile=[], profile_rows=0, baseline="hf")
    variants = [train_step.parse_variant(s) for s in ("hf", "post", "post+eager")]
    group = train_step.measure_group(variants, dict(train_step.SHAPES["tiny"]), "fp32", args, torch.device("cpu"))
    kernels = {row["variant"]: row["attention_kernel"] for row in group["rows"]}
    assert kernels["hf"] == kernels["post"] and kernels["post"] in train_step.SDPA_KERNELS.values(), kernels
    assert kernels["post+eager"] == train_step.NO_SDPA_KERNEL


def test_train_step_benchmark_runs_end_to_end_on_cpu(tmp_path) -> None:
    out = tmp_path / "r.json"
    payload = train_step.main([
        "--shapes=[tiny]", "--precisions=[fp32, bf16]", "--variants=[hf, pre+dense+qkv+foreach, pre+mhc2]", "--reps", "2",
        "--warmup", "1", "--device", "cpu", "--gemm_size", "64", "--profile", "[hf, pre+mhc2]", "--profile_rows", "5",
        "--out", str(out),
    ])  # fmt: skip
    saved = json.loads(out.read_text())
    assert [g["precision"] for g in saved["groups"]] == ["fp32", "bf16"]
    for group in payload["groups"]:
        assert [r["variant"] for r in group["rows"]] == ["hf", "pre+dense+qkv+foreach", "pre+mhc2"]
        for row in group["rows"]:
            assert row["step_s"]["n"] == 2 and row["tokens_per_s"] > 0 and row["loss"] > 0
            assert row["speedup_vs_baseline"]["median"] > 0
            assert row["peak_mib"] > 0
            extra = row["extra_vs_baseline"]
            assert extra["peak"] == pytest.approx(row["peak_mib"] / group["rows"][0]["peak_mib"] - 1)
            assert extra["time"] == pytest.approx(1 / row["cpu_time_speedup_vs_baseline"]["median"] - 1)
        hf, dense, mhc = group["rows"]
        assert hf["exec_flops_per_token"] == dense["exec_flops_per_token"]  # the same count, dense heads both
        assert mhc["exec_flops_per_token"] > group["flops_per_token"]["sparse_head"]  # and the mixing's on top
        assert "aten::" in group["profile"]["hf"] and "aten::" in group["profile"]["pre+mhc2"]
        assert list(group["profile_difference"]) == ["pre+mhc2"]  # against the baseline, hf
        assert "ms per step in all" in group["profile_difference"]["pre+mhc2"]
    assert payload["peaks"]["measured_tflops"]["bf16"] > 0


def test_the_baseline_is_the_faster_of_its_eager_and_compiled_runs() -> None:
    from types import SimpleNamespace

    def runner(spec: str, wall: float, cpu: float) -> SimpleNamespace:
        return SimpleNamespace(variant=SimpleNamespace(spec=spec), times=[wall, 9.0, wall], cpu_times=[cpu, 9.0, cpu])

    runners = [
        runner("pre", 1.0, 2.0),
        runner("pre+compile-layers", 1.2, 1.5),
        runner("pre+hc4+compile-layers", 0.5, 0.5),
    ]
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert train_step.fastest_baseline(runners, "pre", cpu).variant.spec == "pre+compile-layers"  # by CPU time
    assert train_step.fastest_baseline(runners, "pre", cuda).variant.spec == "pre"  # by the wall clock
    assert train_step.fastest_baseline(runners[:1], "pre", cpu).variant.spec == "pre"
    assert train_step.fastest_baseline(runners, "post", cpu) is None


def test_a_steps_peak_memory_is_the_highest_running_sum_of_its_operators() -> None:
    from types import SimpleNamespace

    def op(start: int, change: int, parent: object = None) -> SimpleNamespace:
        return SimpleNamespace(time_range=SimpleNamespace(start=start), cpu_memory_usage=change, cpu_parent=parent)

    top = op(0, 100)
    events = [op(3, -50), top, op(1, 40, parent=top), op(2, 30), op(4, 5)]  # a child is in its parent's 100
    assert train_step.step_peak_bytes(events) == 130  # 100, 130, 80, 85
    assert train_step.step_peak_bytes([op(0, -10)]) == 0  # a free of what existed before never counts as peak


def test_peak_memory_counts_a_schemes_wider_state() -> None:
    """Four streams hold four copies of the state: a larger peak than Pre-LN's at the same shape."""
    from argparse import Namespace

    args = Namespace(seed=0, optimizer="fused", warmup=1, reps=1, profile=[], profile_rows=0, baseline="pre")
    shape = dict(train_step.SHAPES["tiny"], batch=8, seq=64, hidden=64)
    variants = [train_step.parse_variant(s) for s in ("pre", "pre+shc8")]
    group = train_step.measure_group(variants, shape, "fp32", args, torch.device("cpu"))
    pre, shc = group["rows"]
    assert shc["peak_mib"] > pre["peak_mib"] > 0


def test_gpu_peak_table_knows_hopper_and_ampere() -> None:
    assert common.table_peak_tflops("NVIDIA H100 80GB HBM3") == {"bf16": 989.0, "fp32": 494.7}
    assert common.table_peak_tflops("NVIDIA H200")["bf16"] == 989.0
    assert common.table_peak_tflops("NVIDIA H100 PCIe")["bf16"] == 756.0
    assert common.table_peak_tflops("NVIDIA A100-SXM4-80GB")["bf16"] == 312.0
    assert common.table_peak_tflops("Some Future GPU") is None


def test_cuda_timing_synchronises_and_enables_tf32(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    common.timed(lambda: calls.append("work"), torch.device("cuda"))
    assert calls == ["sync", "work", "sync"]
    # Saved and restored by hand: torch's cuBLAS flags live behind __getattr__/__setattr__, which monkeypatch's
    # undo mistakes for a missing attribute (it then tries delattr).
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        common.configure_device(torch.device("cuda"))
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_cuda_peaks_use_the_datasheet_of_a_known_card(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "measured_gemm", lambda dtype, device, size, reps=5: (1.0, 1.0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    peaks = common.gemm_peaks(torch.device("cuda"))
    assert peaks["gemm_size"] == 8192 and peaks["reference"] == "datasheet"
    assert peaks["reference_tflops"]["bf16"] == 989.0


def test_pick_device_explains_missing_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto").type == "cpu"
    with pytest.raises(ValueError, match=r"--device=cuda but torch\.cuda\.is_available"):
        pick_device("cuda")
    with pytest.raises(ValueError, match=r"recipe\.device='tpu' is not a valid choice; valid choices: auto, cpu, cuda"):
        pick_device("tpu", flag="recipe.device")


def _sentences(n: int, seed: int) -> list[str]:
    rng = torch.Generator().manual_seed(seed)
    # 150 made-up words: enough distinct characters and pieces for a WordPiece vocabulary of a few hundred.
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(letters[(7 * i + 3 * j * j) % 26] for j in range(3 + i % 5)) for i in range(150)]
    out = []
    for _ in range(n):
        idx = torch.randint(0, len(words), (int(torch.randint(4, 12, (1,), generator=rng)),), generator=rng)
        out.append(" ".join(words[i] for i in idx).capitalize() + ".")
    return out


def test_data_path_benchmark_runs_on_a_small_corpus(tmp_path) -> None:
    from benchmarks import data_path

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": " ".join(_sentences(30, seed))}) + "\n" for seed in range(12)))
    payload = data_path.main([
        "--corpus", str(corpus), "--max_documents", "12", "--vocab_size", "200", "--max_seq_length", "32",
        "--reps", "1", "--batch", "2", "--steps", "3", "--workers=[0]", "--shape", "tiny", "--precision", "fp32",
        "--device", "cpu", "--cache_dir", str(tmp_path / "cache"), "--out", str(tmp_path / "d.json"),
    ])  # fmt: skip
    pre = payload["preprocessing"]
    assert pre["instances"] > 0 and pre["corpus_tokens"] > 0 and pre["ours_tokens_per_s"] > 0
    pad = payload["padding"]
    assert 0 <= pad["pad_share_pad_to_longest"] <= pad["pad_share_fixed_length"] < 1
    assert 0 <= pad["pad_share_packed_pad_to_longest"] < 1
    assert 0 <= payload["data_wait"][0]["wait_share"] < 1
    assert json.loads((tmp_path / "d.json").read_text())["benchmark"] == "data_path"


def test_padding_waste_counts_positions() -> None:
    from benchmarks.data_path import padding_waste

    waste = padding_waste(torch.tensor([8, 8, 16, 16]).numpy(), batch=2, max_len=32, seed=0)
    assert waste["pad_share_fixed_length"] == pytest.approx(1 - 48 / 128)
    # Batches of two, padded to their longest rounded up to 8: at most 16 wide each.
    assert waste["pad_share_pad_to_longest"] <= 1 - 48 / 64 + 1e-9
    with pytest.raises(ValueError, match="fewer than one batch"):
        padding_waste(torch.tensor([8]).numpy(), batch=2, max_len=32, seed=0)


def test_finetune_throughput_benchmark_runs_on_a_small_task(tmp_path) -> None:
    from benchmarks import finetune_throughput

    task_dir = tmp_path / "MRPC"
    task_dir.mkdir()
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    for split, n in (("train", 24), ("dev", 6)):
        a, b = _sentences(n, 1), _sentences(n, 2)
        rows = "".join(f"{i % 2}\t{i}\t{i + 100}\t{a[i]}\t{b[i]}\n" for i in range(n))
        (task_dir / f"{split}.tsv").write_text(header + rows)
    payload = finetune_throughput.main([
        "--data_dir", str(tmp_path), "--shape", "tiny", "--batch", "4", "--reps", "2", "--device", "cpu",
        "--out", str(tmp_path / "f.json"),
    ])  # fmt: skip
    assert [g["precision"] for g in payload["groups"]] == ["fp32", "bf16"]
    for group in payload["groups"]:
        ours, hf = group["rows"]
        assert (ours["model"], hf["model"]) == ("ours", "hf")
        assert ours["examples_per_s"] > 0 and ours["speedup_vs_hf"]["median"] > 0
