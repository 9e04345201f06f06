"""The code on the page: a recipe's source shown from its file, run, and its loss curve laid over
the engine's with the largest difference computed.

    show("ddp")                                   # syntax-highlighted source of labkit/recipes/ddp.py
    argv = flags(model="gpt", steps=20, batch_size=32)
    print(command("ddp", argv, nproc=2))          # what a learner types
    cmp = compare("ddp", argv, nproc=2)           # the recipe, then `labkit train`, same settings
    plot(cmp)                                     # both curves on one axis
    cmp.agreement, curve_trend(cmp.recipe_losses) # the verdicts a notebook writes its sentence from
    show_mistake("mixed_precision", "softmax")    # a recipe's --mistake lines beside the right ones

Recipes run as their own processes exactly as a learner runs them (`python -m labkit.recipes.NAME`,
torchrun for ddp and fsdp, one process per worker with a TF_CONFIG for tf_multiworker); the
engine runs the same settings (`labkit.recipes.common.engine_config_from_argv`), or an engine
run the notebook already made is reused after checking that it trained those settings.
"""

from __future__ import annotations

import ast
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from labkit.core import precisions
from labkit.core.metrics import MetricsLog, load_metrics
from labkit.core.train_config import PREEMPTED_EXIT_CODE, TrainConfig

RECIPE_DIR = Path(__file__).resolve().parents[1] / "recipes"
# name -> (framework, how several processes are started: "torchrun", "tf_config" or None)
TRAINING_RECIPES = {
    "ddp": ("torch", "torchrun"),
    "fsdp": ("torch", "torchrun"),
    "sharded_checkpoint": ("torch", "torchrun"),
    "zero": ("torch", "torchrun"),
    "deepspeed_zero": ("torch", "torchrun"),
    "tensor_parallel": ("torch", "torchrun"),
    "pipeline": ("torch", "torchrun"),
    "elastic_ddp": ("torch", "torchrun"),
    "mixed_precision": ("torch", None),
    "preemptible": ("torch", None),
    "profile": ("torch", None),
    "attention": ("torch", None),
    "tfrecord_pipeline": ("torch", None),
    "keras_mixed_precision": ("tf", None),
    "keras_mirrored_fit": ("tf", None),  # one process; --devices N replicas inside it
    "tf_multiworker": ("tf", "tf_config"),
    # Asynchronous: its losses are labkit train's with one worker only; `run` it, not `compare`.
    "tf_parameter_server": ("tf", None),
}
RECIPES = (*TRAINING_RECIPES, "vertex_job", "hypertune_report", "jpeg_shards")
# The notebook whose "The code" section shows and runs each recipe.
NOTEBOOKS = {
    "ddp": "02_distribution_tf_vs_ddp", "keras_mirrored_fit": "02_distribution_tf_vs_ddp",
    "tf_multiworker": "02_distribution_tf_vs_ddp", "tf_parameter_server": "02_distribution_tf_vs_ddp",
    "tfrecord_pipeline": "03_input_pipelines", "mixed_precision": "04_mixed_precision",
    "keras_mixed_precision": "04_mixed_precision", "profile": "05_profiling",
    "vertex_job": "06_multi_node", "preemptible": "07_spot_and_preemption",
    "elastic_ddp": "07_spot_and_preemption", "fsdp": "08_memory", "attention": "08_memory",
    "zero": "10_model_parallelism", "deepspeed_zero": "10_model_parallelism",
    "tensor_parallel": "10_model_parallelism", "pipeline": "10_model_parallelism",
    "sharded_checkpoint": "10_model_parallelism",
    "hypertune_report": "11_hyperparameter_tuning", "jpeg_shards": "03_input_pipelines",
}
MAX_RESTARTS = 5  # a preemptible run is restarted after each drill, as Vertex restarts a job
# The settings that decide a run's losses: an engine run is reused for a comparison only when
# it trained with the recipe's values of all of them.
LOSS_FIELDS = ("framework", "model", "scale", "steps", "batch_size", "grad_accum", "lr",
               "warmup_steps", "scale_lr_with_world_size", "precision", "grad_clip", "seed",
               "num_samples")
# The flags every recipe takes, from the TrainConfig fields of the same name (common.parser).
COMMON_FLAGS = ("model", "scale", "steps", "batch_size", "lr", "warmup_steps", "grad_clip", "seed",
                "num_samples", "device")


