"""`labkit run NOTEBOOK` (papermill, or `--vertex` as a custom job, `--executor` on Vertex's
notebook executor) and `labkit course`."""

from __future__ import annotations

from pathlib import Path

from labkit.cli.vertex import add_vertex_options, run_on_vertex
from labkit.core.config import ParameterError
from labkit.core.notebook_params import parse_value
from labkit.course.summary import write_report
from labkit.notebooks import run_course, run_notebook, timestamp


def add_run_command(subparsers) -> None:
    p = subparsers.add_parser("run", help="execute a notebook headless with papermill",
                              description="Execute NOTEBOOK with papermill and parameters.")
    p.add_argument("notebook", help="path to an .ipynb notebook")
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[],
                   metavar=("NAME", "VALUE"), help="set a parameter (repeatable)")
    p.add_argument("-o", "--output", help="executed notebook path (default runs/<time>/<name>)")
    p.add_argument("--log-output", action="store_true", help="stream cell output to the terminal")
    add_vertex_options(p)
    p.set_defaults(handler=_run_command)


def _run_command(args) -> int:
    params = {name: parse_value(value) for name, value in args.parameter}
    if getattr(args, "vertex", False) or getattr(args, "executor", False):
        try:
            return run_on_vertex(args, params)
        except (ParameterError, ValueError) as e:
            print(f"labkit run --vertex: {e}")
            return 2
    try:
        result = run_notebook(args.notebook, args.output, params, log_output=args.log_output,
                              kernel_log=not args.log_output)
    except (ValueError, OSError) as e:  # a parameter, the notebook file or the output path
        print(f"labkit run: {e}")
        return 2
    status = "ok" if result.ok else f"FAILED ({result.error}; kernel log: {result.log})"
    print(f"{result.notebook.name}: {status} in {result.seconds:.0f}s -> {result.output}")
    for fig in result.figures:
        print(f"  {fig.text()}")
    return 0 if result.ok else 1


def add_course_command(subparsers) -> None:
    p = subparsers.add_parser("course", help="run every notebook and write a summary report",
                              description="Execute the whole course with papermill.")
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[],
                   metavar=("NAME", "VALUE"), help="parameter for every notebook that declares it")
    p.add_argument("-o", "--out", help="output folder (default runs/<timestamp>)")
    p.add_argument("--only", action="append", help="run only notebooks whose name contains this")
    p.add_argument("--notebooks", help="folder holding the NN_name.ipynb notebooks")
    p.add_argument("--overwrite", action="store_true",
                   help="run into an -o folder that holds an earlier course run, replacing it")
    p.set_defaults(handler=_course_command)


def _course_command(args) -> int:
    params = {name: parse_value(value) for name, value in args.parameter}
    out = Path(args.out) if args.out else Path("runs") / timestamp()
    try:
        runs = run_course(out, params, notebook_dir=args.notebooks, only=args.only, overwrite=args.overwrite)
    except (ValueError, OSError) as e:  # found before any notebook ran
        print(f"labkit course: {e}")
        return 2
    report = write_report(runs, out)
    print(f"\nexecuted notebooks and report: {report.parent}\nsummary: {report}")
    print(report.read_text(encoding="utf-8"))
    return 0 if all(r.ok for r in runs) else 1
