"""`labkit profile`: profile a small training run, print the step breakdown, the top ops and
the verdict, and write the Chrome trace (Perfetto), TensorBoard logs and a JSON summary.

    labkit profile --input-latency-ms 20            # an input-bound run: see the verdict
    labkit profile --input-latency-ms 20 --num-workers 4 --prefetch-factor 4
    labkit profile --shape deep_narrow --batch-size 2   # launch/overhead-bound
    labkit profile --model cnn --input-latency-ms 100   # a real `labkit train` run (torch engine)
    labkit profile --trace path/to/trace.json        # analyse an existing torch.profiler trace
    labkit profile -- python my_train.py --epochs 3  # your own script, unmodified

With a command after --, the command runs as it is: its first `optimizer.step()` starts the
profiler, --warmup steps are traced and dropped, the next --active steps are kept, then the
command is stopped (--then continue lets it finish). The report names your own functions and
DataLoader. Exit 2 when the command never trains (no optimizer step) or ends too soon.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from labkit.core.config import ParameterError
from labkit.core.placement import DEVICES


def add_profile_command(subparsers) -> None:
    p = subparsers.add_parser("profile", help="profile a training run: step breakdown, top ops, verdict and fix",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--framework", choices=("torch", "tf"), default="torch")
    p.add_argument("--trace", default=None, help="analyse this Chrome trace instead of running")
    p.add_argument("--model", choices=("cnn", "resnet", "gpt"), default=None,
                   help="profile `labkit train` with this model (torch engine) instead of the MLP workload")
    p.add_argument("--shape", choices=("mlp", "deep_narrow"), default="mlp")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--prefetch-factor", type=int, default=2)
    p.add_argument("--pin-memory", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--input-latency-ms", type=float, default=0.0)
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("--cpu-threads", type=int, default=1,
                   help="torch CPU threads (default 1 keeps CPU timings steady; 0 = torch's default)")
    p.add_argument("--wait", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--active", type=int, default=3)
    p.add_argument("--out", default=None, help="folder for traces and summary (default: a temp folder)")
    p.add_argument("--json", default=None, help="also write the summary JSON here")
    p.add_argument("--steps", type=int, default=None,
                   help="with a command: training steps to record (default: --active)")
    p.add_argument("--then", choices=("stop", "continue"), default="stop",
                   help="with a command: stop it once the steps are traced (default), or let it finish")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="profile this training command, unmodified (after --)")
    p.set_defaults(handler=_profile_command)


def trace_file(path: str) -> Path:
    """`--trace`: a trace file, or a folder holding traces (what `tensorboard_trace_handler`
    writes: one file per profiled step range), whose newest trace is read."""
    p = Path(path)
    if not p.is_dir():
        return p
    traces = sorted((q for q in p.rglob("*") if q.is_file() and q.name.endswith((".json", ".json.gz"))),
                    key=lambda q: q.stat().st_mtime)
    if not traces:
        raise ParameterError("--trace", path, "is a folder with no trace file in it (*.json, *.json.gz): "
                             "give the trace file torch.profiler wrote")
    print(f"labkit profile: reading {traces[-1]}, the newest of {len(traces)} trace file(s) in {path}")
    return traces[-1]


def _profile_command(args) -> int:
    from labkit.profiling.analysis import op_profile, step_breakdown, top_ops
    from labkit.profiling.verdict import diagnose

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="labkit-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        if command:
            return _profile_command_line(command, args, out)
        if args.trace:
            from labkit.profiling.trace import timeline_from_chrome_trace

            tl = timeline_from_chrome_trace(trace_file(args.trace))
            b, ops = step_breakdown(tl), op_profile(tl)
            print(b.text())
            for o in top_ops(tl, 5):
                print(f"  {o.share:5.1%}  {o.name} (x{o.count})")
            print(diagnose(b, ops).text())
            return 0
        if args.framework == "tf":
            return _profile_tf(args, out)
        from labkit.profiling.run import profile_training, profile_workload, set_cpu_threads
        from labkit.profiling.torch_profiler import ProfileConfig
        from labkit.profiling.workload import WorkloadConfig

        set_cpu_threads(args.cpu_threads)
        pc = ProfileConfig(out_dir=str(out), wait=args.wait, warmup=args.warmup, active=args.active)
        if args.model:
            from labkit.core.train_config import TrainConfig

            steps = pc.steps_needed
            tc = TrainConfig(model=args.model, batch_size=args.batch_size, steps=steps, num_workers=args.num_workers,
                             pin_memory=args.pin_memory, input_latency_ms=args.input_latency_ms,
                             device=args.device, num_samples=args.batch_size * 4 * steps)
            result = profile_training(tc, pc, label=f"labkit train --model {args.model}")
            return _print_result(result, args, out)
        wl = WorkloadConfig(shape=args.shape, batch_size=args.batch_size, width=args.width, depth=args.depth,
                            num_workers=args.num_workers, prefetch_factor=args.prefetch_factor,
                            pin_memory=args.pin_memory, input_latency_ms=args.input_latency_ms, device=args.device,
                            threads=args.cpu_threads)
        result = profile_workload(wl, pc, label="labkit profile")
    except (ParameterError, ValueError, FileNotFoundError) as e:
        print(f"labkit profile: {e}")
        return 2
    return _print_result(result, args, out)


def _profile_command_line(command: list[str], args, out: Path) -> int:
    import json

    from labkit.profiling.command import profile_command

    print(f"labkit profile: running {' '.join(command)} (traces in {out})", flush=True)
    result = profile_command(command, out, steps=args.steps or args.active, warmup=args.warmup, then=args.then,
                             on_line=lambda line: print(f"  | {line.rstrip()}", flush=True))
    print(result.text())
    path = Path(args.json) if args.json else out / "summary.json"
    path.write_text(json.dumps(result.summary(), indent=2, default=str))
    print(f"summary: {path}")
    return 0


def _print_result(result, args, out: Path) -> int:
    print(result.text())
    summary = result.write_json(Path(args.json) if args.json else out / "summary.json")
    print(f"TensorBoard: tensorboard --logdir {result.tensorboard_dir}\nsummary: {summary}")
    return 0


def _profile_tf(args, out: Path) -> int:
    import json

    from labkit.core.frameworks import has_tf, missing_reason
    from labkit.profiling.analysis import step_breakdown
    from labkit.profiling.tf_profiler import TFWorkloadConfig, run_tf_workload, tf_profile
    from labkit.profiling.verdict import diagnose

    if not has_tf():
        print("labkit profile: " + missing_reason("tensorflow"))
        return 2
    from labkit.tf import runtime

    runtime.configure(args.device)  # --device cuda without a GPU TensorFlow can use: a ParameterError
    cfg = TFWorkloadConfig(batch_size=args.batch_size, width=args.width, depth=args.depth,
                           input_latency_ms=args.input_latency_ms, parallel_calls=max(args.num_workers, 1),
                           prefetch=args.num_workers > 0, steps=args.wait + args.warmup + args.active)
    with tf_profile(out / "tensorboard") as prof:
        timer = run_tf_workload(cfg, prof)
    b = step_breakdown(timer.timeline, skip_first=args.wait + args.warmup)
    verdict = diagnose(b)
    print(b.text())
    print(verdict.text())
    print(f"TensorBoard: tensorboard --logdir {prof.logdir}")
    path = Path(args.json) if args.json else out / "summary.json"
    path.write_text(json.dumps({"fractions": b.fractions, "verdict": verdict.kind, "fix": verdict.fix,
                                "notebook": verdict.notebook,
                                "xplane": [str(p) for p in prof.trace_files()]}, indent=2))
    print(f"summary: {path}")
    return 0
