"""The speed-ups a torch run opts into, in one place. Each is off in the plain step
(`labkit.torch.trainer.update`), switched on by its `TrainConfig` field, and measured against
the same run without it (benchmarks/RESULTS.md):

- `keep_host_memory(device)`: on a CPU, glibc keeps the blocks a step frees for the next step
  (`labkit.core.host_memory`). "Engine overhead": with it the engine's cnn step was 0.76× the
  plain loop's, without it 1.00–1.08×.
- `graphed(c, step)`: `cuda_graph_step`, the whole optimizer step captured once as a CUDA graph
  and replayed (`labkit.torch.step_graph`). "GPU: GPT-2 small and ResNet-50 on one H100", run
  F, GPT-2 small at batch 12: 1.107–1.123× the compiled peer's tokens/s with it, 1.078–1.082×
  without it (three runs each).
- `fp8_head_loss(model, forward_model)`: `fp8_head`, GPT's output projection and loss as one fp8
  function (`labkit.torch.fp8`). Same section, run C: 455,353 tokens/s with it against 445,073
  without (one run each; 1.037× and 1.014× the compiled peer).

Counting collectives (`labkit.torch.comm_count.StepComm`) is the opposite: a measurement that
costs speed (a small CPU step a third or more), so it runs on two steps of a run only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from labkit.core import host_memory
from labkit.torch.step_graph import StepGraph


def keep_host_memory(device: torch.device) -> None:
    """On a CPU: keep freed tensors' memory in the heap rather than faulting in fresh pages each
    step (up to a fifth of a smoke-size step otherwise). Nothing on a GPU."""
    if device.type == "cpu":
        host_memory.keep_freed_memory()


def graphed(c: Any, step: Callable[..., torch.Tensor]) -> StepGraph:
    """`step(micro_batches, grad_clip) -> loss` (forward, backward and update, nothing read on
    the host) run normally for a few steps, then captured and replayed as one CUDA graph."""
    return StepGraph(step, c.optimizer, c.device)


def fp8_head_loss(model: torch.nn.Module, forward_model: Callable) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss of a GPT whose output projection and cross-entropy run as one fp8 function:
    `model` (the unwrapped module) is switched to it, and `forward_model` (its DDP / compiled
    wrapper) returns the loss itself."""
    model.fp8_head = True

    def compute_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return forward_model(x, y)

    return compute_loss
