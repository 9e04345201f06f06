"""fp8 matmuls (labkit.torch.fp8): same function as the bf16/fp32 layers within fp8's rounding,
weight tying kept, and the `fp8_head` switch of the engine. On CPU `_scaled_mm` is emulated, so
these check the maths; speed is measured by benchmarks/bench_gpt_levers.py on a GPU."""

from __future__ import annotations

import copy

import pytest

from labkit.core.config import ParameterError
from labkit.core.models import GPTConfig
from labkit.core.train_config import TrainConfig


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    global torch, F, nn, fp8, GPT
    import torch
    import torch.nn.functional as F
    from torch import nn

    from labkit.torch import fp8
    from labkit.torch.models import GPT


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm())


def test_float8_linear_matches_linear_within_fp8_rounding():
    torch.manual_seed(0)
    layer = nn.Linear(64, 96, bias=True)
    ref = copy.deepcopy(layer)
    assert fp8.convert_linears(layer) == [""]
    x = torch.randn(4, 32, 64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    y, y_ref = layer(x), ref(x_ref)
    grad = torch.randn_like(y_ref)
    y.backward(grad)
    y_ref.backward(grad)
    # e4m3 carries 3 mantissa bits (relative rounding ≤ 6%), e5m2 gradients 2 bits: averaged over
    # many products the errors stay a few percent; a wrong scale or layout gives O(1).
    assert rel(y, y_ref) < 0.06
    assert rel(x.grad, x_ref.grad) < 0.1
    assert rel(layer.weight.grad, ref.weight.grad) < 0.1
    assert layer.weight.grad.dtype == torch.float32 and x.grad.dtype == x.dtype


def test_head_cross_entropy_matches_cross_entropy():
    torch.manual_seed(1)
    x = torch.randn(2, 32, 64, requires_grad=True)
    w = (0.3 * torch.randn(128, 64)).requires_grad_()
    t = torch.randint(128, (2, 32))
    x_ref, w_ref = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    loss = fp8.head_cross_entropy(x, w, t)
    (3 * loss).backward()  # a non-unit upstream gradient goes into the inverse scale
    ref = F.cross_entropy((x_ref @ w_ref.t()).reshape(-1, 128), t.reshape(-1))
    (3 * ref).backward()
    assert abs(loss.item() - ref.item()) / ref.item() < 0.01
    assert rel(x.grad, x_ref.grad) < 0.1
    assert rel(w.grad, w_ref.grad) < 0.1


def test_fp8_gpt_head_keeps_the_tied_weight_and_returns_the_loss():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=256, block_size=32, n_layer=1, n_head=2, n_embd=64))
    model.fp8_head = True
    idx = torch.randint(256, (2, 32))
    loss = model(idx, idx)
    assert loss.dim() == 0
    loss.backward()
    assert model.lm_head.weight is model.wte.weight and model.wte.weight.grad is not None
    assert model(idx).shape == (2, 32, 256)  # without targets: logits, as before


def test_convert_linears_scopes():
    model = GPT(GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=64))
    assert fp8.convert_linears(copy.deepcopy(model), "lm_head") == ["lm_head"]
    switched = fp8.convert_linears(model, "all")
    assert len(switched) == 2 * 4 + 1
    assert model.lm_head.weight is model.wte.weight
    with pytest.raises(ValueError, match="scope"):
        fp8.convert_linears(model, "attention")


def test_fp8_head_config_is_checked():
    with pytest.raises(ParameterError, match="fp8_head"):
        TrainConfig(model="cnn", precision="bf16", fp8_head=True)
    with pytest.raises(ParameterError, match="fp8_head"):
        TrainConfig(model="gpt", precision="fp32", fp8_head=True)


def test_fit_with_fp8_head_trains(tmp_path):
    from labkit.torch.trainer import fit

    log = fit(TrainConfig(model="gpt", precision="bf16", fp8_head=True, steps=8, batch_size=8,
                          lr=3e-3, device="cpu", num_samples=64, eval_samples=0, progress=False))
    losses = [s["loss"] for s in log.steps]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


def test_tf_engine_rejects_fp8_head():
    pytest.importorskip("tensorflow")
    from labkit.tf.engine import fit

    with pytest.raises(ParameterError, match="fp8_head"):
        fit(TrainConfig(framework="tf", model="gpt", precision="bf16", fp8_head=True, steps=1))


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_gpu_fp8_head_with_cuda_graphs_and_accumulation_matches_eager():
    """labkit's fastest GPT settings (fp8 head, CUDA graphs) train the same model as eager
    execution, also when gradients accumulate across micro-steps inside one graph generation."""
    from labkit.torch.trainer import fit

    base = TrainConfig(model="gpt", precision="bf16", fp8_head=True, steps=6, batch_size=16, grad_accum=2,
                       lr=3e-3, device="cuda", progress=False, grad_clip=None)
    eager = [s["loss"] for s in fit(base).steps]
    graphs = [s["loss"] for s in fit(TrainConfig(**{**base.__dict__, "compile": True,
                                                    "compile_mode": "reduce-overhead"})).steps]
    assert graphs[-1] < graphs[0]
    assert max(abs(a - b) for a, b in zip(eager, graphs, strict=True)) < 0.05


def test_compile_modes():
    from labkit.torch.engine import compile_options, uses_cuda_graphs

    assert compile_options("default") == {}
    assert uses_cuda_graphs("reduce-overhead") and uses_cuda_graphs("tuned")
    assert compile_options("tuned")["coordinate_descent_tuning"]
    assert not uses_cuda_graphs("max-autotune-no-cudagraphs")
    with pytest.raises(ParameterError, match="compile_mode"):
        TrainConfig(compile=True, compile_mode="fastest")
