"""The code on the page: a recipe's source shown from its file, run, and its loss curve laid over
the engine's with the largest difference computed.

    show("ddp")                                   # syntax-highlighted source of labkit/recipes/ddp.py
    cmp = compare("ddp", ["--model", "gpt", "--steps", "20", "--batch-size", "32"], nproc=2)
    plot(cmp); cmp.max_abs_diff                   # recipe vs `labkit train`, step by step

Recipes run as their own processes exactly as a learner runs them (`python -m labkit.recipes.NAME`,
torchrun for ddp and fsdp, one process per worker with a TF_CONFIG for tf_multiworker); the
engine runs the same settings (`labkit.recipes.common.engine_config_from_argv`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from labkit.core.metrics import load_metrics
from labkit.core.train_config import PREEMPTED_EXIT_CODE

RECIPE_DIR = Path(__file__).resolve().parents[1] / "recipes"
# name -> (framework, how several processes are started: "torchrun", "tf_config" or None)
TRAINING_RECIPES = {
    "ddp": ("torch", "torchrun"),
    "fsdp": ("torch", "torchrun"),
    "zero": ("torch", "torchrun"),
    "deepspeed_zero": ("torch", "torchrun"),
    "tensor_parallel": ("torch", "torchrun"),
    "pipeline": ("torch", "torchrun"),
    "mixed_precision": ("torch", None),
    "preemptible": ("torch", None),
    "profile": ("torch", None),
    "tfrecord_pipeline": ("torch", None),
    "keras_mixed_precision": ("tf", None),
    "tf_multiworker": ("tf", "tf_config"),
}
RECIPES = (*TRAINING_RECIPES, "vertex_job")
MAX_RESTARTS = 5  # a preemptible run is restarted after each drill, as Vertex restarts a job


def _check(name: str) -> Path:
    path = RECIPE_DIR / f"{name}.py"
    if name not in RECIPES or not path.is_file():
        raise ValueError(f"recipe {name!r} is not one of {', '.join(RECIPES)}")
    return path


def source(name: str) -> str:
    """The recipe's file, as it is on disk."""
    return _check(name).read_text(encoding="utf-8")


def show(name: str):
    """The recipe's source, syntax-highlighted in a notebook (plain text elsewhere)."""
    from IPython.display import Code

    return Code(source(name), language="python")


def lines_of_code(name: str) -> int:
    """Non-blank lines of the recipe that are not comments or the module docstring."""
    import ast

    text = source(name)
    tree = ast.parse(text)
    doc = tree.body[0] if tree.body and isinstance(tree.body[0], ast.Expr) else None
    skip = set(range(doc.lineno, doc.end_lineno + 1)) if doc else set()
    return sum(1 for i, line in enumerate(text.splitlines(), 1)
               if i not in skip and line.strip() and not line.strip().startswith("#"))


@dataclass
class RecipeRun:
    """One run of a recipe: its command lines, exit codes, output and per-step metrics (all
    restarts of a preempted run joined)."""

    name: str
    argv: list[str]
    returncodes: list[int]
    output: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    run: dict[str, Any] = field(default_factory=dict)

    @property
    def losses(self) -> list[float]:
        return [s["loss"] for s in self.steps]


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    root = str(RECIPE_DIR.parents[1])  # the processes import this labkit
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG"):
        env.pop(name, None)  # an enclosing job's cluster must not leak into the recipe
    env.update(extra or {})
    return env


