"""What a Vertex job runs in its container: papermill on a notebook, or torchrun on a node.

``python -m labkit.vertex.entry notebook INPUT OUTPUT_DIR --parameters JSON [--artifacts DIR]
[--cell-timeout S] [--device cuda]`` executes INPUT with the parameters and writes it to
OUTPUT_DIR as ``<name>.ipynb`` on the primary replica and ``<name>.<role><index>.ipynb`` on the
others, so replicas never overwrite each other; the kernel's log goes beside it
(``<name>.log``) and the files the notebook makes under DIR (``$LABKIT_ARTIFACTS``), so all of it
reaches the bucket rather than the VM's disk. ``--cell-timeout`` bounds each cell (0: no limit).
``--device cuda`` (a job with GPUs) stops at once, on one line, when no CUDA GPU is visible.
The exit status is 0 only when every cell ran.

``python -m labkit.vertex.entry torchrun --nproc-per-node 8 -- train ...`` starts one process
per GPU on this node with torchrun (node rank and count from Vertex's RANK / WORLD_SIZE), each
running ``labkit train ...``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from labkit.core.config import parse_int


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
    nb.add_argument("--artifacts", default=None, help="folder for the files the notebook makes")
    nb.add_argument("--cell-timeout", type=parse_int, default=1800, help="seconds per cell (0: no limit)")
    nb.add_argument("--device", choices=("auto", "cuda"), default="auto",
                    help="cuda: the job asked for GPUs; fail at start when none is visible")
    tr = sub.add_parser("torchrun", help="start N processes per node with torchrun, then labkit ARGS")
    tr.add_argument("--nproc-per-node", type=parse_int, required=True)
    tr.add_argument("labkit_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "torchrun":
        return _torchrun(args.nproc_per_node, args.labkit_args)

    import os

    from labkit.notebooks.artifacts import ARTIFACTS_ENV
    from labkit.notebooks.execute import run_notebook
    from labkit.notebooks.kernel import KERNEL_NAME, ensure_kernel
    from labkit.notebooks.stderr import KERNEL_LOG_ENV

    if args.device == "cuda":
        from labkit.core import devices

        if not devices.detect().has_gpu:
            print("labkit notebook job: --device cuda: the job asked for GPUs and this container sees "
                  "no CUDA GPU (is the NVIDIA driver's /usr/local/nvidia/lib64 on LD_LIBRARY_PATH?)",
                  file=sys.stderr)
            return 2
    if ensure_kernel():  # prebuilt images get labkit by pip, without the course kernel
        print(f"registered the Jupyter kernel {KERNEL_NAME!r} for {sys.executable}")

    try:
        params = json.loads(args.parameters)
    except json.JSONDecodeError as e:
        print(f"--parameters is not valid JSON: {e}", file=sys.stderr)
        return 2
    out = Path(args.output_dir) / output_name(args.input)
    # The kernel inherits these: its log and its files go to the bucket with the notebook.
    os.environ[KERNEL_LOG_ENV] = str(out.with_suffix(".log"))
    if args.artifacts:
        suffix = Path(output_name(args.input)).stem.removeprefix(Path(args.input).stem)
        os.environ[ARTIFACTS_ENV] = args.artifacts.rstrip("/") + suffix.replace(".", "-")
    result = run_notebook(args.input, out, params, log_output=True,
                          cell_timeout=args.cell_timeout or None)
    print(f"{Path(args.input).name}: {'ok' if result.ok else 'FAILED ' + result.error} "
          f"in {result.seconds:.0f}s -> {result.output}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