def _check(name: str) -> Path:
    path = RECIPE_DIR / f"{name}.py"
    if name not in RECIPES or not path.is_file():
        raise ValueError(f"recipe {name!r} is not one of {', '.join(RECIPES)}")
    return path


def source(name: str) -> str:
    """The recipe's file, as it is on disk."""
    return _check(name).read_text(encoding="utf-8")


def show(name: str):
    """The recipe's source, syntax-highlighted in a notebook (plain text elsewhere), followed,
    folded under one line, by the source of every `common` helper it calls: everything the
    recipe runs can be read on the page. `show(name).folded()` folds the recipe itself under a
    line naming it, what it teaches and its length (a page showing several recipes one after
    another stays short; each is a click away). `show(name).changes_from(base)` marks the lines
    that recipe `base`, shown before it, does not have (see `new_lines`), as accelerate's
    by-feature examples mark their new code."""
    from IPython.display import Code

    class RecipeCode(Code):
        fold = False
        base: str | None = None

        def folded(self) -> RecipeCode:
            self.fold = True
            return self

        def changes_from(self, base: str) -> RecipeCode:
            _check(base)
            self.base = base
            return self

        def _repr_html_(self) -> str:
            html = super()._repr_html_() if self.base is None else self._marked_html()
            if self.fold:
                teaches = _docstring(name).split("\n\n")[0].replace("\n", " ")
                html = (f"<details><summary>recipes/{name}.py ({lines_of_code(name)} lines of code"
                        f"{self._changes_note()}): {teaches}</summary>{html}</details>")
            elif self.base is not None:
                html = f"<p>recipes/{name}.py{self._changes_note()}:</p>{html}"
            helpers = common_helpers(name)
            if not helpers:
                return html
            folded_helpers = Code("\n\n".join(helpers.values()), language="python")._repr_html_()
            return (html + f"<details><summary>recipes/common.py: the {len(helpers)} helpers this "
                    f"recipe calls ({', '.join(helpers)})</summary>{folded_helpers}</details>"
                    + _copy_note(name))

        def _changes_note(self) -> str:
            if self.base is None:
                return ""
            return (f"; highlighted, the {len(new_lines(name, self.base))} of its "
                    f"{len(self.data.splitlines())} lines that recipes/{self.base}.py does not have")

        def _marked_html(self) -> str:
            return _marked_html(self.data, self._get_lexer(), new_lines(name, self.base or name))

        def __repr__(self) -> str:  # plain text (papermill, a terminal): "+" before the new lines
            if self.base is None:
                return super().__repr__()
            return _marked_text(self.data, new_lines(name, self.base))

    return RecipeCode(source(name), language="python")


def new_lines(name: str, base: str) -> list[int]:
    """The numbers (from 1) of the non-blank lines of recipe `name` that recipe `base` does not
    have: inserted or changed where difflib matches the two files line by line."""
    return changed_lines(source(base), source(name))


def show_file(path: Path, base: Path | None = None):
    """Any source file (an example script), syntax-highlighted, with the lines `base` does not
    have marked as `show(...).changes_from(...)` marks a recipe's."""
    from IPython.display import Code

    text = Path(path).read_text(encoding="utf-8")
    marked = changed_lines(Path(base).read_text(encoding="utf-8"), text) if base is not None else []
    title = Path(path).name + (f"; highlighted, the {len(marked)} lines {Path(base).name} does not have"
                               if base is not None else "")

    class FileCode(Code):
        def _repr_html_(self) -> str:
            return f"<p>{title}:</p>" + _marked_html(self.data, self._get_lexer(), marked)

        def __repr__(self) -> str:
            return f"{title}:\n" + _marked_text(self.data, marked)

    return FileCode(text, language="python")


@dataclass(frozen=True)
class MistakeChange:
    """The lines a recipe runs under `--mistake NAME` (`removed`: the mistake) and the lines it
    runs otherwise (`added`: the fix), read from its file."""

    recipe: str
    mistake: str
    function: str  # where the lines are (a function of the recipe, or "module")
    removed: tuple[str, ...]
    added: tuple[str, ...]

    def text(self) -> str:
        """As a diff: "- " before the mistake's lines, "+ " before the fix's."""
        return "\n".join([*(f"- {ln}" for ln in self.removed), *(f"+ {ln}" for ln in self.added)])


