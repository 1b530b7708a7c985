"""What only a GPU can show: the model on CUDA kernels. Skipped where CUDA is absent (CI); the GPU check
(launch/gpu_check.sh, docs/gpu_check.md) runs this file on the GPU. The training steps run on the CPU where there is
no GPU, with the bound they meet on one (the GPU check's dry run shows it holds), and the test of the SDPA test's
helpers runs on CPU too.

Tolerances: fp32 with TF32 off uses ``assert_close``'s fp32 defaults, as the CPU equivalence test in
test_modeling.py; under bf16 autocast (8 bits of mantissa, relative step 2^-8 = 0.0039) logits agree within
``BF16`` below; SDPA kernels in fp32 sum in different orders, so they agree within ``KERNEL_FP32``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers import AutoModelForPreTraining, AutoModelForSequenceClassification, BertConfig, BertForPreTraining

import pretrain.modeling  # noqa: F401  (registers the Auto classes)
from pretrain.modeling import NORM_PLACEMENTS, LNBertConfig, LNBertForPreTraining


def needs_cuda(test: Callable) -> Callable:
    """The ``cuda`` marker, and skipped without CUDA."""
    skip = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the GPU check: launch/gpu_check.sh)")
    return pytest.mark.cuda(skip(test))


CUDA = torch.device("cuda")
BF16 = dict(rtol=2e-2, atol=2e-2)
KERNEL_FP32 = dict(rtol=1e-4, atol=1e-4)
# Shapes SDPA's flash and memory-efficient kernels accept (head dim 16, a multiple of 8); odd sizes elsewhere.
SMALL = dict(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=64)  # fmt: skip


@pytest.fixture(autouse=True)
def no_tf32() -> None:
    """Exact fp32 on the GPU: TF32 rounds matmul inputs to 10 bits of mantissa."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def make_batch(
    padded: bool, batch: int = 4, seq: int = 24, vocab: int = 99, device: torch.device = CUDA
) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, vocab, (batch, seq), generator=g)
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, seq // 2 :] = 1
    attention_mask = torch.ones_like(input_ids)
    if padded:  # rows of different true lengths, as a batch padded to its longest
        attention_mask[1, 17:] = 0
        attention_mask[2, 5:] = 0
        input_ids[attention_mask == 0] = 0
    tensors = dict(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    return {k: v.to(device) for k, v in tensors.items()}


def mlm_labels(input_ids: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    labels = torch.full(input_ids.shape, -100, dtype=torch.long)
    chosen = torch.rand(input_ids.shape, generator=g) < 0.3
    chosen[0, 1] = True
    labels[chosen] = input_ids.cpu()[chosen]
    return labels.to(input_ids.device)


def ours(placement: str, attn: str = "sdpa", **extra) -> LNBertForPreTraining:
    config = LNBertConfig(norm_placement=placement, **SMALL, **extra)
    config._attn_implementation = attn
    return LNBertForPreTraining(config)


def post_ln_and_hf() -> tuple[LNBertForPreTraining, BertForPreTraining]:
    torch.manual_seed(0)
    config = BertConfig(**SMALL)
    config._attn_implementation = "sdpa"
    hf = BertForPreTraining(config).to(CUDA).eval()
    model = ours("post").to(CUDA).eval()
    model.load_state_dict(hf.state_dict(), strict=True)
    return model, hf


@needs_cuda
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
def test_post_ln_equals_hf_on_cuda_fp32(padded: bool) -> None:
    model, hf = post_ln_and_hf()
    batch = make_batch(padded)
    with torch.no_grad():
        got, expected = model(**batch, output_hidden_states=True), hf(**batch, output_hidden_states=True)
    torch.testing.assert_close(got.prediction_logits, expected.prediction_logits)
    torch.testing.assert_close(got.seq_relationship_logits, expected.seq_relationship_logits)
    for ours_h, hf_h in zip(got.hidden_states, expected.hidden_states, strict=True):
        torch.testing.assert_close(ours_h, hf_h)


@needs_cuda
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
def test_post_ln_equals_hf_under_bf16_autocast(padded: bool) -> None:
    model, hf = post_ln_and_hf()
    batch = make_batch(padded)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        got, expected = model(**batch), hf(**batch)
    torch.testing.assert_close(got.prediction_logits.float(), expected.prediction_logits.float(), **BF16)
    torch.testing.assert_close(got.seq_relationship_logits.float(), expected.seq_relationship_logits.float(), **BF16)


def sdpa_outputs(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], backend: object, bf16: bool
) -> tuple[torch.Tensor | None, str | None]:
    """(MLM logits at real positions, None) with one SDPA backend forced, or (None, why) when the backend refuses.

    Any RuntimeError counts as a refusal: PyTorch says "No available kernel" (flash attention takes no padding
    mask), cuDNN's frontend "No execution plans support the graph" for a graph it has no plan for, and other
    wordings may come. A refusal fails nothing by itself; ``missing_kernels`` then says which kernels had to run.
    """
    from torch.nn.attention import sdpa_kernel

    try:
        with torch.no_grad(), sdpa_kernel(backend), torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            logits = model(**batch).prediction_logits.float()
    except RuntimeError as err:
        return None, f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:300]}"
    return logits[batch["attention_mask"].bool()], None


