"""The GPU check (launch/gpu_check.sh) on CPU: the dry run goes through every stage and writes the same files as the
GPU run, so the day a GPU is lent the check works the first time; a stage that overruns its budget is killed and
recorded as timed out while the earlier stages' results stay."""

from __future__ import annotations

import gzip
import json
import os
import random
import runpy
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from tests.conftest import SHARED_DATA

ROOT = Path(__file__).resolve().parents[1]
GLUE = Path(__file__).resolve().parent / "fixtures" / "glue"
WORDS = ["the", "cat", "sat", "on", "a", "mat", "while", "dogs", "ran", "past", "old", "red", "barns", "near",
         "quiet", "rivers", "under", "grey", "skies", "and", "children", "sang", "songs", "about", "stars"]  # fmt: skip


def make_corpus(folder: Path, documents: int = 40) -> Path:
    """Tiny gzip JSON Lines corpus of the payload's form: documents of sentences, paragraphs split by newlines."""
    rng = random.Random(0)
    folder.mkdir(parents=True)
    with gzip.open(folder / "docs.jsonl.gz", "wt") as f:
        for _ in range(documents):
            sentences = [" ".join(rng.choices(WORDS, k=rng.randint(6, 14))).capitalize() + "." for _ in range(12)]
            f.write(json.dumps({"text": "\n".join(" ".join(sentences[i : i + 3]) for i in range(0, 12, 3))}) + "\n")
    return folder


def gpu_check(
    out: Path, work: Path, corpus: Path, *extra: str, timeout: float = 1200, glue: Path = GLUE
) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}
    cmd = ["bash", str(ROOT / "launch" / "gpu_check.sh"), str(out), "--corpus", str(corpus), "--glue", str(glue),
           "--work", str(work), "--dry-run", *extra]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_dry_run_exercises_every_stage(tmp_path: Path) -> None:
    """On the real GLUE beside the checkout when it is there (its MRPC pairs are longer than the dry-run model's 64
    positions, which the fixture's are not: a crash the fixture once hid), else on the fixture. The corpus is the
    payload's form in small: the dry run reads 40 documents, and on the real 74 MB corpus it took 28 s longer
    (test_data.py builds instances from that corpus)."""
    corpus = make_corpus(tmp_path / "corpus")
    glue = SHARED_DATA / "glue" if SHARED_DATA.is_dir() else GLUE
    # A roomier total than the GPU's 360 s: the suite runs on both cores at once (README), and the budgets'
    # enforcement has its own test below.
    result = gpu_check(tmp_path / "out", tmp_path / "work", corpus, "--total", "900", glue=glue)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["check.log", "loss_curves.png", "results.json", "summary.md"]
    results = json.loads((out / "results.json").read_text())
    stages = results["stages"]
    assert results["dry_run"] is True
    assert {name: s["status"] for name, s in stages.items()} == {
        **dict.fromkeys(["environment", "cuda_tests", "throughput", "pretrain"], "ok"),
        "compile": "skipped",  # a CPU compile takes minutes; its own stage on the GPU
    }
    assert "dry run" in stages["compile"]["reason"]
    env = stages["environment"]["result"]
    assert env["versions"]["torch"] and env["gemm"]["measured_tflops"]["bf16"] > 0
    assert set(env["imports"].values()) == {"ok"} and {"datasets", "pretrain.data.pipeline", "finetune.run"} <= set(
        env["imports"]
    )
    tests = stages["cuda_tests"]["result"]
    if not torch.cuda.is_available():  # every test of tests/test_cuda.py is collected and skipped, none fails
        assert tests["counts"].get("skipped", 0) >= 10 and set(tests["counts"]) == {"skipped"}, tests["counts"]
        assert tests["skip_reasons"] and "needs CUDA" in tests["skip_reasons"][0]
    groups = stages["throughput"]["result"]["groups"]
    assert [r["variant"] for r in groups[0]["rows"]] == ["hf", "post", "post+dense", "pre"]
    assert all(r["tokens_per_s"] > 0 and r["mfu_vs_measured_gemm"] > 0 for r in groups[0]["rows"])
    assert groups[0]["same_attention_kernel"] and groups[0]["rows"][0]["attention_kernel"]
    ratio = groups[0]["implementation_ratio"]
    assert ratio["dense_head_vs_hf"] > 0 and ratio["sparse_head_gain"] > 0 and ratio["sparse_head_gain_from_flops"] > 1
    pre = stages["pretrain"]["result"]
    assert set(pre["runs"]) == {"post_ln", "pre_ln", "post_ln_lr3e-4"}
    for name, run in pre["runs"].items():
        assert run["status"] == "finished" and run["step"] == pre["plan"]["steps"], (name, run)
        assert run["train_loss"] and run["diverged_at_step"] is None
        assert 0 <= run["mrpc"]["accuracy"] <= 1, run["mrpc"]
        assert run["tokens_per_s_vs_stage3"] > 0 and any(
            "AdamW" in d or "batch" in d for d in run["vs_stage3_differences"]
        )
    contrast = pre["placement_contrast"]
    assert contrast["runs"] == ["pre_ln", "post_ln_lr3e-4"] and contrast["steps_to_loss"]["target_loss"] is not None
    # What the runs were really given (their resolved configs): only post_ln warms up.
    resolved = {name: json.loads((tmp_path / "work" / "runs" / name / "run_config.json").read_text())["optim"]
                for name in pre["runs"]}  # fmt: skip
    assert {name: (o["lr"], o["warmup_steps"]) for name, o in resolved.items()} == {
        "post_ln": (1e-4, pre["plan"]["warmup_steps"]),
        "pre_ln": (3e-4, 0),
        "post_ln_lr3e-4": (3e-4, 0),
    }
    summary = (out / "summary.md").read_text()
    for heading in ("## 1. Environment", "## 2. CUDA correctness", "## 3. Throughput",
                    "## 4. Smoke test of the scale path", "## 5. torch.compile"):  # fmt: skip
        assert heading in summary
    assert "| post_ln | finished |" in summary and "MRPC acc" in summary and "not a reproduction" in summary
    assert "Placement contrast (lr 3e-4, no warm-up" in summary and "what still differs" in summary
    assert "the implementation's ratio" in summary and "| attention kernel |" in summary
    assert "stage pretrain: ok" in (out / "check.log").read_text()


