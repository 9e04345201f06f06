"""The whole step as one CUDA graph (`TrainConfig.cuda_graph_step`, labkit.torch.step_graph).

On CPU: the switch is refused where it cannot work (fp16, CPU, DDP, TensorFlow) with an error
naming it, the compile options it implies, and the pieces the graph relies on that run anywhere
(the schedule's LR read without the device, a checkpoint holding a tensor LR). On a GPU: a
captured run trains the same model as the normal step, through warm-up, capture, LR changes
after capture, accumulation, clipping and a preempt-and-resume."""

from __future__ import annotations

import dataclasses

import pytest

from labkit.core.config import ParameterError
from labkit.core.train_config import TrainConfig


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    global torch, engine, trainer, state, DataPosition, DistInfo
    import torch

    from labkit.torch import engine, state, trainer
    from labkit.torch.data import DataPosition
    from labkit.torch.distributed import DistInfo


def test_fp16_is_refused_by_the_config():
    with pytest.raises(ParameterError, match="cuda_graph_step.*GradScaler"):
        TrainConfig(precision="fp16", cuda_graph_step=True)
    TrainConfig(precision="bf16", cuda_graph_step=True)  # allowed


def test_cpu_and_ddp_are_refused_by_build():
    config = TrainConfig(model="gpt", cuda_graph_step=True)
    with pytest.raises(ParameterError, match="cuda_graph_step.*CUDA GPU"):
        engine.build(config, DistInfo(), torch.device("cpu"))
    two = DistInfo(rank=0, world_size=2, local_rank=0)
    with pytest.raises(ParameterError, match="cuda_graph_step.*single process"):
        engine.build(config, two, torch.device("cuda"))  # refused before the device is touched


def test_tensorflow_refuses_it():
    pytest.importorskip("tensorflow")
    from labkit.tf.engine import fit

    with pytest.raises(ParameterError, match="cuda_graph_step"):
        fit(TrainConfig(framework="tf", cuda_graph_step=True, steps=1))


def test_the_step_graph_replaces_inductors_cuda_graphs_but_keeps_tuning():
    from labkit.torch.engine import compile_options

    assert compile_options("tuned", cudagraphs=False) == {"coordinate_descent_tuning": True}
    assert "triton.cudagraphs" not in compile_options("reduce-overhead", cudagraphs=False)
    assert compile_options("reduce-overhead")["triton.cudagraphs"]


def test_scheduled_lr_is_the_optimizers_lr_through_warm_up():
    config = TrainConfig(model="gpt", lr=0.01, warmup_steps=4, grad_clip=None)
    c = engine.build(config, DistInfo(), torch.device("cpu"))
    x = torch.randint(c.model_config.vocab_size, (2, c.model_config.block_size))
    seen = []
    for _ in range(6):
        assert engine.scheduled_lr(c) == pytest.approx(c.optimizer.param_groups[0]["lr"], rel=1e-12)
        seen.append(engine.scheduled_lr(c))
        trainer.train_step(c, [(x, x)], None)
    assert seen[0] < seen[3] == seen[4] == pytest.approx(0.01)


def test_a_checkpoint_with_a_tensor_lr_restores_as_a_float(tmp_path):
    """A captured run holds each group's LR as a device tensor, so its checkpoints store tensors;
    a run restored from one (captured again or not, on any device) starts from plain floats and a
    non-capturable optimizer, which on CPU would otherwise refuse to step."""
    config = TrainConfig(model="gpt", lr=0.01, warmup_steps=2, grad_clip=None)
    c = engine.build(config, DistInfo(), torch.device("cpu"))
    for group in c.optimizer.param_groups:  # what StepGraph does at capture
        group["lr"] = torch.tensor(float(group["lr"]))
        group["capturable"] = True
    state.save(str(tmp_path), c, DistInfo(), 3, DataPosition(0, 4))
    fresh = engine.build(config, DistInfo(), torch.device("cpu"))
    assert state.restore(str(tmp_path), fresh, DistInfo()) == (4, DataPosition(0, 4))
    assert all(type(g["lr"]) is float and not g["capturable"] for g in fresh.optimizer.param_groups)
    x = torch.randint(fresh.model_config.vocab_size, (2, fresh.model_config.block_size))
    trainer.train_step(fresh, [(x, x)], None)  # the optimizer steps with it


