"""What every training loop decides the same way, without torch or TensorFlow.

The loops themselves are written out where a reader looks for them: `labkit.torch.trainer`
(`Trainer.train`) and `labkit.tf.trainer` (the TF custom loop) read the same top to bottom, and
the TF parameter-server loop (steps in windows: `labkit.tf.ps`) and the Keras `model.fit` loop
(callbacks: `labkit.tf.keras_fit`) call the same parts. Each decision has one owner here:

- `CheckpointPolicy`: when a run checkpoints (every `checkpoint_every` steps, after the last step
  and on a stop) and which saves must be finished before going on;
- `Reporter`: what a finished step reports: loss, step and data time, samples/s, tokens/s, MFU,
  peak memory, LR, skipped steps into the `MetricsLog`, the `on_step` callback, TensorBoard
  scalars and a progress bar (main process; `labkit.core.progress`: a widget in JupyterLab, text
  when headless); a loss that is NaN or infinite raises FloatingPointError naming the step. In a
  Vertex AI job (`labkit.core.joblog`) the bar gives way to one JSON log line per step with the
  step's figures as fields, and warnings and a failure become WARNING and ERROR lines. A
  `system` sampler (GPU utilisation and memory, `labkit.torch.gpu_samples`) adds
  `system/<figure>` scalars and fields; W&B gets the same scalars when `wandb_project` is set
  (`labkit.core.wandb_scalars`);
- `Throughput`: samples/s, tokens/s and MFU of a step time; `StepClock` and `timed`: a step's
  time and its data time;
- `begin`, `write_metrics`, `already_complete`: the metrics file, written by the main process at
  each checkpoint, on a stop and at the end. A resumed run keeps the earlier attempt's steps
  before the resumed one from that file (`MetricsLog.continue_from`), so after a preemption and
  a rerun of the same command the file holds every step once. A run resumed from the checkpoint
  of its last step has nothing to train: it leaves the metrics file of the run that trained
  those steps as it is and returns that log, marked `already_complete`;
- `save_checkpoint` and `stopped`: a stop (SIGTERM through `labkit.core.preemption.PreemptionGuard`,
  or the `preempt_at` drill) is checkpointed, then `Preempted` is raised; a stop whose save
  failed says it has no checkpoint;
- `evaluates_at_checkpoints`, `keep_heldout`: held-out loss after the last step, and at each
  checkpoint inside a tuning trial that optimises it.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from labkit.core import hypertune, joblog
from labkit.core.metrics import MetricsLog, StepMetrics
from labkit.core.preemption import PreemptionGuard
from labkit.core.progress import in_kernel, progress
from labkit.core.train_config import Preempted, TrainConfig

StepCallback = Callable[[int, dict[str, Any]], None]
# The machine's figures now, e.g. {"gpu_util": 97.0, "gpu_mem_gib": 31.2}, or None when no new
# sample is due (the sampler keeps its own pace; see `Reporter`).
SystemSampler = Callable[[], Mapping[str, float] | None]
SCALARS = ("loss", "step_time_s", "data_time_s", "samples_per_s", "tokens_per_s", "mfu", "lr")


@dataclass(frozen=True)
class Throughput:
    """What turns a step time into samples/s, tokens/s and MFU. MFU is the model FLOPs of a step
    per second on one device, over `peak_flops`, the peak of one device (`devices` share each
    step)."""

    batch_size: int
    tokens_per_sample: int | None = None
    flops_per_sample: float | None = None
    peak_flops: float | None = None
    devices: int = 1

    def rates(self, step_time: float) -> tuple[float, float | None, float | None]:
        """(samples/s, tokens/s, MFU) of a step that took `step_time` seconds."""
        samples = self.batch_size / step_time
        tokens = samples * self.tokens_per_sample if self.tokens_per_sample else None
        mfu = (samples * self.flops_per_sample / self.devices / self.peak_flops
               if self.flops_per_sample and self.peak_flops else None)
        return samples, tokens, mfu


@dataclass(frozen=True)
class CheckpointPolicy:
    """When a run checkpoints: every `every` steps (0: never periodically), after the last step,
    and when it stops early; only when `enabled`. Only the periodic saves may still be writing
    when training goes on."""

    steps: int
    every: int = 0
    enabled: bool = True

    @classmethod
    def of(cls, config: TrainConfig, enabled: bool) -> CheckpointPolicy:
        return cls(config.steps, config.checkpoint_every, enabled)

    def saves_after(self, step: int, stop: bool) -> bool:
        if not self.enabled:
            return False
        return stop or step + 1 == self.steps or bool(self.every and (step + 1) % self.every == 0)

    def waits_after(self, step: int, stop: bool) -> bool:
        """The save after `step` must be finished before going on (the process is about to exit)."""
        return stop or step + 1 == self.steps


def shows_progress(config: TrainConfig, is_main: bool) -> bool:
    """A progress bar on the main process, unless `config.progress` is off or LABKIT_NO_PROGRESS
    is set."""
    return config.progress and is_main and not os.environ.get("LABKIT_NO_PROGRESS")


class Reporter:
    """Turns a finished step's numbers into `StepMetrics` and reports them: the `MetricsLog`,
    `on_step(step, row)` on every process; on the main process TensorBoard scalars
    (`train/<key>`, and `system/<figure>` from the `system` sampler), the same values to W&B
    when `config.wandb_project` is set, and either the progress bar or, in a job
    (`labkit.core.joblog.json_lines`), one JSON log line per step whose fields are the step's
    figures and the latest system sample. A context manager: the bar, the event file and the
    W&B run close on exit; in a job, warnings raised inside become WARNING lines and an
    exception leaving it an ERROR line (a preemption or Ctrl-C: WARNING) on every process.

    `system()` is called after each step on the main process; it returns a fresh sample or
    None when none is due, so it sets its own pace (the latest sample rides on every line)."""

    def __init__(self, config: TrainConfig, throughput: Throughput, log: MetricsLog, *,
                 is_main: bool = True, start: int = 0, on_step: StepCallback | None = None,
                 system: SystemSampler | None = None):
        self.throughput = throughput
        self.log = log
        self.on_step = on_step
        self.config, self.is_main, self.start = config, is_main, start
        self.json_lines = joblog.json_lines(kernel=in_kernel())
        self._tensorboard_dir = config.tensorboard_dir if is_main else None
        self._bar_settings = ((config.steps, start, f"train {config.model}")
                              if shows_progress(config, is_main) and not self.json_lines else None)
        self._system = system if is_main else None
        self.sample: dict[str, float] = {}  # the latest system sample
        self._writer = None
        self._wandb = None
        self._bar = None
        self._lines: joblog.StepLines | None = None
        self._exits = contextlib.ExitStack()

    def __enter__(self) -> Reporter:
        try:
            self._open()
        except BaseException as e:  # what opened before the failure is closed again
            self.__exit__(type(e), e, e.__traceback__)
            raise
        return self

    def _open(self) -> None:
        if self.json_lines:
            self._exits.enter_context(joblog.warnings_as_lines())
        if self._tensorboard_dir:
            from labkit.core.scalars import ScalarWriter

            self._writer = ScalarWriter(self._tensorboard_dir)
        if self.is_main and self.config.wandb_project:
            from labkit.core import wandb_scalars

            self._wandb = wandb_scalars.open_run(self.config.wandb_project, asdict(self.config))
        if self._bar_settings is not None:
            total, initial, desc = self._bar_settings
            self._bar = progress(total, desc, unit="step", initial=initial, is_main=True)
        if self.json_lines and self.is_main:
            self._lines = joblog.StepLines(self.config.steps, f"train {self.config.model}")
            joblog.emit(self._start_message(), event="start", steps=self.config.steps, start=self.start,
                        tensorboard_dir=self._tensorboard_dir, wandb_project=self.config.wandb_project)

    def _start_message(self) -> str:
        c = self.config
        where = f"; TensorBoard scalars in {c.tensorboard_dir}" if c.tensorboard_dir else ""
        return (f"train {c.model} ({c.framework}): steps {self.start}..{c.steps - 1}, global batch "
                f"{c.batch_size}{where}")

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self.json_lines and exc is not None:
                self._report_exit(exc)
            if self._bar is not None:
                self._bar.close()
            if self._wandb is not None:
                self._wandb.close(failed=exc is not None and not isinstance(exc, Preempted))
            if self._writer is not None:
                self._writer.close()
        finally:
            self._exits.close()

    def _report_exit(self, exc: BaseException) -> None:
        """The line of a run that ends early: WARNING for a stop that checkpointed (or Ctrl-C),
        ERROR for a failure; on every process, each replica's log says how it ended."""
        stopped = isinstance(exc, (Preempted, KeyboardInterrupt))
        last = self.log.steps[-1]["step"] if self.log.steps else None
        joblog.emit(f"{type(exc).__name__}: {exc}".rstrip(": "), "WARNING" if stopped else "ERROR",
                    event="stopped" if stopped else "error", step=last)

    def record(self, step: int, loss: float, step_time: float, *, data_time: float | None = None,
               lr: float | None = None, skipped: bool = False,
               peak_memory: int | None = None) -> dict[str, Any]:
        """Report one step; returns its metrics row. Raises FloatingPointError after reporting a
        loss that is NaN or infinite."""
        samples, tokens, mfu = self.throughput.rates(step_time)
        row = self.log.append(StepMetrics(
            step=step, loss=loss, step_time_s=step_time, data_time_s=data_time,
            samples_per_s=samples, tokens_per_s=tokens, mfu=mfu, peak_memory_bytes=peak_memory,
            lr=lr, skipped=skipped))
        if self.on_step is not None:
            self.on_step(step, row)
        values = {f"train/{k}": row[k] for k in SCALARS if row.get(k) is not None}
        fresh = self._system() if self._system is not None else None
        if fresh:
            self.sample = dict(fresh)
            values.update((f"system/{k}", v) for k, v in fresh.items())
        if self._writer is not None:
            self._writer.add(step, values)
        if self._wandb is not None:
            self._wandb.add(step, values)
        if self._lines is not None:
            self._lines.write(row, self.sample)
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at step {step}")
        return row


