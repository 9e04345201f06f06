"""The training loop both engines run, without torch or TensorFlow.

`run(config, engine, log, start=..., role=..., throughput=...)` drives optimizer steps `start` …
`config.steps - 1` and owns everything about them that is not framework maths:

- cadence: fetch the step's input (timed: the step's data time), dispatch the step, read its
  loss, at once or, with `read_loss_late`, once the next step is dispatched (the host never
  waits for the device between steps);
- the preemption drill: at `config.preempt_at` the process sends itself SIGTERM mid-step;
- the one SIGTERM guard (`labkit.core.preemption.PreemptionGuard`): a requested stop goes into
  the step, the engine reports the stop its processes agreed on, and every process checkpoints
  and raises `Preempted` at that step;
- checkpoint cadence (`CheckpointPolicy`): every `checkpoint_every` steps, after the last step
  and on a stop; periodic saves may finish in the background, the last one and a preemption's
  are waited for;
- metrics (`Reporter`): loss, step and data time, samples/s, tokens/s, MFU, peak memory, LR,
  skipped steps into the `MetricsLog`, the `on_step` callback, TensorBoard scalars and a progress
  bar (main process; `labkit.core.progress`: a widget in JupyterLab, text when headless); a
  loss that is NaN or infinite raises FloatingPointError naming the step. In a Vertex AI job
  (`labkit.core.joblog`) the bar gives way to one JSON log line per step with the step's
  figures as fields, and warnings and a failure become WARNING and ERROR lines. A `system`
  sampler (the engine's: GPU utilisation and memory, `labkit.torch.gpu_samples`) adds
  `system/<figure>` scalars and fields; W&B gets the same scalars when `wandb_project` is set
  (`labkit.core.wandb_scalars`);
- the metrics file, written by this process when `role.metrics_path` is set: at each
  checkpoint, on a stop and at the end. A resumed run keeps the earlier attempt's steps before
  the resumed one from that file (`MetricsLog.continue_from`), so after a preemption and a
  rerun of the same command the file holds every step once. A run resumed from the checkpoint
  of its last step has nothing to train: it leaves the metrics file of the run that trained
  those steps as it is and returns that log, marked `already_complete` (with
  `checkpointed_steps`, which may exceed this run's `steps`).

An engine supplies only what is framework-specific, as an `Engine` of plain callables. It
restores its state before calling `run` (it needs the resume step to position its input) and
passes the step to continue from as `start`.

The parts are public for loops that cannot hand their steps over one at a time: the TF
parameter-server loop (steps run in windows) and the Keras `model.fit` loop (callbacks) use
`PreemptionGuard`, `CheckpointPolicy`, `Reporter` and `write_metrics` directly.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
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
class StepOutcome:
    """What a finished step reports: its loss (the mean over replicas), whether the processes
    agreed to stop after it, and whether fp16 overflow skipped its update."""

    loss: float
    stop: bool = False
    skipped: bool = False


def _nothing() -> None:
    return None


def _no_entries() -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Engine:
    """What an engine supplies to `run`; each is called on every process.

    - `next_batch()`: the input of the next step (placed where the step reads it);
    - `run_step(batch, stop_requested)`: dispatch one optimizer step and return a handle to its
      results without waiting for them; `stop_requested` is this process's SIGTERM flag, for
      engines that agree on it across processes inside the step;
    - `read_step(handle)`: the step's `StepOutcome` (may wait for the device); with several
      processes `stop` must be the agreed flag, the same on every process;
    - `lr(step)`: the learning rate step `step` uses (read before it is dispatched);
    - `save(step, wait)`: checkpoint the state after `step` (None: this run keeps none); with
      `wait=False` it may return before the write finishes;
    - `wait_for_saves()`: join a save still in flight, re-raising its error;
    - `peak_memory()`: peak bytes of the device (or process) so far, None if unknown;
    - `final_run_info()`: entries for the metrics `run` section, added before its last write;
    - `evaluate()`: after the last step (not after a stop or a divergence), and after each
      checkpoint in a tuning trial whose metric is `heldout_loss`: entries for the `run` section
      measured on held-out data (`{"heldout": {"loss": ...}}`).
    """

    next_batch: Callable[[], Any]
    run_step: Callable[[Any, bool], Any]
    read_step: Callable[[Any], StepOutcome]
    lr: Callable[[int], float]
    save: Callable[[int, bool], None] | None = None
    wait_for_saves: Callable[[], None] = _nothing
    peak_memory: Callable[[], int | None] = _nothing
    final_run_info: Callable[[], dict[str, Any]] = _no_entries
    evaluate: Callable[[], dict[str, Any]] = _no_entries


@dataclass(frozen=True)
class ProcessRole:
    """Where this process sits. `is_main` (rank 0, the TF chief) shows progress and writes
    TensorBoard; `processes > 1` means stop flags count only as the engine agreed them;
    `metrics_path` is the file this process writes (None: none)."""

    is_main: bool = True
    processes: int = 1
    metrics_path: str | None = None


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


@dataclass
class _Dispatched:
    """A step whose results have not been read yet."""

    step: int
    handle: Any
    data_time: float
    lr: float


class _Driver:
    """The state of one `run`: the step awaiting its read (with `read_loss_late`) and the clock."""

    def __init__(self, config: TrainConfig, engine: Engine, reporter: Reporter,
                 guard: PreemptionGuard, role: ProcessRole, read_loss_late: bool):
        self.config, self.engine, self.reporter = config, engine, reporter
        self.guard, self.role, self.late = guard, role, read_loss_late
        self.save = engine.save
        self.policy = CheckpointPolicy.of(config, enabled=self.save is not None)
        self.waiting: _Dispatched | None = None
        self.clock = time.perf_counter()
        # Held-out loss is measured after the last step; at checkpoints too inside a tuning
        # trial that optimises it (the median stopping rule compares trials at each report).
        self.evaluates_at_checkpoints = hypertune.tuning_metric() == "heldout_loss"

    def step(self, step: int) -> None:
        """Run optimizer step `step`; raises `Preempted` once it is checkpointed after a stop."""
        if step == self.config.preempt_at:
            self.guard.trigger()  # the drill: SIGTERM to ourselves, mid-step
        t = time.perf_counter()
        batch = self.engine.next_batch()
        data_time = time.perf_counter() - t
        lr = self.engine.lr(step)
        dispatched = _Dispatched(step, self.engine.run_step(batch, self.guard.requested), data_time, lr)
        if self.late:
            self.drain()  # the previous step: its loss is ready or nearly so
            self.waiting = dispatched
            stop = self.guard.requested  # one process: nothing to agree on
        else:
            stop = self.finish(dispatched)
        save = self.policy.saves_after(step, stop)
        if save or stop or step + 1 == self.config.steps:
            self.drain()
        if save and self.save is not None:
            try:
                self.save(step, self.policy.waits_after(step, stop))
            except OSError as e:
                if not stop:
                    raise
                # The process is about to exit: say that this stop has no checkpoint, and keep
                # the metrics of the steps that ran (a rerun resumes from the previous one).
                with contextlib.suppress(OSError):
                    self.write_metrics(final=True)
                raise type(e)(f"stopped by {self.guard.reason} during step {step}, but its "
                              f"checkpoint failed: {e}") from e
        if stop:
            self.write_metrics(final=True)
            self.guard.chain()
            raise Preempted(step, self.guard.reason, saved=self.save is not None)
        if save:
            if step + 1 < self.config.steps and self.evaluates_at_checkpoints:
                self.evaluate()  # the trial reports held-out loss at every checkpoint
            self.write_metrics()

    def evaluate(self) -> None:
        """The engine's held-out evaluation after the step just read: kept in the `run` section
        and on that step's row (`heldout_loss`); its time is left out of the next step's."""
        t = time.perf_counter()
        found = self.engine.evaluate()
        if found:
            log = self.reporter.log
            log.run.update(found)
            if log.steps:
                log.steps[-1]["heldout_loss"] = found["heldout"]["loss"]
        self.clock += time.perf_counter() - t

    def finish(self, d: _Dispatched) -> bool:
        """Read a dispatched step, report it; returns whether to stop after it."""
        outcome = self.engine.read_step(d.handle)
        now = time.perf_counter()
        step_time, self.clock = now - self.clock, now
        self.reporter.record(d.step, outcome.loss, step_time, data_time=d.data_time, lr=d.lr,
                             skipped=outcome.skipped, peak_memory=self.engine.peak_memory())
        # Several processes must stop at the same step: only the agreed flag counts. A lone
        # process also acts on a SIGTERM that arrived during the step.
        return outcome.stop or (self.role.processes == 1 and self.guard.requested)

    def drain(self) -> None:
        if self.waiting is not None:
            waiting, self.waiting = self.waiting, None
            self.finish(waiting)

    def write_metrics(self, final: bool = False) -> None:
        write_metrics(self.reporter.log, self.role.metrics_path,
                      self.engine.final_run_info() if final else None)


def run(config: TrainConfig, engine: Engine, log: MetricsLog, *, start: int = 0,
        role: ProcessRole | None = None, throughput: Throughput | None = None,
        on_step: StepCallback | None = None, read_loss_late: bool = False,
        system: SystemSampler | None = None) -> MetricsLog:
    """Train steps `start` … `config.steps - 1` with `engine`; returns `log` (also written to
    `role.metrics_path`). Raises `Preempted` after checkpointing when SIGTERM arrives (or at
    `config.preempt_at`), FloatingPointError when a loss is NaN or infinite. `read_loss_late`
    (one process only) reads each step's results once the next step is dispatched, so
    `on_step` sees a step one step later. `system`: the machine's sampler (`Reporter`)."""
    if read_loss_late and role is not None and role.processes > 1:
        raise ValueError("read_loss_late needs a single process: replicas agree on each step's "
                         "stop flag before the next step")
    role = role or ProcessRole()
    if start >= config.steps:
        return already_complete(log, role.metrics_path, start)
    log.run["resumed_from_step"] = start - 1 if start else None
    log.continue_from(role.metrics_path, start)
    throughput = throughput or Throughput(config.batch_size)
    try:
        with PreemptionGuard() as guard, Reporter(config, throughput, log, is_main=role.is_main, start=start,
                                                  on_step=on_step, system=system) as reporter:
            driver = _Driver(config, engine, reporter, guard, role, read_loss_late)
            try:
                for step in range(start, config.steps):
                    driver.step(step)
            except FloatingPointError:
                driver.write_metrics(final=True)  # the file shows the step that diverged
                raise
    finally:
        engine.wait_for_saves()
    driver.evaluate()
    driver.write_metrics(final=True)
    return log
