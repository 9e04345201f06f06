"""Sending a CustomJob spec to Vertex AI, or saying exactly why not (preflight + dry run).

`preflight()` lists what is missing to submit (credentials, project, region, bucket, the
google-cloud-aiplatform library). `dry_run(spec)` validates the spec and returns the REST JSON
with the estimated cost per hour. `submit(spec, ...)` refuses a placeholder project, checks with
the credentials that every container image of the job exists in Artifact Registry
(`labkit.vertex.registry`: a missing image would fail only after the machines were
provisioned), uploads local inputs (the notebook and a source archive of labkit) to the bucket
and creates the CustomJob with the job's labels; without a configured cloud it raises
`VertexNotConfigured` listing what is missing. `submit_notebook_execution(spec, ...)` does the
same for Vertex's own notebook executor (`labkit.vertex.notebook_execution`): it uploads the
notebook with its parameters written in and creates the NotebookExecutionJob with the
NotebookService (`notebook_service_client`); `get_job`, `job_state` and `wait` follow either kind.

`submit` talks to the JobService over its REST transport, through `job_service_client`, with
the endpoint and credentials it is given (default: ``REGION-aiplatform.googleapis.com`` and the
application default credentials). A loopback ``http://`` endpoint such as
`labkit.vertex.fake_service.FakeVertex` gets anonymous credentials, so the same code path sends
the same request to the local fake in tests and notebooks as to Vertex AI.
"""

from __future__ import annotations

import io
import os
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.core import gcp
from labkit.core.config import ParameterError
from labkit.core.frameworks import has_aiplatform, missing_reason
from labkit.vertex.fields import field_of
from labkit.vertex.notebook_execution import notebook_content, validate_notebook_execution
from labkit.vertex.pricing import CostEstimate, estimate_cost
from labkit.vertex.registry import check_not_placeholder, require_images
from labkit.vertex.scheduling import check_labels
from labkit.vertex.specs import refuse_placeholders, to_rest_json, validate
from labkit.vertex.tuning import validate_tuning_job


class VertexNotConfigured(RuntimeError):
    """Submission is impossible here; `.missing` says what to provide."""

    def __init__(self, missing: list[str]):
        self.missing = missing
        super().__init__("cannot submit to Vertex AI; missing:\n- " + "\n- ".join(missing))


@dataclass
class Preflight:
    context: gcp.CloudContext
    missing: list[str] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return not self.missing

    def text(self) -> str:
        if self.ready:
            c = self.context
            return f"ready to submit: project {c.project}, region {c.region}, bucket {c.bucket}, {c.credentials}"
        return "dry-run mode; to submit, provide:\n- " + "\n- ".join(self.missing)


def preflight(env: Mapping[str, str] | None = None, *, project: str | None = None,
              region: str | None = None, bucket: str | None = None,
              credentials: Any = None) -> Preflight:
    """What this environment lacks to submit a job (explicit arguments fill gaps; a
    `credentials` object counts as credentials)."""
    ctx = gcp.detect(dict(env) if env is not None else None)
    given = f"the credentials passed in ({type(credentials).__name__})" if credentials is not None else None
    ctx = gcp.CloudContext(project or ctx.project, region or ctx.region,
                           (bucket if bucket is None or bucket.startswith("gs://") else f"gs://{bucket}")
                           or ctx.bucket, given or ctx.credentials, ctx.on_vertex,
                           () if given else ctx.notes)
    missing = ctx.missing() + list(ctx.notes)
    if not has_aiplatform():
        missing.append("library: " + missing_reason("google.cloud.aiplatform").split(" (")[0]
                       + " (pip install 'labkit[vertex]')")
    return Preflight(ctx, missing)


@dataclass
class DryRun:
    """A validated spec not sent anywhere: its REST JSON, cost per hour and the preflight."""

    rest_json: str
    cost: CostEstimate
    preflight: Preflight

    def text(self) -> str:
        return "\n".join([self.rest_json, self.cost.text(), self.preflight.text()])