def write_metrics(log: MetricsLog, path: str | None, final_entries: dict[str, Any] | None = None) -> None:
    """Write the metrics file (when this process has one), with `final_entries` added to its
    `run` section first. Inside a hyperparameter-tuning trial the trial's metric is reported
    too, the way Vertex's tuning service reads it: one measurement per evaluation (each write
    comes with a checkpoint or the end of the run)."""
    if final_entries:
        log.run.update(final_entries)
    if path:
        log.write(path)
        metric = hypertune.tuning_metric()
        if metric:
            hypertune.report_latest(log.to_dict(), metric)


def already_complete(log: MetricsLog, path: str | None, checkpointed: int | None = None) -> MetricsLog:
    """The log of a run whose checkpoint holds its last step: the metrics file of the run that
    trained them, kept as it is (a fresh file would list no steps), or `log` when there is none;
    either way marked `already_complete`, with the `checkpointed_steps` when known."""
    if path and os.path.exists(path):
        try:
            log = MetricsLog.read(path)
        except (OSError, ValueError):
            pass  # not a metrics file after all: still not overwritten
    log.run["already_complete"] = True
    if checkpointed is not None:
        log.run["checkpointed_steps"] = checkpointed
    return log


def begin(log: MetricsLog, metrics_path: str | None, start: int) -> None:
    """A run about to train steps `start` …: record where it resumed, and keep the earlier
    attempt's steps before `start` from its metrics file (`MetricsLog.continue_from`)."""
    log.run["resumed_from_step"] = start - 1 if start else None
    log.continue_from(metrics_path, start)


