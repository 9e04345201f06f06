"""`labkit train` (one run, or local DDP replicas) and `labkit launch-tf` (MultiWorkerMirrored
workers on loopback). The flags of `labkit train` are generated from `TrainConfig`.

Every failure a user can cause or meet prints one line naming the flag, path or variable and
the cause, and exits 2; a run stopped by SIGTERM, Ctrl-C or `--timeout` checkpoints first and
exits 143 (run the same command again to resume)."""

from __future__ import annotations

import argparse
import re
import sys

from labkit.core.config import ParameterError, parse_int
from labkit.core.launcher import LaunchError, check_process_count
from labkit.core.train_config import (
    PREEMPTED_EXIT_CODE,
    Preempted,
    add_arguments,
    from_argv,
    from_namespace,
)


def add_train_command(subparsers) -> None:
    p = subparsers.add_parser(
        "train", help="train a model (torch or tf) and write per-step metrics",
        description="Train a model on deterministic synthetic data. Exit code 143 means the run "
                    "was stopped (SIGTERM, Ctrl-C, --preempt-at or --timeout) after "
                    "checkpointing: run the same command again to resume.")
    add_arguments(p)
    p.add_argument("--nproc-per-node", type=parse_int, default=1,
                   help="start this many local processes (gloo on loopback; torch only): DDP "
                        "replicas, or the ranks of the --parallel mode")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="with --nproc-per-node > 1: stop the replicas after this many seconds "
                        "(they checkpoint first; default: no limit)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --metrics-out file of another run (a fresh run "
                        "refuses to by default)")
    p.set_defaults(handler=_train_command)


def _say(message: str, severity: str = "INFO") -> None:
    """One line of output; in a Vertex AI job a JSON log line with `severity` (labkit.core.joblog)."""
    from labkit.core import joblog

    joblog.say(f"labkit train: {message}", severity)


# Flags of the commands themselves (not TrainConfig fields): their errors name the flag.
_OWN_FLAGS = {"nproc_per_node": "--nproc-per-node", "timeout": "--timeout", "num_workers": "--workers",
              "num_ps": "--ps", "timeout_s": "--timeout"}


def _message(e: BaseException) -> str:
    """An error's message, naming a command's own setting as the flag the user typed."""
    text = str(e)
    for name in sorted(_OWN_FLAGS, key=len, reverse=True):
        text = re.sub(rf"(parameter '{name}'|(?<![\w-]){name}(?!\w))", _OWN_FLAGS[name], text)
    return text


def _train_command(args) -> int:
    from labkit.core.cluster import from_env
    from labkit.core.train_config import with_vertex_dirs
    from labkit.train import check_fresh_metrics, describe_device, run_replicas, run_training

    try:
        config = from_namespace(args)
        nproc = args.nproc_per_node
        crowded = check_process_count("nproc_per_node", nproc)
        if args.timeout is not None and (args.timeout <= 0 or args.timeout != args.timeout):
            raise ParameterError("timeout", args.timeout, "must be a positive number of seconds")
        if args.timeout is not None and nproc == 1:
            raise ParameterError("timeout", args.timeout, "applies to --nproc-per-node > 1 (the "
                                 "launcher stops its replicas); a single process runs until done")
        if nproc > 1:
            if config.framework != "torch":
                raise ParameterError("nproc_per_node", nproc, "is supported for --framework torch only")
            config.check_world_size(nproc)
        check_fresh_metrics(with_vertex_dirs(config), overwrite=args.overwrite)
        where = describe_device(config, nproc)  # `--device cuda` without a GPU stops here
    except ParameterError as e:
        _say(_message(e), "ERROR")
        return 2
    if config.device == "auto" and not from_env().is_distributed:
        _say(where)
    if crowded:
        print(f"labkit train: warning: --nproc-per-node {nproc}: {crowded}", file=sys.stderr)
    try:
        if nproc > 1:
            log = run_replicas(config, nproc, timeout_s=args.timeout)
        else:
            log = run_training(config)
    except Preempted as e:
        _say(f"{e}; run the same command again to resume" if e.saved else str(e), "WARNING")
        return PREEMPTED_EXIT_CODE
    except FloatingPointError as e:  # the loss diverged: the metrics file shows the steps up to it
        _say(f"{e}: the run diverged; a lower --lr (this run: {config.lr:g}) or --grad-clip "
             f"usually helps", "ERROR")
        return 2
    except LaunchError as e:  # a replica failed: its own one-line error says why
        _say(e.summary or str(e).splitlines()[0], "ERROR")
        return 2
    except (ValueError, OSError) as e:  # a setting or an output this run cannot use
        _say(str(e), "ERROR")
        return 2
    summary = log.to_dict()["summary"]
    if log.run.get("already_complete"):
        kept = f"; {config.metrics_out} kept as it was" if config.metrics_out else ""
        done = log.run.get("checkpointed_steps", config.steps)
        beyond = f", more than --steps {config.steps}" if done > config.steps else ""
        _say(f"nothing to train: the run was already complete ({done} steps checkpointed in "
             f"{config.checkpoint_dir}{beyond}){kept}")
        return 0
    resumed = log.run.get("resumed_from_step")
    after = f" (resumed after step {resumed})" if resumed is not None else ""
    heldout = log.run.get("heldout")
    unseen = (f"; held-out loss {heldout['loss']:.4f} on {heldout['samples']} unseen samples "
              f"(chance {heldout['chance']:.4f})" if heldout else "")
    _say(f"{summary.get('num_steps', 0)} steps{after}, final loss {summary.get('final_loss')}{unseen}")
    return 0


def add_launch_tf_command(subparsers) -> None:
    p = subparsers.add_parser(
        "launch-tf", help="run `labkit train --framework tf` as N MultiWorkerMirrored workers "
                          "on loopback (TF_CONFIG per worker)")
    p.add_argument("--workers", type=parse_int, default=2)
    p.add_argument("--ps", type=parse_int, default=0,
                   help="parameter servers (ParameterServerStrategy; the chief coordinates)")
    p.add_argument("--vertex-names", action="store_true",
                   help="name the primary replica 'master' as Vertex does")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop the workers after this many seconds (default: no limit)")
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="flags for labkit train")
    p.set_defaults(handler=_launch_tf_command)


def _launch_tf_command(args) -> int:
    from labkit.tf.launch import LaunchConfig, launch

    train_args = [a for a in args.train_args if a != "--"]
    try:
        config = LaunchConfig(num_workers=args.workers, train_args=tuple(train_args), num_ps=args.ps,
                              vertex_names=args.vertex_names, timeout_s=args.timeout)
        check_process_count("num_workers", config.num_workers + config.num_ps)
        # The workers' flags are checked here, once, not by every worker printing the same error.
        from_argv(["--framework", "tf", *train_args])
    except (ValueError, argparse.ArgumentError) as e:
        print(f"labkit launch-tf: {_message(e) if not isinstance(e, ParameterError) or e.name in _OWN_FLAGS else e}")
        return 2
    results = launch(config)
    for r in results:
        print(f"--- {r.task} exit {r.returncode}")
        print(r.output.strip()[-2000:])
    codes = [r.returncode for r in results]
    return 0 if all(c == 0 for c in codes) else next(c for c in codes if c != 0)
