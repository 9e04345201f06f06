"""A local fake of Vertex AI's JobService, for tests and notebooks that have no cloud.

`FakeVertex()` serves the REST form of the JobService calls the client libraries make for
custom jobs and hyperparameter tuning jobs (create, get, list, cancel, delete) over plain HTTP
on loopback. Both `google.cloud.aiplatform` (`aiplatform.init(api_endpoint=fake.endpoint,
api_transport="rest", credentials=AnonymousCredentials())`) and `aiplatform_v1.JobServiceClient`
(`transport="rest"`) accept an ``http://`` endpoint, so the real client library builds and
serialises every request, and nothing in it is patched. The fake records each request as the
JSON that arrived (`requests`) and answers as Vertex does:

- create: the job's `name` (``projects/P/locations/L/customJobs/ID``), `state`
  JOB_STATE_PENDING, `create_time`; a request Vertex would refuse (no display name, no worker
  pool, a pool without machine or container, a primary pool with more than one replica) gets
  HTTP 400 INVALID_ARGUMENT naming the field.
- get: the job, its state moved on by one step every `polls_per_state` reads:
  PENDING -> RUNNING -> `final_state` (SUCCEEDED, or FAILED with an `error`).
- cancel: an empty answer and the state CANCELLING, CANCELLED (with error code 1, as the API
  reference describes) on the next read; a finished job answers 400 FAILED_PRECONDITION.
- delete: a finished long-running operation; a job still running answers 400.
- unknown job: 404 NOT_FOUND; a call the fake does not implement: 501 UNIMPLEMENTED.

Every field a job carries is accepted and answered back as the REST API does (the proto-plus
message parses the request and writes the answer): labels, ``scheduling`` (strategy SPOT or
FLEX_START, ``maxWaitDuration``, ``timeout``), ``persistentResourceId``, a pool's
``reservationAffinity`` and ``tpuTopology``, ``tensorboard`` and ``serviceAccount``. A create
request breaking one of Vertex's documented rules (`labkit.vertex.specs.check_spec`: machines
and accelerators, boot disks, TPU pools, flex-start, reservations, TensorBoard without a service
account) is refused with 400 INVALID_ARGUMENT naming the field.

The fake also answers the one Artifact Registry call `submit` makes to check that an image
exists (``GET /v1/projects/P/locations/L/repositories/R/packages/IMAGE/tags/TAG``): 200 for an
image in `images` (every image when `images` is None), else 404.

Kinds of job live in `KINDS` (collection name -> proto-plus message type), so each call works
for every kind; extra behaviour per kind (tuning trials, say) goes in `FakeVertex._advance`.

The NotebookService's notebook execution jobs (`labkit.vertex.notebook_execution`) are served
too: create (``POST .../notebookExecutionJobs``, with the ``notebookExecutionJobId`` the client
may send) answers a finished long-running operation whose response is the job, named
``projects/P/locations/L/notebookExecutionJobs/ID``, ``jobState`` JOB_STATE_PENDING; get and list
answer the job(s), its ``jobState`` moved on as a custom job's ``state`` is (a failed one gets a
``status``); the operation can be read back. A create request that
`labkit.vertex.notebook_execution.check_notebook_execution` refuses (no display name, no or two
notebook sources, a machine or GPU count Vertex does not offer, a non-``gs://`` output, bad
labels) gets 400 INVALID_ARGUMENT naming the field. These jobs are recorded only: nothing runs.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from labkit.core.frameworks import require

PENDING, RUNNING, SUCCEEDED = "JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED"
FAILED, CANCELLING, CANCELLED = "JOB_STATE_FAILED", "JOB_STATE_CANCELLING", "JOB_STATE_CANCELLED"
TERMINAL = (SUCCEEDED, FAILED, CANCELLED)

_COLLECTION = r"(?P<parent>projects/[^/]+/locations/[^/]+)/(?P<kind>customJobs|hyperparameterTuningJobs)"
_NOTEBOOK_JOBS = r"(?P<parent>projects/[^/]+/locations/[^/]+)/notebookExecutionJobs"
_REGISTRY = (r"^/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/repositories/"
             r"(?P<repository>[^/]+)/packages/(?P<package>[^/]+)/(?P<what>tags|versions)/(?P<ref>[^/]+)$")
_ROUTES = [  # (HTTP method, path pattern, handler name)
    ("GET", re.compile(_REGISTRY), "image"),
    ("POST", re.compile(rf"^/v1/{_COLLECTION}$"), "create"),
    ("GET", re.compile(rf"^/v1/{_COLLECTION}$"), "list"),
    ("GET", re.compile(rf"^/v1/(?P<name>{_COLLECTION}/[^/:]+)$"), "get"),
    ("DELETE", re.compile(rf"^/v1/(?P<name>{_COLLECTION}/[^/:]+)$"), "delete"),
    ("POST", re.compile(rf"^/v1/(?P<name>{_COLLECTION}/[^/:]+):cancel$"), "cancel"),
    ("POST", re.compile(rf"^/v1/{_NOTEBOOK_JOBS}$"), "notebook_create"),
    ("GET", re.compile(rf"^/v1/{_NOTEBOOK_JOBS}$"), "notebook_list"),
    ("GET", re.compile(rf"^/v1/(?P<name>{_NOTEBOOK_JOBS}/[^/:]+)$"), "notebook_get"),
    ("GET", re.compile(rf"^/v1/(?P<name>{_NOTEBOOK_JOBS}/[^/:]+/operations/[^/:]+)$"), "notebook_operation"),
]
NOTEBOOK_KIND = "notebookExecutionJobs"


def _kinds() -> dict[str, Any]:
    from google.cloud.aiplatform_v1.types import CustomJob, HyperparameterTuningJob

    return {"customJobs": CustomJob, "hyperparameterTuningJobs": HyperparameterTuningJob}


class ApiError(Exception):
    """An error answer: HTTP status, the google.rpc status name and a message."""

    def __init__(self, http: int, status: str, message: str):
        super().__init__(message)
        self.http, self.status, self.message = http, status, message


@dataclass(frozen=True)
class Request:
    """One call as it arrived: HTTP method, path (query string removed), JSON body or None."""

    method: str
    path: str
    body: dict[str, Any] | None


@dataclass
class _Job:
    kind: str
    message: Any  # the proto-plus job, as stored and answered
    reads: int = 0


class FakeVertex:
    """The fake JobService on ``127.0.0.1`` (a free port unless `port` is given). Use as a
    context manager, or `start()` / `stop()`. `endpoint` is the URL to hand the client."""

    def __init__(self, *, polls_per_state: int = 1, final_state: str = SUCCEEDED, port: int = 0,
                 images: set[str] | None = None):
        require("google.cloud.aiplatform")
        if polls_per_state < 1:
            raise ValueError(f"polls_per_state must be >= 1 (got {polls_per_state})")
        if final_state not in (SUCCEEDED, FAILED):
            raise ValueError(f"final_state must be {SUCCEEDED} or {FAILED} (got {final_state!r})")
        self.polls_per_state = polls_per_state
        self.final_state = final_state
        self.images = None if images is None else set(images)  # None: every image exists
        self.requests: list[Request] = []
        self.jobs: dict[str, _Job] = {}
        self.operations: dict[str, dict[str, Any]] = {}  # long-running operations by name
        self._ids = itertools.count(1_000_000_000_000_000_001)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler_for(self))
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeVertex:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                            daemon=True, name="fake-vertex")
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> FakeVertex:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------ what the tests read

    def created(self, kind: str = "customJobs") -> list[dict[str, Any]]:
        """The jobs created so far, as the client sent them (snake_case fields, enum names),
        with the name and state the fake gave them."""
        with self._lock:
            return [_to_dict(j.message) for j in self.jobs.values() if j.kind == kind]

    def state(self, name: str) -> str:
        """A job's current state, without counting as a read."""
        with self._lock:
            return _state_name(self._job(name).message)

    # ------------------------------------------------------------ the API

    def handle(self, method: str, path: str, body: bytes, query: str = "") -> tuple[int, dict[str, Any]]:
        """Answer one HTTP call: (status, JSON). Called by the server's request handler;
        `query`: the URL's query string (the notebook calls read IDs from it)."""
        data = json.loads(body) if body else None
        with self._lock:
            self.requests.append(Request(method, path, data))
            try:
                for verb, pattern, handler in _ROUTES:
                    m = pattern.match(path)
                    if m and verb == method:
                        extra = {"query": query} if handler.startswith("notebook_") else {}
                        return 200, getattr(self, f"_{handler}")(body=body, **m.groupdict(), **extra)
                raise ApiError(501, "UNIMPLEMENTED", f"{method} {path} is not part of the fake JobService")
            except ApiError as e:
                return e.http, {"error": {"code": e.http, "message": e.message, "status": e.status}}

    def _create(self, parent: str, kind: str, body: bytes) -> dict[str, Any]:
        message_type = _kinds()[kind]
        try:
            job = message_type.from_json(body or b"{}", ignore_unknown_fields=False)
        except Exception as e:  # json_format.ParseError and friends
            raise ApiError(400, "INVALID_ARGUMENT", f"invalid {message_type.__name__}: {e}") from e
        _validate(kind, job)
        job.name = f"{parent}/{kind}/{next(self._ids)}"
        job.state = PENDING
        job.create_time = job.update_time = _now()
        self.jobs[job.name] = _Job(kind, job)
        return _to_json(job)

    def _image(self, project: str, location: str, repository: str, package: str, what: str, ref: str,
               body: bytes) -> dict[str, Any]:
        from urllib.parse import unquote

        sep = ":" if what == "tags" else "@"
        image = f"{location}-docker.pkg.dev/{project}/{repository}/{unquote(package)}{sep}{unquote(ref)}"
        if self.images is not None and image not in self.images:
            raise ApiError(404, "NOT_FOUND", f"{image} not found")
        return {"name": f"projects/{project}/locations/{location}/repositories/{repository}/packages/"
                        f"{package}/{what}/{ref}"}

    def _get(self, name: str, parent: str, kind: str, body: bytes) -> dict[str, Any]:
        job = self._job(name)
        job.reads += 1
        if job.reads % self.polls_per_state == 0:
            self._advance(job)
        return _to_json(job.message)

    def _list(self, parent: str, kind: str, body: bytes) -> dict[str, Any]:
        jobs = [_to_json(j.message) for n, j in self.jobs.items()
                if j.kind == kind and n.startswith(parent + "/")]
        return {kind: jobs} if jobs else {}

    def _cancel(self, name: str, parent: str, kind: str, body: bytes) -> dict[str, Any]:
        job = self._job(name)
        state = _state_name(job.message)
        if state in TERMINAL:
            raise ApiError(400, "FAILED_PRECONDITION",
                           f"{name} is in state {state} and cannot be cancelled")
        job.message.state = CANCELLING
        job.message.update_time = _now()
        return {}

    def _delete(self, name: str, parent: str, kind: str, body: bytes) -> dict[str, Any]:
        job = self._job(name)
        state = _state_name(job.message)
        if state not in TERMINAL:
            raise ApiError(400, "FAILED_PRECONDITION",
                           f"{name} is in state {state}; cancel it before deleting it")
        del self.jobs[name]
        return {"name": f"{name}/operations/{next(self._ids)}", "done": True,
                "response": {"@type": "type.googleapis.com/google.protobuf.Empty"}}

    # ------------------------------------------------------------ the NotebookService

    def _notebook_create(self, parent: str, body: bytes, query: str) -> dict[str, Any]:
        from urllib.parse import parse_qs

        from google.cloud.aiplatform_v1.types import NotebookExecutionJob

        try:
            job = NotebookExecutionJob.from_json(body or b"{}", ignore_unknown_fields=False)
        except Exception as e:  # json_format.ParseError and friends
            raise ApiError(400, "INVALID_ARGUMENT", f"invalid NotebookExecutionJob: {e}") from e
        _validate_notebook_job(job)
        job_id = (parse_qs(query).get("notebookExecutionJobId") or [""])[0] or str(next(self._ids))
        job.name = f"{parent}/{NOTEBOOK_KIND}/{job_id}"
        if job.name in self.jobs:
            raise ApiError(409, "ALREADY_EXISTS", f"{job.name} already exists")
        job.job_state = PENDING
        job.create_time = job.update_time = _now()
        self.jobs[job.name] = _Job(NOTEBOOK_KIND, job)
        operation = {
            "name": f"{job.name}/operations/{next(self._ids)}", "done": True,
            "metadata": {"@type": f"{_TYPE_PREFIX}.CreateNotebookExecutionJobOperationMetadata",
                         "genericMetadata": {"createTime": _to_json(job)["createTime"],
                                             "updateTime": _to_json(job)["updateTime"]}},
            "response": {"@type": f"{_TYPE_PREFIX}.NotebookExecutionJob", **_to_json(job)}}
        self.operations[operation["name"]] = operation
        return operation

    def _notebook_get(self, name: str, parent: str, body: bytes, query: str) -> dict[str, Any]:
        job = self._job(name)
        job.reads += 1
        if job.reads % self.polls_per_state == 0:
            self._advance_notebook(job)
        return _to_json(job.message)

    def _notebook_list(self, parent: str, body: bytes, query: str) -> dict[str, Any]:
        jobs = [_to_json(j.message) for n, j in self.jobs.items()
                if j.kind == NOTEBOOK_KIND and n.startswith(parent + "/")]
        return {NOTEBOOK_KIND: jobs} if jobs else {}

    def _notebook_operation(self, name: str, parent: str, body: bytes, query: str) -> dict[str, Any]:
        if name not in self.operations:
            raise ApiError(404, "NOT_FOUND", f"{name} not found")
        return self.operations[name]

    def _advance_notebook(self, job: _Job) -> None:
        """One step of a notebook execution's life: ``job_state`` as `_advance` moves ``state``."""
        m = job.message
        following = {PENDING: RUNNING, RUNNING: self.final_state}.get(_state_name(m))
        if following is None:
            return
        m.job_state = following
        m.update_time = _now()
        if following == FAILED:
            m.status = {"code": 13, "message": "the fake failed this execution, as asked (final_state)"}

    def _job(self, name: str) -> _Job:
        if name not in self.jobs:
            raise ApiError(404, "NOT_FOUND", f"{name} not found")
        return self.jobs[name]

    def _advance(self, job: _Job) -> None:
        """One step of the job's life, as a poll sees it."""
        m = job.message
        state = _state_name(m)
        following = {PENDING: RUNNING, RUNNING: self.final_state, CANCELLING: CANCELLED}.get(state)
        if following is None:
            return
        m.state = following
        m.update_time = _now()
        if following == RUNNING:
            m.start_time = m.update_time
        if following in TERMINAL:
            m.end_time = m.update_time
        if following == FAILED:
            m.error = {"code": 13, "message": "the fake failed this job, as asked (final_state)"}
        if following == CANCELLED:
            m.error = {"code": 1, "message": "CANCELED"}


