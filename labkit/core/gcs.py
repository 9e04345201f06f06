"""Cloud Storage as a Vertex AI job sees it: ``gs://`` addresses, the ``/gcs/`` mount, the
``AIP_*`` output folders, and a local folder standing in for the buckets of an emulated job.

On Vertex, a job with a base output directory gets ``AIP_MODEL_DIR=gs://b/run/model/``,
``AIP_CHECKPOINT_DIR=gs://b/run/checkpoints/`` and ``AIP_TENSORBOARD_LOG_DIR=gs://b/run/logs/``:
``gs://`` addresses, not folders. ``Path("gs://b/x")`` is the local folder ``gs:/b/x`` on the
container's disk, which is lost when the job restarts. Two ways reach the bucket:

* through fsspec (``labkit.core.checkpoint`` does), which needs gcsfs in the image;
* through Cloud Storage FUSE, which Vertex mounts at ``/gcs/<bucket>``: plain file I/O, no extra
  package (close-to-open consistency, last writer wins, folder renames not atomic).

`aip_mount_paths` is the one place that turns the ``AIP_*`` addresses into mount paths; the
engines take their default checkpoint and TensorBoard folders from it.

Two checks keep a run from losing its outputs, each a one-line reason (None when all is well):
`unmounted` says when a ``/gcs/`` path is not on a Cloud Storage FUSE mount on this machine
(the files would land on the local disk and vanish with it), and `unreachable` when Cloud
Storage itself cannot be reached for a ``gs://`` address (one connection attempt, where gcsfs
would retry for over a minute and then print pages of retries).

The local emulator (`labkit.vertex.emulator`) gives its replicas a ``/gcs`` of their own and a
local Cloud Storage server for ``gs://``, so this code needs nothing special there. Where a
machine cannot give replicas their own ``/gcs``, it sets ``LABKIT_LOCAL_GCS`` to the folder that
stands in for Cloud Storage (bucket ``b`` is ``<folder>/b``): the mount root is then that
folder, so `mount_path` maps ``gs://b/x`` to ``<folder>/b/x``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from urllib.parse import urlparse

GCS_MOUNT = "/gcs"
# Names a local folder that stands in for Cloud Storage (set by the emulator in its replicas).
LOCAL_GCS_ENV = "LABKIT_LOCAL_GCS"
# The folders Vertex derives from a job's base output directory, as https://cloud.google.com/
# vertex-ai/docs/training/code-requirements#environment-variables documents them (read
# 2026-11-23). Other AIP_* variables holding gs:// addresses (managed datasets) map the same way.
AIP_OUTPUT_VARIABLES = ("AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR")
_SCHEMES = ("gs://", "gcs://")


def is_gcs_uri(value: str) -> bool:
    return isinstance(value, str) and value.startswith(_SCHEMES)


def fuse_path(uri: str) -> str:
    """``gs://bucket/path`` -> ``/gcs/bucket/path``: where Vertex mounts the bucket in every
    container. Other values are returned unchanged. (For writing job specs; code that runs in
    the job uses `mount_path`, which also knows the emulator's stand-in folder.)"""
    for scheme in _SCHEMES:
        if uri.startswith(scheme):
            return f"{GCS_MOUNT}/{uri[len(scheme):]}"
    return uri


def mount_root(env: Mapping[str, str] | None = None) -> str:
    """Where buckets are mounted here: ``/gcs``, or the emulator's stand-in folder."""
    env = os.environ if env is None else env
    return (env.get(LOCAL_GCS_ENV) or GCS_MOUNT).rstrip("/") or "/"


def mount_path(uri: str, env: Mapping[str, str] | None = None) -> str:
    """The file path of a ``gs://`` address (or of a ``/gcs/`` path) through this machine's
    mount of Cloud Storage; any other value is returned unchanged. A trailing slash is kept."""
    root = mount_root(env)
    for prefix in (*_SCHEMES, GCS_MOUNT + "/"):
        if uri.startswith(prefix):
            return f"{root}/{uri[len(prefix):]}"
    return uri


def aip_mount_paths(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every ``AIP_*`` variable that holds a Cloud Storage address, as its mount path, e.g.
    ``{"AIP_CHECKPOINT_DIR": "/gcs/b/run/checkpoints/", ...}``. Variables that already hold a
    path are kept as they are; unset ones are absent."""
    env = os.environ if env is None else env
    return {name: mount_path(value, env) for name, value in sorted(env.items())
            if name.startswith("AIP_") and value and (is_gcs_uri(value) or name in AIP_OUTPUT_VARIABLES)}


def _mount_points() -> set[str] | None:
    """Every mount point this process sees (Linux), bind mounts included, which
    `os.path.ismount` misses when they share the device of the folder above."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            return {line.split()[4].replace("\\040", " ") for line in f if len(line.split()) > 4}
    except OSError:
        return None


def unmounted(path: str, env: Mapping[str, str] | None = None) -> str | None:
    """Why `path`, under ``/gcs/``, would not reach Cloud Storage here (None: it is not under
    ``/gcs/``, the emulator stands in for the mount, or a mount holds it). On Vertex, Cloud
    Storage FUSE mounts ``/gcs`` (or each ``/gcs/<bucket>``); elsewhere the same path is a
    plain local folder."""
    env = os.environ if env is None else env
    path = os.path.normpath(os.fspath(path))
    if env.get(LOCAL_GCS_ENV) or not (path == GCS_MOUNT or path.startswith(GCS_MOUNT + "/")):
        return None
    mounts = _mount_points()
    here = path
    while True:
        if here != "/" and (here in mounts if mounts is not None else os.path.ismount(here)):
            return None
        if here == GCS_MOUNT:
            break
        here = os.path.dirname(here)
    return (f"{GCS_MOUNT} is not a Cloud Storage FUSE mount on this machine (it is on Vertex AI): "
            f"the files would stay on this disk; use a gs:// address, or a local folder")


def storage_endpoint(env: Mapping[str, str] | None = None) -> tuple[str, int]:
    """(host, port) that gcsfs talks to: STORAGE_EMULATOR_HOST when set, else Google's."""
    env = os.environ if env is None else env
    emulator = env.get("STORAGE_EMULATOR_HOST")
    if emulator:
        url = urlparse(emulator if "://" in emulator else f"http://{emulator}")
        return url.hostname or "localhost", url.port or (443 if url.scheme == "https" else 80)
    return "storage.googleapis.com", 443


def unreachable(uri: str, env: Mapping[str, str] | None = None, *, timeout_s: float = 10.0) -> str | None:
    """Why Cloud Storage cannot be reached for `uri` (None: it is not a ``gs://`` address, the
    emulator's folder stands in for it, or a connection opens). One attempt, `timeout_s` at most."""
    env = os.environ if env is None else env
    if not is_gcs_uri(uri) or env.get(LOCAL_GCS_ENV):
        return None
    host, port = storage_endpoint(env)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        reason = e.strerror or str(e) or type(e).__name__
        return f"Cloud Storage cannot be reached from here ({host}:{port}: {reason})"
    return None
