"""The `labkit` command: one module per group of verbs, each only parsing flags and printing what
the library returns. Nothing in labkit imports this package; it is the top of the layers."""

from __future__ import annotations

import argparse
import importlib
import re
import sys

from labkit import __version__

# (module, function that adds the subparser). Imported when the CLI starts; all are framework-free.
_COMMANDS = (
    ("labkit.cli.doctor", "add_doctor_command"),
    ("labkit.cli.notebooks", "add_run_command"),
    ("labkit.cli.notebooks", "add_course_command"),
    ("labkit.cli.train", "add_train_command"),
    ("labkit.cli.train", "add_launch_tf_command"),
    ("labkit.cli.profile", "add_profile_command"),
    ("labkit.cli.data", "add_data_command"),
    ("labkit.cli.estimate", "add_estimate_command"),
    ("labkit.cli.image", "add_image_command"),
    ("labkit.cli.jobs", "add_emulate_command"),
    ("labkit.cli.jobs", "add_job_command"),
)


# What argparse takes for a negative number (a value, not a flag): its own rule knows only
# `-5` and `-.5`, so `--lr -inf` or `--lr -1e-3` read as an unknown flag and gave "expected one
# argument" instead of the value's own error. No labkit flag looks like a number.
_NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$", re.IGNORECASE)


class Parser(argparse.ArgumentParser):
    """argparse's parser, taking `-inf`, `-nan` and `-1e-3` as values of the flag before them
    (subcommand parsers are made of the same class)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _NEGATIVE_NUMBER


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="labkit", description="Measured, tested building blocks for fast and cheap training on Vertex AI.")
    parser.add_argument("--version", action="version", version=f"labkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module, func in _COMMANDS:
        getattr(importlib.import_module(module), func)(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        code = int(args.handler(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C outside a training loop (which checkpoints and stops itself)
        print(f"labkit {args.command}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    replica = sys.modules.get("labkit.torch.distributed")  # loaded only where torch trained
    if replica is not None:
        replica.exit_if_replica(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
