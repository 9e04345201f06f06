"""The torch precision policy (labkit.torch.precision): what each mode switches on, and what it
changes in the model (`prepare_model`, which the engine calls once after the model is on its
device). fp8 switches the Linear layers to fp8 matmuls; on a CPU `_scaled_mm` is emulated, so these
check the wiring and the maths, not the speed."""

from __future__ import annotations

import pytest

from labkit.core import precisions
from labkit.core.config import ParameterError
from labkit.core.models import CNNConfig, GPTConfig
from labkit.core.train_config import TrainConfig


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    global torch, PrecisionPolicy, fp8, build_model
    import torch

    from labkit.torch import fp8
    from labkit.torch.models import build_model
    from labkit.torch.precision import PrecisionPolicy


def _gpt():
    torch.manual_seed(0)
    return build_model(GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=64))


def test_fp8_is_bf16_autocast_with_tf32_and_no_scaler_measured_against_the_bf16_peak():
    policy = PrecisionPolicy.for_mode("fp8", "cpu")
    assert (policy.autocast_dtype, policy.tf32, policy.grad_scaler) == (torch.bfloat16, True, False)
    assert not policy.make_scaler().is_enabled()
    assert policy.peak_dtype == torch.bfloat16  # labkit.torch.peak cannot time an fp8 matmul


def test_only_fp8_changes_the_model():
    device = torch.device("cpu")
    for p in precisions.precisions("torch"):
        model = _gpt()
        out = PrecisionPolicy.for_mode(p.name, "cpu").prepare_model(model, device)
        switched = [m for m in out.modules() if isinstance(m, fp8.Float8Linear)]
        assert out is model and (len(switched) == 2 * 4 + 1 if p.name == "fp8" else not switched), p.name
    assert model.lm_head.weight is model.wte.weight  # the tied weight stays one parameter


def test_fp8_refuses_a_model_it_would_change_nothing_in():
    model = build_model(CNNConfig())  # its only Linear is the 10-wide classifier
    with pytest.raises(ParameterError, match="^parameter 'precision' found no Linear layer"):
        PrecisionPolicy.for_mode("fp8", "cpu").prepare_model(model, torch.device("cpu"))


def test_fp8_refuses_a_gpu_without_fp8_tensor_cores(monkeypatch):
    """The message a T4 would give (compute capability 7.5), without one here: the driver's two
    answers stand in for it."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    with pytest.raises(ParameterError) as e:
        PrecisionPolicy.for_mode("fp8", "cuda").prepare_model(_gpt(), torch.device("cuda", 0))
    assert str(e.value) == ("parameter 'precision' needs fp8 tensor cores (compute capability 8.9+: L4, H100, "
                            "H200); Tesla T4 is 7.5 (got 'fp8')")


def test_the_engine_trains_gpt_in_fp8_and_its_linears_are_fp8():
    from labkit.torch import distributed
    from labkit.torch.engine import build
    from labkit.torch.trainer import fit

    config = TrainConfig(model="gpt", precision="fp8", steps=6, batch_size=8, lr=3e-3, device="cpu",
                         num_samples=64, eval_samples=0, progress=False)  # no held-out loss asked
    c = build(config, distributed.DistInfo(), torch.device("cpu"))
    assert sum(isinstance(m, fp8.Float8Linear) for m in c.model.modules()) == 2 * 4 + 1
    losses = [s["loss"] for s in fit(config).steps]
    bf16 = [s["loss"] for s in fit(TrainConfig(**{**config.__dict__, "precision": "bf16"})).steps]
    assert losses[-1] < losses[0]
    # fp8 rounding: close to bf16's curve, not equal to it (the matmuls really ran in fp8)
    assert 0 < max(abs(a - b) for a, b in zip(losses, bf16, strict=True)) < 0.05


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_gpu_fp8_trains_close_to_bf16():
    """On an fp8 GPU (L4, H100, H200) the fp8 rung trains the GPT as bf16 does, within fp8's rounding."""
    from labkit.torch.trainer import fit

    if not fp8.supported(torch.device("cuda")):
        pytest.skip("no fp8 tensor cores (compute capability 8.9+) here")
    base = TrainConfig(model="gpt", precision="bf16", steps=20, batch_size=16, lr=3e-3, device="cuda",
                       progress=False)
    bf16 = [s["loss"] for s in fit(base).steps]
    runs = fit(TrainConfig(**{**base.__dict__, "precision": "fp8"}))
    losses = [s["loss"] for s in runs.steps]
    assert losses[-1] < losses[0] and max(abs(a - b) for a, b in zip(losses, bf16, strict=True)) < 0.1
