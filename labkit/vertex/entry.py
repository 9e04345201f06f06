"""What a Vertex job runs in its container: papermill on a notebook, or torchrun on a node.

``python -m labkit.vertex.entry notebook INPUT OUTPUT_DIR --parameters JSON [--artifacts DIR]
[--cell-timeout S] [--device cuda]`` executes INPUT with the parameters and writes it to
OUTPUT_DIR as ``<name>.ipynb`` on the primary replica and ``<name>.<role><index>.ipynb`` on the
others, so replicas never overwrite each other; the kernel's log goes beside it
(``<name>.log``) and the files the notebook makes under DIR (``$LABKIT_ARTIFACTS``). All of it
is worked on in a folder on the VM's disk (``--workdir``, default a fresh temporary folder; the
notebook runs there) and copied to OUTPUT_DIR and DIR every ``--sync-every`` seconds, at each
committed checkpoint and at the end (`labkit.vertex.mirror`); a restarted job first copies back
what the last attempt left under DIR, so its checkpoints resume.
``--cell-timeout`` bounds each cell (0: no limit).
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
    nb.add_argument("--workdir", default=None,
                    help="local folder the notebook runs in (default: a fresh temporary folder)")
    nb.add_argument("--sync-every", type=parse_int, default=60,
                    help="seconds between copies of the working files to the outputs")
    tr = sub.add_parser("torchrun", help="start N processes per node with torchrun, then labkit ARGS")
    tr.add_argument("--nproc-per-node", type=parse_int, required=True)
    tr.add_argument("labkit_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "torchrun":
        return _torchrun(args.nproc_per_node, args.labkit_args)

    from labkit.notebooks.kernel import KERNEL_NAME, ensure_kernel

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
    return _run_notebook_job(args, params)


def _copy_on_sigterm(mirror) -> None:
    """On SIGTERM (a Spot VM taken back, the job cancelled) copy what is there, stop the
    kernel (a child must not outlive the job), then die of the signal."""
    import os
    import signal

    def handler(signum, frame):
        mirror.sync()
        try:
            import psutil  # ipykernel's own dependency, so present wherever a kernel runs
        except ImportError:
            psutil = None
        for child in psutil.Process().children(recursive=True) if psutil else ():
            try:
                child.terminate()
            except psutil.Error:
                pass
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, handler)


def _run_notebook_job(args: argparse.Namespace, params: dict) -> int:
    import os
    import shutil
    import tempfile

    from labkit.notebooks.artifacts import ARTIFACTS_ENV
    from labkit.notebooks.execute import run_notebook
    from labkit.notebooks.stderr import KERNEL_LOG_ENV
    from labkit.vertex.mirror import Mirror, restore

    name = output_name(args.input)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="labkit-notebook-job-")).resolve()
    local_out, local_artifacts = work / "outputs", work / "artifacts"
    local_out.mkdir(parents=True, exist_ok=True)
    local_artifacts.mkdir(parents=True, exist_ok=True)
    notebook = work / Path(args.input).name
    shutil.copyfile(args.input, notebook)  # papermill's working directory is the VM's disk
    pairs = [(local_out, Path(args.output_dir))]
    if args.artifacts:
        suffix = Path(name).stem.removeprefix(Path(args.input).stem)
        artifacts = Path(args.artifacts.rstrip("/") + suffix.replace(".", "-"))
        restored = restore(artifacts, local_artifacts)
        if restored:
            print(f"restored {restored} file(s) a previous attempt left in {artifacts}", flush=True)
        pairs.append((local_artifacts, artifacts))
    out = local_out / name
    # The kernel inherits these: its log and its files stay on this disk until copied.
    os.environ[KERNEL_LOG_ENV] = str(out.with_suffix(".log"))
    os.environ[ARTIFACTS_ENV] = str(local_artifacts)
    with Mirror(pairs, every_s=max(args.sync_every, 1)) as mirror:
        _copy_on_sigterm(mirror)
        result = run_notebook(notebook, out, params, cwd=work, log_output=True,
                              cell_timeout=args.cell_timeout or None)
    for error in mirror.errors[-3:]:
        print(f"labkit notebook job: could not copy {error}", file=sys.stderr)
    print(f"{Path(args.input).name}: {'ok' if result.ok else 'FAILED ' + result.error} "
          f"in {result.seconds:.0f}s -> {Path(args.output_dir) / name}")
    return 0 if result.ok else 1

if __name__ == "__main__":
    sys.exit(main())
