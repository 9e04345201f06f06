"""What a Vertex notebook job runs in its container: papermill on one notebook.

``python -m labkit.vertex.entry notebook INPUT OUTPUT_DIR --parameters JSON`` executes INPUT
with the parameters and writes it to OUTPUT_DIR as ``<name>.ipynb`` on the primary replica and
``<name>.<role><index>.ipynb`` on the others, so replicas never overwrite each other. The exit
status is 0 only when every cell ran.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def output_name(notebook: str, env=None) -> str:
    from labkit.cluster import from_env

    info = from_env(env)
    stem = Path(notebook).stem
    return f"{stem}.ipynb" if info.role in ("chief", "single") else f"{stem}.{info.role}{info.index}.ipynb"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit.vertex.entry")
    sub = parser.add_subparsers(dest="command", required=True)
    nb = sub.add_parser("notebook", help="run a notebook with papermill")
    nb.add_argument("input")
    nb.add_argument("output_dir")
    nb.add_argument("--parameters", default="{}", help="JSON object of notebook parameters")
    args = parser.parse_args(argv)

    from labkit.notebook import run_notebook

    try:
        params = json.loads(args.parameters)
    except json.JSONDecodeError as e:
        print(f"--parameters is not valid JSON: {e}", file=sys.stderr)
        return 2
    out = Path(args.output_dir) / output_name(args.input)
    result = run_notebook(args.input, out, params, log_output=True)
    print(f"{Path(args.input).name}: {'ok' if result.ok else 'FAILED ' + result.error} "
          f"in {result.seconds:.0f}s -> {result.output}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