def mistake_lines(name: str, mistake: str) -> MistakeChange:
    """Recipe `name`'s `if mistake == "MISTAKE":` block (the mistake, `args.mistake` too) and the
    lines that run instead: its `else` block or, without one, the statements after it in the same
    block (after a mistake that returns, the rest of the function)."""
    text = source(name)
    lines = text.splitlines()

    def is_the_mistake(node: ast.AST) -> bool:
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)):
            return False
        t = node.test
        left = t.left.id if isinstance(t.left, ast.Name) else getattr(t.left, "attr", None)
        return (left == "mistake" and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq)
                and isinstance(t.comparators[0], ast.Constant) and t.comparators[0].value == mistake)

    def segment(stmts: list[ast.stmt]) -> tuple[str, ...]:
        import textwrap

        return tuple(textwrap.dedent("\n".join(lines[stmts[0].lineno - 1:stmts[-1].end_lineno])).splitlines())

    for scope in ast.walk(ast.parse(text)):
        for block in (getattr(scope, "body", None), getattr(scope, "orelse", None)):
            for i, node in enumerate(block if isinstance(block, list) else []):
                if is_the_mistake(node):
                    instead = node.orelse or block[i + 1:]
                    where = getattr(scope, "name", "module")
                    return MistakeChange(name, mistake, where, segment(node.body), segment(instead))
    raise ValueError(f"recipe {name!r} has no `if mistake == {mistake!r}:` block")


def show_mistake(name: str, mistake: str):
    """A recipe's `--mistake` lines beside the lines it runs otherwise, as a diff (`mistake_lines`):
    the mistake marked "-", the fix "+" (`show_change`)."""
    change = mistake_lines(name, mistake)
    return show_change(f"recipes/{name}.py, {change.function}(): with --mistake {mistake} (-) and "
                       f"without (+)", change.text())


def show_change(title: str, diff: str):
    """`diff` ("- " before removed lines, "+ " before added ones) under `title`, highlighted as
    Python in a notebook with the added lines shaded (a diff lexer's two colours would hide the
    code's own); plain text elsewhere."""
    from IPython.display import Code
    from pygments.lexers import PythonLexer

    added = [i for i, line in enumerate(diff.splitlines(), 1) if line.startswith("+ ")]

    class ChangeCode(Code):
        def _repr_html_(self) -> str:
            return f"<p>{title}:</p>" + _marked_html(self.data, PythonLexer(), added)

        def __repr__(self) -> str:
            return f"{title}:\n{self.data}"

    return ChangeCode(diff, language="python")


def _marked_html(text: str, lexer, lines: list[int]) -> str:
    """`text` highlighted, the numbered `lines` marked."""
    from pygments import highlight
    from pygments.formatters import HtmlFormatter

    fmt = HtmlFormatter(hl_lines=lines)
    # Scoped to this block: JupyterLab styles pygments' token classes, not its `hll`.
    style = (f"<style>{fmt.get_style_defs('.labkit-changes')}"
             ".labkit-changes .hll { background-color: #fff0b3; display: block; }</style>")
    return f'{style}<div class="labkit-changes">{highlight(text, lexer, fmt)}</div>'


def _marked_text(text: str, lines: list[int]) -> str:
    """`text` as plain text with "+ " before the numbered `lines`."""
    marked = set(lines)
    return "\n".join(("+ " if i in marked else "  ") + line for i, line in enumerate(text.splitlines(), 1))


def changed_lines(old_text: str, new_text: str) -> list[int]:
    """The numbers (from 1) of the non-blank lines of `new_text` that `old_text` does not have."""
    import difflib

    old, new = old_text.splitlines(), new_text.splitlines()
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return [j + 1 for tag, _, _, j1, j2 in matcher.get_opcodes() if tag in ("replace", "insert")
            for j in range(j1, j2) if new[j].strip()]


def common_helpers(name: str) -> dict[str, str]:
    """The `common.NAME` functions and classes a recipe uses, in the order it first uses them,
    each with its source from `recipes/common.py` (and the helpers and settings, such as the
    flag defaults, those use in turn)."""
    common_path = RECIPE_DIR / "common.py"
    text = common_path.read_text(encoding="utf-8")
    defined = {node.name: node for node in ast.parse(text).body
               if isinstance(node, ast.FunctionDef | ast.ClassDef)}
    defined.update({target.id: node for node in ast.parse(text).body if isinstance(node, ast.Assign)
                    for target in node.targets if isinstance(target, ast.Name)})

    def used_by(tree: ast.AST, prefix: bool) -> list[str]:
        names = []
        for node in ast.walk(tree):
            if prefix and isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "common":
                names.append(node.attr)
            elif not prefix and isinstance(node, ast.Name):
                names.append(node.id)
        return [n for n in dict.fromkeys(names) if n in defined]

    order = used_by(ast.parse(source(name)), prefix=True)
    for helper in order:  # breadth-first: what the helpers call, after them
        order += [n for n in used_by(defined[helper], prefix=False) if n not in order]
    return {n: ast.get_source_segment(text, defined[n]) or "" for n in order}


