"""`labkit doctor`: versions, devices, Google Cloud configuration, and what they mean."""

from __future__ import annotations

import json

from labkit.core.doctor import collect


def add_doctor_command(subparsers) -> None:
    p = subparsers.add_parser("doctor", help="check this environment for the course")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=_doctor_command)


def _doctor_command(args) -> int:
    report = collect()
    print(json.dumps(report.to_dict(), indent=1) if args.json else report.text())
    return 0
