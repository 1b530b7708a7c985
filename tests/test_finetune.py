"""GLUE loading, one fine-tuning run on a tiny snapshot, what the results folder says of its jobs, and the
fine-tuning CLI."""

from __future__ import annotations

import dataclasses
import errno
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from finetune.config import FinetuneConfig
from finetune.glue import TASKS, baseline_metrics, batches, encode, get_task, load_task, read_tsv
from finetune.manifest import INTERRUPTED, Manifest, ManifestJob, ResultsFolder, Runtime
from finetune.run import RunConfig, run
from finetune.run import cli as run_cli
from finetune.run import main as run_main
from finetune.schedule import ScheduleConfig, discover, retried, runnable
from finetune.schedule import main as schedule_main
from finetune.train import make_optimizer, make_scheduler
from finetune.worker import describe_model, job_specs, snapshot_hash
from pretrain.common import hardware
from pretrain.common.atomic import write_json
from pretrain.common.cli import ConfigError, parse
from pretrain.common.formats import FormatVersionError
from pretrain.run_folder.layout import SNAPSHOT_INFO
from tests.conftest import TINY
from tests.finetune_fixtures import (
    FIXTURE_GLUE,
    QUICK,
    job_spec,
    make_run,
    results,
    tiny_tokenizer,
    write_snapshot,
)

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------------
# GLUE data
# --------------------------------------------------------------------------------------------------


def test_mrpc_fixture_bom_and_unbalanced_quote() -> None:
    splits = load_task("mrpc", FIXTURE_GLUE)
    assert (len(splits["train"]), len(splits["dev"])) == (16, 8)
    # The stray quote opens a field: with csv's default quoting it would swallow the following rows.
    assert splits["train"][1].text_a == '" The best deal , said the minister .'
    assert splits["train"][1].text_b == "Police denied the witness lied ."
    assert [e.label for e in splits["train"][:4]] == [0, 1, 0, 1]
    assert not splits["train"][0].text_a.startswith("\ufeff")


def test_rte_fixture_string_labels() -> None:
    dev = load_task("rte", FIXTURE_GLUE)["dev"]
    raw = (FIXTURE_GLUE / "RTE" / "dev.tsv").read_text().splitlines()[1:]
    # entailment = 0 and not_entailment = 1, as in nyu-mll/glue on the Hub.
    assert [e.label for e in dev] == [0 if line.endswith("\tentailment") else 1 for line in raw]
    assert dev[2].text_b == 'The "deal was signed .'


def test_real_glue_counts(shared_data: Path) -> None:
    glue = shared_data / "glue"
    mrpc, rte = load_task("mrpc", glue), load_task("rte", glue)
    # GLUE's MRPC train has 3,668 pairs; the copy beside the checkout holds 3,667 data lines (wc -l: 3,668
    # with the header), so the loader must return exactly the lines of the file.
    assert len(mrpc["train"]) == len((glue / "MRPC" / "train.tsv").read_text(encoding="utf-8-sig").splitlines()) - 1
    assert len(mrpc["train"]) in (3667, 3668)
    assert (len(mrpc["dev"]), len(rte["train"]), len(rte["dev"])) == (408, 2490, 277)
    assert {e.label for e in rte["train"]} == {0, 1}
    assert sum(e.label for e in mrpc["dev"]) == 279  # 68% paraphrases on MRPC dev