def copy_files(name: str) -> list[str]:
    """The files (paths from the repository root, the recipe first) a copy of recipe `name`
    takes to run without labkit; [] for a recipe that needs labkit itself. Such a file imports
    the others under `if __package__:` from labkit (its path inside the package) and, otherwise,
    from beside itself (a copy's path): they are read off those imports."""
    _check(name)
    root = RECIPE_DIR.parents[1]
    files = [f"labkit/recipes/{name}.py"]
    for path in files:  # grows while the loop walks it: the files those files import
        for node in ast.walk(ast.parse((root / path).read_text(encoding="utf-8"))):
            if isinstance(node, ast.If) and ast.unparse(node.test) == "__package__":
                files += [f"{imp.module.replace('.', '/')}/{a.name}.py" for imp in node.body
                          if isinstance(imp, ast.ImportFrom) and imp.module for a in imp.names
                          if f"{imp.module.replace('.', '/')}/{a.name}.py" not in files]
    return files if len(files) > 1 else []


def copy_name(name: str) -> str:
    """The file name a copy of recipe `name` takes: its own, unless that is the name of a module
    of Python's standard library, which a script's folder would hide (a `profile.py` beside the
    script replaces the module cProfile imports, and PyTorch's own imports reach cProfile)."""
    return f"{name}_recipe.py" if name in sys.stdlib_module_names else f"{name}.py"


def _copy_note(name: str) -> str:
    files = copy_files(name)
    if not files:
        return ""
    listed = ", ".join(f.removeprefix("labkit/") for f in files)
    renamed = "" if copy_name(name) == f"{name}.py" else (
        f" (the recipe as <code>{copy_name(name)}</code>: a {name}.py there would hide Python's own "
        f"<code>{name}</code> module)")
    return (f"<p>Outside labkit: copy {listed} into one folder{renamed}; <code>{copy_name(name)}</code> "
            f"runs there as it is, without labkit installed.</p>")


def _docstring(name: str) -> str:
    return ast.get_docstring(ast.parse(source(name))) or ""


def lines_of_code(name: str) -> int:
    """Non-blank lines of the recipe that are not comments or the module docstring."""
    text = source(name)
    tree = ast.parse(text)
    doc = tree.body[0] if tree.body and isinstance(tree.body[0], ast.Expr) else None
    skip = set(range(doc.lineno, doc.end_lineno + 1)) if doc else set()
    return sum(1 for i, line in enumerate(text.splitlines(), 1)
               if i not in skip and line.strip() and not line.strip().startswith("#"))


def catalogue() -> list[dict[str, Any]]:
    """One row per recipe, in course order, read from its file: what it teaches (its docstring's
    first paragraph), the notebook that runs it, its lines of code, and the example command from
    its docstring."""
    rows = []
    for name in sorted(RECIPES, key=lambda r: (NOTEBOOKS[r], RECIPES.index(r))):
        doc = _docstring(name)
        line = next((ln for ln in doc.splitlines() if f"labkit.recipes.{name}" in ln), "")
        # From the launcher on (a TF_CONFIG before it is the notebook's to explain); a "\"
        # line continuation in the docstring has already joined its lines.
        start = min((i for i in (line.find("torchrun "), line.find("python -m ")) if i >= 0), default=0)
        example = " ".join(line[start:].split())
        rows.append({"recipe": name, "technique": " ".join(doc.split("\n\n")[0].split()),
                     "notebook": NOTEBOOKS[name], "lines": lines_of_code(name), "run": example})
    return rows


def flags(config: TrainConfig | None = None, **values: Any) -> list[str]:
    """A recipe's command-line flags: the common ones from `config` (the flags every recipe
    takes, `labkit train`'s meaning), then `values` (`batch_size=32` -> `--batch-size 32`;
    a recipe's own flags too, e.g. `precision="bf16"`). `None` and `False` leave a flag out;
    `True` gives the bare flag (`spot=True` -> `--spot`)."""
    merged: dict[str, Any] = {}
    if config is not None:
        merged = {name: getattr(config, name) for name in COMMON_FLAGS}
        merged["grad_clip"] = merged["grad_clip"] or 0.0  # the recipes' spelling of "no clipping"
    merged.update(values)
    argv: list[str] = []
    for name, value in merged.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not None and value is not False:
            argv += [flag, str(value)]
    return argv