def _validate(kind: str, job: Any) -> None:
    """The checks Vertex makes on a create request that a client library does not."""
    def bad(field: str, problem: str):
        return ApiError(400, "INVALID_ARGUMENT", f"{field}: {problem}")

    if not job.display_name:
        raise bad("display_name", "is required")
    if kind == "customJobs":
        spec, prefix = job.job_spec, "job_spec"
    else:
        spec, prefix = job.trial_job_spec, "trial_job_spec"
        if not job.study_spec.metrics:
            raise bad("study_spec.metrics", "at least one metric is required")
        if not job.study_spec.parameters:
            raise bad("study_spec.parameters", "at least one parameter is required")
        if job.max_trial_count < 1 or job.parallel_trial_count < 1:
            raise bad("max_trial_count", "and parallel_trial_count must be >= 1")
    pools = list(spec.worker_pool_specs)
    if not pools or not pools[0].machine_spec.machine_type:
        raise bad(f"{prefix}.worker_pool_specs[0]", "the primary pool is required")
    if pools[0].replica_count != 1:
        raise bad(f"{prefix}.worker_pool_specs[0].replica_count",
                  f"must be 1 (got {pools[0].replica_count})")
    for i, pool in enumerate(pools):
        if not pool.machine_spec.machine_type:
            if pool.replica_count or pool.container_spec.image_uri:
                raise bad(f"{prefix}.worker_pool_specs[{i}].machine_spec.machine_type", "is required")
            continue  # a skipped pool ({}) keeps the positions of the pools after it
        if pool.replica_count < 1:
            raise bad(f"{prefix}.worker_pool_specs[{i}].replica_count", "must be >= 1")
        if not (pool.container_spec.image_uri or pool.python_package_spec.executor_image_uri):
            raise bad(f"{prefix}.worker_pool_specs[{i}]", "needs container_spec.image_uri or a "
                      "python_package_spec")
    from labkit.vertex.specs import check_spec

    try:
        check_spec(type(spec).to_dict(spec, use_integers_for_enums=False, preserving_proto_field_name=True))
    except ValueError as e:  # ParameterError names the field
        where = getattr(e, "name", "")
        raise bad(f"{prefix}.{where}" if where else prefix, str(e)) from e
    labels = dict(job.labels)
    from labkit.vertex.scheduling import check_labels

    try:
        check_labels(labels)
    except ValueError as e:
        raise bad("labels", str(e)) from e


