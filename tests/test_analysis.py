"""The analysis subcommands: the paper's identities hold numerically, and each command writes its table and PNG."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import pytest
import torch

from pretrain.analysis import cli, common, init_grads, init_scale, ln_jacobian, options
from pretrain.modeling import LNBertConfig, LNBertModel
from pretrain.variants import NORM_PLACEMENTS

# --------------------------------------------------------------------------------------------------
# ln-jacobian
# --------------------------------------------------------------------------------------------------


def test_layer_norm_jacobian_norm_is_sqrt_d_over_centred_norm():
    rows = ln_jacobian.ln_jacobian_rows(dims=[16, 64, 200], scales=[1e-2, 1.0, 1e2], eps=1e-12, seed=0)
    assert len(rows) == 9
    for row in rows:
        assert row["rel_err"] < 1e-3, row
        assert row["measured"] == pytest.approx(math.sqrt(row["d"]) / row["y_norm"], rel=1e-3)


def test_layer_norm_jacobian_identity_breaks_when_eps_dominates():
    # Guard against a measurement that would agree with anything: once ||y||^2/d is far below eps the
    # paper's formula is wrong by orders of magnitude, and only the eps-exact value still matches.
    (row,) = ln_jacobian.ln_jacobian_rows(dims=[32], scales=[1e-4], eps=1e-5, seed=0)
    assert row["rel_err"] > 0.9
    assert row["rel_err_eps"] < 1e-6


def test_ln_jacobian_command_writes_table_and_png(tmp_path, capsys):
    out = tmp_path / "lnj"
    assert cli.main(["ln-jacobian", "--dims=[8, 24]", "--scales", "[0.1, 10]", "--out", str(out)]) == 0
    assert "largest relative error" in capsys.readouterr().out
    assert (out / "ln_jacobian.png").stat().st_size > 1000
    results = json.loads((out / "results.json").read_text())
    assert [(r["d"], r["scale"]) for r in results["rows"]] == [(8, 0.1), (8, 10.0), (24, 0.1), (24, 10.0)]
    assert "sqrt(d)/||y||" in (out / "table.txt").read_text()


# --------------------------------------------------------------------------------------------------
# init-scale
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def simplified_scales() -> dict[str, tuple[list[float], list[float]]]:
    """Mean and standard error over 400 weight draws, d = 64, 6 layers (seeded: the test is deterministic)."""
    return {
        placement: common.mean_and_sem(
            init_scale.simplified_stream_scale(placement, 64, 6, seq_len=8, num_sequences=2, num_draws=400, seed=1)
        )
        for placement in ("post", "pre")
    }


def test_simplified_post_ln_ffn_sum_is_one_and_a_half_d(simplified_scales):
    mean, sem = simplified_scales["post"]
    for m, s in zip(mean, sem, strict=True):
        assert s < 0.02  # enough draws that the 4-sigma band below is narrow
        assert abs(m - 1.5) < 4 * s + 1e-3, (mean, sem)


def test_simplified_pre_ln_stream_within_paper_bounds(simplified_scales):
    mean, sem = simplified_scales["pre"]
    for layer, (m, s) in enumerate(zip(mean, sem, strict=True), start=1):
        low, high = init_scale.paper_bounds(layer)
        assert low + 3 * s < m < high - 3 * s, (layer, m, s)
    assert all(b > a for a, b in itertools.pairwise(mean))  # grows with depth


def test_simplified_setting_rejects_other_placements():
    with pytest.raises(ValueError, match="covers 'post' and 'pre' only"):
        init_scale.simplified_stream_scale("sandwich", 8, 1, 2, 1, 1, seed=0)


@pytest.mark.parametrize("placement", ["pre", "sandwich"])
def test_model_stream_hooks_read_the_raw_residual_stream(tiny_kwargs, placement):
    config = LNBertConfig(
        **tiny_kwargs, norm_placement=placement, init_scheme="xavier", hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    scales = init_scale.model_stream_scale(config, batch_size=2, seq_len=7, seed=0)
    torch.manual_seed(0)
    model = LNBertModel(config, add_pooling_layer=False).eval()
    ids = torch.randint(0, config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states
    d = config.hidden_size
    expected = [(h.double().pow(2).sum(-1) / d).mean().item() for h in hidden[1:]]
    assert scales[:-1] == pytest.approx(expected[:-1], rel=1e-6)
    # hidden_states[-1] is after the final LayerNorm (norm^2/d = 1); the hook sees the stream before it.
    assert expected[-1] == pytest.approx(1.0, abs=1e-4)
    assert scales[-1] > scales[0] > 1.2  # Xavier init: the stream grows layer by layer


def test_model_stream_hook_reads_post_ln_ffn_sum(tiny_kwargs):
    config = LNBertConfig(
        **tiny_kwargs, norm_placement="post", init_scheme="xavier", hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    scales = init_scale.model_stream_scale(config, batch_size=4, seq_len=16, seed=0)
    assert len(scales) == config.num_hidden_layers
    # Every Post-LN hidden state has ||x||^2/d = 1; the hook reads the FFN LayerNorm's input instead,
    # x_post5 = x_post3 + FFN(x_post3), whose expected size is 1 plus the FFN output's share.
    assert all(s > 1.05 for s in scales), scales


def test_init_scale_panel_tells_norm_types_and_inits_apart():
    layernorm, rmsnorm = (init_scale.curve_style("post", norm, "bert") for norm in ("layernorm", "rmsnorm"))
    assert layernorm["color"] == rmsnorm["color"]  # one colour per placement
    assert layernorm["linestyle"] != rmsnorm["linestyle"]  # post/bert and post-rmsnorm/bert differ
    xavier = init_scale.curve_style("post", "layernorm", "xavier")
    assert xavier["markerfacecolor"] != layernorm["markerfacecolor"]  # post/xavier and post/bert differ
    assert init_scale.curve_style("pre", "layernorm", "bert", scheme_index=1)["marker"] != layernorm["marker"]
    assert init_scale.curve_style("pre", "layernorm", "bert")["color"] != layernorm["color"]


def test_init_scale_command_writes_table_and_png(tmp_path, tiny_kwargs):
    """Every placement, as the command's default (docs/results.md section 2) measures them."""
    out = tmp_path / "scale"
    argv = [
        "init-scale", "--num_layers=2", "--paper_hidden_size=16", "--seeds=8", "--model_seeds=1",
        "--hidden_size=32", "--num_heads=2", "--vocab_size=99", "--seq_len=9", "--batch_size=2",
        "--init_schemes=[xavier]", "--out", str(out),
    ]  # fmt: skip
    assert cli.main(argv) == 0
    assert (out / "init_scale.png").stat().st_size > 1000
    results = json.loads((out / "results.json").read_text())
    assert sorted(results["model"]) == sorted(f"{p}/xavier" for p in NORM_PLACEMENTS)
    assert results["model"]["ngpt/xavier"]["mean"] == pytest.approx([1 / 32] * 2)  # unit vectors: 1/d
    assert len(results["simplified"]["pre"]["mean"]) == 2
    assert "bound lo" in (out / "table.txt").read_text()


