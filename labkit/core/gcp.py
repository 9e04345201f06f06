"""Is Google Cloud configured here? Read from environment variables and gcloud's files only.

Nothing here calls the network: the course must answer quickly on a laptop with no cloud at all,
and say precisely what is missing before any cell tries to submit a job.
"""

from __future__ import annotations

import configparser
import json
import os
from dataclasses import dataclass, field
from pathlib import Path


def _gcloud_dir(env: dict[str, str]) -> Path:
    if env.get("CLOUDSDK_CONFIG"):
        return Path(env["CLOUDSDK_CONFIG"])
    return Path(env.get("HOME", str(Path.home()))) / ".config" / "gcloud"


def _gcloud_property(env: dict[str, str], section: str, key: str) -> str | None:
    gdir = _gcloud_dir(env)
    try:
        active = (gdir / "active_config").read_text(encoding="utf-8").strip() or "default"
    except OSError:
        active = "default"
    parser = configparser.ConfigParser()
    try:
        parser.read(gdir / "configurations" / f"config_{active}", encoding="utf-8")
    except configparser.Error:
        return None
    return parser.get(section, key, fallback=None) or None


@dataclass(frozen=True)
class CloudContext:
    """Project, region, staging bucket and where credentials come from (None when absent)."""

    project: str | None
    region: str | None
    bucket: str | None
    credentials: str | None
    on_vertex: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ready(self) -> bool:
        """Enough to submit a Vertex job: credentials, a project, a region and a bucket."""
        return not self.missing()

    def missing(self) -> list[str]:
        """What is missing to submit a job, each with how to provide it."""
        out = []
        if not self.credentials:
            out.append("credentials: run `gcloud auth application-default login` or set "
                       "GOOGLE_APPLICATION_CREDENTIALS to a service-account key file")
        if not self.project:
            out.append("project: set GOOGLE_CLOUD_PROJECT or run `gcloud config set project ID`")
        if not self.region:
            out.append("region: set GOOGLE_CLOUD_REGION (e.g. us-central1) or "
                       "`gcloud config set compute/region REGION`")
        if not self.bucket:
            out.append("bucket: set LABKIT_BUCKET to a gs://bucket you can write (job outputs)")
        return out


def detect(env: dict[str, str] | None = None) -> CloudContext:
    env = dict(os.environ if env is None else env)
    project = (env.get("GOOGLE_CLOUD_PROJECT") or env.get("CLOUDSDK_CORE_PROJECT")
               or env.get("CLOUD_ML_PROJECT_ID") or _gcloud_property(env, "core", "project"))
    region = (env.get("GOOGLE_CLOUD_REGION") or env.get("CLOUD_ML_REGION")
              or env.get("CLOUDSDK_COMPUTE_REGION") or _gcloud_property(env, "compute", "region"))
    bucket = env.get("LABKIT_BUCKET") or None
    if bucket and not bucket.startswith("gs://"):
        bucket = f"gs://{bucket}"
    on_vertex = bool(env.get("CLOUD_ML_JOB_ID") or env.get("AIP_MODEL_DIR"))
    credentials = None
    key_file = env.get("GOOGLE_APPLICATION_CREDENTIALS")
    adc = _gcloud_dir(env) / "application_default_credentials.json"
    notes = []
    if key_file:
        if not Path(key_file).is_file():
            notes.append(f"GOOGLE_APPLICATION_CREDENTIALS points to {key_file}, which does not exist")
        elif (problem := _key_file_problem(Path(key_file))) is not None:
            notes.append(f"GOOGLE_APPLICATION_CREDENTIALS points to {key_file}, which {problem}")
        else:
            credentials = f"GOOGLE_APPLICATION_CREDENTIALS ({key_file})"
    elif adc.is_file():
        credentials = f"application default credentials ({adc})"
    elif on_vertex or env.get("GCE_METADATA_HOST") or Path("/var/run/google.workbench").exists():
        credentials = "the VM's service account (metadata server)"
    return CloudContext(project, region, bucket, credentials, on_vertex, tuple(notes))


def _key_file_problem(path: Path) -> str | None:
    """Why the credentials file at `path` cannot sign in (None: it looks like one): google-auth
    reads a JSON object with a ``type`` (service_account, authorized_user, external_account...)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return f"is not a JSON credentials file ({type(e).__name__})"
    if not isinstance(data, dict) or not data.get("type"):
        return "is JSON but not a credentials file (it has no 'type', e.g. service_account)"
    return None
