"""Does a job's container image exist? Asked of Artifact Registry before a job is created, so a
missing image fails here, not after Vertex has provisioned the machines.

An Artifact Registry image ``LOCATION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE:TAG`` exists when
the Artifact Registry API answers for the tag
(``GET v1/projects/PROJECT/locations/LOCATION/repositories/REPOSITORY/packages/IMAGE/tags/TAG``,
the image path URL-encoded; ``@sha256:...`` asks for the version instead). Vertex's own images
(prebuilt training images, the Reduction Server) are Google's and not checked; images in other
registries cannot be checked this way and are reported as unchecked. A placeholder project
(``YOUR_PROJECT``, say) in the job or in an image is refused outright.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from labkit.core.config import ParameterError

ARTIFACT_REGISTRY_API = "https://artifactregistry.googleapis.com"
PLACEHOLDER_PROJECTS = ("your_project", "your-project", "your_project_id", "your-project-id",
                        "project_id", "my-project", "my_project", "project")
_AR_IMAGE = re.compile(r"^(?P<location>[a-z0-9-]+)-docker\.pkg\.dev/(?P<project>[^/]+)/"
                       r"(?P<repository>[^/]+)/(?P<package>[^:@]+)(?::(?P<tag>[^@]+))?(?:@(?P<digest>.+))?$")
_GOOGLE_IMAGES = ("-docker.pkg.dev/vertex-ai/", "-docker.pkg.dev/vertex-ai-restricted/",
                  "-docker.pkg.dev/deeplearning-platform-release/", "gcr.io/deeplearning-platform-release/")


def is_placeholder(project: str | None) -> bool:
    return bool(project) and project.strip().lower() in PLACEHOLDER_PROJECTS


def check_not_placeholder(project: str | None, images: Iterable[str] = ()) -> None:
    """Refuse a placeholder project, for the job or in an image's address."""
    if is_placeholder(project):
        raise ParameterError("project", project, "is a placeholder: set GOOGLE_CLOUD_PROJECT or pass "
                             "project= with your Google Cloud project ID")
    for image in images:
        m = _AR_IMAGE.match(image)
        if m and is_placeholder(m.group("project")):
            raise ParameterError("image_uri", image, f"names the placeholder project "
                                 f"{m.group('project')!r}: build labkit's image in your project "
                                 "(`labkit image`) or pass image_uri=")


@dataclass(frozen=True)
class ImageCheck:
    image: str
    exists: bool | None  # None: not checked (Google's own image, or not in Artifact Registry)
    detail: str


def _api_path(image: str) -> str | None:
    m = _AR_IMAGE.match(image)
    if not m:
        return None
    base = (f"/v1/projects/{m.group('project')}/locations/{m.group('location')}/repositories/"
            f"{m.group('repository')}/packages/{quote(m.group('package'), safe='')}")
    if m.group("digest"):
        return f"{base}/versions/{quote(m.group('digest'), safe='')}"
    return f"{base}/tags/{quote(m.group('tag') or 'latest', safe='')}"


def check_images(images: Iterable[str], *, credentials: Any, endpoint: str | None = None) -> list[ImageCheck]:
    """Ask Artifact Registry (at `endpoint`, default the API's) whether each image exists, with
    `credentials` (google-auth; anonymous ones for a loopback stand-in)."""
    from google.auth.transport.requests import AuthorizedSession

    session = AuthorizedSession(credentials)
    out = []
    for image in dict.fromkeys(images):
        if any(g in image for g in _GOOGLE_IMAGES):
            out.append(ImageCheck(image, None, "Google's image"))
            continue
        path = _api_path(image)
        if path is None:
            out.append(ImageCheck(image, None, "not in Artifact Registry: not checked"))
            continue
        url = (endpoint or ARTIFACT_REGISTRY_API).rstrip("/") + path
        response = session.get(url, timeout=30)
        if response.status_code == 200:
            out.append(ImageCheck(image, True, url))
        elif response.status_code == 404:
            out.append(ImageCheck(image, False, url))
        else:
            raise OSError(f"image_uri {image}: Artifact Registry answered HTTP {response.status_code} "
                          f"for {url}: {response.text[:200]}")
    return out


def require_images(images: Iterable[str], *, credentials: Any, endpoint: str | None = None) -> list[ImageCheck]:
    """`check_images`, refusing (ParameterError naming image_uri) an image that does not exist."""
    checks = check_images(images, credentials=credentials, endpoint=endpoint)
    for c in checks:
        if c.exists is False:
            raise ParameterError("image_uri", c.image, "does not exist in Artifact Registry: build and "
                                 "push it first (`labkit image`), or pass image_uri= an image that exists")
    return checks