@pytest.mark.slow
def test_a_stage_that_overruns_is_killed_and_the_earlier_results_stay(tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path / "corpus")
    # pytest and the throughput stage cannot import torch in 1 s. The pretraining stage gets the rest of a 3-second
    # total, i.e. nothing, so its own budget (4 s) as the floor, and is killed inside its first run.
    budgets = ["--budget", "cuda_tests=1", "--budget", "throughput=1", "--budget", "pretrain=4", "--total", "3"]
    result = gpu_check(tmp_path / "out", tmp_path / "work", corpus, *budgets)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    stages = results["stages"]
    assert stages["environment"]["status"] == "ok" and stages["environment"]["result"]["gemm"]
    for name in ("cuda_tests", "throughput"):
        assert stages[name]["status"] == "timed_out" and stages[name]["seconds"] < 1 + 12, stages[name]
    assert stages["pretrain"]["status"] == "timed_out" and stages["pretrain"]["seconds"] < 4 + 12
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| throughput | timed_out |" in summary and "## 1. Environment" in summary
    # Nothing the killed stages started is left running.
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path / "work")], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", leftover.stdout


def test_bad_arguments_exit_2_with_the_fix(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    cmd = ["bash", str(ROOT / "launch" / "gpu_check.sh"), str(tmp_path / "out"), "--corpus", str(tmp_path / "none"),
           "--glue", str(tmp_path), "--budget", "warp=3"]  # fmt: skip
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--corpus" in result.stderr and "prepare_gpu_check.sh" in result.stderr
    assert "MRPC/train.tsv" in result.stderr and "unknown stage 'warp'" in result.stderr
    assert "Traceback" not in result.stderr


def test_payload_copy_fits_the_limit_and_subsamples(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(1)
    for name, docs in (("wiki.jsonl", 1200), ("books.jsonl", 400)):
        with open(corpus / name, "w") as f:
            for i in range(docs):
                text = " ".join(f"{rng.random():.12f}" for _ in range(400))  # barely compressible
                f.write(json.dumps({"id": i, "title": "t", "text": text}) + "\n")
    payload = tmp_path / "payload"
    (payload / "wheels").mkdir(parents=True)
    glue = tmp_path / "glue"
    shutil.copytree(GLUE / "MRPC", glue / "MRPC")
    script = str(ROOT / "launch" / "gpu_check_payload.py")
    payload_module = runpy.run_path(script)
    tree_mib = payload_module["tree_bytes"](ROOT) // 2**20
    limit = tree_mib + 3  # room for 2-3 MiB of corpus: less than the ~5 MiB the whole corpus takes
    result = subprocess.run([sys.executable, script, "--corpus", str(corpus), "--glue", str(glue), "--payload",
                             str(payload), "--limit-mib", str(limit)], capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads((payload / "payload.json").read_text())
    assert report["total_bytes"] <= report["limit_bytes"]
    kept = {name: info["documents_kept"] for name, info in report["files"].items()}
    assert 0 < kept["wiki.jsonl.gz"] < 1200 and 0 < kept["books.jsonl.gz"] < 400, kept
    with gzip.open(payload / "corpus" / "wiki.jsonl.gz", "rt") as f:
        assert list(json.loads(f.readline())) == ["text"]
    assert (payload / "glue" / "MRPC" / "dev.tsv").is_file()
    # A limit the tree alone exceeds: exit 2 with the sizes, nothing half-written passed off as ready.
    result = subprocess.run([sys.executable, script, "--corpus", str(corpus), "--glue", str(glue), "--payload",
                             str(payload), "--limit-mib", "0.5"], capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 2 and "no room for the corpus" in result.stderr


def gpu_check_module() -> dict:
    return runpy.run_path(str(ROOT / "launch" / "gpu_check.py"))


def fake_wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        meta = [f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
        wheel.writestr(f"{name}-{version}.dist-info/METADATA", "\n".join(meta) + "\n")
    return path


def test_carried_wheels_install_where_missing_or_too_old(tmp_path: Path) -> None:
    choose = gpu_check_module()["wheels_to_install"]
    datasets = fake_wheel(
        tmp_path, "datasets", "5.2.0", ["pyarrow>=24.0.0", "dill<0.4.2,>=0.3.0", 'pytest; extra == "dev"']
    )
    pyarrow = fake_wheel(tmp_path, "pyarrow", "24.0.0", [])
    dill = fake_wheel(tmp_path, "dill", "0.4.1", [])
    wheels = [datasets, dill, pyarrow]
    # The machine has a new enough pyarrow and no dill: the carried pyarrow stays unused.
    got = choose(wheels, {"datasets": None, "dill": None, "pyarrow": "26.0.1"})
    assert [w.name for w in got] == [datasets.name, dill.name]
    # An older pyarrow than datasets needs, and a dill too new: the carried ones are installed.
    got = choose(wheels, {"datasets": None, "dill": "0.5.0", "pyarrow": "21.0.0"})
    assert [w.name for w in got] == [datasets.name, dill.name, pyarrow.name]


def test_cuda_test_outcomes_are_read_from_pytests_junit_report(tmp_path: Path) -> None:
    (tmp_path / "test_some.py").write_text(
        "import pytest\n"
        "@pytest.mark.parametrize('x', [1])\n"
        "def test_a(x): pass\n"
        "def test_b(): assert 1 == 2, 'Tensor-likes are not close!'\n"
        "@pytest.mark.skipif(True, reason='needs CUDA')\n"
        "def test_c(): pass\n"
        "@pytest.mark.xfail(reason='known')\n"
        "def test_d(): assert False\n"
    )
    report = tmp_path / "report.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                    "test_some.py"], cwd=tmp_path, capture_output=True, check=False)  # fmt: skip
    read = gpu_check_module()["read_junit"]
    got = read(report)
    assert got["counts"] == {"passed": 1, "failed": 1, "skipped": 1, "xfailed": 1}
    assert "Tensor-likes are not close!" in got["tests"]["test_some::test_b"]["message"]
    assert got["skip_reasons"] == ["needs CUDA"] and "test_some::test_a[1]" in got["tests"]
    # pytest killed at the deadline writes no report: the outcomes are unknown, and the summary says why.
    assert read(tmp_path / "absent.xml") == {"counts": {}, "tests": {}, "skip_reasons": [],
                                             "report": "absent: pytest did not finish"}  # fmt: skip


def test_steps_are_sized_so_that_three_runs_fit() -> None:
    module = gpu_check_module()
    plan = module["plan_steps"](240.0, 500_000.0, False)
    tokens = plan["steps"] * plan["batch"] * plan["seq"]
    train_s = 240.0 - module["DATA_PREP_S"] - 3 * module["RUN_OVERHEAD_S"] - module["FINETUNE_S"] - module["MARGIN_S"]
    assert tokens / (500_000.0 * module["LOOP_EFFICIENCY"]) <= train_s / 3 + 1
    assert plan["warmup_steps"] == round(0.1 * plan["steps"]) and plan["tokens_per_s_source"].startswith("stage 3")
    slow = module["plan_steps"](240.0, None, False)
    assert slow["steps"] < plan["steps"] and slow["tokens_per_s_source"] == "fallback guess"
    assert module["plan_steps"](10.0, 500_000.0, False)["steps"] == module["MIN_STEPS"]


class _Forward(torch.nn.Module):
    """A stand-in model for tests/test_cuda.py's helpers: returns fixed logits, or raises ``error``."""

    def __init__(self, error: str | None = None) -> None:
        super().__init__()
        self.error = error

    def forward(self, **batch: torch.Tensor) -> object:
        if self.error:
            raise RuntimeError(self.error)
        logits = torch.arange(batch["input_ids"].numel() * 2, dtype=torch.float32).view(*batch["input_ids"].shape, 2)
        return type("Output", (), {"prediction_logits": logits})()


def test_cuda_tests_take_any_refusal_of_a_forced_sdpa_backend_as_a_refusal() -> None:
    from torch.nn.attention import SDPBackend

    from tests import test_cuda

    batch = {"input_ids": torch.ones(2, 3, dtype=torch.long), "attention_mask": torch.tensor([[1, 1, 1], [1, 0, 0]])}
    cudnn = "cuDNN Frontend error: [cudnn_frontend] Error: No execution plans support the graph."
    for message in (cudnn, "No available kernel. Aborting execution."):
        got, why = test_cuda.sdpa_outputs(_Forward(message), batch, SDPBackend.MATH, bf16=False)
        assert got is None and message.split(":")[0] in why, why
    got, why = test_cuda.sdpa_outputs(_Forward(), batch, SDPBackend.MATH, bf16=False)
    assert why is None and got.shape == (4, 2)  # the real positions only
    # The kernels the check relies on must still have run: a refusal of flash or efficient fails the test.
    everything = {("EFFICIENT_ATTENTION", False), ("EFFICIENT_ATTENTION", True), ("FLASH_ATTENTION", True)}
    assert test_cuda.missing_kernels(everything, padded=False, capability=(9, 0)) == []
    assert test_cuda.missing_kernels(everything - {("FLASH_ATTENTION", True)}, False, (9, 0)) == [
        "FLASH_ATTENTION (bf16=True)"
    ]
    assert test_cuda.missing_kernels({("FLASH_ATTENTION", True)}, padded=True, capability=(9, 0)) == [
        "EFFICIENT_ATTENTION (bf16=False)",
        "EFFICIENT_ATTENTION (bf16=True)",
    ]
    assert test_cuda.missing_kernels(everything - {("FLASH_ATTENTION", True)}, False, (7, 5)) == []


def resolved_configs(module: dict, dry_run: bool) -> dict[str, dict]:
    """Each stage-4 run's config as pretrain/run.py resolves it from the command the check builds."""
    from pretrain.common.cli import flatten, to_dict
    from pretrain.config import parse_args

    ctx = module["Context"](out="/o", work="/w", corpus="/c", glue="/g", dry_run=dry_run)
    plan = module["plan_steps"](240.0, 500_000.0, dry_run)
    configs = {}
    for name in module["RUNS"]:
        cmd = module["pretrain_command"](ctx, name, plan, 1e15)
        configs[name] = flatten(to_dict(parse_args(cmd[cmd.index(str(ROOT / "pretrain" / "run.py")) + 1 :])))
    return configs


def test_pre_ln_is_contrasted_with_post_ln_on_its_own_recipe() -> None:
    module = gpu_check_module()
    configs = resolved_configs(module, dry_run=False)
    pre, post = (configs[name] for name in module["CONTRAST"])
    differ = {key for key in pre if pre[key] != post.get(key)}
    assert differ == {"model.norm_placement", "train.output_dir", "train.run_name"}, differ
    assert (post["optim.lr"], post["optim.warmup_steps"]) == (3e-4, 0)  # the paper's failing case: no warm-up
    assert configs["post_ln"]["optim.lr"] == 1e-4 and configs["post_ln"]["optim.warmup_steps"] > 0
    # Post-LN diverged (its last losses not finite): the target is its last finite loss, Pre-LN's steps to it.
    runs = {
        "post_ln": {"train_loss": [(10, 9.0), (20, 8.0), (30, 7.0)], "final_train_loss": 7.0},
        "pre_ln": {"train_loss": [(10, 8.0), (20, 6.0), (30, 5.0)], "final_train_loss": 5.0, "status": "finished"},
        "post_ln_lr3e-4": {
            "train_loss": [(10, 9.0), (20, 7.0), (30, float("nan"))],
            "final_train_loss": 7.0,
            "status": "diverged",
            "diverged_at_step": 25,
        },
    }
    contrast = module["placement_contrast"](runs)
    assert contrast["runs"] == ["pre_ln", "post_ln_lr3e-4"] and contrast["final_loss_gap"] == 2.0
    assert contrast["diverged_at_step"]["post_ln_lr3e-4"] == 25
    stl = contrast["steps_to_loss"]
    assert stl["target_loss"] == 8.0 and stl["steps"] == {"pre_ln": 10, "post_ln_lr3e-4": 20}
    assert stl["speedup_vs_reference"]["pre_ln"] == 2.0
    assert "post_ln" not in stl["steps"]  # the paper recipe (1e-4, warm-up) stays outside the ratio


def test_a_slow_compile_has_its_own_budget_and_does_not_fail_the_check() -> None:
    module = gpu_check_module()
    ctx = module["Context"](out="/o", work="/w", corpus="/c", glue="/g", started=0.0)  # long past: no time left
    assert module["stage_budget"](ctx, "compile") == module["BUDGETS_S"]["compile"]
    assert module["stage_budget"](ctx, "pretrain") == 60.0  # the rest of the total is gone: its floor
    passed = module["check_passed"]
    ok = {name: {"status": "ok"} for name in module["STAGES"]}
    assert passed(ok) and passed({**ok, "compile": {"status": "timed_out"}})
    assert passed({**ok, "compile": {"status": "skipped"}})
    assert not passed({**ok, "compile": {"status": "failed"}})  # a compile that crashes is a finding
    assert not passed({**ok, "throughput": {"status": "timed_out"}})
    assert module["STAGES"][-1] == "compile"  # after the runs: it cannot take their time


def test_the_loop_to_benchmark_ratio_lists_what_still_differs() -> None:
    module = gpu_check_module()
    differences, vs_stage3 = module["loop_vs_benchmark"], module["vs_stage3"]
    bench = {"tokens_per_s": 1000.0, "attention_kernel": "memory-efficient", "seq": 128}
    config = {"optim": {"implementation": "auto"}, "train": {"per_device_batch_size": 256},
              "data": {"max_seq_length": 128}}  # fmt: skip
    run = {"tokens_per_s_median": 800.0, "slot_tokens_per_s_median": None}
    lines = differences(run, config, bench, 128, True)
    assert any(line.startswith("tokens: the loop counts real tokens") for line in lines)
    assert "AdamW: the loop's foreach (auto), the benchmark's fused" in lines
    assert any("256 x up to 128" in line and "128 x 128" in line for line in lines)
    assert any("memory-efficient" in line for line in lines)
    assert vs_stage3(run, 1000.0) == (0.8, "real")
    # Slot tokens/s logged and fused AdamW: those two differences are gone, and the ratio is slot to slot.
    run = {"tokens_per_s_median": 800.0, "slot_tokens_per_s_median": 900.0}
    lines = differences(run, {**config, "optim": {"implementation": "fused"}}, bench, 128, True)
    assert not any(line.startswith(("tokens:", "AdamW:")) for line in lines)
    assert vs_stage3(run, 1000.0) == (0.9, "slot")


def test_stage_1_names_a_failed_import_and_the_stages_that_need_it_are_skipped() -> None:
    module = gpu_check_module()
    env = {"imports": {"datasets": "ImportError: datasets needs pyarrow>=24.0.0", "pretrain.modeling": "ok"}}
    assert "datasets (ImportError: datasets needs pyarrow>=24.0.0)" in module["skip_reason"]("pretrain", env)
    assert module["skip_reason"]("throughput", env) is None and module["skip_reason"]("cuda_tests", env) is None
    assert "datasets" in module["STAGE_IMPORTS"]["pretrain"]


@pytest.mark.slow
def test_a_missing_wheel_fails_stage_1_and_shows_first(tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path / "corpus")
    fake = tmp_path / "work" / "site" / "datasets"  # first on every stage's path: shadows the real datasets
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("datasets 5.2 needs pyarrow>=24.0.0; found 21.0.0")\n')
    budgets = ["--budget", "cuda_tests=1", "--budget", "throughput=1"]  # not what this test is about
    result = gpu_check(tmp_path / "out", tmp_path / "work", corpus, *budgets)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    stages = json.loads((tmp_path / "out" / "results.json").read_text())["stages"]
    assert stages["environment"]["status"] == "failed" and "datasets" in stages["environment"]["reason"]
    assert stages["environment"]["result"]["gemm"]  # the rest of stage 1 is still recorded
    assert stages["pretrain"]["status"] == "skipped" and "pyarrow>=24.0.0" in stages["pretrain"]["reason"]
    summary = (tmp_path / "out" / "summary.md").read_text().splitlines()
    assert summary[2].startswith("**Stage 1 could not import datasets") and "skipped: pretrain" in summary[2]
    assert "[gpu_check] stage pretrain: skipped: stage 1 could not import datasets" in result.stdout
