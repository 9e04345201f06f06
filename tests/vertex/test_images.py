"""The images jobs run satisfy labkit's own minimum versions (pyproject.toml), and `labkit image`
builds labkit's image with Cloud Build or prints exactly how."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import vertex
from labkit.core.config import ParameterError
from labkit.vertex import images

ROOT = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib")


def pyproject_minimums() -> dict[str, str]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    out = {}
    for requirement in sum(extras.values(), []):
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", requirement)
        if m and m.group(1) in images.FRAMEWORK_MINIMUMS:
            out[m.group(1)] = m.group(2)
    return out


def test_labkit_minimums_are_pyprojects():
    assert pyproject_minimums() == images.FRAMEWORK_MINIMUMS
    assert images.version_tuple(images.FRAMEWORK_MINIMUMS["torch"]) >= (2, 6)  # public fully_shard


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_default_images_satisfy_the_minimums(framework):
    image = vertex.default_image(framework)
    assert images.prebuilt(image) is None  # labkit's own image: built from pyproject (below)
    assert image.endswith(f"/labkit/labkit-{framework}:{images.image_tag(framework)}")
    for spec in (vertex.training_job({"framework": framework}, output_uri="gs://bkt/r"),
                 vertex.notebook_job("nb.ipynb", {}, output_uri="gs://bkt/r", framework=framework)):
        uri = spec["worker_pool_specs"][0]["container_spec"]["image_uri"]
        images.check_image(uri)  # refuses a prebuilt image below the minimums or past its date
        assert uri == image


def _source_copy(tmp_path: Path) -> Path:
    for name in images.IMAGE_INPUTS:
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    (tmp_path / "labkit" / "core").mkdir(parents=True)
    (tmp_path / "labkit" / "__init__.py").write_text("x = 1\n")
    (tmp_path / "labkit" / "core" / "a.py").write_text("y = 2\n")
    return tmp_path


def test_the_image_tag_is_a_digest_of_what_goes_into_the_image(tmp_path):
    src = _source_copy(tmp_path)
    tag = images.image_tag("torch", src)
    assert re.fullmatch(r"src-[0-9a-f]{16}", tag) and images.image_tag("torch", src) == tag
    assert images.image_tag("tf", src) != tag  # one image per framework
    (src / "labkit" / "core" / "a.py").write_text("y = 3\n")
    edited = images.image_tag("torch", src)
    assert edited != tag  # edited code names a new image
    (src / "labkit" / "core" / "__pycache__").mkdir()
    (src / "labkit" / "core" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    assert images.image_tag("torch", src) == edited  # what the build does not copy does not count
    (src / "Dockerfile").write_text((src / "Dockerfile").read_text() + "# a change\n")
    assert images.image_tag("torch", src) != edited
    plan = vertex.build_plan("torch", source=src, env={"HOME": str(tmp_path)})
    assert plan.image.endswith(":" + images.image_tag("torch", src))


def test_the_dockerfile_builds_an_image_that_sees_the_gpu():
    dockerfile = (ROOT / "Dockerfile").read_text()
    # A CUDA base image, and the driver's library path that Vertex does not set.
    base = re.search(r"^ARG CUDA_IMAGE=(\S+)", dockerfile, re.M).group(1)
    assert base.startswith("nvidia/cuda:") and "cudnn" in base
    assert re.search(r"^FROM --platform=linux/amd64 \$\{CUDA_IMAGE\}", dockerfile, re.M)
    assert "LD_LIBRARY_PATH=/usr/local/nvidia/lib64" in dockerfile
    # labkit and its extras from pyproject.
    assert "COPY pyproject.toml" in dockerfile and "COPY labkit ./labkit" in dockerfile
    assert 'pip install ".[torch,vertex,data,tune]"' in dockerfile and 'pip install ".[tf,vertex,data,tune]"' in dockerfile
    # torch pinned to a CUDA build meeting labkit's minimum; TensorFlow likewise.
    torch_version = re.search(r"^ARG TORCH_VERSION=([0-9.]+)$", dockerfile, re.M).group(1)
    assert images.meets_minimum("torch", torch_version)
    assert re.search(r"^ARG TORCH_INDEX=https://download\.pytorch\.org/whl/cu1\d\d$", dockerfile, re.M)
    assert 'pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"' in dockerfile
    assert "assert torch.version.cuda" in dockerfile  # the build fails on a CPU-only torch
    tf_version = re.search(r"^ARG TENSORFLOW_VERSION=([0-9.]+)$", dockerfile, re.M).group(1)
    assert images.meets_minimum("tensorflow", tf_version)
    assert 'pip install "tensorflow[and-cuda]==${TENSORFLOW_VERSION}"' in dockerfile
    assert "tf.test.is_built_with_cuda()" in dockerfile
    # Reduction Server's NCCL plugin, for jobs with a reducer pool.
    assert "apt-get install -y --no-install-recommends google-reduction-server" in dockerfile
    assert "packages.cloud.google.com/apt google-fast-socket main" in dockerfile
    assert "${_FRAMEWORK}" in (ROOT / "cloudbuild.yaml").read_text()
    assert images.image_arch(vertex.default_image("tf")) == "amd64"


def test_every_prebuilt_image_in_the_table_is_refused_today():
    for p in images.PREBUILT_IMAGES.values():
        with pytest.raises(ParameterError) as err:
            images.check_image(p.uri("europe"), today=dt.date(2026, 11, 23))
        assert err.value.name == "image_uri" and p.name in str(err.value)
    tf = images.PREBUILT_IMAGES["tf-gpu.2-17.py310"]
    images.check_image(tf.uri(), today=dt.date(2026, 6, 30))  # new enough, and still available then
    images.check_image("gcr.io/me/my-image:1")  # custom images are the owner's business


def test_labkit_image_dry_run_prints_the_exact_build(tmp_path):
    env = {"HOME": str(tmp_path), "PATH": "/nonexistent", "GOOGLE_CLOUD_PROJECT": "proj",
           "GOOGLE_CLOUD_REGION": "europe-west4", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "labkit", "image", "--framework", "tf"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    image = f"europe-west4-docker.pkg.dev/proj/labkit/labkit-tf:{images.image_tag('tf')}"
    assert f"gcloud builds submit {ROOT} --config {ROOT / 'cloudbuild.yaml'} " \
           f"--substitutions=_IMAGE={image},_FRAMEWORK=tf --region=europe-west4 --project proj" in out.stdout
    assert "gcloud artifacts repositories create labkit --repository-format=docker " \
           "--location=europe-west4 --project proj" in out.stdout
    for missing in ("credentials", "gcloud: install"):
        assert missing in out.stdout
    assert "nothing built" in out.stdout
    plan = vertex.build_plan("torch", env={"HOME": str(tmp_path)})
    assert not plan.ready and plan.image.startswith("us-central1-docker.pkg.dev/YOUR_PROJECT/")
    with pytest.raises(RuntimeError, match="credentials"):
        images.build(plan)