def test_hub_loader_matches_tsv_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hub path (nyu-mll/glue) and the TSV path give the same examples and label ids."""
    import datasets

    local = load_task("rte", FIXTURE_GLUE)
    calls = []

    def fake_load_dataset(name: str, config: str) -> datasets.DatasetDict:
        calls.append((name, config))
        names = TASKS[config].label_names
        return datasets.DatasetDict(
            {
                hub_split: datasets.Dataset.from_dict(
                    {
                        "sentence1": [e.text_a for e in local[split]],
                        "sentence2": [e.text_b for e in local[split]],
                        "label": [e.label for e in local[split]],
                        "idx": list(range(len(local[split]))),
                    },
                    features=datasets.Features(
                        {
                            "sentence1": datasets.Value("string"),
                            "sentence2": datasets.Value("string"),
                            "label": datasets.ClassLabel(names=list(names)),
                            "idx": datasets.Value("int32"),
                        }
                    ),
                )
                for split, hub_split in (("train", "train"), ("dev", "validation"))
            }
        )

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert load_task("rte") == local
    assert calls == [("nyu-mll/glue", "rte")]


def test_cli_bad_input_exits_2_with_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["finetune.run", "--model", "m", "--task", "cola"])
    assert run_cli() == 2
    assert "error: task: unknown GLUE task 'cola'; valid tasks: mrpc, rte" in capsys.readouterr().err


def test_unknown_task_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown GLUE task 'cola'; valid tasks: mrpc, rte"):
        get_task("cola")
    with pytest.raises(ValueError, match="valid tasks"):
        RunConfig(model="x", task="sst2")
    # Tasks key jobs and results by name: "MRPC" would run mrpc's jobs again apart, and the report would miss them.
    with pytest.raises(ValueError, match="unknown GLUE task 'MRPC' \\(did you mean 'mrpc'\\?\\)"):
        RunConfig(model="x", task="MRPC")


def test_a_learning_rate_given_twice_is_refused() -> None:
    """Its one job would count as two seeds with no spread between them."""
    with pytest.raises(ConfigError, match="lrs must be a non-empty list of distinct positive learning rates"):
        RunConfig(model="x", lrs=[5e-4, 0.0005])


def test_missing_task_folder_names_path_and_layout(tmp_path: Path) -> None:
    (tmp_path / "MRPC").mkdir()
    with pytest.raises(FileNotFoundError, match=r"RTE/train\.tsv.*index\tsentence1\tsentence2\tlabel") as raised:
        load_task("rte", tmp_path)
    assert "--data_dir" in str(raised.value) and "--data-dir" not in str(raised.value)  # the flag the commands take
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "MRPC" / "dev.tsv")):
        load_task("mrpc", tmp_path)


def test_a_file_cut_within_its_last_line_is_refused(tmp_path: Path) -> None:
    """MRPC's last field is a sentence: its last line cut short still has every field, so only the missing line break
    says the file was cut."""
    (tmp_path / "MRPC").mkdir()
    whole = (FIXTURE_GLUE / "MRPC" / "dev.tsv").read_text(encoding="utf-8-sig")
    path = tmp_path / "MRPC" / "dev.tsv"
    path.write_text(whole[:-20])
    lines = whole[:-20].count("\n") + 1
    with pytest.raises(ValueError, match=rf"dev\.tsv:{lines} ends without a line break: the file was cut short"):
        read_tsv(path, TASKS["mrpc"])
    path.write_text(whole)
    assert len(read_tsv(path, TASKS["mrpc"])) == lines - 1


def test_bad_label_and_missing_column(tmp_path: Path) -> None:
    (tmp_path / "RTE").mkdir()
    path = tmp_path / "RTE" / "train.tsv"
    path.write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n")
    with pytest.raises(ValueError, match=r"train\.tsv:2: label 'maybe'"):
        read_tsv(path, TASKS["rte"])
    path.write_text("index\ts1\ts2\tlabel\n")
    with pytest.raises(ValueError, match="lacks the column"):
        read_tsv(path, TASKS["rte"])


def test_dynamic_padding_pads_to_batch_longest() -> None:
    tokenizer = tiny_tokenizer()
    features = encode(tokenizer, load_task("mrpc", FIXTURE_GLUE)["dev"], max_length=12)
    assert max(len(f["input_ids"]) for f in features) <= 12
    for batch in batches(features[:3], 3, tokenizer.pad_token_id):
        lengths = [len(f["input_ids"]) for f in features[:3]]
        assert batch["input_ids"].shape == (3, max(lengths))
        assert batch["attention_mask"].sum(1).tolist() == lengths
        assert set(batch["token_type_ids"].unique().tolist()) == {0, 1}


# --------------------------------------------------------------------------------------------------
# Fine-tuning, and what the results folder says of its jobs
# --------------------------------------------------------------------------------------------------


def test_weight_decay_skips_norms_and_biases_by_module_type() -> None:
    class Odd(nn.Module):  # a norm whose name says nothing about being a norm
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.zz = nn.LayerNorm(4)

    model = Odd()
    optimizer = make_optimizer(model, FinetuneConfig(), lr=1e-3)
    decay, no_decay = (set(map(id, g["params"])) for g in optimizer.param_groups)
    assert decay == {id(model.proj.weight)}
    assert no_decay == {id(model.proj.bias), id(model.zz.weight), id(model.zz.bias)}


def test_lr_schedule_is_berts_linear_warmup_then_decay() -> None:
    """10 steps, 30% warm-up, peak 1: from 0 up over 3 steps, then down to 0 at step 10 (get_scheduler "linear")."""
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = make_scheduler(optimizer, FinetuneConfig(warmup_ratio=0.3), total_steps=10)
    lrs = []
    for _ in range(10):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([0, 1 / 3, 2 / 3, 1, 6 / 7, 5 / 7, 4 / 7, 3 / 7, 2 / 7, 1 / 7])
    # The hand-written schedule it replaces agreed from the end of warm-up on; in warm-up it ran one step ahead
    # ((step + 1) / warmup), where BERT, pretraining and get_scheduler start from 0.
    old = [(s + 1) / 3 if s < 3 else (10 - s) / 7 for s in range(10)]
    assert lrs[3:] == pytest.approx(old[3:]) and lrs[1:3] == pytest.approx(old[:2])


def test_one_job_key_for_a_snapshot_however_it_is_found(tmp_path: Path) -> None:
    """finetune.run (a model path) and the scheduler (a run's snapshots) describe a snapshot the same way, with the
    same fallbacks when snapshot.json lacks the run name or placement."""
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    snapshot = run_dir / "snapshots" / "step_00000010"
    info = json.loads((snapshot / SNAPSHOT_INFO).read_text())
    del info["run_name"], info["norm_placement"]
    (snapshot / SNAPSHOT_INFO).write_text(json.dumps(info))
    described = describe_model(str(snapshot))
    discovered = discover(ScheduleConfig(runs=[str(run_dir)], lrs=[1e-3], seeds=[0], tasks=["mrpc"]))
    assert described.run_name == "post_ln" and described.placement == "post"  # run folder; config.json
    assert described.run_dir == str(run_dir.resolve()) and described.pretrain_step == 10
    (spec,) = job_specs(described, "mrpc", [1e-3], [0], FinetuneConfig())
    assert discovered.specs == [spec] and not discovered.refused


def test_a_damaged_run_id_is_read_from_the_snapshot_that_records_it(tmp_path: Path) -> None:
    """RUN/run_id damaged since: a snapshot's jobs keep their run's id, the copy its snapshot.json records; a snapshot
    that records none is refused naming the file (pretraining restores it at its next start)."""
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    snapshot = run_dir / "snapshots" / "step_00000010"
    run_id = describe_model(str(snapshot)).run_id
    (run_dir / "run_id").write_bytes(b"\xff\xfe")
    assert describe_model(str(snapshot)).run_id == run_id
    info = json.loads((snapshot / SNAPSHOT_INFO).read_text())
    (snapshot / SNAPSHOT_INFO).write_text(json.dumps({**info, "run_id": None}))
    with pytest.raises(ValueError, match=r"run_id is damaged"):
        describe_model(str(snapshot))


def test_a_snapshots_hash_is_read_from_its_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Describing a snapshot reads no weights: its manifest lists every file's checksum. The task checks the files
    against it before their weights are used (test_finetune_schedule.py)."""
    from finetune import worker

    snapshot = make_run(tmp_path, "post_ln", "post", steps=(10,)) / "snapshots" / "step_00000010"
    expected = snapshot_hash(snapshot)
    monkeypatch.setattr(worker, "sha256_file", lambda path: pytest.fail(f"{path} was hashed"))
    assert describe_model(str(snapshot)).snapshot_hash == expected


def test_recipe_and_runtime_fields_are_declared_once() -> None:
    """The recipe's roles (pretrain/common/roles.py) split it into the job key's fields and the worker's runtime."""
    recipe = FinetuneConfig(torch_threads=3, device="cpu")
    assert recipe.runtime() == {"eval_batch_size": 64, "torch_threads": 3, "device": "cpu", "progress": True}
    assert set(recipe.result_key()) | set(recipe.runtime()) == set(dataclasses.asdict(recipe))
    assert not set(recipe.result_key()) & set(recipe.runtime())
    assert job_spec(recipe=FinetuneConfig(device="cpu").result_key()).key == job_spec(recipe=recipe.result_key()).key


def quick_run(snapshot: Path, task: str, folder: Path, seeds: list[int] | None = None, **recipe: Any) -> RunConfig:
    """finetune.run's config for ``snapshot`` on the fixture GLUE at lr 1e-3 with the QUICK recipe."""
    return RunConfig(model=str(snapshot), task=task, data_dir=str(FIXTURE_GLUE), lrs=[1e-3], seeds=seeds or [0],
                     results_dir=str(folder), recipe=FinetuneConfig(**QUICK, **recipe))  # fmt: skip


def test_a_model_folder_whose_weights_are_not_of_its_config_fails_its_jobs_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain model folder (no manifest) whose config.json was replaced by another placement's after the command
    checked it (finetune.run refuses it up front: tests/test_crash_safety.py): loading refuses it in the job
    (``from_pretrained`` checks the weights against the config), once, for good, naming the fix."""
    monkeypatch.setattr("finetune.run.check_loads", lambda model, dev: None)
    snapshot = make_run(tmp_path, "pre_ln", "pre", steps=(10,)) / "snapshots" / "step_00000010"
    folder = tmp_path / "copied"
    shutil.copytree(snapshot, folder, ignore=shutil.ignore_patterns("snapshot.json", "manifest.json", "COMPLETE"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "norm_placement": "rezero"}))
    (row,) = run(quick_run(folder, "mrpc", tmp_path / "results.d"))
    assert (row["status"], row["attempts"], row["permanent"]) == ("failed", 1, True)
    assert row["error"].startswith("CheckpointMismatch: Checkpoint does not match norm_placement='rezero'")
    assert "restore it from a copy" in row["error"]


def _hub_bert_folder(path: Path, prefix: str = "") -> dict[str, torch.Tensor]:
    """A Hugging Face BERT folder as bert-base-uncased is on the Hub: BertForPreTraining's weights with the LayerNorms'
    old names (gamma, beta), each name after ``prefix``; returns the weights by their names in a model."""
    from safetensors.torch import load_file, save_file
    from transformers import BertConfig, BertForPreTraining

    tokenizer = tiny_tokenizer()
    config = BertConfig(**{k: TINY[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                "intermediate_size")}, vocab_size=len(tokenizer),
                        max_position_embeddings=128, pad_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    model = BertForPreTraining(config)
    with torch.no_grad():
        model.bert.embeddings.LayerNorm.weight.uniform_(0.5, 1.5)  # unlike a new LayerNorm's
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    weights = load_file(path / "model.safetensors")
    old_names = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
                 for k, v in weights.items()}  # fmt: skip
    save_file({prefix + k: v for k, v in old_names.items()}, path / "model.safetensors", metadata={"format": "pt"})
    return weights


def test_a_hugging_face_bert_folder_fine_tunes_with_its_weights_and_one_of_other_names_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Hub BERT folder (old LayerNorm names) is fine-tuned from its own weights; a folder whose weights load none of
    the encoder (names of another model) is refused before any job, and in a job for good, as is one whose config.json
    leaves layers of its weights unused: a random or truncated encoder is never fine-tuned in its place (Hugging Face
    models only warn)."""
    from finetune.train import load_classifier
    from pretrain.modeling import CheckpointMismatch

    folder = tmp_path / "bert-base"
    weights = _hub_bert_folder(folder)
    model = load_classifier(str(folder))
    for name, value in model.bert.state_dict().items():
        assert torch.equal(value, weights[f"bert.{name}"]), name
    (row,) = run(quick_run(folder, "mrpc", tmp_path / "results.d"))
    assert row["status"] == "done"
    renamed = tmp_path / "renamed"
    _hub_bert_folder(renamed, prefix="model.")
    monkeypatch.setattr(sys, "argv", ["finetune.run", f"--model={renamed}", "--task=mrpc", f"--data_dir={FIXTURE_GLUE}",
                                      f"--results_dir={tmp_path / 'other.d'}"])  # fmt: skip
    assert run_cli() == 2
    assert re.search(r"cannot be fine-tuned: the checkpoint of .*renamed does not fit the encoder of its config.json: "
                     r"\d+ weights missing \['bert\.", capsys.readouterr().err)  # fmt: skip
    shallower = tmp_path / "shallower"  # a config.json of fewer layers than its weights: the rest would go unused
    shutil.copytree(folder, shallower)
    config = json.loads((shallower / "config.json").read_text())
    (shallower / "config.json").write_text(json.dumps({**config, "num_hidden_layers": config["num_hidden_layers"] - 1}))
    with pytest.raises(CheckpointMismatch, match=r"0 weights missing \[\], \d+ unused \['bert\.encoder\.layer\.1\."):
        load_classifier(str(shallower))
    monkeypatch.setattr("finetune.run.check_loads", lambda model, dev: None)
    (row,) = run(quick_run(renamed, "mrpc", tmp_path / "other.d"))
    assert (row["status"], row["attempts"], row["permanent"]) == ("failed", 1, True)
    assert row["error"].startswith("CheckpointMismatch: ") and "restore it from a copy" in row["error"]


def _refused(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    monkeypatch.setattr(sys, "argv", ["finetune.run", *argv])
    assert run_cli() == 2
    return capsys.readouterr().err


def test_a_hub_folder_is_fine_tuned_only_with_its_own_tokenizer_and_readable_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before any job, each naming the fix: a folder without tokenizer files (transformers builds a tokenizer
    of the special tokens alone, and the jobs would learn from [UNK]s), a tokenizer larger than the model's vocabulary
    or cut short, a pytorch_model.bin cut short. A classifier of another task's labels is replaced by a new one. The job key of a
    plain folder covers its tokenizer: another tokenizer gives other numbers."""
    from transformers import BertConfig, BertForSequenceClassification

    from finetune.train import load_classifier

    folder = tmp_path / "bert"
    _hub_bert_folder(folder)
    args = ["--task=mrpc", f"--data_dir={FIXTURE_GLUE}", f"--results_dir={tmp_path / 'results.d'}"]
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(folder / name, bare / name)
    assert "reads 100% of the task's text as [UNK]: the folder lacks the model's tokenizer files" in _refused(
        [f"--model={bare}", *args], monkeypatch, capsys)  # fmt: skip
    assert snapshot_hash(bare) != snapshot_hash(folder)
    small = tmp_path / "small"
    shutil.copytree(folder, small)
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 20}))
    err = _refused([f"--model={small}", *args], monkeypatch, capsys)
    assert re.search(r"has \d+ tokens, more than the model's 20 embeddings \(config.json vocab_size\)", err), err
    torn = tmp_path / "torn"
    shutil.copytree(folder, torn)
    (torn / "tokenizer.json").write_text('{"version": "1.0", "trunc')
    assert "its tokenizer cannot be read (" in _refused([f"--model={torn}", *args], monkeypatch, capsys)
    three = tmp_path / "mnli"
    config = BertConfig.from_pretrained(folder, num_labels=3)
    BertForSequenceClassification.from_pretrained(folder, config=config).save_pretrained(three)
    model = load_classifier(str(three))
    assert model.classifier.out_features == 2
    # As older Hub repositories hold it (transformers 5 saves safetensors only), then cut short by a copy.
    bin_file = three / "pytorch_model.bin"
    torch.save(model.state_dict(), bin_file)
    (three / "model.safetensors").unlink()
    bin_file.write_bytes(bin_file.read_bytes()[: bin_file.stat().st_size // 2])
    shutil.copy(folder / "tokenizer.json", three)
    err = _refused([f"--model={three}", *args], monkeypatch, capsys)
    assert f"--model {str(three)!r}: its weights cannot be read (" in err and "copy them again" in err
    assert not (tmp_path / "results.d" / "jobs").exists()
    monkeypatch.setattr("finetune.run.check_loads", lambda model, dev: None)  # a job finds it: failed for good
    (row,) = run(quick_run(bare, "mrpc", tmp_path / "jobs.d"))
    assert (row["status"], row["attempts"], row["permanent"]) == ("failed", 1, True) and "[UNK]" in row["error"]


@pytest.mark.parametrize(
    ("placement", "options"),
    [("pre", dict(norm_type="derf", gpas=True, attention_gate="elementwise", value_residual="learnable")),
     ("deepnorm", dict(norm_type="seednorm", gpas=True, attention_gate="headwise", value_residual="identity"))],
)  # fmt: skip
def test_the_designs_inside_the_layer_fine_tune(tmp_path: Path, placement: str, options: dict[str, Any]) -> None:
    """Derf, SeeDNorm, GPAS, gated attention and value residual (docs/placements.md) through finetune.run."""
    run_dir = make_run(tmp_path, "design", placement, steps=(10,))
    snapshot = write_snapshot(run_dir, "design", placement, 10, **options)  # over the plain one
    assert json.loads((snapshot / "config.json").read_text()).items() >= options.items()
    (row,) = run(quick_run(snapshot, "mrpc", tmp_path / "results.d"))
    assert row["status"] == "done" and 0.0 <= row["accuracy"] <= 1.0 and row["dev_loss"] > 0


def test_finetune_writes_rows_then_skips_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = make_run(tmp_path, "pre_ln", "pre", steps=(10,))
    snapshot = run_dir / "snapshots" / "step_00000010"
    config = quick_run(snapshot, "mrpc", tmp_path / "results.d", seeds=[0, 1])
    rows = run(config)
    out = capsys.readouterr()
    assert "Loading weights" not in out.err  # no loading bar per job
    # One line per job as it ends: what it was and what it measured.
    assert re.findall(r"^done mrpc lr=0\.001 seed=(\d) step=10 \(pre_ln\) acc [\d.]+ in \d+ s$", out.out, re.M) == ["0", "1"]
    assert [(r["status"], r["seed"], r["attempts"]) for r in rows] == [("done", 0, 1), ("done", 1, 1)]
    row = rows[0]
    assert (row["run_name"], row["placement"], row["pretrain_step"], row["tokens_seen"]) == (
        "pre_ln",
        "pre",
        10,
        10_000,
    )
    assert row["run_dir"] == str(run_dir.resolve())
    assert 0.0 <= row["accuracy"] <= 1.0 and 0.0 <= row["f1"] <= 1.0 and row["dev_loss"] > 0
    # The fixture's MRPC dev set is 4 paraphrases in 8: the report's majority baseline comes with every row.
    assert row["majority_accuracy"] == 0.5 and 0.5 <= row["top_class_share"] <= 1.0
    assert (row["epochs"], row["train_steps"]) == (1, 2)
    assert row["device"] == hardware.device_name(torch.device("cpu"))  # the CPU's model and torch's kernel level
    assert row["device"].endswith(f", {torch.backends.cpu.get_cpu_capability()}")
    assert row["run_id"] == (run_dir / "run_id").read_text().strip()
    folder = ResultsFolder(config.results_dir)
    (manifest,) = folder.manifests()  # one submission of both jobs
    assert [job.spec.seed for job in manifest.jobs] == [0, 1]
    assert run(config) == rows  # the second invocation recomputes nothing
    assert len(folder.manifests()) == 1
    assert len(list((tmp_path / "results.d" / "done").glob("*.json"))) == 2  # one result file per job


def test_finetune_run_takes_over_the_jobs_of_a_killed_run(tmp_path: Path) -> None:
    snapshot = make_run(tmp_path, "pre_ln", "pre", steps=(10,)) / "snapshots" / "step_00000010"
    config = quick_run(snapshot, "mrpc", tmp_path / "results.d")
    (spec,) = job_specs(describe_model(config.model), "mrpc", [1e-3], [0], config.recipe)
    folder = ResultsFolder(config.results_dir)  # what a run killed inside its job leaves behind:
    job = ManifestJob(spec=spec, attempt=1)
    folder.write_manifest(Manifest(1, "inprocess", 1, Runtime(None, {}, None), [job]))  # its manifest,
    folder.write_started(job, 1)  # and the start of its job
    assert folder.jobs()[spec.key].status == "submitted"
    (row,) = run(config)
    assert (row["status"], row["attempts"]) == ("done", 1)  # in-process, the job died with its run: not counted


def test_finetune_is_deterministic_given_seed(tmp_path: Path) -> None:
    snapshot = make_run(tmp_path, "post_ln", "post", steps=(10,)) / "snapshots" / "step_00000010"
    results = []
    for name in ("a", "b"):
        config = quick_run(snapshot, "rte", tmp_path / f"{name}.d", seeds=[3])
        (row,) = run(config)
        results.append((row["dev_loss"], row["accuracy"], row["f1"], row["train_loss"]))
    assert results[0] == results[1]
    assert results[0][2] is None  # RTE has no F1


@pytest.mark.parametrize("variant", [{"random_init": True}, {"mixed_precision": "bf16"}])
def test_recipe_variants_are_stored_apart(tmp_path: Path, variant: dict) -> None:
    """The random-init baseline and bf16 training are other recipes: own hash, own rows, other numbers."""
    snapshot = make_run(tmp_path, "post_ln", "post", steps=(10,)) / "snapshots" / "step_00000010"
    rows = {}
    for name, extra in (("base", {}), ("variant", variant)):
        config = quick_run(snapshot, "rte", tmp_path / "results.d", **extra)
        (rows[name],) = run(config)
    assert rows["variant"]["recipe_hash"] != rows["base"]["recipe_hash"]
    assert rows["variant"]["key"] != rows["base"]["key"]
    assert rows["variant"]["dev_loss"] != rows["base"]["dev_loss"]  # other weights, or other rounding
    assert 0 < rows["variant"]["dev_loss"] < 10


def test_rewritten_snapshot_gets_a_new_hash(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "post_ln", "post", steps=(10,))
    path = run_dir / "snapshots" / "step_00000010"
    first = snapshot_hash(path)
    assert snapshot_hash(path) == first
    write_snapshot(run_dir, "post_ln", "post", 10, seed=123)  # other weights in the same folder
    assert snapshot_hash(path) != first


def test_the_folder_says_what_each_job_is(tmp_path: Path) -> None:
    """Status, attempts and errors come from the files alone: a manifest, its ended tasks, started, failed and
    result files; nothing is taken in or cached."""
    folder = ResultsFolder(tmp_path / "results")
    a, b, c = job_spec(), job_spec(seed=1), job_spec(seed=2)
    runtime = Runtime(None, {}, None)
    jobs = [ManifestJob(spec, 1) for spec in (a, b, c)]
    folder.write_manifest(Manifest(1, "local", 1, runtime, jobs))
    assert {s.status for s in folder.jobs().values()} == {"submitted"}
    folder.write_failed(jobs[1], 1, "OSError: disk full")
    folder.write_done(jobs[0], 1, results(accuracy=0.9))
    states = folder.jobs()  # at once: what a task wrote is what the folder says
    assert (states[a.key].status, states[a.key].results.accuracy) == ("done", 0.9)
    assert (states[b.key].status, states[b.key].attempts, states[b.key].error) == ("failed", 1, "OSError: disk full")
    assert states[c.key].status == "submitted"
    # Its task ends (SLURM's TIMEOUT) after starting job c: that attempt is charged; an interrupt charges none.
    folder.write_started(jobs[2], 1)
    folder.write_manifest(Manifest(1, "local", 1, runtime, jobs, ended={0: "sacct: TIMEOUT"}))
    states = folder.jobs()
    assert (states[c.key].status, states[c.key].attempts) == ("failed", 1)
    assert states[c.key].error == "task 0 of submission 1 ended without a result (sacct: TIMEOUT)"
    folder.write_manifest(Manifest(1, "local", 1, runtime, jobs, ended={0: INTERRUPTED}))
    assert (folder.jobs()[c.key].status, folder.jobs()[c.key].attempts) == ("queued", 0)
    # What to run: the failed job while it has attempts left, a moved one with its spec as found now.
    moved = job_spec(seed=2, model_path="/moved/s")
    assert moved.key == c.key and runnable(folder.jobs(), [a, b, moved], max_attempts=2) == [(b, 1), (moved, 0)]
    assert runnable(folder.jobs(), [b], max_attempts=1) == []
    # --retry_failed: a fresh count until a submission records the new attempt; the old failure no longer counts.
    (reset,) = retried(folder.jobs(), [b]).values()
    assert (reset.status, reset.attempts) == ("queued", 0)
    folder.write_manifest(Manifest(2, "local", 1, runtime, [ManifestJob(b, 1)]))
    assert (folder.jobs()[b.key].status, folder.jobs()[b.key].attempts) == ("submitted", 1)


def test_a_result_set_aside_does_not_charge_the_attempt_that_wrote_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job's task ended by itself (exit code 0) after its result was written; that file, damaged since, is set
    aside: the job is queued again with the attempts it had before, and a later attempt is charged as any."""
    folder = ResultsFolder(tmp_path / "results")
    job, runtime = ManifestJob(job_spec(), 1), Runtime(None, {}, None)
    folder.write_manifest(Manifest(1, "local", 1, runtime, [job], ended={0: "exit code 0"}))
    folder.write_started(job, 1)
    folder.write_done(job, 1, results())
    done = folder.done_path(job.spec.key)
    done.write_text(done.read_text()[:-9])  # cut short since
    (state,) = ResultsFolder(folder.root).jobs().values()
    assert (state.status, state.attempts) == ("queued", 0) and not done.exists()
    assert f"warning: {done} is not readable JSON" in capsys.readouterr().err
    (aside,) = (folder.root / "damaged").iterdir()
    assert aside.name.startswith(f"done.{job.spec.key}.json.1.") and aside.stat().st_size > 0  # kept
    folder.write_manifest(Manifest(2, "local", 1, runtime, [job], ended={0: "killed by SIGKILL"}))
    folder.write_started(job, 2)
    (state,) = folder.jobs().values()
    assert (state.status, state.attempts) == ("failed", 1)


def test_a_full_disk_while_setting_a_file_aside_is_said_as_one_and_leaves_it_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No room to make damaged/: the full disk itself is raised (run_cli says "make room ... run the same command"),
    not "cannot move it", and the damaged file stays where it was, to be set aside on the next read."""
    folder = ResultsFolder(tmp_path / "results")
    job = ManifestJob(job_spec(), 1)
    folder.write_done(job, 1, results())
    done = folder.done_path(job.spec.key)
    done.write_text("[]")

    def no_room(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "mkdir", no_room)
    with pytest.raises(OSError, match="No space left"):  # run_cli's full-disk message, not "cannot be moved"
        folder.jobs()
    assert done.read_text() == "[]"


def test_status_never_lags_the_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A result file a task writes is in the next status listing, with nothing in between."""
    folder = ResultsFolder(tmp_path / "results")
    job = ManifestJob(job_spec(), 1)
    folder.write_manifest(Manifest(1, "slurm", 1, Runtime(None, {}, None), [job], handle="1000"))
    argv = ["status", f"--results_dir={folder.root}"]
    assert schedule_main(argv) == 0
    assert capsys.readouterr().out.splitlines()[-1].split()[1:] == ["0", "1", "0", "0", "0"]
    folder.write_done(job, 1, results())  # as the array task does, while no scheduler runs
    assert schedule_main(argv) == 0
    assert capsys.readouterr().out.splitlines()[-1].split()[1:] == ["0", "0", "1", "0", "0"]
    with pytest.raises(FileNotFoundError, match=r"results folder .*nothing does not exist; pass --results_dir"):
        schedule_main(["status", f"--results_dir={tmp_path / 'nothing'}"])


def test_a_results_folder_of_another_format_is_refused_with_what_to_do(tmp_path: Path) -> None:
    folder = ResultsFolder(tmp_path / "results")
    write_json(folder.done_path("k"), {"version": 1, "key": "k"})  # as the results store's version wrote them
    with pytest.raises(FormatVersionError, match=r"done/k\.json has no format_version .*finish that results folder "
                                                 r"with the checkout that wrote it, or point --results_dir at a new"):  # fmt: skip
        folder.jobs()
    write_json(folder.manifest_path(1), {"format_version": 99})
    with pytest.raises(FormatVersionError, match=r"000001\.json has format_version 99; this code reads format_versi"):
        folder.manifests()


def test_baseline_metrics_of_a_model_that_answers_one_class() -> None:
    # MRPC's dev set: 279 paraphrases in 408. Always "equivalent" scores 68.38% accuracy and 81.22% F1.
    labels = torch.tensor([1] * 279 + [0] * 129).numpy()
    metrics = baseline_metrics(get_task("mrpc"), labels, labels * 0 + 1)
    assert metrics == {
        "majority_accuracy": pytest.approx(279 / 408),
        "top_class_share": 1.0,
        "majority_f1": pytest.approx(2 * 279 / (2 * 279 + 129)),
    }
    rte = baseline_metrics(get_task("rte"), labels, (labels + 1) % 2)  # the minority class's share of predictions
    assert rte == {"majority_accuracy": pytest.approx(279 / 408), "top_class_share": pytest.approx(279 / 408)}


# --------------------------------------------------------------------------------------------------
# Configuration and CLI
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", sorted((ROOT / "configs" / "finetune").glob("*.yaml")), ids=lambda p: p.name)
def test_presets_parse(preset: Path) -> None:
    config = parse(RunConfig, ["--model=m", "--config", str(preset)], prog="test")
    assert config.recipe.batch_size >= 1 and config.lrs and config.seeds


def test_mixed_precision_choices_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"recipe\.mixed_precision must be one of no, bf16; got 'fp16'"):
        parse(RunConfig, ["--model=m", "--recipe.mixed_precision=fp16"], prog="test")


def test_cli_overrides_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    preset = ROOT / "configs" / "finetune" / "bert_glue.yaml"

    def parse_run(*argv: str) -> RunConfig:
        return parse(RunConfig, list(argv), prog="finetune.run")

    config = parse_run(
        "--config", str(preset), "--model=m", "--lrs=[1e-5, 2e-5]", "--recipe.epochs", "2", "--data_dir=d"
    )
    assert (config.lrs, config.recipe.epochs, config.data_dir, config.seeds) == (
        [1e-5, 2e-5],
        2,
        "d",
        [0, 1, 2, 3, 4, 5],
    )
    assert parse_run("--model", "m", "--recipe.random_init").recipe.random_init is True  # a bare flag: true
    assert parse_run("--model", "m", "--recipe.random_init", "--task=rte").recipe.random_init is True
    for argv, message in [
        (["--lrs", "1e-5", "2e-5"], r"lrs expects list\[float\], got '1e-5'; lists are YAML"),  # space-separated
        (["--lrs=1e-5,2e-5"], r"lrs expects list\[float\], got '1e-5,2e-5'; lists are YAML"),
        (["--recipe.epochs", "0"], r"recipe\.epochs must be at least 1; got 0"),
        (["--recipe.warmup_ratio", "lots"], r"recipe\.warmup_ratio expects float, got 'lots'"),
        (["--recipe.epoch=3"], r"unknown key 'recipe\.epoch'; did you mean 'recipe\.epochs'\?"),
        (["--data-dir=d"], r"unknown key 'data-dir'; did you mean 'data_dir'\?"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_run("--model=m", *argv)
    with pytest.raises(SystemExit) as exit_info:
        run_main(["--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    assert "--recipe.warmup_ratio" in help_text and "Fraction of the optimizer steps with linear warm-up" in help_text


def test_summary_shows_no_spread_for_one_seed() -> None:
    from finetune.run import summarize

    one = [{"lr": 1e-3, "seed": 0, "status": "done", "accuracy": 0.5, "f1": None, "error": None}]
    two = [*one, {**one[0], "seed": 1, "accuracy": 0.7}]
    assert "0.5000 " in summarize(one) and "±" not in summarize(one)
    assert "0.6000±0.1000" in summarize(two)


def test_a_run_folder_as_model_names_its_snapshots_and_the_scheduler(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "lnbert-post", steps=(10, 20))
    with pytest.raises(ValueError, match=r"is a pretraining run folder, not a model; its complete snapshots: .*"
                                         r"step_00000010, .*step_00000020\. .*finetune\.schedule --runs="):  # fmt: skip
        run(quick_run(run_dir, "mrpc", tmp_path / "results.d"))


def test_jobs_that_failed_every_attempt_point_to_retry_failed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A job failed for a missing --data_dir; rerun with it, the old error must come back with the hint.
    failed = {"lr": 1e-3, "seed": 0, "status": "failed", "attempts": 3, "accuracy": None, "f1": None,
              "error": "OSError: nyu-mll/glue is not reachable"}  # fmt: skip
    monkeypatch.setattr("finetune.run.run", lambda config: [failed])
    assert run_main(["--model=m", f"--data_dir={FIXTURE_GLUE}"]) == 1
    assert "run the same command with --retry_failed=true" in capsys.readouterr().err
    assert run_main(["--model=m", "--retry_failed=true"]) == 1  # asked for already: no hint
    assert "--retry_failed" not in capsys.readouterr().err