def _torchrun_flags(nproc: int, max_restarts: int | None) -> list[str]:
    restarts = [] if max_restarts is None else ["--max-restarts", str(max_restarts)]
    return ["--standalone", "--nproc-per-node", str(nproc), *restarts]


def command(name: str, argv: list[str], nproc: int = 1, max_restarts: int | None = None) -> str:
    """The command line a learner types to run the recipe as `compare` and `run` do.
    `max_restarts`: torchrun's `--max-restarts` (how often it restarts the worker group after a
    worker fails; torchrun's default 0 when None)."""
    _check(name)
    module = f"labkit.recipes.{name}"
    launcher = TRAINING_RECIPES.get(name, ("torch", None))[1]
    if nproc > 1 and launcher == "torchrun":
        return shlex.join(["torchrun", *_torchrun_flags(nproc, max_restarts), "-m", module, *argv])
    text = shlex.join(["python", "-m", module, *argv])
    if nproc > 1 and launcher == "tf_config":
        return f"{text}   # in each of {nproc} workers, each with its own TF_CONFIG"
    return text


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
    resumed_at: list[int] = field(default_factory=list)  # first step of each restarted attempt

    @property
    def losses(self) -> list[float]:
        return [s["loss"] for s in self.steps]

    @property
    def restarts(self) -> int:
        """How many times the run was preempted (exit 143) and started again, or torchrun
        restarted its worker group after a failure (the `restart_count` the recipe recorded)."""
        return (sum(1 for c in self.returncodes if c == PREEMPTED_EXIT_CODE)
                + int(self.run.get("restart_count") or 0))

    def repeated_steps(self) -> list[int]:
        """The steps the recipe printed ("step N loss ...") more than once: trained again after
        a restart because they came after the last snapshot."""
        printed = [ln.split()[1] for ln in self.output.splitlines()
                   if ln.startswith("step ") and " loss " in ln]
        return sorted({int(s) for s in printed if printed.count(s) > 1})

    def lines(self, *words: str) -> str:
        """The lines the recipe printed that contain any of `words`."""
        return "\n".join(ln for ln in self.output.splitlines() if any(w in ln for w in words))

    def block(self, first: str, last: str) -> str:
        """What the recipe printed from the first line starting with `first` to the next line
        containing `last` (e.g. a table), or "" when there is none."""
        out: list[str] = []
        for line in self.output.splitlines():
            if out or line.startswith(first):
                out.append(line)
                if last in line:
                    return "\n".join(out)
        return ""

    def median_step_s(self) -> float:
        """Median step time after the first step (which pays one-off costs)."""
        import statistics

        times = [s["step_time_s"] for s in self.steps[1:] if s.get("step_time_s")]
        return statistics.median(times) if times else float("nan")


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    root = str(RECIPE_DIR.parents[1])  # the processes import this labkit
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG"):
        env.pop(name, None)  # an enclosing job's cluster must not leak into the recipe
    env.update(extra or {})
    return env


def _launch(name: str, argv: list[str], nproc: int, timeout_s: float,
            max_restarts: int | None = None) -> tuple[list[int], str]:
    framework, launcher = TRAINING_RECIPES.get(name, ("torch", None))
    module = f"labkit.recipes.{name}"
    if nproc > 1 and launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", *_torchrun_flags(nproc, max_restarts),
               "-m", module, *argv]
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