def missing_kernels(ran: set[tuple[str, bool]], padded: bool, capability: tuple[int, int]) -> list[str]:
    """The (backend, bf16) runs that must have happened and did not: the memory-efficient kernel takes masks and
    fp32 (so it runs in both precisions); flash runs in bf16 on an unpadded batch from sm80 (Ampere) on."""
    required = [("EFFICIENT_ATTENTION", False), ("EFFICIENT_ATTENTION", True)]
    if not padded and capability >= (8, 0):
        required.append(("FLASH_ATTENTION", True))
    return [f"{name} (bf16={bf16})" for name, bf16 in required if (name, bf16) not in ran]


@needs_cuda
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
@pytest.mark.parametrize("placement", NORM_PLACEMENTS)
def test_every_sdpa_backend_gives_the_same_outputs(placement: str, padded: bool) -> None:
    from torch.nn.attention import SDPBackend

    torch.manual_seed(0)
    model = ours(placement).to(CUDA).eval()
    batch = make_batch(padded)
    ran: set[tuple[str, bool]] = set()
    refused: dict[str, str] = {}
    for bf16, tolerance in ((False, KERNEL_FP32), (True, BF16)):
        reference, why = sdpa_outputs(model, batch, SDPBackend.MATH, bf16)
        assert reference is not None, f"the math backend (the reference) failed: {why}"
        # cuDNN attention where this torch has it (Hopper); math is the reference.
        others = [
            SDPBackend.FLASH_ATTENTION,
            SDPBackend.EFFICIENT_ATTENTION,
            getattr(SDPBackend, "CUDNN_ATTENTION", None),
        ]
        for backend in [b for b in others if b is not None]:
            got, why = sdpa_outputs(model, batch, backend, bf16)
            if got is None:
                refused[f"{backend.name} (bf16={bf16})"] = why or ""
                continue
            torch.testing.assert_close(got, reference, **tolerance, msg=f"{backend.name}, bf16={bf16}")
            ran.add((backend.name, bf16))
    missing = missing_kernels(ran, padded, torch.cuda.get_device_capability())
    assert not missing, f"these kernels did not run: {missing}; refusals: {refused}"


@needs_cuda
@pytest.mark.parametrize("placement", ["post", "pre"])
def test_sparse_mlm_head_equals_dense_on_cuda(placement: str) -> None:
    torch.manual_seed(0)
    dense = ours(placement, sparse_mlm_head=False).to(CUDA).eval()
    sparse = ours(placement, sparse_mlm_head=True).to(CUDA).eval()
    sparse.load_state_dict(dense.state_dict())
    batch = make_batch(padded=True)
    labels, nsp = mlm_labels(batch["input_ids"]), torch.tensor([1, 0, 1, 0], device=CUDA)
    out_dense = dense(**batch, labels=labels, next_sentence_label=nsp)
    out_sparse = sparse(**batch, labels=labels, next_sentence_label=nsp)
    out_dense.loss.backward()
    out_sparse.loss.backward()
    # The head's GEMMs have other shapes (masked rows only): other kernels, another summation order.
    torch.testing.assert_close(out_sparse.loss, out_dense.loss, **KERNEL_FP32)
    logits = out_dense.prediction_logits[labels != -100]
    torch.testing.assert_close(out_sparse.prediction_logits, logits, **KERNEL_FP32)
    dense_grads = dict(dense.named_parameters())
    for name, param in sparse.named_parameters():
        torch.testing.assert_close(param.grad, dense_grads[name].grad, **KERNEL_FP32, msg=f"gradient of {name}")