def _launch(name: str, argv: list[str], nproc: int, timeout_s: float) -> tuple[list[int], str]:
    framework, launcher = TRAINING_RECIPES.get(name, ("torch", None))
    module = f"labkit.recipes.{name}"
    if nproc > 1 and launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", "-m", module, *argv]
        r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout_s)
        return [r.returncode], r.stdout + r.stderr
    if nproc > 1 and launcher == "tf_config":
        from labkit.tf.launch import LaunchConfig, tf_configs, worker_env

        procs = [subprocess.Popen([sys.executable, "-m", module, *argv],
                                  env=_env(worker_env(tfc, LaunchConfig())), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
                 for tfc in tf_configs(nproc)]
        try:
            outputs = [p.communicate(timeout=timeout_s)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return [p.returncode for p in procs], "\n".join(outputs)
    if nproc > 1:
        raise ValueError(f"nproc: recipe {name!r} runs as one process (got nproc={nproc})")
    r = subprocess.run([sys.executable, "-m", module, *argv], env=_env(), capture_output=True,
                       text=True, timeout=timeout_s)
    return [r.returncode], r.stdout + r.stderr


def run(name: str, argv: list[str], *, nproc: int = 1, timeout_s: float = 600.0) -> RecipeRun:
    """Run a training recipe with `argv` (`nproc` processes for ddp, fsdp and tf_multiworker)
    and read its metrics back. A run that exits 143 after a preemption drill is started again
    with the same flags, as Vertex restarts a preempted job, until it finishes."""
    _check(name)
    if name not in TRAINING_RECIPES:
        raise ValueError(f"recipe {name!r} does not train; see submit_locally for vertex_job")
    argv = list(argv)
    if "--metrics-out" not in argv:
        argv += ["--metrics-out", str(Path(tempfile.mkdtemp(prefix=f"recipe-{name}-")) / "m.json")]
    metrics_out = argv[argv.index("--metrics-out") + 1]
    result = RecipeRun(name, argv, [], "")
    for _ in range(MAX_RESTARTS + 1):
        codes, output = _launch(name, argv, nproc, timeout_s)
        result.returncodes += codes
        result.output += output
        if any(c not in (0, PREEMPTED_EXIT_CODE) for c in codes):
            raise RuntimeError(f"recipe {name} failed (exit codes {codes}):\n{output[-3000:]}")
        data = load_metrics(metrics_out)
        result.steps += data["steps"]
        result.run = data.get("run", {})
        if all(c == 0 for c in codes):
            return result
    raise RuntimeError(f"recipe {name} was still preempted after {MAX_RESTARTS} restarts")


@dataclass
class Comparison:
    """A recipe's per-step losses beside the engine's for the same settings."""

    recipe: RecipeRun
    engine_losses: list[float]
    precision: str

    @property
    def recipe_losses(self) -> list[float]:
        return self.recipe.losses

    @property
    def max_abs_diff(self) -> float:
        if len(self.recipe_losses) != len(self.engine_losses):
            raise ValueError(f"the recipe logged {len(self.recipe_losses)} steps, the engine "
                             f"{len(self.engine_losses)}")
        return max(abs(a - b) for a, b in zip(self.recipe_losses, self.engine_losses, strict=True))

    @property
    def tolerance(self) -> float:
        """What the tests hold a recipe to: 1e-5 in fp32 and tf32, 1e-3 in bf16 and fp16."""
        return 1e-5 if self.precision in ("fp32", "tf32") else 1e-3

    @property
    def equal(self) -> bool:
        return self.max_abs_diff <= self.tolerance


def engine_losses(name: str, argv: list[str], nproc: int = 1) -> tuple[list[float], str]:
    """`labkit train`'s per-step losses for a recipe's settings (`nproc` replicas), and the
    precision they ran in. Checkpointing and the drill are left out: an uninterrupted run."""
    from labkit.recipes.common import engine_config_from_argv
    from labkit.train import run_replicas, run_training

    framework = TRAINING_RECIPES[name][0]
    config = replace(engine_config_from_argv(argv, framework, recipe=name), checkpoint_dir=None,
                     checkpoint_every=0, preempt_at=None, metrics_out=None)
    log = run_replicas(config, nproc) if nproc > 1 else run_training(config)
    return log.losses, config.precision


def compare(name: str, argv: list[str], *, nproc: int = 1, timeout_s: float = 600.0) -> Comparison:
    """Run the recipe, then the engine with the same settings; `.max_abs_diff` is the largest
    per-step loss difference."""
    recipe = run(name, argv, nproc=nproc, timeout_s=timeout_s)
    losses, precision = engine_losses(name, argv, nproc)
    return Comparison(recipe, losses, precision)


def plot(comparison: Comparison, ax=None):
    """The two loss curves on one axis, titled with the largest difference."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    steps = [s["step"] for s in comparison.recipe.steps]
    ax.plot(steps, comparison.engine_losses, "-", lw=3, alpha=0.4, label="labkit train (engine)")
    ax.plot(steps, comparison.recipe_losses, "o--", ms=3, label=f"recipe {comparison.recipe.name}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"largest difference {comparison.max_abs_diff:.2e} "
                 f"(tolerance {comparison.tolerance:.0e}, {comparison.precision})")
    ax.legend()
    return ax.figure


def submit_locally(argv: list[str], *, timeout_s: float = 120.0) -> dict[str, Any]:
    """Run the vertex_job recipe against a local fake of Vertex AI's JobService: the request the
    real client library sent (as the fake recorded it), the states the recipe polled, its output."""
    from labkit.vertex.fake_service import FakeVertex

    with FakeVertex() as fake:
        cmd = [sys.executable, "-m", "labkit.recipes.vertex_job", "--endpoint", fake.endpoint,
               "--wait", "--poll-seconds", "0.05", *argv]
        r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout_s)
        if r.returncode:
            raise RuntimeError(f"vertex_job failed (exit {r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        created = fake.created()
        states = [line.split()[-1] for line in r.stdout.splitlines() if " JOB_STATE_" in line]
    return {"request": created[-1] if created else None, "states": states, "output": r.stdout}