class StepClock:
    """Wall time from one step's report to the next: each step's time includes the host work
    around it (fetching its batch, reading its loss); `paused()` leaves out work that is no
    step's (a held-out evaluation)."""

    def __init__(self) -> None:
        self._last = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        seconds, self._last = now - self._last, now
        return seconds

    @contextlib.contextmanager
    def paused(self):
        t = time.perf_counter()
        try:
            yield
        finally:
            self._last += time.perf_counter() - t


def timed(fetch: Callable[[], Any]) -> tuple[Any, float]:
    """`fetch()`'s result and the seconds it took (a step's data time)."""
    t = time.perf_counter()
    value = fetch()
    return value, time.perf_counter() - t


def save_checkpoint(save: Callable[[int, bool], None], step: int, *, wait: bool, stop: bool,
                    guard: PreemptionGuard, on_failed_stop: Callable[[], None]) -> None:
    """`save(step, wait)`. When the save of a stop fails the process is about to exit:
    `on_failed_stop()` keeps what can be kept (the metrics of the steps that ran) and the
    error says that this stop has no checkpoint (a rerun resumes from the previous one)."""
    try:
        save(step, wait)
    except OSError as e:
        if not stop:
            raise
        with contextlib.suppress(OSError):
            on_failed_stop()
        raise type(e)(f"stopped by {guard.reason} during step {step}, but its checkpoint "
                      f"failed: {e}") from e


def stopped(guard: PreemptionGuard, step: int, saved: bool) -> Preempted:
    """The `Preempted` to raise after the checkpoint of a stop at `step`; the signal's earlier
    handler (a notebook kernel's Ctrl-C) runs first."""
    guard.chain()
    return Preempted(step, guard.reason, saved=saved)


@contextlib.contextmanager
def saves_joined(saver: Any):
    """Around a run's steps: the save still in flight (`saver.wait()`) is joined when they end.
    A run that is already ending with an error (a stop, a diverged loss) keeps that error; the
    save's own failure is then a warning. `saver` None: nothing to join."""
    try:
        yield
    except BaseException:
        if saver is not None:
            try:
                saver.wait()
            except Exception as e:  # noqa: BLE001 - reported, the run's own error goes on
                warnings.warn(f"the checkpoint written in the background failed too: {e}", stacklevel=3)
        raise
    if saver is not None:
        saver.wait()


def evaluates_at_checkpoints() -> bool:
    """Held-out loss is measured after the last step; at checkpoints too inside a tuning trial
    that optimises it (the median stopping rule compares trials at each report)."""
    return hypertune.tuning_metric() == "heldout_loss"


def keep_heldout(log: MetricsLog, found: dict[str, Any]) -> None:
    """A held-out evaluation's entries in the `run` section and on the last step's row."""
    if found:
        log.run.update(found)
        if log.steps:
            log.steps[-1]["heldout_loss"] = found["heldout"]["loss"]