def dry_run(spec: Mapping[str, Any], env: Mapping[str, str] | None = None) -> DryRun:
    """Validate (when google-cloud-aiplatform is installed) and describe `spec`; sends nothing."""
    if has_aiplatform():
        validate(spec)
    return DryRun(to_rest_json(spec), estimate_cost(spec), preflight(env))


def source_archive() -> bytes:
    """A pip-installable tar.gz of this labkit source tree (pyproject.toml + labkit/)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file():
        raise FileNotFoundError(f"no pyproject.toml beside the labkit package in {root}: "
                                "pass package_uri or use a custom image with labkit installed")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in ("pyproject.toml", "README.md"):
            if (root / name).is_file():
                tar.add(root / name, arcname=f"labkit/{name}")
        tar.add(root / "labkit", arcname="labkit/labkit",
                filter=lambda t: None if "__pycache__" in t.name else t)
    return buf.getvalue()


def _upload(fs, uri: str, data: bytes) -> None:
    """Write `data` to ``gs://bucket/path`` through `fs` (an fsspec filesystem whose paths are
    ``bucket/path``: gcsfs, or a local folder standing in for the bucket)."""
    path = uri[len("gs://"):] if uri.startswith("gs://") else uri
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, data)


def is_loopback(endpoint: str) -> bool:
    """Whether `endpoint` (``host:port`` or a URL) names this machine."""
    from urllib.parse import urlsplit

    host = urlsplit(endpoint if "://" in endpoint else f"//{endpoint}").hostname or ""
    return host in ("localhost", "127.0.0.1", "::1")


def job_service_client(*, region: str | None = None, endpoint: str | None = None,
                       credentials: Any = None):
    """An `aiplatform_v1.JobServiceClient` on the REST transport: for `endpoint` when given
    (``https://host`` or, on loopback, ``http://host:port``), else Vertex AI in `region`.
    Credentials: those given; anonymous ones for a loopback endpoint; else the application
    default credentials."""
    from google.cloud import aiplatform_v1

    endpoint, credentials = _connection("job_service_client", region, endpoint, credentials)
    return aiplatform_v1.JobServiceClient(credentials=credentials, transport="rest",
                                          client_options={"api_endpoint": endpoint})


def notebook_service_client(*, region: str | None = None, endpoint: str | None = None,
                            credentials: Any = None):
    """An `aiplatform_v1.NotebookServiceClient` (notebook execution jobs) on the REST transport,
    connected as `job_service_client` is."""
    from google.cloud import aiplatform_v1

    endpoint, credentials = _connection("notebook_service_client", region, endpoint, credentials)
    return aiplatform_v1.NotebookServiceClient(credentials=credentials, transport="rest",
                                               client_options={"api_endpoint": endpoint})


def _connection(who: str, region: str | None, endpoint: str | None, credentials: Any) -> tuple[str, Any]:
    """The endpoint (Vertex AI in `region` unless given) and the credentials (anonymous ones
    for a loopback endpoint unless given)."""
    if endpoint is None:
        if not region:
            raise ValueError(f"{who} needs a region or an endpoint")
        endpoint = f"{region}-aiplatform.googleapis.com"
    if credentials is None and is_loopback(endpoint):
        from google.auth.credentials import AnonymousCredentials

        credentials = AnonymousCredentials()
    return endpoint, credentials


def _local_bucket(endpoint: str, uploads: Mapping[str, bytes]):
    """The filesystem uploads go through when submitting to a local endpoint: the local Cloud
    Storage server named by ``STORAGE_EMULATOR_HOST``."""
    if not os.environ.get("STORAGE_EMULATOR_HOST"):
        raise ValueError(f"filesystem: submitting to the local endpoint {endpoint} "
                         f"uploads {', '.join(uploads)}; pass a filesystem standing in "
                         "for the bucket (e.g. a local folder), or set STORAGE_EMULATOR_HOST")
    from gcsfs.core import GCSFileSystem  # the plain one: nothing to ask but the JSON API

    return GCSFileSystem(token="anon", endpoint_url=os.environ["STORAGE_EMULATOR_HOST"],
                         skip_instance_cache=True)


def is_tuning_job(spec: Mapping[str, Any]) -> bool:
    """Whether `spec` is a HyperparameterTuningJob (`labkit.vertex.tuning_job`) rather than a
    CustomJobSpec."""
    return "trial_job_spec" in spec


def _job_spec(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """The CustomJobSpec a job runs: the spec itself, or a tuning job's trial job."""
    return spec["trial_job_spec"] if is_tuning_job(spec) else spec


def refuse_submitting_placeholders(spec: Mapping[str, Any], more: Mapping[str, Any] | None = None) -> None:
    """What `submit` refuses before anything is uploaded or created: a placeholder such as
    ``gs://YOUR_BUCKET`` in the output (named ``output_uri``), elsewhere in the spec, or in `more`
    (the bucket, the display name): on the service it fails only once machines are billed.
    Images and the project have their own check (`registry.check_not_placeholder`), which says
    how to make them."""
    refuse_placeholders((_job_spec(spec).get("base_output_directory") or {}).get("output_uri_prefix"), "output_uri")
    refuse_placeholders(spec, "spec", skip=frozenset({"image_uri"}))
    refuse_placeholders(dict(more or {}), "submit")


def submission_placeholder(spec: Mapping[str, Any]) -> str | None:
    """The field `refuse_submitting_placeholders` would name for `spec`, or None."""
    try:
        refuse_submitting_placeholders(spec)
    except ParameterError as e:
        return e.name
    return None


def job_images(spec: Mapping[str, Any]) -> list[str]:
    """The container images a job's pools run (a tuning job's trial job's)."""
    pools = field_of(_job_spec(spec), "worker_pool_specs") or []
    return [img for p in pools if p for img in [field_of(field_of(p, "container_spec") or {}, "image_uri")] if img]


def submit(spec: Mapping[str, Any], *, display_name: str, notebook: str | None = None,
           env: Mapping[str, str] | None = None, project: str | None = None,
           region: str | None = None, bucket: str | None = None, endpoint: str | None = None,
           credentials: Any = None, filesystem: Any = None, labels: Mapping[str, str] | None = None,
           registry_endpoint: str | None = None, files: Mapping[str, bytes] | None = None):
    """Create the job on Vertex AI: a CustomJob for a CustomJobSpec dict (`custom_job_spec`,
    `notebook_job`, `training_job`), a HyperparameterTuningJob for a `tuning_job` dict. Returns
    the created resource (aiplatform_v1); follow it with `job_state`, `wait` and `cancel`.

    `notebook`: the local notebook a `notebook_job` spec reads from ``<output_uri>/inputs/``;
    it is uploaded first, with the labkit source archive when the spec pip-installs it.
    `endpoint` / `credentials`: where the JobService is and how to sign in (see
    `job_service_client`; a loopback endpoint needs no credentials). `filesystem`: the fsspec
    filesystem uploads go through (default: gcsfs with the same project and credentials; with a
    loopback endpoint, the local Cloud Storage server named by ``STORAGE_EMULATOR_HOST``).
    `files`: more uploads, ``{gs:// address: bytes}`` (a user job's code archive or packages),
    made before the job is created."""
    loopback = endpoint is not None and is_loopback(endpoint)
    if loopback and credentials is None:
        from google.auth.credentials import AnonymousCredentials

        credentials = AnonymousCredentials()
    check = preflight(env, project=project, region=region, bucket=bucket, credentials=credentials)
    if not check.ready:
        raise VertexNotConfigured(check.missing)
    tuning = is_tuning_job(spec)
    if tuning:
        validate_tuning_job(spec)
    else:
        validate(spec)
    from google.cloud import aiplatform_v1

    ctx = check.context
    refuse_submitting_placeholders(spec, {"bucket": ctx.bucket, "display_name": display_name})
    images = job_images(spec)
    # A local stand-in of the service has no registry of yours: only its project must be real.
    check_not_placeholder(ctx.project, [] if loopback else images)
    job_labels = check_labels(labels if labels is not None else
                              spec.get("labels") if tuning else getattr(spec, "labels", None))
    if notebook and not Path(notebook).is_file():
        raise FileNotFoundError(f"notebook: no notebook at {notebook}")
    job_spec = _job_spec(spec)
    base = (job_spec.get("base_output_directory") or {}).get("output_uri_prefix", "").rstrip("/")
    uploads = dict(files or {})
    if notebook and base:
        uploads[f"{base}/inputs/{Path(notebook).name}"] = Path(notebook).read_bytes()
    if base and any(f"{base}/inputs/labkit.tar.gz".replace("gs://", "/gcs/") in str(p)
                    for p in job_spec.get("worker_pool_specs", [])):
        uploads[f"{base}/inputs/labkit.tar.gz"] = source_archive()
    if uploads and filesystem is None and loopback:
        filesystem = _local_bucket(endpoint, uploads)
    if credentials is None:
        import google.auth

        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    # Before anything is uploaded or created: a missing image would fail only once the
    # machines are provisioned (and billed).
    require_images(images, credentials=credentials,
                   endpoint=registry_endpoint or (endpoint if loopback else None))
    if uploads:
        if filesystem is None:
            import fsspec

            filesystem = fsspec.filesystem("gs", project=ctx.project, token=credentials)
        for uri, data in uploads.items():
            _upload(filesystem, uri, data)
    client = job_service_client(region=ctx.region, endpoint=endpoint, credentials=credentials)
    parent = f"projects/{ctx.project}/locations/{ctx.region}"
    if tuning:
        job = aiplatform_v1.HyperparameterTuningJob(**{**spec, "display_name": display_name,
                                                       "labels": job_labels})
        return client.create_hyperparameter_tuning_job(parent=parent, hyperparameter_tuning_job=job)
    job = aiplatform_v1.CustomJob(display_name=display_name, job_spec=aiplatform_v1.CustomJobSpec(**spec),
                                  labels=job_labels)
    return client.create_custom_job(parent=parent, custom_job=job)


# ---------------------------------------------------------------- the notebook executor

def notebook_execution_missing(spec: Mapping[str, Any], check: Preflight) -> list[str]:
    """What is missing to submit a NotebookExecutionJob: the preflight's list, and a service
    account (the executor runs the notebook as one; gcloud requires it for Workbench runs)."""
    missing = list(check.missing)
    if not (field_of(spec, "service_account") or field_of(spec, "execution_user")):
        missing.append("service account: pass --service-account NAME@PROJECT.iam.gserviceaccount.com "
                       "(service_account=...), the identity the executor runs the notebook as")
    return missing


def submit_notebook_execution(spec: Mapping[str, Any], *, notebook: str | None = None,
                              parameters: Mapping[str, Any] | None = None, job_id: str | None = None,
                              env: Mapping[str, str] | None = None, project: str | None = None,
                              region: str | None = None, bucket: str | None = None,
                              endpoint: str | None = None, credentials: Any = None, filesystem: Any = None):
    """Create a NotebookExecutionJob (`labkit.vertex.notebook_execution_job`) with the
    NotebookService and return it as created (aiplatform_v1); follow it with `get_job`,
    `job_state` or `wait`.

    `notebook` / `parameters` (default: those the spec carries): the local notebook, uploaded
    with the parameters written in to the spec's ``gcs_notebook_source.uri`` before the job is
    created. `job_id`: the job's ID (default: one the service chooses). Refused before anything
    is uploaded: a placeholder such as ``gs://YOUR_BUCKET`` or ``YOUR_PROJECT``, and a job with
    no service account. Connection, credentials and uploads are `submit`'s."""
    loopback = endpoint is not None and is_loopback(endpoint)
    if loopback and credentials is None:
        from google.auth.credentials import AnonymousCredentials

        credentials = AnonymousCredentials()
    check = preflight(env, project=project, region=region, bucket=bucket, credentials=credentials)
    if not check.ready:
        raise VertexNotConfigured(notebook_execution_missing(spec, check))
    message = validate_notebook_execution(spec)
    ctx = check.context
    refuse_placeholders(spec.get("gcs_output_uri"), "output_uri")
    refuse_placeholders(dict(spec), "spec")
    refuse_placeholders({"bucket": ctx.bucket}, "submit")
    check_not_placeholder(ctx.project, [])
    if notebook_execution_missing(spec, check):
        raise ParameterError("service_account", None, "is required: the executor runs the notebook as a "
                             "service account (gcloud workbench executions create requires one too)")
    notebook = notebook if notebook is not None else getattr(spec, "notebook", None)
    params = parameters if parameters is not None else getattr(spec, "parameters", None)
    uploads = {}
    if notebook:
        uploads[field_of(field_of(spec, "gcs_notebook_source"), "uri")] = notebook_content(notebook, params)
    elif params:
        raise ParameterError("parameters", dict(params), "need the local notebook to be written into")
    if uploads and filesystem is None and loopback:
        filesystem = _local_bucket(endpoint, uploads)
    if credentials is None:
        import google.auth

        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    if uploads:
        if filesystem is None:
            import fsspec

            filesystem = fsspec.filesystem("gs", project=ctx.project, token=credentials)
        for uri, data in uploads.items():
            _upload(filesystem, uri, data)
    client = notebook_service_client(region=ctx.region, endpoint=endpoint, credentials=credentials)
    operation = client.create_notebook_execution_job(
        parent=f"projects/{ctx.project}/locations/{ctx.region}", notebook_execution_job=message,
        notebook_execution_job_id=job_id or "")
    return operation.result()


# ---------------------------------------------------------------- following a submitted job

FINAL_STATES = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED")


def _region_of(name: str) -> str:
    """`projects/p/locations/us-central1/customJobs/1` -> `us-central1`."""
    parts = name.split("/")
    if len(parts) < 6 or parts[0] != "projects" or parts[2] != "locations":
        raise ValueError(f"job name {name!r} is not projects/P/locations/R/<kind>/ID")
    return parts[3]


def _calls(name: str) -> tuple[str, str]:
    """The JobService get and cancel methods for a job's resource name."""
    if "/hyperparameterTuningJobs/" in name:
        return "get_hyperparameter_tuning_job", "cancel_hyperparameter_tuning_job"
    if "/customJobs/" in name:
        return "get_custom_job", "cancel_custom_job"
    raise ValueError(f"job name {name!r} names neither a customJobs nor a hyperparameterTuningJobs resource")


def get_job(name: str, *, endpoint: str | None = None, credentials: Any = None):
    """The job resource named `name` (CustomJob, HyperparameterTuningJob or
    NotebookExecutionJob), as Vertex has it now."""
    if "/notebookExecutionJobs/" in name:
        client = notebook_service_client(region=_region_of(name), endpoint=endpoint, credentials=credentials)
        return client.get_notebook_execution_job(name=name)
    get, _ = _calls(name)
    client = job_service_client(region=_region_of(name), endpoint=endpoint, credentials=credentials)
    return getattr(client, get)(name=name)


def job_state(name: str, **connection: Any) -> str:
    """The job's state name now, e.g. ``JOB_STATE_RUNNING``."""
    return _state_of(get_job(name, **connection))


def _state_of(job: Any) -> str:
    """A job resource's state name (a NotebookExecutionJob calls the field ``job_state``)."""
    return (job.job_state if "job_state" in type(job).meta.fields else job.state).name


def cancel(name: str, *, endpoint: str | None = None, credentials: Any = None) -> None:
    """Ask Vertex to cancel the job (it moves through JOB_STATE_CANCELLING to CANCELLED; a job
    that already ended cannot be cancelled and the service says so)."""
    _, cancel_call = _calls(name)
    client = job_service_client(region=_region_of(name), endpoint=endpoint, credentials=credentials)
    getattr(client, cancel_call)(name=name)


def wait(name: str, *, poll_s: float = 30.0, timeout_s: float = 24 * 3600.0,
         on_state: Any = None, **connection: Any):
    """Poll the job until it reaches a final state; returns the job resource. `on_state(state)`
    is called whenever the state changes. Raises TimeoutError naming the job and its last state."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        job = get_job(name, **connection)
        state = _state_of(job)
        if state != last and on_state is not None:
            on_state(state)
        last = state
        if state in FINAL_STATES:
            return job
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name}: still {state} after {timeout_s:.0f} s")
        time.sleep(poll_s)
