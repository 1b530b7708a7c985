"""The ranking over grids: verdicts over seeds, gaps to each seed's own reference, ties, lr ranges."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pretrain.analysis.cli import main
from pretrain.analysis.ranking import Result, rank, summarise, verdict


def _cell(model: str, lr: float, seed: int, outcome: str, loss: float, reference: float = 6.2) -> dict:
    return {"setting": [model, 128, 12, 0, lr], "seed": seed, "outcome": outcome, "val_mlm_loss": loss,
            "probe": {"val_unigram_cross_entropy": reference}}  # fmt: skip


def _grid(folder: Path, cells: list[dict]) -> Path:
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"cells": {str(i): c for i, c in enumerate(cells)}}))
    return folder


def test_verdicts_need_every_seed() -> None:
    assert verdict(["trained", "trained"]) == "trains"
    assert verdict(["failed to train", "diverged"]) == "fails"
    assert verdict(["trained", "failed to train"]) == "mixed"


def test_gaps_are_to_each_seeds_own_reference_and_ties_use_the_larger_spread() -> None:
    def results(model: str, gaps: list[float]) -> list[Result]:
        return [Result(model, 12, 128, 0, 1e-3, seed, "trained", gap, "x") for seed, gap in enumerate(gaps)]

    summaries = {m: {"model": m, **summarise(results(m, g))}
                 for m, g in {"a": [-0.30, -0.20], "b": [-0.19, -0.17], "c": [-0.05, -0.06]}.items()}  # fmt: skip
    ranked = rank(summaries, tie_floor=0.01)
    assert [s["model"] for s in ranked] == ["a", "b", "c"]
    a, b, c = ranked
    assert a["range"] == pytest.approx(0.10) and b["mean_gap"] == pytest.approx(-0.18)
    assert b["ties_with"] == ["a"] and b["place"] == 1  # 0.07 apart, within a's range of 0.10
    assert c["ties_with"] == [] and c["place"] == 3


def test_ranking_command_reads_grids_and_recorded_results(tmp_path: Path) -> None:
    grid = _grid(tmp_path / "grid", [
        _cell("pre", 1e-3, 1, "trained", 6.0, reference=6.25),  # gap -0.25 against its own seed's reference
        _cell("post", 1e-3, 1, "failed to train", 6.19),
        _cell("pre", 3e-3, 0, "failed to train", 6.15),
        _cell("pre", 1e-3, 2, "incomplete", 7.0),  # left out
    ])  # fmt: skip
    recorded = tmp_path / "recorded.json"
    kept = {"model": "pre", "depth": 12, "width": 128, "warmup": 0, "lr": 1e-3}
    recorded.write_text(json.dumps([{**kept, "seed": 0, "outcome": "trained", "gap": -0.171},
                                    {**kept, "seed": 1, "outcome": "trained", "gap": -0.9}]))  # the grid's seed 1 wins  # fmt: skip
    out = tmp_path / "out"
    assert main(["ranking", f"--grids=[{grid}]", f"--recorded={recorded}", f"--out={out}"]) == 0
    found = json.loads((out / "results.json").read_text())
    pre, post = found["ranked"]
    assert (pre["model"], pre["seeds"], pre["verdict"]) == ("pre", [0, 1], "trains")
    assert pre["gaps"] == pytest.approx([-0.171, -0.25])
    assert (post["verdict"], post["place"]) == ("fails", 2)
    assert found["lr_verdicts"]["pre"] == {"0.0003": None, "0.001": "trains", "0.003": "fails"}
    assert (out / "ranking.png").stat().st_size > 0 and "trains (2)" in (out / "table.txt").read_text()


def test_steps_to_the_targets_final_loss_and_sublayer_numbers(tmp_path: Path) -> None:
    pre = {**_cell("pre", 1e-3, 0, "trained", 6.0), "train_curve": [[1, 7.0], [2, 6.0], [3, 5.0]],
           "probe": {"val_unigram_cross_entropy": 6.2, "sublayers": {"input_similarity": [0.9, 0.7],
                                                                     "output_norm": [1.0, 1.0, 3.0, 5.0]}}}  # fmt: skip
    hc = {**_cell("pre-hc4", 1e-3, 0, "trained", 5.9), "train_curve": [[1, 6.0], [2, 5.0], [3, 4.0]]}
    slow = {**_cell("post", 1e-3, 0, "failed to train", 6.19), "train_curve": [[1, 7.0], [2, 6.5], [3, 6.2]]}
    grid = _grid(tmp_path / "grid", [pre, hc, slow])
    out = tmp_path / "out"
    assert main(["ranking", f"--grids=[{grid}]", "--smoothing=1", f"--out={out}"]) == 0
    found = {s["model"]: s["diagnostics"]["mean"] for s in json.loads((out / "results.json").read_text())["ranked"]}
    assert (found["pre"]["steps_to_target"], found["pre-hc4"]["steps_to_target"], found["post"]["steps_to_target"]) == (3, 2, None)
    assert found["pre"]["input_similarity"] == pytest.approx(0.8)
    assert found["pre"]["output_norm_last_over_first"] == pytest.approx(4.0)
    assert "never" in (out / "table.txt").read_text()


def test_a_grid_without_results_or_with_damaged_ones_names_the_command(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="--report_only"):
        main(["ranking", f"--grids=[{tmp_path}]", f"--out={tmp_path / 'out'}"])
    (tmp_path / "results.json").write_text('{"cells": {"a"')  # cut short
    with pytest.raises(ValueError, match=r"is damaged.*--report_only"):
        main(["ranking", f"--grids=[{tmp_path}]", f"--out={tmp_path / 'out'}"])


def test_sublayer_inputs_are_alike_when_the_sub_layers_add_nothing(tmp_path: Path) -> None:
    """Pre-LN with zero sub-layer outputs: every sub-layer reads LN(embeddings), so consecutive inputs are equal."""
    import torch
    from safetensors.torch import load_file, save_file

    from pretrain.analysis.probes import sublayer_io
    from pretrain.run_folder.manifest import write_manifest
    from tests.finetune_fixtures import write_snapshot

    snapshot = write_snapshot(tmp_path, "run", "pre", step=5)
    batch = {"input_ids": torch.randint(5, 30, (2, 9)), "attention_mask": torch.ones(2, 9, dtype=torch.long),
             "token_type_ids": torch.zeros(2, 9, dtype=torch.long)}  # fmt: skip
    batch["attention_mask"][1, 6:] = 0
    outputs = ("attention.output.dense.weight", "attention.output.dense.bias", "output.dense.weight", "output.dense.bias")

    def rewrite(scale: float) -> dict:
        state = load_file(str(snapshot / "model.safetensors"))
        for key in [k for k in state if k.endswith(outputs)]:
            state[key] = state[key] * scale
        save_file(state, str(snapshot / "model.safetensors"), metadata={"format": "pt"})
        write_manifest(snapshot)
        return state

    layers = sum(k.endswith("intermediate.dense.weight") for k in rewrite(100.0))  # sub-layers that change the stream
    found = sublayer_io(tmp_path, batch)
    assert found["step"] == 5 and len(found["input_similarity"]) == 2 * layers - 1
    assert all(-1 <= c <= 1 for c in found["input_similarity"]) and min(found["input_similarity"]) < 0.99
    assert len(found["output_norm"]) == 2 * layers and min(found["output_norm"]) > 0
    rewrite(0.0)
    found = sublayer_io(tmp_path, batch)
    assert found["output_norm"] == [0.0] * (2 * layers)
    assert found["input_similarity"] == pytest.approx([1.0] * (2 * layers - 1), abs=1e-6)
