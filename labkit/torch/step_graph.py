"""One whole optimizer step captured as a CUDA graph and replayed (`TrainConfig.cuda_graph_step`).

torch.compile's CUDA graphs (`compile_mode="reduce-overhead"`) cover the compiled forward and
backward pass but not what runs between them: the loss accumulation, gradient clipping and the
optimizer. The GPU idles while the host launches those: in benchmarks/RESULTS.md labkit's best
GPT-2 step on an H100 took 1.6 ms longer than its kernels (25.8 ms against 24.2 ms). Here every
micro-step's forward and backward pass, clipping and the fused AdamW update are recorded once
into one `torch.cuda.CUDAGraph`; each later step copies its batch into the graph's input buffers
and replays it, one launch for the whole step.

What capture requires, and how this module meets it:

- the first `WARMUP_STEPS` steps run normally, on a side stream (lazy initialisation, compilation
  and kernel tuning happen there, never during capture); they are real training steps;
- nothing may read a device value on the host, so fp16's GradScaler and DDP (whose reducer is
  driven from the host) are refused by `TrainConfig` / `engine.build`;
- the optimizer must read the learning rate from device memory, so each group's `lr` becomes a
  0-dim device tensor at capture (the scheduler's `fill_` then updates it in place) and the groups
  are marked `capturable`;
- other threads keep running (the loader's pin-memory thread, the checkpoint writer), so capture
  restricts only the training thread (`capture_error_mode="thread_local"`);
- gradients live in the graph's memory from then on: the backward pass of each replay writes them
  afresh, as it did during capture, so they are not zeroed between steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

# Steps run normally before capture: compilation, autotuning and cuBLAS/cuDNN workspace set-up
# must all have happened (PyTorch's CUDA-graph notes use three).
WARMUP_STEPS = 3

MicroBatches = Sequence[tuple[torch.Tensor, ...]]
StepFunction = Callable[..., torch.Tensor]  # (micro_batches, *settings) -> loss


class StepGraph:
    """Runs `step(micro_batches, *settings) -> loss` (forward, backward and optimizer update, no
    host reads) normally for `warmup_steps` steps, then captures it and replays it for every
    later step. `optimizer.zero_grad(set_to_none=True)` runs after each normal step; the
    replayed graph needs none. A replay repeats the captured batch shapes and `settings`."""

    def __init__(self, step: StepFunction, optimizer: torch.optim.Optimizer,
                 device: torch.device, warmup_steps: int = WARMUP_STEPS):
        if device.type != "cuda":
            raise ValueError(f"a CUDA graph needs a CUDA device, got {device}")
        self.step = step
        self.optimizer = optimizer
        self.device = device
        self.warmup_steps = warmup_steps
        self.steps_run = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self._inputs: list[tuple[torch.Tensor, ...]] = []
        self._settings: tuple[Any, ...] = ()
        self._loss: torch.Tensor | None = None
        self._side_stream: torch.cuda.Stream | None = None

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self, micro_batches: MicroBatches, *settings: Any) -> torch.Tensor:
        """One optimizer step; returns its loss as a fresh device tensor (the graph's own output
        buffer is overwritten by the next replay)."""
        self.steps_run += 1
        if self.graph is None and self.steps_run <= self.warmup_steps:
            return self._run_on_side_stream(micro_batches, settings)
        if self.graph is None:
            self._capture(micro_batches, settings)
        self._check_same(micro_batches, settings)
        for static, batch in zip(self._inputs, micro_batches, strict=True):
            for dst, src in zip(static, batch, strict=True):
                dst.copy_(src, non_blocking=True)
        assert self.graph is not None and self._loss is not None
        self.graph.replay()
        return self._loss.clone()

    def _run_on_side_stream(self, micro_batches: MicroBatches, settings: tuple[Any, ...]) -> torch.Tensor:
        main = torch.cuda.current_stream(self.device)
        side = self._side_stream = self._side_stream or torch.cuda.Stream(self.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            loss = self.step(micro_batches, *settings)
            self.optimizer.zero_grad(set_to_none=True)
        main.wait_stream(side)
        loss.record_stream(main)  # the caller reads it on the main stream
        return loss

    def _capture(self, micro_batches: MicroBatches, settings: tuple[Any, ...]) -> None:
        for group in self.optimizer.param_groups:
            lr = group["lr"]
            group["lr"] = (lr.detach().to(self.device, torch.float32) if isinstance(lr, torch.Tensor)
                           else torch.tensor(float(lr), device=self.device))
            group["capturable"] = True
        self._inputs = [tuple(t.detach().clone() for t in batch) for batch in micro_batches]
        self._settings = settings
        self.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()  # entering capture syncs and frees the warm-up's cached blocks
        try:
            # "thread_local": the DataLoader's pin-memory thread keeps allocating page-locked
            # buffers; under the default "global" mode that would invalidate the capture.
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self._loss = self.step(self._inputs, *settings)
        except RuntimeError as e:  # an op that reads the device on the host, or cannot be captured
            raise RuntimeError(f"capturing the training step as one CUDA graph failed: {e}\n"
                               f"Train without cuda_graph_step (--no-cuda-graph-step).") from e
        self.graph = graph  # capture records, it does not run: __call__ replays this step next

    def _check_same(self, micro_batches: MicroBatches, settings: tuple[Any, ...]) -> None:
        got = [tuple(t.shape for t in batch) for batch in micro_batches]
        want = [tuple(t.shape for t in batch) for batch in self._inputs]
        if got != want:
            raise ValueError(f"a captured step replays one batch shape: captured {want}, got {got} "
                             f"(drop the last partial batch, or turn cuda_graph_step off)")
        if settings != self._settings:
            raise ValueError(f"a captured step replays the settings it was captured with: "
                             f"captured {self._settings}, got {settings}")

