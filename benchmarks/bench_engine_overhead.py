"""Engine overhead: `labkit train` against the plain recipe loop, same settings, in one command.

    python benchmarks/bench_engine_overhead.py                     # cnn and gpt, 5 runs each
    python benchmarks/bench_engine_overhead.py --runs 7 --json benchmarks/results/DATE-cpu-engine-overhead.json
    python benchmarks/bench_engine_overhead.py --baseline /path/to/older/checkout   # + labkit then vs now

The peer is `python -m labkit.recipes.mixed_precision` (fp32): a plain single-process torch loop
with the same model, synthetic data, sampler order, AdamW, warm-up schedule and gradient clipping
as `labkit train`, whose per-step losses the tests prove equal. Both run on the CPU at smoke
sizes with their defaults (batch 32, clipping at 1.0), one torch thread each (`--threads`).

Every variant runs in a process of its own, and the processes of one run take turns step by
step: after each step a process hands over and waits until every other process has run its next
step (the order rotates every step), so each step runs alone on this side of the machine and
adjacent steps of two variants see the same machine. One untimed warm-up run of every variant
comes first, then `--runs` runs, each with fresh processes. Inside a process both loops record
each step through `labkit.core.metrics.MetricsLog.append` (the engine's `Reporter`, the recipe's
`StepLog`): the child stamps the wall clock and the process's CPU time there and again when its
turn comes back, so a step's time is everything from one hand-over to the next recorded step:
input, step, loss read, and the reporting after the previous step's record (tqdm, TensorBoard).
The first `--skip` steps of each run are left out; a run's figure is the median of its steps.
Reported per variant: the median over runs and the spread (min-max), in wall-clock ms per step
and in CPU-ms per step (this process's CPU time, all its threads), which a busy machine disturbs
less than wall-clock time; ratios as ratios of those medians and as paired ratios (step k of one
variant over step k of the other, which ran right after each other; median over steps and runs).

Variants:
  recipe                the peer (`mixed_precision.main`), its own data path: one sample per
                        index, batched by DataLoader's default collate
  labkit                `labkit train --no-progress` (no TensorBoard): the like-for-like run
  labkit +progress      the same with the tqdm bar (written to a file, as in a job's log)
  labkit +tensorboard   the same with `--tensorboard-dir` (scalar events every step)
  data: engine          the engine's input alone (`ResumableLoader`, a batch built at once, then
                        `engine.to_device`), one batch per step
  data: recipe          the recipe's input alone (`common.batches`, then `common.to_device`)

The two data paths differ by design (same bytes, different construction), so the report gives
the whole step of each, what each data path costs alone, and the step less its own data path.
The benchmark also checks that `labkit train` and the recipe computed the same losses (1e-5).

What the engine's reporting adds to a step is far below what whole runs resolve on a busy
machine, so it is also measured alone: CPU-µs per `Reporter.record` call (the metrics row; with
the tqdm bar; with TensorBoard events; with both), in blocks that take turns, in a process of
its own per run. `--baseline` runs the labkit variants and that measurement with labkit
imported from another checkout too, in the same runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if "--child" not in sys.argv:  # a child imports labkit from its PYTHONPATH (this checkout or a baseline)
    sys.path.insert(0, str(REPO))

VARIANTS = ("recipe", "labkit", "labkit +progress", "labkit +tensorboard", "data: engine", "data: recipe")
BASELINE = "baseline "  # prefix of a variant that imports labkit from the --baseline checkout
REPORTING = ("none", "progress", "tensorboard", "progress + tensorboard")
LOSS_TOLERANCE = 1e-5  # fp32, as tests/recipes/test_torch.py
PROTOCOL = "@@bench "  # prefix of a child's lines to the orchestrator (the loops print too)


# ---------------------------------------------------------------------------------------------
# One variant, in its own process


class Turns:
    """A child's side of the step-by-step turns: `done(loss)` after each step stamps its end,
    hands over, waits for the turn to come back and stamps the next step's start."""

    def __init__(self):
        self.starts: list[tuple[float, float] | None] = [None]  # step 0 starts before any hook
        self.ends: list[tuple[float, float]] = []
        self.losses: list[float] = []

    @staticmethod
    def _now() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    def start(self) -> None:
        self.starts[-1] = self._now()

    def done(self, loss: float | None = None) -> None:
        self.ends.append(self._now())
        if loss is not None:
            self.losses.append(loss)
        print(PROTOCOL + "step", flush=True)
        if sys.stdin.readline().strip() != "go":
            raise SystemExit("the orchestrator went away")
        self.starts.append(self._now())

    def result(self) -> dict:
        steps = [(s, e) for s, e in zip(self.starts, self.ends, strict=False) if s is not None]
        return {"wall": [e[0] - s[0] for s, e in steps], "cpu": [e[1] - s[1] for s, e in steps],
                "first_timed_step": len(self.ends) - len(steps), "losses": self.losses}