def _validate_notebook_job(job: Any) -> None:
    """What Vertex refuses in a NotebookExecutionJob that the client library does not
    (`labkit.vertex.notebook_execution.check_notebook_execution`), as 400 naming the field."""
    from labkit.vertex.notebook_execution import check_notebook_execution

    try:
        check_notebook_execution(_to_dict(job))
    except ValueError as e:  # ParameterError names the field
        where = getattr(e, "name", "") or "notebook_execution_job"
        raise ApiError(400, "INVALID_ARGUMENT", f"{where}: {e}") from e


_TYPE_PREFIX = "type.googleapis.com/google.cloud.aiplatform.v1"


def _state_name(message: Any) -> str:
    """``state`` of a job, ``job_state`` of a notebook execution job."""
    fields = type(message).to_dict(message, use_integers_for_enums=False)
    return fields["state"] if "state" in fields else fields["job_state"]


def _to_dict(message: Any) -> dict[str, Any]:
    return type(message).to_dict(message, use_integers_for_enums=False,
                                 preserving_proto_field_name=True)


def _to_json(message: Any) -> dict[str, Any]:
    return json.loads(type(message).to_json(message, use_integers_for_enums=False))


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _handler_for(fake: FakeVertex):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            path, _, query = self.path.partition("?")
            status, payload = fake.handle(self.command, path, body, query)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PATCH = _answer

        def log_message(self, format, *args):  # noqa: A002 (the base class's name)
            pass  # requests are recorded in `fake.requests`, not printed

    return Handler
