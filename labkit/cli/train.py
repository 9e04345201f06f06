"""`labkit train` (one run, or local DDP replicas) and `labkit launch-tf` (MultiWorkerMirrored
workers on loopback). The flags of `labkit train` are generated from `TrainConfig`."""

from __future__ import annotations

import argparse

from labkit.core.config import ParameterError, parse_int
from labkit.core.train_config import (
    PREEMPTED_EXIT_CODE,
    Preempted,
    add_arguments,
    from_namespace,
)


def add_train_command(subparsers) -> None:
    p = subparsers.add_parser(
        "train", help="train a model (torch or tf) and write per-step metrics",
        description="Train a model on deterministic synthetic data. Exit code 143 means the run "
                    "was preempted (SIGTERM or --preempt-at) after checkpointing: run the same "
                    "command again to resume.")
    add_arguments(p)
    p.add_argument("--nproc-per-node", type=parse_int, default=1,
                   help="start this many local processes (gloo on loopback; torch only): DDP "
                        "replicas, or the ranks of the --parallel mode")
    p.set_defaults(handler=_train_command)


def _train_command(args) -> int:
    from labkit.core.cluster import from_env
    from labkit.train import describe_device, run_replicas, run_training

    try:
        config = from_namespace(args)
    except ParameterError as e:
        print(f"labkit train: {e}")
        return 2
    nproc = args.nproc_per_node
    try:
        where = describe_device(config, max(1, nproc))  # `--device cuda` without a GPU stops here
        if config.device == "auto" and not from_env().is_distributed:
            print(f"labkit train: {where}", flush=True)
        if nproc > 1:
            if config.framework != "torch":
                raise ParameterError("nproc_per_node", nproc, "is supported for --framework torch only")
            config.check_world_size(nproc)
            log = run_replicas(config, nproc)
        else:
            log = run_training(config)
    except Preempted as e:
        print(f"labkit train: {e}; run the same command again to resume")
        return PREEMPTED_EXIT_CODE
    except (ValueError, OSError) as e:  # a setting or an output this run cannot use (found on start-up)
        print(f"labkit train: {e}")
        return 2
    summary = log.to_dict()["summary"]
    if log.run.get("already_complete"):
        kept = f"; {config.metrics_out} kept as it was" if config.metrics_out else ""
        print(f"labkit train: nothing to train: the run was already complete ({config.steps} steps "
              f"checkpointed in {config.checkpoint_dir}){kept}")
        return 0
    print(f"labkit train: {summary.get('num_steps', 0)} steps, final loss {summary.get('final_loss')}")
    return 0


def add_launch_tf_command(subparsers) -> None:
    p = subparsers.add_parser(
        "launch-tf", help="run `labkit train --framework tf` as N MultiWorkerMirrored workers "
                          "on loopback (TF_CONFIG per worker)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--ps", type=int, default=0,
                   help="parameter servers (ParameterServerStrategy; the chief coordinates)")
    p.add_argument("--vertex-names", action="store_true",
                   help="name the primary replica 'master' as Vertex does")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="flags for labkit train")
    p.set_defaults(handler=_launch_tf_command)


def _launch_tf_command(args) -> int:
    from labkit.tf.launch import LaunchConfig, launch

    train_args = [a for a in args.train_args if a != "--"]
    results = launch(LaunchConfig(num_workers=args.workers, train_args=tuple(train_args),
                                  num_ps=args.ps,
                                  vertex_names=args.vertex_names, timeout_s=args.timeout))
    for r in results:
        print(f"--- {r.task} exit {r.returncode}")
        print(r.output.strip()[-2000:])
    codes = [r.returncode for r in results]
    return 0 if all(c == 0 for c in codes) else next(c for c in codes if c != 0)
