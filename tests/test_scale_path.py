"""The scale path's CPU-reachable parts: DDP with the MLM-only objective, the fp16 step decision, the
device peak-FLOP/s table, compile after DDP, asynchronous copies, slot tokens/s, bf16 on CPUs without it."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import socket
import sys
from pathlib import Path
from types import SimpleNamespace, TracebackType

import pytest
import torch
import torch.multiprocessing as mp
import yaml
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from safetensors.torch import load_file

from benchmarks import common, train_step
from benchmarks.common import table_peak_tflops
from finetune import train as finetune_train
from finetune.config import FinetuneConfig
from finetune.manifest import ResultsFolder
from finetune.run import RunConfig
from finetune.run import run as finetune_run
from finetune.schedule import schedule
from finetune.train import DataCache, finetune
from pretrain import training
from pretrain.common import hardware
from pretrain.common.hardware import gpu_peak, mfu_peak
from pretrain.config import TrainConfig, parse_args
from pretrain.modeling import LNBertConfig, LNBertForPreTraining
from pretrain.optim import build_adamw, resolve_adamw_implementation
from pretrain.run import main as pretrain_main
from pretrain.run_folder.checkpointing import TrainState, latest_checkpoint, save_snapshot
from pretrain.run_folder.layout import read_metrics, read_status
from pretrain.training import build_accelerator, build_model
from tests import pretrain_helpers
from tests.conftest import ROOT, TINY, TINY_MODEL_ARGS
from tests.finetune_fixtures import FIXTURE_GLUE, QUICK, config_for, make_run, tiny_config, tiny_tokenizer
from tests.pretrain_helpers import accelerate_launch, tiny_args


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tiny_batch(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, TINY["vocab_size"], (4, 16), generator=generator)
    labels = torch.full_like(input_ids, -100)
    labels[:, 3] = input_ids[:, 3]
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}


def _thread_names() -> list[str]:
    return [(task / "comm").read_text().strip() for task in Path("/proc/self/task").iterdir()]


def _uncaught_error_holding(model: torch.nn.Module) -> TracebackType | None:
    try:
        raise RuntimeError(f"an error in a frame that holds {type(model).__name__}")
    except RuntimeError as err:
        return err.__traceback__


def _ddp_worker(rank: int, port: int, out: Path) -> None:
    """One of two gloo processes: training.py's accelerator and model, the MLM-only objective, train.compile=true
    (torch.compile recorded, not run: what matters is what it is given)."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
        LOCAL_WORLD_SIZE="2", ACCELERATE_USE_CPU="1",
    )  # fmt: skip
    torch.set_num_threads(1)
    compiled: list[str] = []

    def record_compile(model: torch.nn.Module, **kwargs: object) -> torch.nn.Module:
        compiled.append(type(model).__name__)
        return model

    torch.compile = record_compile
    try:
        cfg = parse_args([*TINY_MODEL_ARGS, "--data.objective=mlm", "--train.compile=true", f"--train.output_dir={out}"])
        accelerator = build_accelerator(cfg)
        torch.manual_seed(0)
        model = build_model(cfg, TINY["vocab_size"])
        optimizer = build_adamw(model, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
        model, optimizer = accelerator.prepare(model, optimizer)
        for step in range(3):  # DDP raises at the second step when a parameter got no gradient in the first
            accelerator.backward(model(**_tiny_batch(seed=10 * step + rank)).loss)
            optimizer.step()
            optimizer.zero_grad()
        accelerator.unwrap_model(model)  # as a run does (Accelerate imports DeepSpeed here, the group alive)
        sys.last_traceback = _uncaught_error_holding(model)  # as Python keeps an uncaught error's traceback for exit
        del model, optimizer, accelerator
        atexit._run_exitfuncs()
        gloo = sorted(name for name in _thread_names() if "gloo" in name)
        (out / f"rank{rank}.json").write_text(json.dumps({"compiled": compiled, "gloo threads at exit": gloo}))
    except Exception as err:
        (out / f"rank{rank}.json").write_text(json.dumps({"error": f"{type(err).__name__}: {err}"}))
        raise


@pytest.mark.slow  # two processes that import the project: ~25 s on a busy 2-core machine
def test_ddp_trains_the_mlm_only_objective_and_compiles_after_the_wrap(tmp_path: Path) -> None:
    """Point 1: without NSP labels the pooler and the NSP head get no gradient, and DDP's default
    find_unused_parameters=False fails the second step. Point 5: torch.compile is given the DDP-wrapped model. At exit,
    an uncaught error's traceback holding the model, the handler build_accelerator registers joins gloo's threads (one
    left to interpreter teardown can abort the process)."""
    context = mp.start_processes(_ddp_worker, args=(_free_port(), tmp_path), nprocs=2, join=False, start_method="spawn")
    with contextlib.suppress(mp.ProcessRaisedException):
        while not context.join(timeout=180):
            pass
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert results == [{"compiled": ["DistributedDataParallel"], "gloo threads at exit": []}] * 2, results


def test_the_mlm_only_loss_reaches_every_trainable_parameter() -> None:
    """What DDP needs of the MLM-only objective, in one process: no trainable parameter without a gradient."""
    model = build_model(parse_args([*TINY_MODEL_ARGS, "--data.objective=mlm"]), TINY["vocab_size"])
    out = model(**_tiny_batch(seed=0))
    out.loss.backward()
    assert out.seq_relationship_logits is None
    unused = {name for name, p in model.named_parameters() if p.requires_grad and p.grad is None}
    assert not unused, unused
    assert {n for n, p in model.named_parameters() if not p.requires_grad} == {
        "bert.pooler.dense.weight", "bert.pooler.dense.bias", "cls.seq_relationship.weight",
        "cls.seq_relationship.bias",
    }  # fmt: skip
    # With NSP, everything trains.
    assert all(p.requires_grad for p in build_model(parse_args(TINY_MODEL_ARGS), TINY["vocab_size"]).parameters())
    # Without labels (inference) the NSP logits are there, as in Hugging Face's BertForPreTraining.
    assert model(input_ids=_tiny_batch(seed=0)["input_ids"]).seq_relationship_logits.shape == (4, 2)


# --------------------------------------------------------------------------------------------------
# Point 3: the peak FLOP/s behind train/mfu
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "label", "bf16"),
    [
        ("NVIDIA H200 NVL", "H200 NVL", 835.0),  # not the SXM entry, though its name contains "H200"
        ("NVIDIA H200", "H200 SXM", 989.0),
        ("NVIDIA GH200 480GB", "GH200", 989.0),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.0),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", "H100 NVL", 835.0),
        ("NVIDIA A100-SXM4-80GB", "A100", 312.0),
        ("NVIDIA A10G", "A10G", 70.0),
        ("NVIDIA L4", "L4", 121.0),
    ],
)
def test_a_gpu_name_matches_its_own_entry(name: str, label: str, bf16: float) -> None:
    entry = gpu_peak(name)
    assert entry is not None and (entry.label, entry.bf16) == (label, bf16)
    assert table_peak_tflops(name)["bf16"] == bf16  # the benchmarks read the same table