def run(name: str, argv: list[str], *, nproc: int = 1, timeout_s: float = 600.0,
        max_restarts: int | None = None) -> RecipeRun:
    """Run a training recipe with `argv` (`nproc` processes for ddp, fsdp and tf_multiworker)
    and read its metrics back. A run that exits 143 after a preemption drill is started again
    with the same flags, as Vertex restarts a preempted job, until it finishes. `max_restarts`:
    torchrun's `--max-restarts` for the torchrun recipes (torchrun restarts the group itself)."""
    _check(name)
    if name not in TRAINING_RECIPES:
        raise ValueError(f"recipe {name!r} does not train; see submit_locally for vertex_job")
    argv = list(argv)
    if "--metrics-out" not in argv:  # a file of our own, read back and then deleted
        with tempfile.TemporaryDirectory(prefix=f"recipe-{name}-") as tmp:
            return run(name, [*argv, "--metrics-out", str(Path(tmp) / "m.json")], nproc=nproc,
                       timeout_s=timeout_s, max_restarts=max_restarts)
    metrics_out = argv[argv.index("--metrics-out") + 1]
    result = RecipeRun(name, argv, [], "")
    for _ in range(MAX_RESTARTS + 1):
        codes, output = _launch(name, argv, nproc, timeout_s, max_restarts)
        result.returncodes += codes
        result.output += output
        if any(c not in (0, PREEMPTED_EXIT_CODE) for c in codes):
            raise RuntimeError(f"recipe {name} failed (exit codes {codes}):\n{output[-3000:]}")
        data = load_metrics(metrics_out)
        if result.returncodes[:-len(codes)] and data["steps"]:
            result.resumed_at.append(data["steps"][0]["step"])
        result.steps += data["steps"]
        result.run = data.get("run", {})
        if result.run.get("restart_count") and result.run.get("resumed_at_step") is not None:
            result.resumed_at.append(result.run["resumed_at_step"])  # torchrun restarted it
        if all(c == 0 for c in codes):
            return result
    raise RuntimeError(f"recipe {name} was still preempted after {MAX_RESTARTS} restarts")


# On a GPU a run does not repeat itself exactly (some kernels, cuDNN's convolution backward
# among them, add in a varying order, and the steps carry the rounding forward): a recipe whose
# gap to the engine is within this many times the engine's gap to itself shows no difference.
SPREAD_MARGIN = 2.0
# What a comparison shows (`Comparison.agreement`), from the closest to the farthest.
BIT_FOR_BIT = "bit for bit"
WITHIN_TOLERANCE = "within the tolerance"
WITHIN_SPREAD = f"over the tolerance, but within {SPREAD_MARGIN:g}× labkit train's own run-to-run spread"
DIFFERENT = "over the tolerance: not the same computation"


@dataclass
class Comparison:
    """A recipe's per-step losses beside the engine's for the same settings. `engine_reused`:
    the engine run was one the notebook had already made, not a run for this comparison.
    `engine_repeat_losses`: a second engine run with the same settings, made when the two
    differ on a GPU, to measure how far the engine differs from itself there."""

    recipe: RecipeRun
    engine_losses: list[float]
    precision: str
    nproc: int = 1
    engine_reused: bool = False
    engine_repeat_losses: list[float] | None = None

    @property
    def recipe_losses(self) -> list[float]:
        return self.recipe.losses

    def _diffs(self) -> list[float]:
        if len(self.recipe_losses) != len(self.engine_losses):
            raise ValueError(f"the recipe logged {len(self.recipe_losses)} steps, the engine "
                             f"{len(self.engine_losses)}")
        return [abs(a - b) for a, b in zip(self.recipe_losses, self.engine_losses, strict=True)]

    @property
    def max_abs_diff(self) -> float:
        return max(self._diffs())

    @property
    def worst_step(self) -> int:
        """The step with the largest difference (the first of several equal ones)."""
        diffs = self._diffs()
        return self.recipe.steps[diffs.index(max(diffs))]["step"]

    @property
    def tolerance(self) -> float:
        """What the tests hold a recipe to: 1e-5 in a 4-byte format (fp32, tf32), 1e-3 in a
        narrower one (bf16, fp16)."""
        return 1e-5 if precisions.get(self.precision).bytes == 4 else 1e-3

    @property
    def equal(self) -> bool:
        return self.max_abs_diff <= self.tolerance

    @property
    def engine_spread(self) -> float | None:
        """The largest per-step loss difference of the engine against its repeat run (None
        without one)."""
        if self.engine_repeat_losses is None:
            return None
        return max(abs(a - b) for a, b in zip(self.engine_losses, self.engine_repeat_losses, strict=True))

    @property
    def within_spread(self) -> bool:
        """Whether a gap over the tolerance is within `SPREAD_MARGIN` times the engine's own."""
        spread = self.engine_spread
        return bool(spread) and self.max_abs_diff <= SPREAD_MARGIN * spread

    @property
    def agreement(self) -> str:
        """The verdict on the two curves: `BIT_FOR_BIT`, `WITHIN_TOLERANCE`, `WITHIN_SPREAD`
        (over the tolerance on a GPU, but within `SPREAD_MARGIN` times the engine's difference
        from a second run of itself) or `DIFFERENT`."""
        if self.max_abs_diff == 0:
            return BIT_FOR_BIT
        if self.equal:
            return WITHIN_TOLERANCE
        return WITHIN_SPREAD if self.within_spread else DIFFERENT