# --------------------------------------------------------------------------------------------------
# init-grads
# --------------------------------------------------------------------------------------------------


def grads_args(cache_dir, **overrides) -> options.InitGradsConfig:
    """The init-grads config as its command line gives it, at a tiny size."""
    argv = ["init-grads", "--cache_dir", str(cache_dir), "--hidden_size=32", "--num_heads=2", "--seq_len=32",
            "--batch_size=8", "--vocab_size=300", "--max_documents=40", "--device=cpu"]  # fmt: skip
    command, args = cli.parse_args(argv)
    assert command == "init-grads"
    return dataclasses.replace(args, **overrides)


@pytest.fixture(scope="module")
def python_docs_data(tmp_path_factory):
    """40 documents of Python's documentation, a 300-token WordPiece vocabulary, 32-token MLM sequences."""
    args = grads_args(tmp_path_factory.mktemp("cache"))
    return args, init_grads.load_mlm_data(args)


def test_ffn_gradient_norms_are_deterministic_and_per_layer(python_docs_data):
    args, data = python_docs_data
    batch = init_grads.mlm_batch(data, 4, seed=3)
    assert (batch["labels"] != -100).any()
    config = common.model_config(args, "pre", "xavier", 3, len(data.tokenizer), data.tokenizer.pad_token_id)
    w1, w2 = init_grads.ffn_gradient_norms(config, batch, seed=5)
    assert len(w1) == len(w2) == 3
    assert all(math.isfinite(v) and v > 0 for v in w1 + w2)
    assert init_grads.ffn_gradient_norms(config, batch, seed=5) == (w1, w2)  # dropout off: same numbers
    assert init_grads.ffn_gradient_norms(config, batch, seed=6) != (w1, w2)