def _take_turns_at_every_recorded_step(turns: Turns) -> None:
    """Both loops record every step (the engine through `MetricsLog.append`, a recipe through
    its `StepLog.log`): the stamp and hand-over go there."""
    from labkit.core.metrics import MetricsLog

    record = MetricsLog.append

    def recorded(self, metrics):
        row = record(self, metrics)
        turns.done(metrics.loss)
        return row

    MetricsLog.append = recorded
    try:  # a recipe records its steps in its own plain log (copyable recipes import no labkit)
        from labkit.recipes.common import StepLog
    except ImportError:  # an older checkout: its recipes recorded through MetricsLog
        return
    log = StepLog.log

    def logged(self, step, loss, **kwargs):
        log(self, step, loss, **kwargs)
        turns.done(loss)

    StepLog.log = logged


def _data_only(kind: str, model: str, steps: int, batch: int, turns: Turns) -> None:
    import torch

    from labkit.recipes import common

    args = common.parse(common.parser("data"), ["--model", model, "--batch-size", str(batch)])
    if kind == "data: recipe":
        data = common.batches(common.torch_dataset(args), batch, args.seed)
        place = lambda b: common.to_device(b, torch.device("cpu"))  # noqa: E731
    else:
        from labkit.torch import engine
        from labkit.torch.data import ResumableLoader, make_dataset
        from labkit.torch.distributed import DistInfo

        config = common.engine_config(args)
        c = engine.build(config, DistInfo(), torch.device("cpu"))
        data = ResumableLoader(make_dataset(c.model_config, config.num_samples_or_default(), config.seed),
                               batch, seed=config.seed)
        place = lambda b: engine.to_device(b, c, False)  # noqa: E731
    turns.start()
    for _ in range(steps):
        place(next(data))
        turns.done()


def reporting_cost(workdir: str, calls: int = 2000, blocks: int = 7) -> dict[str, float]:
    """CPU-µs one `Reporter.record` call takes with each kind of reporting on (the metrics row;
    the tqdm bar, writing to a buffer; TensorBoard events, to `workdir`), in blocks of `calls`
    that take turns: what the engine's reporting adds to every step."""
    import contextlib
    import io

    from labkit.core import loop
    from labkit.core.metrics import MetricsLog
    from labkit.core.train_config import TrainConfig

    per_call: dict[str, list[float]] = {k: [] for k in REPORTING}
    for block in range(blocks):
        for kind in REPORTING:
            config = TrainConfig(steps=10 ** 9, progress="progress" in kind,
                                 tensorboard_dir=str(Path(workdir) / f"tb-{block}") if "tensorboard" in kind else None)
            with contextlib.redirect_stderr(io.StringIO()), \
                    loop.Reporter(config, loop.Throughput(32, 64, 1e9, 1e12), MetricsLog()) as reporter:
                t = time.process_time()
                for i in range(calls):
                    reporter.record(i, 1.0, 0.02, data_time=0.001, lr=1e-3, peak_memory=1 << 30)
                per_call[kind].append((time.process_time() - t) / calls * 1e6)
    return {k: statistics.median(v) for k, v in per_call.items()}