def engine_losses(name: str, argv: list[str], nproc: int = 1) -> tuple[list[float], str]:
    """`labkit train`'s per-step losses for a recipe's settings (`nproc` replicas), and the
    precision they ran in. Checkpointing and the drill are left out: an uninterrupted run."""
    from labkit.train import run_replicas, run_training

    config = _engine_config(name, argv)
    log = run_replicas(config, nproc) if nproc > 1 else run_training(config)
    return log.losses, config.precision


def _engine_config(name: str, argv: list[str]) -> TrainConfig:
    from labkit.recipes.common import engine_config_from_argv

    framework = TRAINING_RECIPES[name][0]
    return replace(engine_config_from_argv(argv, framework, recipe=name), checkpoint_dir=None,
                   checkpoint_every=0, preempt_at=None, metrics_out=None)


def check_engine_run(name: str, argv: list[str], log: MetricsLog, nproc: int = 1) -> None:
    """Raise ValueError naming the settings in which an engine run's log differs from the
    recipe's `argv` (and its process count from `nproc`)."""
    wanted = asdict(_engine_config(name, argv))
    ran = log.run.get("config")
    if not ran:
        raise ValueError("engine: the log records no config, so its settings cannot be checked")
    differ = [f"{k} {ran.get(k)!r} (recipe: {wanted[k]!r})" for k in LOSS_FIELDS if ran.get(k) != wanted[k]]
    world = log.run.get("world_size", 1)
    if world != nproc:
        differ.append(f"world_size {world} (recipe: {nproc} processes)")
    if differ:
        raise ValueError("engine: the run trained other settings than the recipe: " + "; ".join(differ))


def compare(name: str, argv: list[str], *, nproc: int = 1, engine: MetricsLog | None = None,
            timeout_s: float = 600.0, max_restarts: int | None = None) -> Comparison:
    """Run the recipe, then the engine with the same settings; `.max_abs_diff` is the largest
    per-step loss difference. `engine`: a `labkit train` run already made with the same settings
    (checked field by field, see `check_engine_run`) to compare against instead of a new one.
    `max_restarts`: torchrun's `--max-restarts` (see `run`)."""
    if engine is not None:
        check_engine_run(name, argv, engine, nproc)
    recipe = run(name, argv, nproc=nproc, timeout_s=timeout_s, max_restarts=max_restarts)
    if engine is not None:
        comparison = Comparison(recipe, engine.losses, _engine_config(name, argv).precision, nproc, True)
    else:
        comparison = Comparison(recipe, *engine_losses(name, argv, nproc), nproc)
    if not comparison.equal and ran_on_a_gpu(recipe.run):
        comparison.engine_repeat_losses = engine_losses(name, argv, nproc)[0]
    return comparison


def ran_on_a_gpu(run: dict[str, Any]) -> bool:
    """Whether a recipe's metrics say it trained on a GPU (torch's `device`, TF's `devices`)."""
    devices = [run.get("device"), *(run.get("devices") or ())]
    return any("cuda" in str(d).lower() or "gpu" in str(d).lower() for d in devices if d)


# A curve counts as falling when the mean loss of its last quarter of steps is under this share
# of its first quarter's: one batch's loss is noisy, a tenth is not noise at these sizes.
FALLS_BELOW = 0.9


@dataclass(frozen=True)
class CurveTrend:
    """Whether a loss curve shows the model learning: the mean loss of its first and last
    quarters of steps (of one step each under 4 steps)."""

    first: float
    last: float

    @property
    def falls(self) -> bool:
        return self.last < FALLS_BELOW * self.first

    @property
    def verdict(self) -> str:
        return f"falls by more than {1 - FALLS_BELOW:.0%}" if self.falls else f"does not fall by {1 - FALLS_BELOW:.0%}"