def test_mfu_peak_follows_the_device_and_the_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200 NVL")
    cuda = torch.device("cuda")
    peak, note = mfu_peak(None, cuda, "bf16")
    assert peak == 835e12 and "'NVIDIA H200 NVL' matched H200 NVL, bf16 dense" in note
    assert mfu_peak(None, cuda, "no")[0] in (418e12, 60e12)  # TF32 or plain fp32, as torch's flag says
    assert mfu_peak(312e12, cuda, "bf16")[0] == 312e12  # a configured figure wins
    assert mfu_peak(None, torch.device("cpu"), "bf16")[0] == 0.0
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA B300")
    peak, note = mfu_peak(None, cuda, "bf16")
    assert peak == 0.0 and "set train.peak_flops_per_device" in note
    # The presets look the device up rather than assume an A100.
    assert TrainConfig().peak_flops_per_device is None
    for preset in sorted((ROOT / "configs" / "pretrain").glob("bert_base_*.yaml")):
        assert yaml.safe_load(preset.read_text())["train"].get("peak_flops_per_device") is None, preset


# --------------------------------------------------------------------------------------------------
# Points 6 and 11: asynchronous copies, slot tokens/s, fused AdamW on CUDA
# --------------------------------------------------------------------------------------------------


def test_pinned_batches_are_copied_without_blocking(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Accelerate copies batches with non_blocking=False unless told; pinned memory alone copies synchronously."""
    cfg = parse_args([*TINY_MODEL_ARGS, f"--train.output_dir={tmp_path}"])
    monkeypatch.setattr(training, "copies_asynchronously", lambda: True)
    try:
        assert training.build_accelerator(cfg).dataloader_config.non_blocking is True
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    monkeypatch.setattr(training, "copies_asynchronously", lambda: False)
    try:
        assert training.build_accelerator(cfg).dataloader_config.non_blocking is False
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


def test_auto_adamw_is_fused_on_cuda() -> None:
    assert resolve_adamw_implementation("auto", torch.device("cuda")) == "fused"
    assert resolve_adamw_implementation("auto", torch.device("cpu")) == "auto"
    assert resolve_adamw_implementation("foreach", torch.device("cuda")) == "foreach"


# --------------------------------------------------------------------------------------------------
# Point 2: fp16 overflow steps are skipped, not divergence
# --------------------------------------------------------------------------------------------------


def _stats(finite: bool, overflow: bool) -> training.StepStats:
    return training.StepStats(
        loss=1.0, mlm_loss=1.0, nsp_loss=0.0, tokens=1, slots=1, finite=finite, overflow=overflow, stop=False, disk_full=False,
        grad_norm=1.0 if finite else float("inf"), layer_grad_norms={},
    )  # fmt: skip


def test_the_step_outcome_skips_overflows_until_too_many_in_a_row() -> None:
    assert training.step_outcome(_stats(True, False), skipped_in_a_row=0, max_skipped_steps=25) == "stepped"
    assert training.step_outcome(_stats(False, True), skipped_in_a_row=0, max_skipped_steps=25) == "skipped"
    assert training.step_outcome(_stats(False, True), skipped_in_a_row=24, max_skipped_steps=25) == "skipped"
    assert training.step_outcome(_stats(False, True), skipped_in_a_row=25, max_skipped_steps=25) == "diverged"
    assert training.step_outcome(_stats(False, True), skipped_in_a_row=0, max_skipped_steps=0) == "diverged"
    # Not finite without a loss scaler (or a non-finite loss): divergence at once.
    assert training.step_outcome(_stats(False, False), skipped_in_a_row=0, max_skipped_steps=25) == "diverged"


@pytest.fixture
def fresh_accelerate_state() -> None:
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.mark.parametrize(("allowed", "status"), [(2, "finished"), (1, "diverged")])
def test_the_loop_goes_on_through_overflow_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_accelerate_state: None, allowed: int, status: str
) -> None:
    """Steps 2 and 3 overflow (as fp16's first steps do, which only a GPU shows): with 2 allowed in a row the
    run finishes; with 1 it is called diverged at step 3, and the message names the key."""
    real_step, calls = training.train_step, []

    def overflowing_step(*args: object, **kwargs: object) -> training.StepStats:
        stats = real_step(*args, **kwargs)
        calls.append(1)
        return dataclasses.replace(stats, finite=False, overflow=True) if len(calls) in (2, 3) else stats

    monkeypatch.setattr(training, "train_step", overflowing_step)
    out = tmp_path / "run"
    args = [*TINY_MODEL_ARGS, "--data.max_seq_length=32", "--data.vocab_size=300", "--data.max_documents=30",
            "--data.validation_documents=2", f"--data.cache_dir={tmp_path / 'cache'}", f"--train.output_dir={out}",
            "--train.per_device_batch_size=8", "--train.max_steps=5", "--train.eval_every=0", "--train.log_every=1",
            "--train.snapshot_at_start=false", f"--train.max_skipped_steps={allowed}"]  # fmt: skip
    torch.set_num_threads(1)
    assert pretrain_main(args) == 0
    state = read_status(out)
    assert state["status"] == status, state
    if status == "diverged":
        assert state["diverged_at_step"] == 3 and "train.max_skipped_steps=1" in state["message"]
    else:
        assert state["step"] == 5


# --------------------------------------------------------------------------------------------------
# Points 4 (fine-tuning loads float32) and 19 (recipe.max_length beyond the model's positions)
# --------------------------------------------------------------------------------------------------


def _snapshot(root: Path, positions: int, dtype: torch.dtype = torch.float32) -> Path:
    """A plain model folder (no snapshot.json): a tiny LNBert with ``positions`` position embeddings."""
    tokenizer = tiny_tokenizer()
    config = tiny_config("pre", len(tokenizer))
    config.max_position_embeddings = positions
    torch.manual_seed(0)
    LNBertForPreTraining(config).to(dtype).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return root / "model"


def _quick(model: Path, folder: Path, glue: Path = FIXTURE_GLUE, **recipe: object) -> RunConfig:
    return RunConfig(model=str(model), task="mrpc", data_dir=str(glue), lrs=[1e-3], seeds=[0], results_dir=str(folder),
                     recipe=FinetuneConfig(**{**QUICK, **recipe}))  # fmt: skip


def test_a_max_length_beyond_the_models_positions_is_refused_before_any_job(tmp_path: Path) -> None:
    model = _snapshot(tmp_path, positions=16)
    config = _quick(model, tmp_path / "results.d", max_length=128)
    with pytest.raises(ValueError, match=r"recipe\.max_length=128 exceeds the max_position_embeddings=16 .*"
                       r"set --recipe\.max_length=16 \(or lower\)"):  # fmt: skip
        finetune_run(config)
    assert not Path(config.results_dir).exists()  # nothing submitted
    # A scheduled job (the worker's path) refuses too, before training.
    data = DataCache().get(str(model), "mrpc", str(FIXTURE_GLUE), config.recipe)
    with pytest.raises(ValueError, match=r"recipe\.max_length=128 exceeds"):
        finetune(str(model), "mrpc", data, 1e-3, 0, config.recipe)
    # The scheduler refuses the snapshot as it finds it, planning none of its jobs (each would fail alike), and runs
    # the others': a run of another model a scheduler that follows several runs meets.
    run_dir = make_run(tmp_path, "r", steps=(10,))
    positions = json.loads((run_dir / "snapshots" / "step_00000010" / "config.json").read_text())["max_position_embeddings"]
    scheduled = config_for(tmp_path, [run_dir], recipe={**QUICK, "max_length": positions + 1})
    (snapshot, why), = schedule(scheduled).refused.items()
    assert snapshot.endswith("step_00000010") and f"recipe.max_length={positions + 1} exceeds" in why
    assert not ResultsFolder(scheduled.results_dir).jobs()
    (row,) = finetune_run(_quick(model, tmp_path / "ok.d", max_length=16))
    assert row["status"] == "done"


def test_a_bf16_checkpoint_is_fine_tuned_in_float32(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers 5 loads a checkpoint in its saved dtype; fine-tuning's weights must be float32 anyway."""
    model = _snapshot(tmp_path, positions=128, dtype=torch.bfloat16)
    seen: list[set[torch.dtype]] = []
    real = finetune_train.make_optimizer

    def recording(module: torch.nn.Module, *args: object) -> torch.optim.Optimizer:
        seen.append({p.dtype for p in module.parameters()})
        return real(module, *args)

    monkeypatch.setattr(finetune_train, "make_optimizer", recording)
    (row,) = finetune_run(_quick(model, tmp_path / "results.d", mixed_precision="bf16"))
    assert row["status"] == "done" and seen == [{torch.float32}]


def test_the_real_mrpc_pairs_need_the_length_check(shared_data: Path, tmp_path: Path) -> None:
    """The GPU check's dry-run model has 64 positions and real MRPC pairs are longer: refused with the fix, not a
    crash in the forward pass; with the length it names, the job runs."""
    model = _snapshot(tmp_path, positions=64)
    with pytest.raises(ValueError, match=r"set --recipe\.max_length=64"):
        finetune_run(_quick(model, tmp_path / "a.d", glue=shared_data / "glue", max_length=128))
    (row,) = finetune_run(_quick(model, tmp_path / "b.d", glue=shared_data / "glue", max_length=64))
    assert row["status"] == "done", row


# --------------------------------------------------------------------------------------------------
# Point 18: bf16 on a CPU without native bf16
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def cpu_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on an AMD EPYC with AVX2 only (the machine of the report; also this development machine)."""
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_bf16_on_a_cpu_without_it_is_announced_before_any_work(
    cpu_without_bf16: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    training.check_environment(parse_args(["--train.mixed_precision=bf16", f"--train.output_dir={tmp_path}"]))
    err = capsys.readouterr().err
    assert "no native bf16 (no AVX512-BF16, no AMX" in err and "use --train.mixed_precision=no" in err
    finetune_train.warn_emulated_bf16.cache_clear()
    finetune_train.warn_emulated_bf16(torch.device("cpu"), "bf16")
    finetune_train.warn_emulated_bf16(torch.device("cpu"), "bf16")  # once per process
    assert capsys.readouterr().err.count("use --recipe.mixed_precision=no") == 1
    training.check_environment(parse_args([f"--train.output_dir={tmp_path}"]))  # fp32: nothing to say
    assert capsys.readouterr().err == ""


def test_the_cpu_presets_choose_the_precision_for_the_machine(
    cpu_without_bf16: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for preset in ("small_pre_ln", "small_post_ln"):
        cfg = parse_args(["--config", str(ROOT / "configs" / "pretrain" / f"{preset}.yaml")])
        assert cfg.train.mixed_precision == "auto"
        training.resolve_mixed_precision(cfg)
        assert cfg.train.mixed_precision == "no", preset
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: True)
    cfg = parse_args(["--train.mixed_precision=auto"])
    training.resolve_mixed_precision(cfg)
    assert cfg.train.mixed_precision == "bf16"


def test_a_cpu_is_named_with_its_generation(tmp_path: Path) -> None:
    """A virtual machine names Zen 3 and Zen 4 alike ("AMD EPYC"): the family and model numbers tell them apart."""
    cpuinfo = tmp_path / "cpuinfo"
    first = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n"
    cpuinfo.write_text(first + "\n" + first.replace("processor\t: 0", "processor\t: 1"))
    assert hardware.cpu_model(cpuinfo) == "AMD EPYC (family 25, model 17)"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Neoverse-V2\n")  # no family: the name alone
    assert hardware.cpu_model(cpuinfo) == "Neoverse-V2"
    assert hardware.cpu_model(tmp_path / "absent")  # not Linux: platform's word


def test_the_benchmark_measures_only_the_precisions_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    measured: list[torch.dtype] = []

    def fake_gemm(dtype: torch.dtype, device: torch.device, size: int, reps: int = 5) -> tuple[float, float]:
        measured.append(dtype)
        return 1.0, 1.0

    monkeypatch.setattr(common, "measured_gemm", fake_gemm)
    peaks = common.gemm_peaks(torch.device("cpu"), 64, precisions=["fp32"])
    assert measured == [torch.float32] and set(peaks["reference_tflops"]) == {"fp32"}
    common.gemm_peaks(torch.device("cpu"), 64, earlier=peaks, precisions=["fp32"])
    assert measured == [torch.float32] * 2
    monkeypatch.setattr(train_step, "measure_group", lambda *a, **k: pytest.fail("stop after the peaks"))
    measured.clear()
    with pytest.raises(pytest.fail.Exception):
        train_step.main(["--shapes=[tiny]", "--precisions=[fp32]", "--device", "cpu"])
    assert measured == [torch.float32]  # the benchmark's own peaks: no bf16 GEMM


def test_a_snapshot_of_a_compiled_model_has_the_models_own_keys(
    tmp_path: Path, fresh_accelerate_state: None
) -> None:
    """accelerator.prepare compiles last (train.compile), and get_state_dict keeps the "_orig_mod." prefix of
    the compiled wrapper: the snapshot must not (fine-tuning opens it with from_pretrained). Compilation is lazy:
    nothing is compiled here."""
    accelerator = Accelerator(dynamo_backend="inductor")
    torch.manual_seed(0)
    model = accelerator.prepare(LNBertForPreTraining(LNBertConfig(**TINY)))
    assert type(model).__name__ == "OptimizedModule"
    info = {"step": 0, "tokens_seen": 0, "run_name": "r", "norm_placement": "post", "metrics": {}}
    path = save_snapshot(accelerator, model, tiny_tokenizer(), tmp_path, info)
    keys = load_file(path / "model.safetensors").keys()
    assert not any(k.startswith("_orig_mod.") for k in keys), sorted(keys)[:3]
    loaded = LNBertForPreTraining.from_pretrained(path)
    original = accelerator.unwrap_model(model, keep_torch_compile=False)
    assert torch.equal(loaded.bert.embeddings.word_embeddings.weight, original.bert.embeddings.word_embeddings.weight)



# --------------------------------------------------------------------------------------------------
# A run continues on another number of processes or with train.compile changed; DeepSpeed's partitions refused
# --------------------------------------------------------------------------------------------------

data_cache = pretrain_helpers.data_cache  # one data cache for the module's runs
NO_DROPOUT = ("--model.hidden_dropout_prob=0", "--model.attention_probs_dropout_prob=0")


def _same_weights(a: Path, b: Path) -> bool:
    x, y = load_file(latest_checkpoint(a) / "model.safetensors"), load_file(latest_checkpoint(b) / "model.safetensors")
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def _train_losses(run: Path) -> dict[int, float]:
    return {row["step"]: row["train/loss"] for row in read_metrics(run) if "train/loss" in row}


@pytest.mark.slow  # two processes that import the project
def test_a_run_continues_on_another_number_of_processes_bit_exactly(
    tmp_path: Path, data_cache: Path, fresh_accelerate_state: None
) -> None:
    """Two processes of 8 sequences (DDP, gloo) stop at step 2; one process continues with two micro-batches of 8,
    the same global batch, to step 4, and two processes again to the end: each step sees the same sequences and
    averages the same gradients, so the weights and losses equal a one-process run's from the start, bit for bit.
    Dropout off: each process draws its own masks, which no other split reproduces. The checkpoints hold the model's
    own names (no DDP "module."), and a launch that would change the global batch is refused before training."""
    common = (*NO_DROPOUT, "--train.max_steps=6", "--train.checkpoint_every=2")
    split, straight = tmp_path / "split", tmp_path / "straight"

    def two_processes(port: int, *args: str) -> None:
        launched = accelerate_launch(["--multi_gpu", "--num_processes", "2", "--main_process_port", str(port)],
                                     tiny_args(split, data_cache, *common, *args), tmp_path)  # fmt: skip
        assert launched.returncode == 0, (launched.stdout + launched.stderr)[-3000:]
        assert not [k for k in load_file(latest_checkpoint(split) / "model.safetensors") if k.startswith("module.")]

    two_processes(29525, "--train.stop_at_step=2")
    with pytest.raises(ValueError, match=r"global batch of 16 sequences per step; this launch gives 8 "):
        pretrain_main(tiny_args(split, data_cache, *common, "--train.resume=auto"))
    one = ("--train.gradient_accumulation_steps=2",)
    assert pretrain_main(tiny_args(split, data_cache, *common, *one, "--train.resume=auto", "--train.stop_at_step=4")) == 0
    two_processes(29526, "--train.resume=auto")
    assert pretrain_main(tiny_args(straight, data_cache, *common, *one)) == 0
    assert read_status(split)["status"] == "finished" and _same_weights(split, straight)
    assert _train_losses(split) == _train_losses(straight)


def test_a_position_another_split_cannot_start_at_goes_back_less_than_a_micro_batch(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """One process of 2 micro-batches of 8 a step, over an epoch of an odd number of micro-batches: a step ends 8
    sequences into the next epoch (24 after two more steps). Two processes of 8 (micro-batches of 16) cannot start
    there: they continue at 16 of the same epoch, not at the start of epoch 0. Other data starts over."""
    saved = TrainState(step=7, epoch=1, samples_in_epoch=24, data_fingerprint="data", global_batch_size=16)
    monkeypatch.setattr(training, "load_checkpoint", lambda accelerator, path: dataclasses.replace(saved))
    cfg = parse_args([*TINY_MODEL_ARGS, "--train.per_device_batch_size=8"])
    two = SimpleNamespace(num_processes=2, print=print)
    state = training.start_state(cfg, two, Path("step_00000007"), "data")
    assert (state.step, state.epoch, state.samples_in_epoch, state.num_processes) == (7, 1, 16, 2)
    assert "at sequence 24 of epoch 1, where micro-batches of 16 sequences cannot start: 8 " in capsys.readouterr().out
    one = SimpleNamespace(num_processes=1, print=print)
    assert dataclasses.astuple(training.start_state(cfg, one, Path("step_00000007"), "data"))[:3] == (7, 1, 24)
    assert dataclasses.astuple(training.start_state(cfg, two, Path("step_00000007"), "other"))[:3] == (7, 0, 0)


def test_a_run_continues_with_train_compile_changed_bit_exactly(
    tmp_path: Path, data_cache: Path, monkeypatch: pytest.MonkeyPatch, fresh_accelerate_state: None
) -> None:
    """torch.compile wraps the model ("_orig_mod."): a run compiled to step 2, continued uncompiled to step 4 and
    compiled again to the end equals a run never compiled. torch.compile is its module wrapper here, run eagerly:
    the wrapper is all that differs between the runs (inductor's kernels round otherwise, which no resume undoes)."""
    from torch._dynamo.eval_frame import OptimizedModule

    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: OptimizedModule(model, lambda forward: forward))
    split, straight = tmp_path / "split", tmp_path / "straight"
    for stop, compiled in (("--train.stop_at_step=2", "true"), ("--train.stop_at_step=4", "false"), ("", "true")):
        argv = tiny_args(split, data_cache, f"--train.compile={compiled}", "--train.resume=auto", *[stop][: bool(stop)])
        assert pretrain_main(argv) == 0
        keys = load_file(latest_checkpoint(split) / "model.safetensors").keys()
        assert keys and not [k for k in keys if k.startswith("_orig_mod.")]
    assert pretrain_main(tiny_args(straight, data_cache)) == 0
    assert read_status(split)["status"] == "finished" and _same_weights(split, straight)
    assert _train_losses(split) == _train_losses(straight)


def test_a_deepspeed_checkpoint_is_refused_where_its_partitions_cannot_load(tmp_path: Path, data_cache: Path) -> None:
    """ZeRO partitions the optimizer state one way per process: on another number of processes, or without
    DeepSpeed, the run stops before training, naming the launch that continues it and the consolidated fp32
    weights. A checkpoint saved without DeepSpeed cannot load into its engine either."""
    from pretrain.common.atomic import write_json
    from pretrain.common.cli import to_dict
    from pretrain.common.formats import RUN_FORMAT, stamped
    from pretrain.run_folder.checkpointing import check_continuable
    from pretrain.run_folder.manifest import write_manifest

    run = tmp_path / "run"
    argv = tiny_args(run, data_cache)
    write_json(run / "run_config.json", stamped(to_dict(parse_args(argv)), RUN_FORMAT))
    checkpoint = run / "checkpoints" / "step_00000003"
    (checkpoint / "pytorch_model").mkdir(parents=True)  # the engine's own folder in accelerate's save_state
    write_json(checkpoint / "train_state.json", {"step": 3, "global_batch_size": 64, "num_processes": 8})
    write_manifest(checkpoint)
    with pytest.raises(ValueError, match=r"saved by DeepSpeed ZeRO on 8 process\(es\).* --num_processes 8 .*not on 1 "
                       rf"without DeepSpeed.*python {checkpoint}/zero_to_fp32.py {checkpoint} OUT_DIR"):  # fmt: skip
        pretrain_main([*argv, "--train.resume=auto"])
    with pytest.raises(ValueError, match=r"continues only under DeepSpeed on 8 process\(es\).*not on 4\."):
        check_continuable(checkpoint, True, 64, 4, deepspeed=True)
    check_continuable(checkpoint, True, 64, 8, deepspeed=True)
    (checkpoint / "pytorch_model").rmdir()
    with pytest.raises(ValueError, match=r"saved without DeepSpeed, whose engine cannot load it"):
        check_continuable(checkpoint, True, 64, 8, deepspeed=True)


# --------------------------------------------------------------------------------------------------
# Numbers that mislead: bf16 where a GPU emulates it, TF32 for fp32
# --------------------------------------------------------------------------------------------------


def test_auto_precision_is_fp32_on_a_gpu_that_emulates_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.cuda.is_bf16_supported() counts emulation (V100: compute capability 7.0, T4: 7.5), several times
    slower than fp32; auto picks bf16 from Ampere (8.0) on, and says why."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    for capability, expected in (((7, 0), "no"), ((7, 5), "no"), ((8, 0), "bf16"), ((9, 0), "bf16")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        precision, why = hardware.auto_mixed_precision(on_cpu=False)
        assert precision == expected, capability
        assert ("computes bf16 natively" in why) == (expected == "bf16") and f"{capability[0]}.{capability[1]}" in why


def test_fp32_training_uses_tf32_and_measures_mfu_against_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Set for fp32 on a GPU whatever train.compile says (Accelerate sets it for a compiled model only), so MFU is
    against the TF32 peak; bf16 training leaves it as it is."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    cuda = torch.device("cuda")
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        training.use_tf32_for_fp32(cuda, "bf16")
        assert not torch.backends.cuda.matmul.allow_tf32
        training.use_tf32_for_fp32(torch.device("cpu"), "no")
        assert not torch.backends.cuda.matmul.allow_tf32
        training.use_tf32_for_fp32(cuda, "no")
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        peak, note = mfu_peak(None, cuda, "no")
        assert peak == 494.7e12 and "TF32 dense" in note
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