def child(variant: str, model: str, steps: int, batch: int, threads: int, workdir: str) -> int:
    import torch

    torch.set_num_threads(threads)
    if variant == "reporting":
        print(PROTOCOL + json.dumps(reporting_cost(workdir)), flush=True)
        return 0
    turns = Turns()
    flags = ["--model", model, "--steps", str(steps), "--batch-size", str(batch)]
    if variant == "recipe":
        from labkit.recipes import mixed_precision

        _take_turns_at_every_recorded_step(turns)
        mixed_precision.main(flags)
    elif variant.startswith("labkit"):
        from labkit.cli import main as labkit

        flags += ["--device", "cpu", "--progress" if variant == "labkit +progress" else "--no-progress"]
        if variant == "labkit +tensorboard":
            flags += ["--tensorboard-dir", str(Path(workdir) / "tb")]
        _take_turns_at_every_recorded_step(turns)
        if labkit(["train", *flags]) != 0:
            raise RuntimeError("labkit train failed")
    else:
        _data_only(variant, model, steps, batch, turns)
    print(PROTOCOL + json.dumps(turns.result()), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# The orchestrator


def _start(variant: str, model: str, a: argparse.Namespace, workdir: str) -> subprocess.Popen:
    code = a.baseline if variant.startswith(BASELINE) else str(REPO)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([code, os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    env.pop("LABKIT_NO_PROGRESS", None)  # the variants choose with --progress / --no-progress
    os.makedirs(workdir, exist_ok=True)
    log = tempfile.TemporaryFile()  # stderr (tqdm's bar, warnings): shown if the child fails
    proc = subprocess.Popen([sys.executable, __file__, "--child", variant.removeprefix(BASELINE), "--model", model,
                             "--steps", str(a.steps), "--batch-size", str(a.batch_size), "--threads",
                             str(a.threads), "--workdir", workdir], env=env, cwd=workdir, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
    proc.log = log
    return proc


def _next_message(proc: subprocess.Popen, variant: str) -> str:
    while True:
        line = proc.stdout.readline()
        if not line:
            code = proc.wait()
            proc.log.seek(0)
            raise RuntimeError(f"{variant} exited (code {code}):\n{proc.log.read().decode(errors='replace')[-3000:]}")
        if line.startswith(PROTOCOL):
            return line[len(PROTOCOL):].strip()


def one_run(variants: list[str], model: str, a: argparse.Namespace, workdir: str) -> dict[str, dict]:
    """One run of every variant, each in its own process, taking turns step by step."""
    procs = {v: _start(v, model, a, f"{workdir}/{i}") for i, v in enumerate(variants)}
    results: dict[str, dict] = {}
    try:
        for v in variants:
            _next_message(procs[v], v)  # step 0 done (start-up and step 0 overlap: neither is timed)
        turn = 0
        while len(results) < len(variants):
            k = turn % len(variants)
            for v in variants[k:] + variants[:k]:
                if v in results:
                    continue
                procs[v].stdin.write("go\n")
                procs[v].stdin.flush()
                message = _next_message(procs[v], v)
                if message != "step":
                    results[v] = json.loads(message)
            turn += 1
    finally:
        for p in procs.values():
            try:
                p.stdin.close()
                p.wait(timeout=120)
            except Exception:  # a child that hangs must not hang the benchmark
                p.kill()
    return results


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "each": [round(v, 3) for v in values]}


def bench_reporting(a: argparse.Namespace, workdir: str) -> dict:
    """`reporting_cost` in a process of its own per run (this checkout and the baseline taking turns)."""
    sources = ["", BASELINE] if a.baseline else [""]
    each: dict[str, list[dict]] = {src: [] for src in sources}
    for r in range(a.runs):
        for src in sources[r % len(sources):] + sources[:r % len(sources)]:
            proc = _start(src + "reporting", "cnn", a, f"{workdir}/reporting-{r}{src.strip()}")
            each[src].append(json.loads(_next_message(proc, src + "reporting")))
            proc.wait()
    return {(src or "this checkout").strip(): {k: _summary([run[k] for run in runs]) for k in REPORTING}
            for src, runs in each.items()}


def bench_model(model: str, a: argparse.Namespace, workdir: str) -> dict:
    variants = [v for v in VARIANTS if not a.only or any(s in v for s in a.only.split(","))]
    if a.baseline:
        variants += [BASELINE + v for v in variants if v.startswith("labkit")]
    print(f"{model}: warm-up run", flush=True)
    one_run(variants, model, a, f"{workdir}/{model}-warm-up")
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(a.runs):
        k = r % len(variants)  # the order of the first turn rotates from run to run
        out = one_run(variants[k:] + variants[:k], model, a, f"{workdir}/{model}-{r}")
        for v in variants:
            skip = max(0, a.skip - out[v]["first_timed_step"])
            wall, cpu = out[v]["wall"][skip:], out[v]["cpu"][skip:]
            runs[v].append({"wall_ms": 1000 * statistics.median(wall), "cpu_ms": 1000 * statistics.median(cpu),
                            "steps_wall_ms": [1000 * x for x in wall], "steps_cpu_ms": [1000 * x for x in cpu],
                            "losses": out[v]["losses"]})
        print(f"{model}: run {r + 1}/{a.runs}: " + ", ".join(
            f"{v} {runs[v][-1]['wall_ms']:.2f} ms ({runs[v][-1]['cpu_ms']:.2f} CPU-ms)" for v in variants), flush=True)
    if "labkit" in runs and "recipe" in runs:
        for ours, theirs in zip(runs["labkit"], runs["recipe"], strict=True):
            gap = max(abs(x - y) for x, y in zip(ours["losses"], theirs["losses"], strict=True))
            if gap > LOSS_TOLERANCE:
                raise AssertionError(f"{model}: labkit train and the recipe computed different losses (gap {gap:.3g})")
    rows = {v: {"wall_ms": _summary([x["wall_ms"] for x in rs]), "cpu_ms": _summary([x["cpu_ms"] for x in rs])}
            for v, rs in runs.items()}
    ratios = {}

    def ratio(name: str, top: str, bottom: str) -> None:
        if top not in runs or bottom not in runs:
            return
        ratios[name] = {}
        for kind in ("wall_ms", "cpu_ms"):
            per_run = [statistics.median(x / y for x, y in zip(t[f"steps_{kind}"], b[f"steps_{kind}"], strict=True))
                       for t, b in zip(runs[top], runs[bottom], strict=True)]
            ratios[name][kind] = {"of_medians": rows[top][kind]["median"] / rows[bottom][kind]["median"],
                                  "paired_median": statistics.median(per_run), "paired_each_run": per_run}

    ratio("labkit / recipe", "labkit", "recipe")
    ratio("labkit +progress / labkit", "labkit +progress", "labkit")
    ratio("labkit +tensorboard / labkit", "labkit +tensorboard", "labkit")
    ratio("data: engine / data: recipe", "data: engine", "data: recipe")
    for v in variants:
        if v.startswith(BASELINE):
            ratio(f"{v.removeprefix(BASELINE)} / {v}", v.removeprefix(BASELINE), v)
    less_data = {}
    for loop_name, data in (("labkit", "data: engine"), ("recipe", "data: recipe")):
        if loop_name in rows and data in rows:
            less_data[loop_name] = {k: rows[loop_name][k]["median"] - rows[data][k]["median"]
                                    for k in ("wall_ms", "cpu_ms")}
    if len(less_data) == 2:
        ratios["labkit / recipe, each less its own data path"] = {
            k: {"of_medians": less_data["labkit"][k] / less_data["recipe"][k]} for k in ("wall_ms", "cpu_ms")}
    for rs in runs.values():
        for x in rs:
            del x["losses"]
    return {"rows": rows, "ratios": ratios, "step_less_data_ms": less_data, "runs": runs}


def report(results: dict) -> str:
    lines = []
    for source, costs in results.get("reporting_us_per_step", {}).items():
        lines.append(f"Reporter.record, CPU-µs per step ({source}): " + ", ".join(
            f"{k} {v['median']:.1f} ({v['min']:.1f}-{v['max']:.1f})" for k, v in costs.items()))
    for model, r in results["models"].items():
        lines.append(f"\n{model} (smoke, batch {results['batch_size']}, {results['threads']} thread(s), "
                     f"{results['steps']} steps, first {results['skip']} left out)")
        lines.append(f"| {'variant':30s} | ms/step median (min-max) | CPU-ms/step median (min-max) |")
        lines.append(f"|{'-' * 32}|---|---|")
        for v, row in r["rows"].items():
            w, c = row["wall_ms"], row["cpu_ms"]
            lines.append(f"| {v:30s} | {w['median']:.2f} ({w['min']:.2f}-{w['max']:.2f}) | "
                         f"{c['median']:.2f} ({c['min']:.2f}-{c['max']:.2f}) |")
        for name, rr in r["ratios"].items():
            parts = []
            for kind, label in (("wall_ms", "wall"), ("cpu_ms", "CPU")):
                x = rr[kind]
                paired = f", paired {x['paired_median']:.3f}" if "paired_median" in x else ""
                parts.append(f"{label} {x['of_medians']:.3f}{paired}")
            lines.append(f"  {name}: " + "; ".join(parts))
    return "\n".join(lines)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _commit(path: Path) -> str:
    """The commit of a checkout ("abc1234 subject"), else the folder's name (never a full path)."""
    r = subprocess.run(["git", "-C", str(path), "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    return (r.stdout.strip()[:80] if r.returncode == 0 else "") or path.name


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["cnn", "gpt"], choices=["cnn", "gpt"])
    p.add_argument("--runs", type=int, default=5, help="timed runs of every variant (after a warm-up run)")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps per run")
    p.add_argument("--skip", type=int, default=5, help="leading steps of each run left out")
    p.add_argument("--batch-size", type=int, default=32, help="global batch (labkit train's default)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--only", default="", help="comma-separated substrings: run only matching variants "
                                              "('reporting' for the reporting cost)")
    p.add_argument("--json", help="write the results file here")
    p.add_argument("--baseline", help="a checkout of another labkit version: its labkit variants run too, "
                                      "in the same runs")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        return child(a.child, a.model, a.steps, a.batch_size, a.threads, a.workdir)
    if a.runs < 1 or a.steps <= a.skip + 1:
        p.error("--runs must be >= 1 and --steps larger than --skip + 1")
    import numpy
    import torch

    from labkit.core import devices

    args = list(argv if argv is not None else sys.argv[1:])
    if a.baseline:  # the results name the baseline by its commit, not by where it sat on this machine
        a.baseline = str(Path(a.baseline).resolve())
        args = [Path(x).name if x == a.baseline or x.startswith("--baseline=") else x for x in args]
    results = {
        "command": "python benchmarks/bench_engine_overhead.py " + shlex.join(args),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "device": {"cpu": devices.cpu_model(), "cores": os.cpu_count(), "kernel": platform.release()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
                     "tqdm": _version("tqdm"), "tensorboard": _version("tensorboard")},
        "this_checkout": _commit(REPO), "baseline": a.baseline and _commit(Path(a.baseline)), "runs": a.runs,
        "steps": a.steps, "skip": a.skip, "batch_size": a.batch_size, "threads": a.threads,
        "load_before": os.getloadavg(), "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as workdir:
        if not a.only or "reporting" in a.only:
            print("reporting cost per step", flush=True)
            results["reporting_us_per_step"] = bench_reporting(a, workdir)
        for model in a.models:
            if not a.only or any(v for v in VARIANTS if any(s in v for s in a.only.split(","))):
                results["models"][model] = bench_model(model, a, workdir)
    results["load_after"] = os.getloadavg()
    print(f"{results['device']['cpu']}, {results['device']['cores']} cores; load average "
          f"{results['load_before'][0]:.1f} before / {results['load_after'][0]:.1f} after; {results['date']}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items() if v))
    print(report(results))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
