"""`labkit emulate` and `labkit job`: your own training code as a Vertex AI job, run here the
way the service would run it, then for real.

    labkit emulate --workers 1 --output gs://my-bucket/run -- python -m trainer.task --epochs 2
    labkit emulate --spec job.yaml --preempt-at-step 3 --step-pattern 'Epoch (\\d+)'
    labkit job --dry-run --workers 1 --accelerator-type NVIDIA_L4 --accelerator-count 1 \\
        --machine-type g2-standard-8 --spot --output gs://my-bucket/run -- python train.py
    labkit job --spec job.yaml

Both build the same CustomJobSpec from the same flags (or read the spec file a user passes to
``gcloud ai custom-jobs create --config``); `labkit job --emulate` is `labkit emulate`.
`labkit emulate` runs every replica here (`labkit.vertex.emulator`): ``--workdir`` holds
everything the job leaves (``gcs/<bucket>/...`` is its emulated bucket, ``jobs/<id>/`` the
replicas' logs and container disks); the replicas' output is shown as it comes. `labkit job`
validates the spec offline and, with credentials, a project and a region, creates the job
with google-cloud-aiplatform (uploading the code archive first); otherwise it prints the REST
JSON and the equivalent ``gcloud`` command.

With ``--tune-metric`` and ``--param`` the job is a hyperparameter tuning study whose trials
run the command with the trial's values appended as ``--NAME=VALUE``: `labkit emulate` runs the
study here, `labkit job` submits it.

Exit status: 0 the job succeeded (or was submitted / printed), 1 it failed (the failing replica
and its last line are printed), 2 input refused before anything started (one line).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from labkit.core.config import ParameterError, parse_int

REPLICA_NAMES = {0: "chief", 1: "worker", 2: "pool2", 3: "evaluator"}


class Refused(Exception):
    """Input refused before anything started: one line, exit status 2."""


def _count(text: str) -> int:
    value = parse_int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (got {text})")
    return value


def _duration(text: str) -> float:
    from labkit.vertex.faults import parse_duration

    try:
        return parse_duration(text, "duration")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).replace("duration ", "")) from None


def add_job_flags(p: argparse.ArgumentParser, *, emulate: bool) -> None:
    g = p.add_argument_group("the job (or --spec FILE)")
    g.add_argument("--spec", default=None, metavar="FILE",
                   help="a CustomJobSpec, CustomJob or HyperparameterTuningJob as JSON or YAML (what "
                        "`gcloud ai custom-jobs create --config` takes); replaces the flags below")
    g.add_argument("--output", default=None, metavar="gs://BUCKET/PATH",
                   help="base output directory: Vertex sets AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and "
                        "AIP_TENSORBOARD_LOG_DIR under it")
    g.add_argument("--workers", type=_count, default=0, help="replicas in workerpool1 (besides the primary)")
    g.add_argument("--ps", type=_count, default=0, help="parameter servers (workerpool2)")
    g.add_argument("--reduction-server", type=_count, default=0, metavar="N",
                   help="Reduction Server replicas (workerpool2, Google's image)")
    g.add_argument("--evaluators", type=_count, default=0, help="evaluators (workerpool3)")
    g.add_argument("--machine-type", default=None, help="default n1-standard-8")
    g.add_argument("--accelerator-type", default=None, help="e.g. NVIDIA_L4, NVIDIA_H100_80GB")
    g.add_argument("--accelerator-count", type=_count, default=0)
    g.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="container env (repeatable)")
    g.add_argument("--image", default=None, metavar="URI",
                   help="your container image (default: labkit's image, with --code shipped as an archive)")
    g.add_argument("--entrypoint", default=None, metavar="COMMAND",
                   help="the image's ENTRYPOINT: the words after -- become its args, as "
                        "CustomContainerTrainingJob sends them (JSON list or shell words)")
    g.add_argument("--dockerfile", default=None, metavar="FILE",
                   help="read ENTRYPOINT, CMD, WORKDIR, ENV and the COPY'd files from your Dockerfile")
    g.add_argument("--container-workdir", default=None, metavar="DIR",
                   help="the image's working directory: a local folder holding what the image has "
                        "there (each replica starts in a fresh copy), or with --dockerfile a path in it")
    g.add_argument("--code", default=None, metavar="DIR",
                   help="the folder with your code (default: the current folder); without --image it "
                        "is shipped to the job as an archive in the bucket")
    g.add_argument("--requirements", default=None, metavar="FILE",
                   help="pip requirements inside --code, installed when the container starts "
                        "(default: its requirements.txt when there is one)")
    g.add_argument("--framework", choices=("torch", "tf"), default="torch",
                   help="labkit image family when --image is not given")
    g.add_argument("--python-module", default=None, metavar="MODULE",
                   help="run as a python_package_spec: python -m MODULE from --package")
    g.add_argument("--package", action="append", default=[], metavar="PATH|gs://...",
                   help="an sdist, wheel or source folder holding --python-module (repeatable)")
    s = p.add_argument_group("capacity and cost guards")
    s.add_argument("--spot", action="store_true", help="scheduling.strategy = SPOT")
    s.add_argument("--flex-start", action="store_true", help="scheduling.strategy = FLEX_START")
    s.add_argument("--max-wait", type=_duration, default=None, metavar="DURATION")
    s.add_argument("--timeout", type=_duration, default=None, metavar="DURATION",
                   help="scheduling.timeout, e.g. 6h (default: labkit's 24h for a built spec)")
    s.add_argument("--restart-job-on-worker-restart", action=argparse.BooleanOptionalAction, default=None,
                   help="restart every replica when one restarts (default: on for multi-node jobs)")
    s.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("--tensorboard", default=None, metavar="projects/P/locations/L/tensorboards/ID")
    s.add_argument("--service-account", default=None)
    s.add_argument("--display-name", default=None)
    w = p.add_argument_group("looking inside the running job")
    w.add_argument("--enable-web-access", action="store_true",
                   help="an interactive shell into each node (the job's web_access_uris)")
    w.add_argument("--tensorboard-profiler", action="store_true",
                   help="TensorFlow: capture profiles from the running job in Vertex AI TensorBoard "
                        "(needs --tensorboard and --service-account)")
    t = p.add_argument_group("hyperparameter tuning (the command reads --NAME=VALUE flags)")
    t.add_argument("--tune-metric", default=None, metavar="METRIC",
                   help="the metric the script reports with cloudml-hypertune")
    t.add_argument("--goal", choices=("minimize", "maximize"), default="minimize")
    t.add_argument("--param", action="append", default=[], metavar="NAME=SPEC",
                   help="log:LOW:HIGH, linear:LOW:HIGH, or V1,V2,... (repeatable)")
    t.add_argument("--trials", type=parse_int, default=4)
    t.add_argument("--parallel-trials", type=parse_int, default=2)
    t.add_argument("--algorithm", choices=("bayesian", "grid", "random"), default="bayesian")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="the training command (after --)")
    if emulate:
        add_emulate_flags(p)


def add_emulate_flags(p: argparse.ArgumentParser) -> None:
    e = p.add_argument_group("running it here")
    e.add_argument("--workdir", default=None, metavar="DIR",
                   help="holds everything the job leaves: gcs/ (the emulated bucket) and jobs/<id>/ "
                        "(logs, container disks); default runs/emulate/<time>")
    e.add_argument("--upload", action="append", default=[], metavar="LOCAL=gs://BUCKET/PATH",
                   help="copy a local file or folder into the emulated bucket first (your data)")
    e.add_argument("--preempt-after", type=_duration, default=None, metavar="DURATION",
                   help="preempt --preempt-replica this long into its run (e.g. 30s)")
    e.add_argument("--preempt-at-step", type=_count, default=None, metavar="N",
                   help="preempt when a replica prints step N (read with --step-pattern)")
    e.add_argument("--step-pattern", default=None, metavar="REGEX",
                   help=r"how a step shows in your output, group 1 the number, e.g. 'Epoch:? (\d+)' "
                        "(default: 'step N' or a tqdm 'N/M' counter)")
    e.add_argument("--preempt-when-file", default=None, metavar="PATH",
                   help="preempt when this file appears (gs://, /gcs/ or local), e.g. a checkpoint")
    e.add_argument("--preempt-replica", default="workerpool0", metavar="REPLICA",
                   help="workerpool0 (default) or workerpool1[0] ...")
    e.add_argument("--preempt-signal", choices=("SIGTERM", "SIGKILL"), default="SIGTERM",
                   help="SIGTERM: a preemption (restarts the job on --spot); SIGKILL: a machine failure")
    e.add_argument("--preempt-times", type=parse_int, default=1)
    e.add_argument("--gcs-mount", choices=("auto", "namespace", "rewrite"), default="auto",
                   help="how replicas get their /gcs (see labkit.vertex.emulator)")
    e.add_argument("--quiet", action="store_true", help="do not show the replicas' output as it comes")


def add_emulate_command(subparsers) -> None:
    p = subparsers.add_parser(
        "emulate", help="run your own training code here as a multi-replica Vertex AI job",
        description="Run a training command (after --) or a CustomJob spec file on this machine as "
                    "Vertex AI would: one process per replica with CLUSTER_SPEC, TF_CONFIG, "
                    "MASTER_ADDR/RANK and the AIP_* folders, an emulated Cloud Storage bucket behind "
                    "gs:// and /gcs/, Vertex's restart rules and injected preemptions.")
    add_job_flags(p, emulate=True)
    p.set_defaults(handler=_emulate_command)


def add_job_command(subparsers) -> None:
    p = subparsers.add_parser(
        "job", help="submit your own training code as a Vertex AI job (dry run without credentials)",
        description="Build the CustomJob (or tuning job) for a training command (after --) or a spec "
                    "file, validate it offline, and create it with google-cloud-aiplatform when a "
                    "project, region and credentials are configured; otherwise print the REST JSON "
                    "and the equivalent gcloud command.")
    add_job_flags(p, emulate=True)
    p.add_argument("--dry-run", action="store_true", help="only validate and print; submit nothing")
    p.add_argument("--emulate", action="store_true", help="run it here instead (labkit emulate)")
    p.add_argument("--project", default=None)
    p.add_argument("--region", default=None)
    p.add_argument("--endpoint", default=None,
                   help="another JobService, e.g. the local fake (labkit.vertex.fake_service)")
    p.set_defaults(handler=_job_command)


# ---------------------------------------------------------------- labkit emulate

def _printer(quiet: bool):
    if quiet:
        return None
    import threading

    lock = threading.Lock()

    def show(replica: str, line: str) -> None:
        text = line.rstrip()
        if text:
            with lock:
                print(f"[{replica}] {text}", flush=True)

    return show


def emulate(args) -> int:
    """`labkit emulate` (and `labkit job --emulate`): `labkit.vertex.own_job`, printed as it goes."""
    from labkit.vertex.emulator import CannotEmulate, run_local
    from labkit.vertex.own_job import Emulated, JobRequest, prepare

    request = JobRequest.from_namespace(args)
    try:
        built, fault, workdir, jobdir, notes = prepare(request)
    except (ParameterError, ValueError, OSError) as e:
        raise Refused(str(e)) from None
    for note in notes:
        print(f"labkit emulate: {note}")
    out = Emulated(built, workdir, jobdir, notes=notes)
    try:
        if built.tuning:
            return _emulate_study(out)
        _describe(out)
        out.job = run_local(built.spec, jobdir, fault=fault, gcs_root=workdir / "gcs", image=built.image,
                            job_id=jobdir.name, step_pattern=request.step_pattern, gcs_mount=request.gcs_mount,
                            show_progress=args.quiet, on_output=_printer(args.quiet))
    except (ParameterError, CannotEmulate) as e:
        raise Refused(str(e)) from None
    return _report(out)


def _describe(out) -> None:
    parts = [f"{int(p.get('replica_count', 0))} x workerpool{i} ({REPLICA_NAMES[i]})"
             for i, p in enumerate(out.built.spec["worker_pool_specs"]) if p]
    print(f"labkit emulate: {', '.join(parts)}; bucket folder {out.workdir / 'gcs'}; logs in {out.jobdir / 'logs'}")
    if out.built.output_uri:
        print(f"labkit emulate: AIP_MODEL_DIR={out.built.output_uri.rstrip('/')}/model/ (and checkpoints/, logs/)")


def _report(out) -> int:
    job = out.job
    print(f"labkit emulate: {job.state} in {job.seconds:.1f}s ({job.job_restarts} job restart(s), "
          f"{job.worker_restarts} replica restart(s))")
    routine = re.compile(r"^attempt \d+: (started \d+ replica|\S+ exited 0$)|^job JOB_STATE")
    for event in job.events:
        if not routine.search(event):
            print(f"  {event}")
    if out.built.output_uri:
        files = out.outputs()
        print(f"labkit emulate: {len(files)} file(s) under {out.built.output_uri} -> {out.bucket_folder}")
        for name in files[:12]:
            print(f"  {name}")
        if len(files) > 12:
            print(f"  ... and {len(files) - 12} more")
    if job.succeeded:
        return 0
    bad = job.failing()
    where = f" (log {bad.log_path})" if bad is not None else ""
    print(f"labkit emulate: the job failed: {job.error}{where}")
    return 1


def _emulate_study(out) -> int:
    from labkit.vertex.tuning import run_local_tuning, study_summary

    spec = out.built.spec
    metric = spec["study_spec"]["metrics"][0]
    print(f"labkit emulate: a study of {spec['max_trial_count']} trial(s), {spec['parallel_trial_count']} at a "
          f"time; trials in {out.jobdir}")
    try:
        out.trials = run_local_tuning(spec, out.jobdir, image=out.built.image, gcs_root=out.workdir / "gcs")
    except (ParameterError, ValueError) as e:
        raise Refused(str(e)) from None
    for r in out.trials:
        print(f"  trial {r.trial_id}: {r.state} {metric['metric_id']}={r.metric} {r.parameters}"
              + (f" ({r.error})" if r.error else ""))
    best = study_summary(out.trials, metric["goal"].lower()).best
    if best is not None:
        print(f"labkit emulate: best trial {best.trial_id}: {metric['metric_id']}={best.metric} with {best.parameters}")
        return 0
    print(f"labkit emulate: no trial reported {metric['metric_id']!r}")
    return 1


def _emulate_command(args) -> int:
    return _run(emulate, args, "labkit emulate")


# ---------------------------------------------------------------- labkit job

def submit_job(args) -> int:
    from labkit import vertex
    from labkit.vertex.userjob import gcloud_command, rest_json

    if args.emulate:
        return emulate(args)
    import tempfile

    from labkit.vertex.own_job import JobRequest, build

    with tempfile.TemporaryDirectory(prefix="labkit-job-") as staging:
        try:
            built = build(JobRequest.from_namespace(args), for_emulator=False, staging=Path(staging))
            if built.tuning:
                vertex.validate_tuning_job(built.spec) if _has_aiplatform() else None
            elif _has_aiplatform():
                vertex.validate(built.spec)
        except (ParameterError, ValueError, OSError) as e:
            raise Refused(str(e)) from None
    for note in built.notes:
        print(f"labkit job: {note}")
    credentials = None
    if args.endpoint and _loopback(args.endpoint):
        from google.auth.credentials import AnonymousCredentials

        credentials = AnonymousCredentials()
    base = built.output_uri
    bucket = "gs://" + base[5:].split("/")[0] if base.startswith("gs://") else None
    check = vertex.preflight(project=args.project, region=args.region, bucket=bucket, credentials=credentials)
    if args.dry_run or not check.ready:
        spec_json = json.dumps(built.spec, indent=2) if built.tuning else rest_json(built.spec)
        print(spec_json)
        if not built.tuning:
            print(vertex.estimate_cost(built.spec).text())
        for uri, data in built.uploads.items():
            print(f"would upload {uri} ({len(data) / 1e6:.2f} MB)")
        if not built.tuning:
            region = check.context.region or "us-central1"
            print("\nthe same job with gcloud:\n" + gcloud_command(built.spec, display_name=built.display_name,
                                                                   region=region, labels=built.labels))
        print(check.text())
        print("(dry run: nothing submitted)")
        return 0
    from labkit.vertex.submit import job_images

    if any("/labkit/labkit-" in i for i in job_images(built.spec)):
        print("labkit job: the job runs labkit's image with your code unpacked in it; build and push "
              "that image once with `labkit image`, or give your own with --image")
    try:
        job = vertex.submit(built.spec, display_name=built.display_name, project=args.project,
                            region=args.region, bucket=bucket, labels=built.labels, files=built.uploads,
                            endpoint=args.endpoint, credentials=credentials)
    except (ParameterError, ValueError, vertex.VertexNotConfigured) as e:
        raise Refused(str(e)) from None
    print(f"submitted {job.name}")
    if built.job_spec.get("enable_web_access"):
        print("interactive shells: once the job runs, its webAccessUris list one per node (the job's "
              f"page in the console, or gcloud ai custom-jobs describe {job.name} "
              "--format='value(webAccessUris)')")
    return 0


def _loopback(endpoint: str) -> bool:
    from labkit.vertex.submit import is_loopback

    return is_loopback(endpoint)


def _has_aiplatform() -> bool:
    from labkit.core.frameworks import has_aiplatform

    return has_aiplatform()


def _job_command(args) -> int:
    return _run(submit_job, args, "labkit job")


def _run(func, args, name: str) -> int:
    try:
        return func(args)
    except Refused as e:
        print(f"{name}: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
