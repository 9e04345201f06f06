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
from labkit.cli import main
from labkit.core.config import ParameterError
from labkit.hardware import gpus as gpu_facts
from labkit.vertex import images, machines, nccl
from labkit.vertex.dockerfile import instructions as dockerfile_instructions
from labkit.vertex.dockerfile import read_dockerfile

ROOT = Path(__file__).resolve().parents[2]
OUT = "gs://bkt/run"
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


def _run_lines(dockerfile: str) -> list[str]:
    """Each RUN instruction with its continuations joined."""
    return [body for name, body in dockerfile_instructions(dockerfile) if name == "RUN"]


def test_the_dockerfile_builds_a_lean_image_that_sees_the_gpu(tmp_path):
    dockerfile = (ROOT / "Dockerfile").read_text()
    # One copy of CUDA and cuDNN: the framework's wheels; the base is plain Ubuntu, no CUDA image.
    base = re.search(r"^ARG BASE_IMAGE=(\S+)", dockerfile, re.M).group(1)
    assert base == "ubuntu:24.04" and "cudnn" not in base and "nvidia/cuda" not in base
    assert re.search(r"^FROM --platform=linux/amd64 \$\{BASE_IMAGE\}", dockerfile, re.M)
    assert "cudnn" not in " ".join(_run_lines(dockerfile)).lower()  # no apt cuDNN either
    # The driver set-up an NVIDIA base would make, as labkit's own Dockerfile reader sees it.
    env = read_dockerfile(ROOT / "Dockerfile", tmp_path / "staging").image.env
    assert env["LD_LIBRARY_PATH"].split(":")[:2] == ["/usr/local/nvidia/lib", "/usr/local/nvidia/lib64"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "compute" in env["NVIDIA_DRIVER_CAPABILITIES"]
    assert "/usr/local/nvidia/bin" in env["PATH"]
    system = _run_lines(dockerfile)[0]
    assert "echo /usr/local/nvidia/lib64 >> /etc/ld.so.conf.d/nvidia.conf" in system and "ldconfig" in system
    # libibverbs for the gIB NCCL plugin (Debian/Ubuntu package names).
    installs = re.findall(r"apt-get install -y --no-install-recommends ([^&]+)", system)
    packages = set(" ".join(installs).split())
    assert {"libibverbs1", "ibverbs-providers", "python3", "python3-venv", "google-reduction-server"} <= packages
    # Build-only tools: none compiled with, and the key-fetching ones leave in the layer that used them.
    assert not packages & {"python3-dev", "build-essential", "gcc", "g++", "make"}
    assert "python3-dev" not in " ".join(_run_lines(dockerfile))
    assert "apt-mark auto curl gnupg && apt-get autoremove --purge -y" in system
    assert "rm -rf /var/lib/apt/lists/*" in system
    # The Reduction Server plugin moves where only LD_LIBRARY_PATH names it (labkit.vertex.nccl).
    assert f"mkdir -p {nccl.REDUCTION_SERVER_LIB_DIR} && mv $plugins {nccl.REDUCTION_SERVER_LIB_DIR}/" in system
    assert env["LD_LIBRARY_PATH"].split(":")[-1] == nccl.REDUCTION_SERVER_LIB_DIR
    assert "packages.cloud.google.com/apt google-fast-socket main" in system
    # labkit and its extras from pyproject; each framework pinned to the CUDA build labkit knows.
    assert "COPY pyproject.toml" in dockerfile and "COPY labkit ./labkit" in dockerfile
    assert 'pip install ".[torch,vertex,data,tune]"' in dockerfile and 'pip install ".[tf,vertex,data,tune]"' in dockerfile
    args = dict(re.findall(r"^ARG ([A-Z_]+)=(\S+)$", dockerfile, re.M))
    assert args["TORCH_VERSION"] == images.TORCH_VERSION and images.meets_minimum("torch", args["TORCH_VERSION"])
    assert args["TORCH_INDEX"] == images.torch_index(images.DEFAULT_TORCH_CUDA)
    assert args["TENSORFLOW_VERSION"] == images.TF_BUILD.version
    assert images.meets_minimum("tensorflow", args["TENSORFLOW_VERSION"])
    assert 'pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"' in dockerfile
    assert "assert torch.version.cuda" in dockerfile  # the build fails on a CPU-only torch
    assert 'pip install "tensorflow[and-cuda]==${TENSORFLOW_VERSION}"' in dockerfile
    assert "tf.test.is_built_with_cuda()" in dockerfile
    cloudbuild = (ROOT / "cloudbuild.yaml").read_text()
    assert "${_FRAMEWORK}" in cloudbuild and "TORCH_INDEX=${_TORCH_INDEX}" in cloudbuild
    assert f"_TORCH_INDEX: {args['TORCH_INDEX']}" in cloudbuild
    assert images.image_arch(vertex.default_image("tf")) == "amd64"


GPUS = sorted({gpu for row in machines.GPU_COUNTS.values() for gpu in row})
OLD_GPUS = {"NVIDIA_TESLA_P4", "NVIDIA_TESLA_P100", "NVIDIA_TESLA_V100"}  # Pascal and Volta
N1 = dict(machine_type="n1-standard-8", accelerator_count=1)


def test_every_gpu_labkit_accepts_has_a_compute_capability_that_agrees_with_the_gpu_table():
    assert set(GPUS) <= set(images.ACCELERATOR_CAPABILITY)
    for row in gpu_facts.TABLE:
        assert images.ACCELERATOR_CAPABILITY[row.accelerator_type] == row.compute_capability, row.key
    default = images.image_build(vertex.default_image("torch"))
    assert default is images.TORCH_BUILDS["cu128"]
    assert {g for g in GPUS if not default.runs(g)} == OLD_GPUS
    assert {g for g in GPUS if not images.TORCH_BUILDS["cu126"].runs(g)} == {
        "NVIDIA_B200", "NVIDIA_GB200", "NVIDIA_RTX_PRO_6000"}
    assert all(images.TF_BUILD.runs(g) for g in GPUS)  # sm_60 to sm_89 and PTX for 9.0


@pytest.mark.parametrize("gpu", sorted(OLD_GPUS))
@pytest.mark.parametrize("job", ["training", "notebook"])
def test_a_gpu_labkits_torch_image_has_no_kernels_for_is_refused_when_the_spec_is_built(gpu, job):
    build = {"training": lambda **kw: vertex.training_job({"model": "gpt"}, output_uri=OUT, **kw),
             "notebook": lambda **kw: vertex.notebook_job("nb.ipynb", {}, output_uri=OUT, **kw)}[job]
    with pytest.raises(ParameterError) as err:
        build(accelerator_type=gpu, **N1)
    text = str(err.value)
    assert err.value.name == "accelerator_type" and gpu in text and "\n" not in text
    for words in ("torch 2.7.1+cu128", "sm_75-sm_120", "NVIDIA_TESLA_T4", "NVIDIA_L4", "--torch-cuda cu126",
                  "github.com/pytorch/pytorch"):
        assert words in text
    # The same job builds on an image that has the kernels: labkit's on the CUDA 12.6 wheels, a
    # user's own image (labkit cannot know its build), and TensorFlow's.
    for image in (vertex.labkit_image("torch", torch_cuda="cu126"), "gcr.io/me/trainer:1"):
        spec = build(accelerator_type=gpu, image_uri=image, **N1)
        assert spec["worker_pool_specs"][0]["machine_spec"]["accelerator_type"] == gpu
    assert vertex.training_job({"framework": "tf"}, output_uri=OUT, accelerator_type=gpu, **N1)


def test_the_refusal_leaves_other_mistakes_their_own_words():
    # an invalid pairing is still refused by the machine rules, naming their field
    with pytest.raises(ParameterError) as err:
        vertex.training_job({}, output_uri=OUT, machine_type="n1-standard-32",
                            accelerator_type="NVIDIA_TESLA_V100", accelerator_count=1)
    assert err.value.name == "accelerator_count" and "[4, 8]" in str(err.value)
    images.check_image_gpu(vertex.default_image("torch"), None)  # a CPU job
    images.check_image_gpu(vertex.default_image("torch"), "TPU_V3")  # not a GPU labkit knows
    assert vertex.training_job({}, output_uri=OUT, accelerator_type="NVIDIA_TESLA_T4", **N1)
    # Blackwell on the CUDA 12.6 image: refused, pointing back at the default build.
    with pytest.raises(ParameterError, match="NVIDIA_TESLA_T4") as err:
        images.check_image_gpu(vertex.labkit_image("torch", torch_cuda="cu126"), "NVIDIA_B200", "gpu")
    assert err.value.name == "gpu" and "torch 2.7.1+cu126" in str(err.value)
    assert "labkit's default torch image (torch 2.7.1+cu128" in str(err.value)


def test_which_build_each_image_runs():
    reg = "europe-west4-docker.pkg.dev/p/labkit"
    assert images.image_build(f"{reg}/labkit-torch:src-0123456789abcdef") is images.TORCH_BUILDS["cu128"]
    assert images.image_build(f"{reg}/labkit-torch:src-0123456789abcdef-cu126") is images.TORCH_BUILDS["cu126"]
    assert images.image_build(f"{reg}/labkit-torch:0.1.0-cu126").variant == "cu126"
    assert images.image_build(f"{reg}/labkit-tf:src-0123456789abcdef") is images.TF_BUILD
    for unknown in (f"{reg}/labkit-torch@sha256:" + "0" * 64, "gcr.io/me/img:1",
                    images.PREBUILT_IMAGES["pytorch-gpu.2-4.py310"].uri()):
        assert images.image_build(unknown) is None


def test_labkit_image_builds_the_cuda_12_6_variant_on_request(tmp_path, capsys):
    plan = vertex.build_plan("torch", env={"HOME": str(tmp_path)}, torch_cuda="cu126")
    assert plan.image.endswith(f":{images.image_tag('torch')}-cu126")
    assert images.image_build(plan.image) is images.TORCH_BUILDS["cu126"]
    assert "_TORCH_INDEX=https://download.pytorch.org/whl/cu126" in " ".join(plan.commands[1])
    default = vertex.build_plan("torch", env={"HOME": str(tmp_path)}, torch_cuda="cu128")
    assert "_TORCH_INDEX" not in " ".join(default.commands[1]) and default.image == vertex.build_plan(
        "torch", env={"HOME": str(tmp_path)}).image
    for bad, name in ((dict(framework="tf", torch_cuda="cu126"), "torch_cuda"),
                      (dict(framework="torch", torch_cuda="cu118"), "torch_cuda")):
        with pytest.raises(ParameterError) as err:
            vertex.build_plan(env={"HOME": str(tmp_path)}, **bad)
        assert err.value.name == name
    assert main(["image", "--torch-cuda", "cu126", "--dry-run"]) == 0
    assert "_TORCH_INDEX=https://download.pytorch.org/whl/cu126" in capsys.readouterr().out


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


# ---------------------------------------------------------------- the image's size (benchmarks/image_size.py)

def _image_size_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("image_size", ROOT / "benchmarks" / "image_size.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_size_script_measures_what_the_dockerfile_installs():
    import io
    import zipfile

    size = _image_size_module()
    args = size.dockerfile_args((ROOT / "Dockerfile").read_text())
    assert size.requirements("torch", args) == [f"torch=={images.TORCH_VERSION}", ".[torch,vertex,data,tune]"]
    assert size.requirements("tf", args)[0] == f"tensorflow[and-cuda]=={images.TF_BUILD.version}"
    flags = size.platform_args((2, 39), "3.12")
    assert "manylinux_2_39_x86_64" in flags and "manylinux_2_28_x86_64" in flags and "manylinux2014_x86_64" in flags
    assert "manylinux_2_40_x86_64" not in flags and flags[-1] == "--only-binary=:all:" and "cp312" in flags
    report = {"install": [
        {"metadata": {"name": "labkit", "version": "0.1.0"}, "download_info": {"url": "file:///src", "dir_info": {}}},
        {"metadata": {"name": "nvidia-cudnn-cu12", "version": "9.5.1.17"},
         "download_info": {"url": "https://files.pythonhosted.org/p/nvidia_cudnn_cu12-9.5.1.17-py3-none-x.whl"}}]}
    rows = size.resolved(report)
    assert rows[0]["url"] is None and rows[1]["filename"] == "nvidia_cudnn_cu12-9.5.1.17-py3-none-x.whl"
    project = {"info": {"version": "9.6.0"}, "urls": [],
               "releases": {"9.5.1.17": [{"filename": rows[1]["filename"], "size": 570988386}]}}
    assert size.wheel_size(project, "9.5.1.17", rows[1]["filename"]) == 570988386
    assert size.wheel_size(project, "9.5.1.17", "other.whl") is None
    wheel = io.BytesIO()
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.so", b"\0" * 10_000)
        z.writestr("b/METADATA", "Name: x\n")
    assert size.unpacked_bytes(io.BytesIO(wheel.getvalue())) == 10_000 + len("Name: x\n")
    summary = size.summarize([dict(rows[0], wheel_bytes=None, installed_bytes=None),
                              dict(rows[1], wheel_bytes=100, installed_bytes=300),
                              {"name": "torch", "version": "2.7.1", "wheel_bytes": 50, "installed_bytes": 80}])
    assert (summary["packages"], summary["wheel_bytes"], summary["installed_bytes"]) == (3, 150, 380)
    assert summary["nvidia_installed_bytes"] == 300 and summary["unmeasured"] == ["labkit"]
    assert summary["largest"][0]["name"] == "nvidia-cudnn-cu12"


def test_the_recorded_image_size_says_what_was_measured():
    import json

    result = json.loads((ROOT / "benchmarks" / "results" / "image_size.json").read_text())
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", result["date"]) and result["python_target"] == "3.12"
    assert result["command"].startswith("python benchmarks/image_size.py") and "apt" in result["not_measured"]
    for framework, image in result["images"].items():
        assert image["requirements"] == _image_size_module().requirements(
            framework, dict(re.findall(r"^ARG ([A-Z_]+)=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M)))
        assert image["installed_bytes"] > image["wheel_bytes"] > image["nvidia_wheel_bytes"] > 0
        assert "--only-binary=:all:" in image["command"] and "/tmp" not in image["command"]
        assert image["unmeasured"] == ["labkit"]  # every other package has a wheel on PyPI
    assert "CUDA 12.6" in result["images"]["torch"]["torch_measured"] or "download.pytorch.org" in \
        result["images"]["torch"]["torch_measured"]


def test_a_users_job_on_labkits_image_is_refused_a_gpu_the_image_cannot_run():
    from labkit.core.config import ParameterError
    from labkit.vertex import userjob

    v100 = dict(machine_type="n1-standard-8", accelerator_type="NVIDIA_TESLA_V100", accelerator_count=1)
    with pytest.raises(ParameterError) as err:
        userjob.user_job(["python", "t.py"], output_uri="gs://bkt/r", code="gs://bkt/r/c.tar.gz", **v100)
    assert err.value.name == "accelerator_type"
    assert userjob.user_job(["python", "t.py"], output_uri="gs://bkt/r", image_uri="gcr.io/p/own:1", **v100)
