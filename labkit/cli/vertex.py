"""`labkit run NOTEBOOK --vertex ...`: the notebook as a Vertex AI custom job.

Without a configured cloud (or with --dry-run) it prints the validated spec, the estimated cost
per hour and what is missing to submit; with one, it uploads the notebook and labkit and
creates the job.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from labkit.core.config import parse_int

PLACEHOLDER_BUCKET = "gs://YOUR_BUCKET"


def _count_or_auto(text: str) -> int | str:
    return "auto" if text.strip().lower() == "auto" else parse_int(text)


_count_or_auto.__name__ = "count or 'auto'"


def add_vertex_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Vertex AI (with --vertex)")
    g.add_argument("--vertex", action="store_true", help="run as a Vertex AI custom job")
    g.add_argument("--machine-type", default="n1-standard-8")
    g.add_argument("--accelerator-type", default=None, help="e.g. NVIDIA_L4, NVIDIA_H100_80GB")
    g.add_argument("--accelerator-count", type=parse_int, default=0)
    g.add_argument("--replicas", type=parse_int, default=1, help="training nodes (pool 0 + pool 1)")
    g.add_argument("--reduction-servers", type=_count_or_auto, default=0,
                   help="Reduction Server replicas, or 'auto' for as many as the bandwidth rule asks")
    g.add_argument("--spot", action="store_true", help="scheduling.strategy = SPOT")
    g.add_argument("--flex-start", action="store_true",
                   help="scheduling.strategy = FLEX_START (Dynamic Workload Scheduler)")
    g.add_argument("--max-wait-s", type=parse_int, default=None,
                   help="with --flex-start: longest wait for capacity (0: indefinitely)")
    g.add_argument("--reservation", default=None, help="'any' or projects/P/zones/Z/reservations/R")
    g.add_argument("--persistent-resource-id", default=None)
    g.add_argument("--tensorboard", default=None, help="projects/P/locations/L/tensorboards/ID")
    g.add_argument("--service-account", default=None)
    g.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="job label (repeatable)")
    g.add_argument("--cell-timeout-s", type=parse_int, default=1800, help="seconds per cell (0: no limit)")
    g.add_argument("--image", default=None, help="custom container with labkit installed")
    g.add_argument("--framework", default="torch", choices=("torch", "tf"),
                   help="prebuilt image family when --image is not given")
    g.add_argument("--timeout-s", type=parse_int, default=None,
                   help="scheduling.timeout (default: labkit.vertex.DEFAULT_TIMEOUT_S)")
    g.add_argument("--project", default=None)
    g.add_argument("--region", default=None)
    g.add_argument("--bucket", default=None, help="gs://bucket for inputs and outputs")
    g.add_argument("--dry-run", action="store_true",
                   help="only print the spec and cost (the default when the cloud is not configured)")


def _labels(pairs: list[str]) -> dict[str, str]:
    from labkit.core.config import ParameterError

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ParameterError("label", pair, "must be KEY=VALUE")
        out[key] = value
    return out


def run_on_vertex(args: argparse.Namespace, params: dict[str, Any]) -> int:
    from labkit import vertex
    from labkit.core.notebook_params import check_parameters
    from labkit.notebooks import timestamp

    notebook = Path(args.notebook)
    if not notebook.is_file():
        print(f"labkit run: no notebook at {notebook}")
        return 2
    check_parameters(notebook, params)
    check = vertex.preflight(project=args.project, region=args.region, bucket=args.bucket)
    bucket = (check.context.bucket or PLACEHOLDER_BUCKET).rstrip("/")
    output_uri = f"{bucket}/labkit/runs/{timestamp()}-{notebook.stem}"
    spec = vertex.notebook_job(
        str(notebook), params, output_uri=output_uri, machine_type=args.machine_type,
        accelerator_type=args.accelerator_type, accelerator_count=args.accelerator_count,
        replica_count=args.replicas, spot=args.spot, image_uri=args.image,
        reduction_server_count=args.reduction_servers, framework=args.framework,
        timeout_s=args.timeout_s, flex_start=args.flex_start, max_wait_s=args.max_wait_s,
        reservation=args.reservation, persistent_resource_id=args.persistent_resource_id,
        tensorboard=args.tensorboard, service_account=args.service_account,
        labels=_labels(args.label), cell_timeout_s=args.cell_timeout_s or None)
    if args.dry_run or not check.ready:
        print(vertex.dry_run(spec).text())
        print(f"(dry run: nothing submitted; the executed notebook would be written under {output_uri}/notebooks/)")
        return 0
    job = vertex.submit(spec, display_name=f"labkit-{notebook.stem}", notebook=str(notebook),
                        project=args.project, region=args.region, bucket=args.bucket)
    print(f"submitted {job.name}; the executed notebook will be at {output_uri}/notebooks/{notebook.name}")
    return 0