def test_pre_ln_last_layer_gradient_shrinks_with_depth(python_docs_data):
    # Paper, Theorem 1: Pre-LN's ||dL/dW2|| of the last layer scales like 1/sqrt(L) (here: expect ~2x from 2 to 8).
    args, data = python_docs_data
    args = dataclasses.replace(args, seeds=10, seed=0)
    last = {}
    for depth in (2, 8):
        w2 = init_grads.measure_init_grads(args, data, "xavier", "pre", depth)["w2"]
        last[depth] = common.mean_and_sem(torch.tensor([[g[-1]] for g in w2]))
    (shallow,), (shallow_sem,) = last[2]
    (deep,), (deep_sem,) = last[8]
    assert shallow - deep > 3 * math.hypot(shallow_sem, deep_sem), last
    assert shallow / deep > 1.4, last


def test_init_grads_command_on_a_jsonl_file(tmp_path):
    words = [
        "river",
        "bridge",
        "city",
        "house",
        "garden",
        "street",
        "market",
        "school",
        "window",
        "table",
        "light",
        "paper",
    ]
    lines = [
        json.dumps({"text": " ".join(f"The {words[(i + k) % 12]} is near the {words[(3 * i + k) % 12]}." for k in range(30))})
        for i in range(40)
    ]  # fmt: skip
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    out = tmp_path / "grads"
    argv = ["init-grads", "--data", str(corpus), "--cache_dir", str(tmp_path / "cache"), "--hidden_size=16",
            "--num_heads=2", "--seq_len=16", "--batch_size=2", "--vocab_size=120", "--seeds=2",
            "--num_layers=3", "--depths=[1, 3]", "--placements=[post, sandwich, rezero]", "--init_schemes=[bert]",
            "--norm_types=[layernorm, rmsnorm]", "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    assert (out / "init_grads.png").stat().st_size > 1000
    results = json.loads((out / "results.json").read_text())
    models = ("post", "sandwich", "rezero", "post-rmsnorm", "sandwich-rmsnorm", "rezero-rmsnorm")
    assert sorted(results["raw"]) == sorted(f"bert/{p}/{d}" for p in models for d in (1, 3))
    # ReZero's FFN weights get no gradient at init (its gates are 0): the depth ratio says so instead of failing.
    assert results["raw"]["bert/rezero/3"]["w2"][0] == [0.0, 0.0, 0.0]
    assert len(results["raw"]["bert/post/3"]["w2"]) == 2 and len(results["raw"]["bert/post/3"]["w2"][0]) == 3
    table = (out / "table.txt").read_text()
    assert "post W1" in table and "1/3" in table and "n/a (0)" in table and "sandwich-rmsnorm W2" in table


def test_init_grads_rejects_a_missing_data_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        cli.main(["init-grads", "--data", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path)])


def test_ln_jacobian_default_eps_is_the_models_layer_norm_eps() -> None:
    """options.py writes BERT's eps out (it is read before transformers is imported); they must agree."""
    assert options.LnJacobianConfig().eps == LNBertConfig().layer_norm_eps
