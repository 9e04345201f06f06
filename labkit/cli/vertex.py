"""`labkit run NOTEBOOK --vertex ...`: the notebook as a Vertex AI custom job, or with
`--executor` as a job of Vertex's own notebook executor (a NotebookExecutionJob).

Without a configured cloud (or with --dry-run) it prints the validated spec, the estimated cost
per hour and what is missing to submit; with one, it uploads the notebook and labkit and
creates the job. With `--executor` the dry run prints the NotebookExecutionJob's REST JSON and
the equivalent `gcloud workbench executions create` command; options the executor cannot
honour (replicas, Reduction Server, Spot, flex-start, images...) are refused, naming the flag.
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
    g.add_argument("--replicas", "--replica-count", dest="replicas", type=parse_int, default=1,
                   help="training nodes (pool 0 + pool 1)")
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
    g.add_argument("--executor", action="store_true",
                   help="run on Vertex's own notebook executor (the Workbench runtime image and kernel, "
                        "one VM) instead of a custom job in labkit's image")
    g.add_argument("--kernel-name", default="python3", help="with --executor: the kernel that runs the notebook")
    g.add_argument("--endpoint", default=None,
                   help="another Vertex API endpoint, e.g. the local fake (labkit.vertex.fake_service)")


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
    if args.executor:
        return run_on_executor(args, params)
    credentials = _loopback_credentials(args.endpoint)
    check = vertex.preflight(project=args.project, region=args.region, bucket=args.bucket,
                             credentials=credentials)
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
                        project=args.project, region=args.region, bucket=args.bucket,
                        endpoint=args.endpoint, credentials=credentials)
    print(f"submitted {job.name}; the executed notebook will be at {output_uri}/notebooks/{notebook.name}")
    return 0


def _loopback_credentials(endpoint: str | None):
    """Anonymous credentials for a local endpoint (the fake service); None otherwise."""
    from labkit.vertex.submit import is_loopback

    if endpoint and is_loopback(endpoint):
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    return None


# (option, its default, flag, why the executor cannot honour it). A NotebookExecutionJob has one
# VM, no container image, no scheduling block and no per-cell timeout (labkit.vertex.notebook_execution).
_NOT_FOR_EXECUTOR = (
    ("replicas", 1, "--replicas/--replica-count", "the executor runs the notebook on one VM; "
     "multi-replica jobs are custom jobs (drop --executor)"),
    ("reduction_servers", 0, "--reduction-servers", "the executor has no worker pools, so no Reduction Server"),
    ("spot", False, "--spot", "a NotebookExecutionJob has no scheduling strategy (no Spot VMs)"),
    ("flex_start", False, "--flex-start", "a NotebookExecutionJob has no scheduling strategy (no DWS flex-start)"),
    ("max_wait_s", None, "--max-wait-s", "a NotebookExecutionJob has no scheduling strategy (no DWS flex-start)"),
    ("reservation", None, "--reservation", "the executor offers no reservation (gcloud workbench executions "
     "create has no such flag)"),
    ("persistent_resource_id", None, "--persistent-resource-id", "a NotebookExecutionJob runs on its own VM"),
    ("tensorboard", None, "--tensorboard", "a NotebookExecutionJob has no TensorBoard field"),
    ("image", None, "--image", "the executor runs the Workbench runtime's image (choose the kernel with "
     "--kernel-name), not a container image"),
    ("framework", "torch", "--framework", "it picks labkit's image, which the executor does not run"),
    ("cell_timeout_s", 1800, "--cell-timeout-s", "the executor bounds the whole run (--timeout-s), not each cell"),
)


def executor_refusal(args: argparse.Namespace):
    """A ParameterError for the first option `args` sets that the executor cannot honour, or None."""
    from labkit.core.config import ParameterError

    for option, default, flag, why in _NOT_FOR_EXECUTOR:
        value = getattr(args, option, default)
        if value != default:
            return ParameterError(flag, value, f"cannot be used with --executor: {why}")
    return None


def run_on_executor(args: argparse.Namespace, params: dict[str, Any]) -> int:
    """`labkit run NOTEBOOK --vertex --executor`: build the NotebookExecutionJob; print it (dry
    run) or create it."""
    from labkit import vertex
    from labkit.notebooks import timestamp
    from labkit.vertex import notebook_execution as nbx

    refusal = executor_refusal(args)
    if refusal:
        raise refusal
    notebook = Path(args.notebook)
    credentials = _loopback_credentials(args.endpoint)
    check = vertex.preflight(project=args.project, region=args.region, bucket=args.bucket,
                             credentials=credentials)
    bucket = (check.context.bucket or PLACEHOLDER_BUCKET).rstrip("/")
    output_uri = f"{bucket}/labkit/runs/{timestamp()}-{notebook.stem}"
    spec = nbx.notebook_execution_job(
        str(notebook), params, output_uri=output_uri, machine_type=args.machine_type,
        accelerator_type=args.accelerator_type, accelerator_count=args.accelerator_count,
        kernel_name=args.kernel_name, service_account=args.service_account,
        timeout_s=args.timeout_s, labels=_labels(args.label))
    if nbx.imports_without_install(notebook):
        print(f"labkit run --executor: {notebook.name} imports labkit but installs nothing; the executor's "
              "runtime image has no labkit: add a first cell that pip-installs it (e.g. a wheel in your bucket)")
    missing = vertex.notebook_execution_missing(spec, check)
    if args.dry_run or missing:
        vertex.validate_notebook_execution(spec)
        print(nbx.execution_rest_json(spec))
        source = spec["gcs_notebook_source"]["uri"]
        print(f"would upload {source} ({len(nbx.notebook_content(notebook, params)) / 1e3:.1f} kB"
              + (", parameters written into its injected-parameters cell)" if params else ")"))
        region = check.context.region or "us-central1"
        print("\nthe same job with gcloud (an older Cloud SDK has it under `gcloud beta`):\n"
              + nbx.gcloud_command(spec, region))
        for gap in nbx.gcloud_gaps(spec):
            print(f"  (not carried by the gcloud command: {gap})")
        print("dry-run mode; to submit, provide:\n- " + "\n- ".join(missing) if missing else check.text())
        print(f"(dry run: nothing submitted; the executed notebook would be written under {spec['gcs_output_uri']}/)")
        return 0
    job = vertex.submit_notebook_execution(spec, project=args.project, region=args.region, bucket=args.bucket,
                                           endpoint=args.endpoint, credentials=credentials)
    print(f"submitted {job.name}; the executed notebook will be written under {spec['gcs_output_uri']}/")
    return 0