def _gpu_config(**overrides) -> TrainConfig:
    base = TrainConfig(model="gpt", precision="fp32", steps=9, batch_size=8, grad_accum=2, lr=3e-3,
                       warmup_steps=6, grad_clip=1.0, device="cuda", progress=False, seed=0)
    return dataclasses.replace(base, **overrides)


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_gpu_captured_step_trains_like_the_normal_step():
    """Three normal steps, capture, then replays while the LR still warms up (so the tensor LR
    must follow the schedule), with accumulation and clipping inside the graph."""
    from labkit.torch.trainer import fit

    # A loader worker and pinned memory: the pin-memory thread allocates while the step is captured.
    normal = [s["loss"] for s in fit(_gpu_config()).steps]
    graphed_log = fit(_gpu_config(cuda_graph_step=True, num_workers=1, pin_memory=True))
    graphed = [s["loss"] for s in graphed_log.steps]
    assert len(graphed) == len(normal) == 9
    assert graphed[-1] < graphed[0]
    assert max(abs(a - b) for a, b in zip(normal, graphed, strict=True)) < 1e-3
    assert [s["lr"] for s in graphed_log.steps] == pytest.approx([3e-3 * min(1, (i + 1) / 6) for i in range(9)])


@pytest.mark.gpu
def test_gpu_after_capture_the_optimizer_reads_the_schedules_lr_from_the_device():
    c = engine.build(_gpu_config(cuda_graph_step=True, grad_accum=1), DistInfo(), torch.device("cuda"))
    x = torch.randint(c.model_config.vocab_size, (8, c.model_config.block_size), device="cuda")
    for _ in range(4):  # three normal steps, then the capture and its first replay
        trainer.train_step(c, [(x, x)], 1.0)
    assert c.step_graph is not None and c.step_graph.captured
    lr = c.optimizer.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and lr.device.type == "cuda"
    # The schedule moved on after the replay (warm-up over 6 steps: step 5 uses 5/6 of the peak).
    assert engine.scheduled_lr(c) == pytest.approx(3e-3 * 5 / 6)
    assert lr.item() == pytest.approx(engine.scheduled_lr(c))


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_gpu_captured_step_with_compile_and_fp8_head_matches_the_compiled_step():
    from labkit.torch.trainer import fit

    fast = _gpu_config(precision="bf16", compile=True, compile_mode="tuned",
                       fp8_head=torch.cuda.get_device_capability() >= (8, 9))
    normal = [s["loss"] for s in fit(fast).steps]
    graphed = [s["loss"] for s in fit(dataclasses.replace(fast, cuda_graph_step=True)).steps]
    assert graphed[-1] < graphed[0]
    assert max(abs(a - b) for a, b in zip(normal, graphed, strict=True)) < 0.05


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_gpu_captured_run_preempted_and_resumed_finishes_like_the_uninterrupted_one(tmp_path):
    from labkit.core.train_config import Preempted
    from labkit.torch.trainer import fit

    # 12 steps: the resumed run (steps 6-11) also warms up for three steps and then captures.
    whole = [s["loss"] for s in fit(_gpu_config(cuda_graph_step=True, steps=12)).steps]
    config = _gpu_config(cuda_graph_step=True, steps=12, checkpoint_dir=str(tmp_path), checkpoint_every=2)
    with pytest.raises(Preempted):
        fit(dataclasses.replace(config, preempt_at=5))
    rest = fit(config).steps
    assert rest[0]["step"] == 6
    resumed = [s["loss"] for s in rest]
    assert max(abs(a - b) for a, b in zip(whole[6:], resumed, strict=True)) < 1e-3


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_gpu_captured_step_with_activation_checkpointing_matches_the_normal_step():
    """Recomputation in the backward pass saves and restores the CUDA RNG state: under capture
    that must not read the generator on the host."""
    from labkit.torch.trainer import fit

    config = _gpu_config(activation_checkpointing=True, steps=6)
    normal = [s["loss"] for s in fit(config).steps]
    graphed = [s["loss"] for s in fit(dataclasses.replace(config, cuda_graph_step=True)).steps]
    assert max(abs(a - b) for a, b in zip(normal, graphed, strict=True)) < 1e-3


@pytest.mark.gpu
def test_gpu_step_graph_refuses_a_new_batch_shape_or_setting():
    from labkit.torch.step_graph import StepGraph

    model = torch.nn.Linear(4, 4, device="cuda")
    opt = torch.optim.AdamW(model.parameters(), fused=True)

    def step(batches, scale):
        loss = sum(model(x).square().mean() for (x,) in batches) * scale
        loss.backward()
        opt.step()
        return loss.detach()

    graph = StepGraph(step, opt, torch.device("cuda"), warmup_steps=1)
    for _ in range(3):
        graph([(torch.ones(2, 4, device="cuda"),)], 1.0)
    assert graph.captured
    with pytest.raises(ValueError, match="one batch shape"):
        graph([(torch.ones(3, 4, device="cuda"),)], 1.0)
    with pytest.raises(ValueError, match="settings it was captured with"):
        graph([(torch.ones(2, 4, device="cuda"),)], 2.0)
