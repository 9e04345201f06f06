"""What a Vertex job runs in its container: papermill on a notebook, or torchrun on a node.

``python -m labkit.vertex.entry notebook INPUT OUTPUT_DIR --parameters JSON`` executes INPUT
with the parameters and writes it to OUTPUT_DIR as ``<name>.ipynb`` on the primary replica and
``<name>.<role><index>.ipynb`` on the others, so replicas never overwrite each other. The exit
status is 0 only when every cell ran.

``python -m labkit.vertex.entry torchrun --nproc-per-node 8 -- train ...`` starts one process
per GPU on this node with torchrun (node rank and count from Vertex's RANK / WORLD_SIZE), each
running ``labkit train ...``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def output_name(notebook: str, env=None) -> str:
    from labkit.core.cluster import from_env

    info = from_env(env)
    stem = Path(notebook).stem
    return f"{stem}.ipynb" if info.role in ("chief", "single") else f"{stem}.{info.role}{info.index}.ipynb"


def torchrun_argv(nproc_per_node: int, labkit_args: list[str], env=None) -> list[str]:
    """torchrun for this node: node rank and node count from Vertex's variables (RANK and
    WORLD_SIZE count nodes), `nproc_per_node` processes each (one per GPU)."""
    from labkit.core.cluster import from_env

    info = from_env(env)
    args = labkit_args[1:] if labkit_args[:1] == ["--"] else labkit_args
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={info.world_size}",
            f"--node_rank={info.rank or 0}", f"--nproc_per_node={nproc_per_node}",
            f"--master_addr={info.master_addr}", f"--master_port={info.master_port}",
            "-m", "labkit", *args]


def _torchrun(nproc_per_node: int, labkit_args: list[str]) -> int:
    import os
    import subprocess

    argv = torchrun_argv(nproc_per_node, labkit_args)
    print("launching: " + " ".join(argv), flush=True)
    # torchrun sets the per-process RANK / WORLD_SIZE / LOCAL_RANK itself.
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.call(argv, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit.vertex.entry")
    sub = parser.add_subparsers(dest="command", required=True)
    nb = sub.add_parser("notebook", help="run a notebook with papermill")
    nb.add_argument("input")
    nb.add_argument("output_dir")
    nb.add_argument("--parameters", default="{}", help="JSON object of notebook parameters")
    tr = sub.add_parser("torchrun", help="start N processes per node with torchrun, then labkit ARGS")
    tr.add_argument("--nproc-per-node", type=int, required=True)
    tr.add_argument("labkit_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "torchrun":
        return _torchrun(args.nproc_per_node, args.labkit_args)

    from labkit.course.notebook import KERNEL_NAME, ensure_kernel, run_notebook

    if ensure_kernel():  # prebuilt images get labkit by pip, without the course kernel
        print(f"registered the Jupyter kernel {KERNEL_NAME!r} for {sys.executable}")

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
