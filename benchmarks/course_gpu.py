"""The whole course, executed with papermill at full size on the GPU this machine has: the run a
reader makes on a Workbench VM, measured, with its results in one file.

    python benchmarks/course_gpu.py                              # every notebook, scale=full
    python benchmarks/course_gpu.py --budget 600                 # trimmed to fit ten minutes
    python benchmarks/course_gpu.py --notebooks 04 09 --out runs/gpu
    python benchmarks/course_gpu.py --scale smoke --notebooks 00_tour --out /tmp/x   # any machine
    python benchmarks/course_gpu.py --wheels .whl                # a machine with no Jupyter installed

Each notebook runs in its own process group with a time limit (`--timeout-per-notebook`; under
`--budget`, twice the notebook's forecast within that limit): the whole group is killed at the
limit, kernel included, and the notebook is recorded as timed out with the cells it finished. The executed notebooks, their kernel logs and
`<date>-<gpu>-course.json` go to `--out`: per notebook the status, seconds, the plan it ran
(sizes, skipped rungs, what the budget trimmed, the forecast) and its key figures, and the
peak GPU memory sampled while it ran; with the device, driver and software versions. A full-size
run on a GPU also writes the JSON to `--results` (default benchmarks/results/).

`--budget SECONDS` shares the seconds among the notebooks in proportion to their forecasts and
passes each its share as `time_budget_s`, which trims sizes that only buy precision (never a
verdict's 3 repeats) and records what it trimmed. Frameworks a notebook lacks (TensorFlow,
DeepSpeed, the Vertex client) are skipped by the notebook itself, which says so.

On a locked-down machine (python3 and torch, no network, no Jupyter): fetch the wheels elsewhere
with `python benchmarks/fetch_course_wheels.py` (about 20 MB into .whl/), bring the folder, and
pass `--wheels .whl`: they are installed into `--out`/site and the harness restarts itself with
them on its path; the notebook kernel is registered inside `--out`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHILD_FLAG = "--run-one"
DESCRIBE_FLAG = "--describe"


def _ensure_imports(wheels: str | None, out: Path) -> None:
    """Make papermill and ipykernel importable: install `wheels` into out/site and restart this
    script with it on PYTHONPATH (once). Exits with one line when they are missing and no
    wheels were given."""
    missing = [m for m in ("papermill", "ipykernel", "nbformat", "crc32c") if not _importable(m)]
    if not missing:
        return
    if os.environ.get("LABKIT_COURSE_GPU_SITE"):
        sys.exit(f"course_gpu: {', '.join(missing)} still missing after installing the wheels in "
                 f"{os.environ['LABKIT_COURSE_GPU_SITE']}: fetch them again with benchmarks/fetch_course_wheels.py")
    if not wheels:
        sys.exit(f"course_gpu: {', '.join(missing)} not installed: pass --wheels DIR (made by "
                 "benchmarks/fetch_course_wheels.py) or install labkit's environment")
    found = sorted(Path(wheels).glob("*.whl"))
    if not found:
        sys.exit(f"course_gpu: --wheels {wheels}: no .whl files there")
    site = (out / "site").resolve()
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                    "--no-compile", "--disable-pip-version-check", "--upgrade", "--target", str(site),
                    *map(str, found)], check=True)
    env = dict(os.environ, LABKIT_COURSE_GPU_SITE=str(site),
               PYTHONPATH=os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _register_kernel(out: Path) -> dict[str, str]:
    """A "labkit" kernel spec inside `out` for this interpreter (the name every notebook asks for),
    found first through JUPYTER_PATH; returns the environment the runs need."""
    from labkit.notebooks import KERNEL_DISPLAY_NAME, KERNEL_NAME

    kernels = (out / "jupyter" / "kernels" / KERNEL_NAME)
    kernels.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(p for p in (os.environ.get("LABKIT_COURSE_GPU_SITE"), str(REPO),
                                       os.environ.get("PYTHONPATH")) if p)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": KERNEL_DISPLAY_NAME, "language": "python", "env": {"PYTHONPATH": path}}
    (kernels / "kernel.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
    jupyter = os.pathsep.join(p for p in (str((out / "jupyter").resolve()), os.environ.get("JUPYTER_PATH")) if p)
    return {"JUPYTER_PATH": jupyter, "PYTHONPATH": path}


def _describe(argv: list[str]) -> int:
    """Child process (so the harness itself never holds a CUDA context on the GPU it measures):
    print the machine, the GPU's table key, and each notebook's plan with its budget share, as
    JSON (argv: scale, budget or "", notebook stems...)."""
    from labkit.core import devices
    from labkit.core.config import resolve_scale
    from labkit.course import sizing

    scale, budget, stems = resolve_scale(argv[0]), float(argv[1]) if argv[1] else None, argv[2:]
    info = devices.detect()
    machine = sizing.Machine.detect(probe=scale == "full")
    described = {"gpu": [g.name for g in info.gpus], "gpu_memory_gib": [round(g.memory_gib, 1) for g in info.gpus],
                 "compute_capability": [g.compute_capability for g in info.gpus], "cpu_cores": info.cpu_count,
                 "cpu_model": info.cpu_model, "python": platform.python_version(), "facts": machine.facts_line(),
                 "probe_tflops": machine.probe_tflops, "driver": _driver(), "versions": _versions()}
    forecasts = {stem: sizing.plan(stem, scale, machine=machine).expected_s for stem in stems}
    total = sum(forecasts.values()) or 1.0
    shares = {stem: (round(budget * f / total, 1) if budget else None) for stem, f in forecasts.items()}
    plans = {stem: sizing.plan(stem, scale, machine=machine, time_budget_s=shares[stem]).record() for stem in stems}
    print(json.dumps({"machine": described, "slug": machine.gpu.key if machine.has_gpu else "cpu", "scale": scale,
                      "shares": shares, "plans": plans}, default=str))
    return 0


def _driver() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True, timeout=30)
    return q.stdout.strip().splitlines()[0] if q.returncode == 0 and q.stdout.strip() else None


def _versions() -> dict[str, str | None]:
    versions = {name: _version(name) for name in ("labkit", "torch", "tensorflow", "papermill", "ipykernel",
                                                   "deepspeed", "optuna", "google.cloud.aiplatform")}
    if versions.get("torch"):
        import torch

        versions["cuda"] = torch.version.cuda
    return versions


def _version(module: str) -> str | None:
    if not _importable(module):
        return None
    try:
        from importlib.metadata import version

        dist = {"google.cloud.aiplatform": "google-cloud-aiplatform"}.get(module, module)
        return version(dist)
    except Exception:  # noqa: BLE001 - a module without distribution metadata
        return "present"


def _select(names: list[str] | None) -> list[Path]:
    from labkit.notebooks import course_notebooks

    notebooks = course_notebooks(REPO / "notebooks")
    if not names:
        return notebooks
    chosen = [nb for nb in notebooks if any(nb.stem == n or nb.stem.startswith(n) for n in names)]
    unknown = [n for n in names if not any(nb.stem == n or nb.stem.startswith(n) for nb in notebooks)]
    if unknown:
        sys.exit(f"course_gpu: --notebooks: no notebook matches {', '.join(unknown)} "
                 f"(they are {', '.join(nb.stem for nb in notebooks)})")
    return chosen


def _run_one(argv: list[str]) -> int:
    """Child process: execute one notebook and write its outcome as JSON (argv: notebook,
    output, parameters JSON, result path)."""
    from labkit.notebooks import run_notebook

    notebook, output, params, result = argv
    run = run_notebook(notebook, output, json.loads(params), kernel_log=True, cell_timeout=None)
    Path(result).write_text(json.dumps({
        "ok": run.ok, "error": run.error, "seconds": run.seconds,
        "figures": [{"name": f.name, "value": f.value, "unit": f.unit, "note": f.note} for f in run.figures],
        "log": str(run.log) if run.log else None}), encoding="utf-8")
    return 0


def _execute(nb: Path, out: Path, params: dict, timeout_s: float, env: dict[str, str]) -> dict:
    """Run `nb` in a child process group under a time limit, sampling GPU memory meanwhile."""
    from labkit.profiling.gpu_sampler import GpuSampler

    output = out / "notebooks" / nb.name
    output.parent.mkdir(parents=True, exist_ok=True)
    result = out / "notebooks" / f"{nb.stem}.result.json"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), CHILD_FLAG, str(nb), str(output), json.dumps(params),
           str(result)]
    start = time.perf_counter()
    status = "ok"
    with GpuSampler(0.5) as sampler:
        proc = subprocess.Popen(cmd, env={**os.environ, **env}, cwd=str(REPO), start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            status = "timeout"
            os.killpg(proc.pid, signal.SIGKILL)  # the kernel and every process it started
            proc.wait()
    seconds = time.perf_counter() - start
    # Paths relative to --out: the JSON names no folder of the machine it ran on.
    record: dict = {"status": status, "seconds": round(seconds, 1), "output": str(output.relative_to(out))}
    if result.exists():
        data = json.loads(result.read_text(encoding="utf-8"))
        log = data["log"] and Path(data["log"]).resolve()
        record.update(figures=data["figures"], notebook_seconds=round(data["seconds"], 1),
                      log=str(log.relative_to(out)) if log and log.is_relative_to(out) else data["log"])
        if not data["ok"]:
            record.update(status="failed", error=data["error"])
    elif status == "ok":
        record.update(status="failed", error=f"the runner exited {proc.returncode} without a result")
    summary = sampler.summary()
    record["peak_gpu_memory_mib"] = round(summary["peak_memory_mb"]) if summary else None
    return record


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == CHILD_FLAG:
        return _run_one(argv[1:])
    if argv and argv[0] == DESCRIBE_FLAG:
        return _describe(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", choices=("full", "smoke", "auto"), default="full")
    p.add_argument("--notebooks", nargs="*", help="names or prefixes (default: all of them)")
    p.add_argument("--out", default=None, help="folder for the executed notebooks and the JSON "
                   "(default runs/course-<date>)")
    p.add_argument("--budget", type=float, default=None, help="seconds for all the notebooks together")
    p.add_argument("--timeout-per-notebook", type=float, default=1800.0,
                   help="seconds before a notebook's processes are killed (default 1800)")
    p.add_argument("--wheels", default=None, help="folder of wheels to install when Jupyter is missing")
    p.add_argument("--results", default=None, help="also write the JSON here (default for a full-size "
                   "GPU run: benchmarks/results)")
    args = p.parse_args(argv)
    if args.budget is not None and args.budget <= 0:
        p.error(f"--budget must be a positive number of seconds (got {args.budget:g})")
    if args.timeout_per_notebook <= 0:
        p.error(f"--timeout-per-notebook must be positive (got {args.timeout_per_notebook:g})")
    sys.path.insert(0, str(REPO))
    out = Path(args.out or REPO / "runs" / f"course-{dt.date.today().isoformat()}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    _ensure_imports(args.wheels, out)
    env = _register_kernel(out)
    env["LABKIT_ARTIFACTS"] = str(out / "artifacts")
    env.setdefault("LABKIT_PROGRESS", "off")
    notebooks = _select(args.notebooks)
    described = subprocess.run([sys.executable, str(Path(__file__).resolve()), DESCRIBE_FLAG, args.scale,
                                str(args.budget or ""), *(nb.stem for nb in notebooks)],
                               capture_output=True, text=True, env={**os.environ, **env}, cwd=str(REPO))
    if described.returncode != 0:
        sys.exit(f"course_gpu: could not describe this machine:\n{described.stderr.strip()}")
    info = json.loads(described.stdout.strip().splitlines()[-1])
    machine, slug, shares, scale = info["machine"], info["slug"], info["shares"], info["scale"]
    date = dt.date.today().isoformat()
    report = {"date": date, "scale": scale, "budget_s": args.budget,
              "timeout_per_notebook_s": args.timeout_per_notebook,
              "command": "python benchmarks/course_gpu.py " + " ".join(argv), "machine": machine, "notebooks": {}}
    path = out / f"{date}-{slug}-course.json"
    print(f"course_gpu: {len(notebooks)} notebook(s) at scale {scale} on {machine['facts']}", flush=True)
    for nb in notebooks:
        declared = _declared(nb)
        params = {"scale": scale} | ({"time_budget_s": shares[nb.stem]}
                                     if shares[nb.stem] and "time_budget_s" in declared else {})
        # Under a budget a notebook may take twice its forecast, within --timeout-per-notebook.
        limit = (min(args.timeout_per_notebook, max(45.0, 2 * info["plans"][nb.stem]["expected_s"]))
                 if args.budget else args.timeout_per_notebook)
        record = {"plan": info["plans"][nb.stem], "parameters": params, "time_limit_s": round(limit)}
        print(f"  {nb.stem}: expected {record['plan']['expected_s']:.0f} s (limit {limit:.0f} s) ...", end=" ",
              flush=True)
        record |= _execute(nb, out, params, limit, env)
        print(f"{record['status']} in {record['seconds']:.0f} s"
              + (f" (peak GPU memory {record['peak_gpu_memory_mib']} MiB)" if record.get("peak_gpu_memory_mib") else "")
              + (f": {record['error']}" if record.get("error") else ""), flush=True)
        report["notebooks"][nb.stem] = record
        path.write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")  # after each, for a killed run
    runs = report["notebooks"].values()
    report["total_s"] = round(sum(r["seconds"] for r in runs), 1)
    report["ok"] = sum(r["status"] == "ok" for r in runs)
    report["finished_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    path.write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    results = args.results or (str(REPO / "benchmarks" / "results") if scale == "full" and slug != "cpu" else None)
    if results:
        Path(results).mkdir(parents=True, exist_ok=True)
        target, n = Path(results) / path.name, 1
        while target.exists():  # an earlier run of the same day on the same GPU is kept
            n += 1
            target = Path(results) / f"{date}-{slug}-run{n}-course.json"
        shutil.copy(path, target)
    print(f"course_gpu: {report['ok']} of {len(notebooks)} ok, {report['total_s'] / 60:.1f} min; {path}", flush=True)
    return 0 if report["ok"] == len(notebooks) else 1


def _declared(nb: Path) -> dict:
    from labkit.core.notebook_params import notebook_parameters

    return notebook_parameters(nb)


if __name__ == "__main__":
    sys.exit(main())
