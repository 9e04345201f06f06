"""`labkit estimate` on user-style models (a CNN written here, a ViT and a GPT in
estimate_models.py): the fake-tensor count against the bytes of a real run, the plan over the
catalog, and bad input."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from labkit.torch.estimate import estimate
from labkit.torch.footprint import ModelError, load_factory, measure


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch and the models written with it, imported when this module's first test runs rather
    than at collection."""
    global torch, nn, GPT, ViT
    torch = pytest.importorskip("torch")
    nn = torch.nn
    from tests.torch.estimate_models import GPT, ViT


def cnn():
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(64, 10))


def vit():
    return ViT()


def gpt():
    return GPT()


def real_step(factory, shape, batch):
    """The bytes of a real step on the CPU: parameters, gradients and AdamW state from the real
    tensors, and what the forward and the loss left allocated besides their outputs (the
    allocator's own events, profiled)."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = factory()
    x = torch.randint(0, 2, (batch, *shape)) if len(shape) == 1 else torch.randn(batch, *shape)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = model(x)
        logits = out.flatten(0, -2)
        loss = nn.functional.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long))
    held = sum(e.self_cpu_memory_usage for e in prof.events())
    forward_bytes = held - out.numel() * out.element_size() - loss.numel() * loss.element_size()
    loss.backward()
    opt = torch.optim.AdamW(model.parameters())
    opt.step()
    params = {id(p): p for p in model.parameters()}.values()
    return {"params": sum(p.numel() * p.element_size() for p in params),
            "grads": sum(p.grad.numel() * p.grad.element_size() for p in params),
            "optimizer": sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()),
            "forward": forward_bytes}


@pytest.mark.parametrize("factory,shape,kind", [(cnn, (3, 32, 32), "convolutional"), (vit, (3, 32, 32), "matmul"),
                                                (gpt, (32,), "matmul")], ids=["cnn", "vit", "gpt"])
def test_the_count_matches_a_real_run(factory, shape, kind):
    fp = measure(factory, shape, batch_size=8)
    real = real_step(factory, shape, 8)
    assert (fp.param_bytes, fp.grad_bytes, fp.optimizer_bytes) == (real["params"], real["grads"], real["optimizer"])
    assert fp.activation_bytes == pytest.approx(real["forward"], rel=0.10)
    assert fp.kind == kind
    assert fp.parameters == sum(p.numel() for p in {id(p): p for p in factory().parameters()}.values())


def test_tied_weights_count_once_and_bf16_halves_what_autocast_saves():
    g = GPT()
    fp32, bf16 = measure(gpt, (32,), 64, "fp32"), measure(gpt, (32,), 64, "bf16")
    assert fp32.parameters == sum(p.numel() for p in g.parameters()) < sum(p.numel() for p in g.state_dict().values())
    assert bf16.param_bytes == fp32.param_bytes and bf16.optimizer_bytes == fp32.optimizer_bytes
    assert bf16.activation_bytes < 0.8 * fp32.activation_bytes
    assert fp32.flops_per_step == pytest.approx(bf16.flops_per_step)


def test_a_seven_billion_parameter_model_is_counted_without_its_memory():
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # 8 layers of width 8192 rather than a 7B model's usual 32 of 4096: as many parameters (6.7
    # billion) in a quarter of the traced operations (the count's time goes with the operations).
    fp = measure(lambda: GPT(vocab=32000, d=8192, layers=8, heads=64, block=64), (64,), 1, "bf16")
    grown_gb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 2**20
    assert 6.4e9 < fp.parameters < 6.8e9 and fp.param_bytes == 4 * fp.parameters
    assert grown_gb < 1.0  # the weights alone would be 26 GB
    per = fp.per_gpu("fsdp", 8)
    assert per["params"] == -(-fp.param_bytes // 8) and per["activations"] == fp.activation_bytes
    assert fp.per_gpu("zero1", 8)["optimizer"] == -(-fp.optimizer_bytes // 8)
    assert fp.per_gpu("zero1", 8)["grads"] == fp.grad_bytes


def test_the_plan_fits_prices_and_says_where_its_utilisation_comes_from():
    report = estimate(vit, (3, 32, 32), batch_size=64, gpus=2, samples_per_epoch=10_000)
    text = report.text()
    assert "benchmarks/results/" in text and "GPT" in text  # a matmul model: the GPT run, cited
    assert all(f.verdict == "fits" for f in report.fits)
    run = report.runs[0]
    steps = -(-10_000 // (64 * 2))
    assert run.hours_per_epoch == pytest.approx(steps * run.step_s / 3600)
    assert run.usd_per_epoch <= report.runs[-1].usd_per_epoch
    fed = estimate(vit, (3, 32, 32), batch_size=64, mfu=0.3, input_samples_per_s=50.0)
    assert all(r.input_bound for r in fed.runs) and all(r.step_s == pytest.approx(64 / 50.0) for r in fed.runs)
    assert "your --mfu" in fed.text()
    none = estimate(gpt, (32,), batch_size=2, precision="fp32")
    assert none.runs == [] and "pass --mfu" in none.text()


@pytest.mark.slow
def test_bad_models_are_named(tmp_path):
    with pytest.raises(ModelError, match=r"returned int, not a torch.nn.Module"):
        measure(lambda: 3, (3, 8, 8))
    with pytest.raises(ModelError, match=r"layer '2' \(Linear\) on an input of shape \(1, 3, 8, 8\)"):
        measure(lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(5, 2)), (3, 8, 8))
    (tmp_path / "user_models.py").write_text(textwrap.dedent("""
        import torch
        def cnn():
            return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.LazyLinear(2))
        def not_a_model():
            return {"weights": 1}
    """))
    assert load_factory("user_models:cnn", tmp_path)().__class__.__name__ == "Sequential"

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "labkit", "estimate", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)

    ok = cli("user_models:cnn", "--input-shape", "3,16,16", "--batch-size", "4")
    assert ok.returncode == 0 and "parameters" in ok.stdout and "fits" in ok.stdout, ok.stdout + ok.stderr
    for args, says in [(["user_models:not_a_model", "--input-shape", "3,8,8"], "not a torch.nn.Module"),
                       (["user_models:nope", "--input-shape", "3,8,8"], "has no attribute 'nope'"),
                       (["user_models:cnn", "--input-shape", "3,a"], "--input-shape"),
                       (["user_models:cnn", "--input-shape", "3,8,8", "--gpus", "0"], "--gpus")]:
        bad = cli(*args)
        assert bad.returncode == 2 and says in bad.stdout and "Traceback" not in bad.stderr, bad.stdout + bad.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("factory,shape", [(cnn, (3, 64, 64)), (gpt, (32,))], ids=["cnn", "gpt"])
def test_gpu_the_count_matches_the_cuda_allocator(factory, shape):
    """On a GPU: what the forward and the loss leave allocated, from the CUDA allocator."""
    torch.manual_seed(0)
    model = factory().cuda()
    x = (torch.randint(0, 2, (16, *shape)) if len(shape) == 1 else torch.randn(16, *shape)).cuda()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = model(x)
    logits = out.flatten(0, -2)
    loss = nn.functional.cross_entropy(logits.float(), torch.zeros(len(logits), dtype=torch.long, device="cuda"))
    held = torch.cuda.memory_allocated() - before - out.numel() * out.element_size() - 512  # the loss's block
    fp = measure(factory, shape, batch_size=16)
    assert fp.activation_bytes == pytest.approx(held, rel=0.15)
    del loss