def curve_trend(losses: list[float]) -> CurveTrend:
    """The trend of a loss curve (an agreement between two flat curves proves the code equal,
    not that these settings train)."""
    if not losses:
        raise ValueError("losses: an empty curve has no trend")
    quarter = max(1, len(losses) // 4)
    return CurveTrend(sum(losses[:quarter]) / quarter, sum(losses[-quarter:]) / quarter)


def plot(comparison: Comparison, path: str | os.PathLike | None = None, ax=None):
    """The two loss curves on one axis, titled with the largest difference."""
    from labkit.course.plots import finish, new_figure

    fig = None
    if ax is None:
        fig, ax = new_figure((6, 3.5))
    steps = [s["step"] for s in comparison.recipe.steps]
    ax.plot(steps, comparison.engine_losses, "-", lw=3, alpha=0.4, label="labkit train (engine)")
    ax.plot(steps, comparison.recipe_losses, "o--", ms=3, label=f"recipe {comparison.recipe.name}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"largest difference {comparison.max_abs_diff:.2e} "
                 f"(tolerance {comparison.tolerance:.0e}, {comparison.precision})")
    ax.legend()
    return finish(fig or ax.figure, path)


# ---------------------------------------------------------------- vertex_job, against a fake service


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


POOL_ROLES = ("primary replica", "workers", "parameter servers / Reduction Server", "evaluators")


def request_rows(request: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per worker pool of a CustomJob as the service received it."""
    rows = []
    for i, pool in enumerate(request["job_spec"]["worker_pool_specs"]):
        machine = pool.get("machine_spec", {})
        container = pool.get("container_spec", {})
        accel = machine.get("accelerator_type", "")
        rows.append({"pool": i, "role": POOL_ROLES[i], "replicas": int(pool.get("replica_count", 0)),
                     "machine": machine.get("machine_type"),
                     "accelerators": f"{machine.get('accelerator_count')} x {accel}"
                     if machine.get("accelerator_count") else "none",
                     "image": container.get("image_uri")})
    return rows


@dataclass(frozen=True)
class ReceivedJob:
    """What a CustomJob request held when the service received it (`received`), read from its
    fields, and the states the recipe polled; notebook 06 writes the sentences."""

    pools: int
    training_nodes: int  # replicas of pools 0 and 1
    pool2_replicas: int  # parameter servers or the Reduction Server (0: no pool 2)
    pool2_image: str | None
    pool2_machine: str | None
    strategy: str  # scheduling.strategy; "STANDARD" (on-demand) when the request leaves it out
    restart_job_on_worker_restart: bool
    base_output_directory: str | None
    output_dirs: dict[str, str]  # the AIP_*_DIR variables Vertex sets from base_output_directory
    primary_command: str | None  # what pool 0 runs (the script of a `bash -c` command)
    states: tuple[str, ...]


def received(submitted: dict[str, Any]) -> ReceivedJob:
    """`submit_locally`'s result as `ReceivedJob`: the request's pools, scheduling and output
    folder, the AIP_*_DIR variables Vertex derives from it (`labkit.vertex.emulator.vertex_variables`),
    and the states the recipe saw."""
    from labkit.vertex.emulator import vertex_variables

    spec = submitted["request"]["job_spec"]
    pools = spec["worker_pool_specs"]
    scheduling = spec.get("scheduling", {})
    pool2 = pools[2] if len(pools) > 2 and pools[2] else {}
    cmd = pools[0].get("container_spec", {}).get("command", [])
    dirs = {k: v for k, v in vertex_variables(spec, job_id="").items() if k.startswith("AIP_") and k.endswith("_DIR")}
    return ReceivedJob(
        len(pools), sum(int(p.get("replica_count", 0)) for p in pools[:2]), int(pool2.get("replica_count", 0)),
        pool2.get("container_spec", {}).get("image_uri"), pool2.get("machine_spec", {}).get("machine_type"),
        scheduling.get("strategy") or "STANDARD", bool(scheduling.get("restart_job_on_worker_restart")),
        spec.get("base_output_directory", {}).get("output_uri_prefix"), dirs,
        (cmd[-1] if cmd[:2] == ["bash", "-c"] else shlex.join(cmd)) if cmd else None,
        tuple(submitted.get("states") or ()))


# ---------------------------------------------------------------- the capstone's levers


def lever_code_rows(framework: str, levers: list[Any]) -> list[dict[str, Any]]:
    """For each capstone lever (objects with `key` and `label`): the recipe that shows it with its
    lines of code, or the plain code it takes (`labkit.course.levers`)."""
    from labkit.course.levers import ENGINE_ONLY, lever

    rows = []
    for lv in levers:
        entry = lever(framework, lv.key)
        recipe, code = (entry.recipe, entry.code) if entry else (None, ENGINE_ONLY)
        rows.append({"lever": lv.label, "recipe": recipe or "–",
                     "recipe lines": lines_of_code(recipe) if recipe else None, "plain code": code})
    return rows
