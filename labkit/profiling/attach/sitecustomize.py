"""Run at start-up by every Python process of a command that `labkit profile -- COMMAND` runs
(this folder is first on its PYTHONPATH): the first process that steps a torch optimizer is
profiled, with no edit to its code.

When ``torch.optim.optimizer`` is imported, a global optimizer-step hook is registered
(`torch.optim.optimizer.register_optimizer_step_post_hook`, a public PyTorch API): every
``optimizer.step()`` ends one training step. From the first step on, torch.profiler records
with Python stacks; `LABKIT_PROFILE_WARMUP` steps are traced and dropped (one-off costs), the
next `LABKIT_PROFILE_STEPS` are kept. The Chrome trace goes to ``$LABKIT_PROFILE_OUT/trace.json``
(and a copy for TensorBoard's profiler plugin), and ``profiled.json`` says it is ready, with
what this process's DataLoaders look like; `labkit profile` then stops the command or lets it
run on. Only one process profiles: rank 0 of a distributed run, never a DataLoader worker or a
second program the command starts. The sitecustomize this one shadows, if any, runs afterwards.
"""

import importlib.machinery
import importlib.util
import json
import os
import socket
import sys
import time

_OUT = os.environ.get("LABKIT_PROFILE_OUT")


def _rank_zero() -> bool:
    return os.environ.get("RANK", "0") in ("", "0") and os.environ.get("LOCAL_RANK", "0") in ("", "0")


def _claim() -> bool:
    """Whether this process profiles: the first to step an optimizer (a file created once)."""
    try:
        fd = os.open(os.path.join(_OUT, "owner.pid"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except OSError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def _loaders() -> list:
    """The DataLoaders alive in this process: what feeds the steps."""
    import gc
    import inspect
    import warnings

    try:
        from torch.utils.data import DataLoader
    except ImportError:
        return []
    out = []
    with warnings.catch_warnings():  # isinstance() on deprecated torch objects warns
        warnings.simplefilter("ignore")
        objects = [obj for obj in gc.get_objects() if isinstance(obj, DataLoader)]
    for obj in objects:
        dataset = type(obj.dataset)
        try:
            where = f"{inspect.getsourcefile(dataset)}:{inspect.getsourcelines(dataset)[1]}"
        except (TypeError, OSError):
            where = ""
        out.append({"dataset": dataset.__qualname__, "defined_at": where, "num_workers": obj.num_workers,
                    "batch_size": obj.batch_size, "pin_memory": bool(obj.pin_memory),
                    "prefetch_factor": obj.prefetch_factor})
    return out


class _Stepper:
    """The optimizer-step hook: starts the profiler, steps it, writes the trace when done."""

    def __init__(self) -> None:
        self.warmup = int(os.environ.get("LABKIT_PROFILE_WARMUP", "2"))
        self.active = int(os.environ.get("LABKIT_PROFILE_STEPS", "5"))
        self.prof = None
        self.steps = 0
        self.done = False
        self.exiting = False
        self.started = time.time()

    def __call__(self, optimizer, args, kwargs) -> None:
        if self.done:
            return
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        self.steps += 1
        if self.prof is None:
            if not _claim():  # another process of the command is the one profiled
                self.done = True
                return
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            import warnings

            warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
            self.prof = profile(activities=activities, with_stack=True,
                                schedule=schedule(wait=0, warmup=self.warmup, active=self.active, repeat=1),
                                on_trace_ready=self._ready)
            self.prof.start()
            return
        self.prof.step()

    def _ready(self, prof) -> None:
        trace = os.path.join(_OUT, "trace.json")
        prof.export_chrome_trace(trace)
        board = os.path.join(_OUT, "tensorboard")
        os.makedirs(board, exist_ok=True)
        name = f"{socket.gethostname()}_{os.getpid()}.{time.time_ns() // 1_000_000}.pt.trace.json"
        with open(trace, "rb") as src, open(os.path.join(board, name), "wb") as dst:
            dst.write(src.read())
        self.done = True
        info = {"pid": os.getpid(), "trace": trace, "tensorboard": board, "warmup": self.warmup,
                "active": self.active, "steps_seen": self.steps, "complete": not self.exiting,
                "seconds_to_ready": time.time() - self.started,
                "argv": sys.argv, "cwd": os.getcwd(), "loaders": _loaders()}
        tmp = os.path.join(_OUT, "profiled.json.tmp")
        with open(tmp, "w") as f:
            json.dump(info, f, default=str)
        os.replace(tmp, os.path.join(_OUT, "profiled.json"))

    def stop(self) -> None:
        """At exit: a run that ended before its steps were recorded flushes what it has,
        marked incomplete."""
        if self.prof is not None and not self.done:
            self.exiting = True
            try:
                self.prof.stop()
            except Exception:  # noqa: BLE001 - never fail the user's program at exit
                pass


class _WhenOptimizerImported:
    """An import finder that registers the hook once torch.optim.optimizer is loaded."""

    name = "torch.optim.optimizer"

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            stepper = _Stepper()
            module.register_optimizer_step_post_hook(stepper)
            import atexit

            atexit.register(stepper.stop)

        spec.loader.exec_module = exec_module
        sys.meta_path.remove(self)
        return spec


if _OUT and os.path.isdir(_OUT) and _rank_zero() and not os.path.exists(os.path.join(_OUT, "owner.pid")):
    sys.meta_path.insert(0, _WhenOptimizerImported())


def _run_shadowed() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_run_shadowed()