# Memorising one batch in 15 steps (lr 1e-3, bf16 autocast): the loss falls to 0.63-0.69 of its first value for every
# placement but nGPT, which reaches 0.861: its blocks move the normalised hidden state by their eigen learning rates
# (0.05 at init, pretrain/ngpt.py) and its matrices stay on the unit sphere, so a step at this lr changes it less.
# CPU, fp32 and bf16 alike, and 0.861-0.871 over initial weights drawn with seeds 0-4 (2026-12-06, 2-core AMD EPYC;
# the test itself measures it, in the GPU check's dry run); nothing in it is random after the seed (no dropout in
# nGPT), so CUDA follows. The bound sits above the slowest with room for another device's rounding, and below the 1.0
# of steps that do not train.
MEMORISED = 0.9


@pytest.mark.parametrize("placement", NORM_PLACEMENTS)
def test_training_steps_with_fused_adamw(placement: str) -> None:
    device = CUDA if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(0)
    model = ours(placement).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=True)
    batch = make_batch(padded=True, device=device)
    labels, nsp = mlm_labels(batch["input_ids"]), torch.tensor([1, 0, 1, 0], device=device)
    losses = []
    for _ in range(15):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(**batch, labels=labels, next_sentence_label=nsp).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert losses[-1] < MEMORISED * losses[0], losses
    state = optimizer.state[next(iter(model.parameters()))]
    assert state["exp_avg"].device.type == device.type and all(torch.isfinite(p).all() for p in model.parameters())


@needs_cuda
@pytest.mark.parametrize("placement", NORM_PLACEMENTS)
def test_snapshot_saved_from_cuda_reloads_on_cuda(placement: str, tmp_path) -> None:
    torch.manual_seed(0)
    model = ours(placement).to(CUDA).eval()
    model.save_pretrained(tmp_path / "snap")
    reloaded = AutoModelForPreTraining.from_pretrained(tmp_path / "snap").to(CUDA).eval()
    assert type(reloaded) is LNBertForPreTraining and reloaded.config.norm_placement == placement
    batch = make_batch(padded=True)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).prediction_logits, model(**batch).prediction_logits)
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path / "snap", num_labels=2).to(CUDA)
    with torch.no_grad():
        assert torch.isfinite(classifier(**batch).logits).all()


class _Forward(torch.nn.Module):
    """A stand-in model for sdpa_outputs: returns fixed logits, or raises RuntimeError(``error``)."""

    def __init__(self, error: str | None = None) -> None:
        super().__init__()
        self.error = error

    def forward(self, **batch: torch.Tensor) -> object:
        if self.error:
            raise RuntimeError(self.error)
        logits = torch.arange(batch["input_ids"].numel() * 2, dtype=torch.float32).view(*batch["input_ids"].shape, 2)
        return type("Output", (), {"prediction_logits": logits})()


def test_the_sdpa_test_takes_any_refusal_as_one_and_needs_the_kernels_that_must_run() -> None:
    """On CPU: the helpers of test_every_sdpa_backend_gives_the_same_outputs, which only a GPU runs."""
    from torch.nn.attention import SDPBackend

    batch = {"input_ids": torch.ones(2, 3, dtype=torch.long), "attention_mask": torch.tensor([[1, 1, 1], [1, 0, 0]])}
    cudnn = "cuDNN Frontend error: [cudnn_frontend] Error: No execution plans support the graph."
    for message in (cudnn, "No available kernel. Aborting execution."):
        got, why = sdpa_outputs(_Forward(message), batch, SDPBackend.MATH, bf16=False)
        assert got is None and message.split(":")[0] in why, why
    got, why = sdpa_outputs(_Forward(), batch, SDPBackend.MATH, bf16=False)
    assert why is None and got.shape == (4, 2)  # the real positions only
    everything = {("EFFICIENT_ATTENTION", False), ("EFFICIENT_ATTENTION", True), ("FLASH_ATTENTION", True)}
    assert missing_kernels(everything, padded=False, capability=(9, 0)) == []
    assert missing_kernels(everything - {("FLASH_ATTENTION", True)}, False, (9, 0)) == ["FLASH_ATTENTION (bf16=True)"]
    assert missing_kernels({("FLASH_ATTENTION", True)}, padded=True, capability=(9, 0)) == [
        "EFFICIENT_ATTENTION (bf16=False)",
        "EFFICIENT_ATTENTION (bf16=True)",
    ]
    assert missing_kernels(everything - {("FLASH_ATTENTION", True)}, False, (7, 5)) == []  # no flash before sm80
