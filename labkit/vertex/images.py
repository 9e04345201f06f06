"""Which container image a job runs, and whether its framework is new enough for labkit.

labkit needs PyTorch >= 2.6 (`torch.distributed.fsdp.fully_shard` is public from 2.6, and
`torch._scaled_mm` returns one tensor from 2.5) and TensorFlow >= 2.16 with Keras 3 (the TF
engine uses `keras.ops` and Keras 3's `LossScaleOptimizer`), and google-cloud-aiplatform >= 1.62
(1.60's aiplatform_v1 has no `Scheduling.strategy`, so no Spot): `FRAMEWORK_MINIMUMS`, the same
minimums as pyproject.toml (a test keeps them equal).

Vertex's prebuilt training images (https://cloud.google.com/vertex-ai/docs/training/
pre-built-containers and https://cloud.google.com/vertex-ai/docs/supported-frameworks-list,
read 2026-11-23) stop at PyTorch 2.4 and TensorFlow 2.17 for Python 3.10, and both reach their
end of availability in July 2026 (`PREBUILT_IMAGES`). So every job runs on labkit's own image by
default: the Dockerfile at the root of the source tree starts from plain Ubuntu and makes the
GPU set-up NVIDIA's CUDA images make (Vertex mounts the GPU driver under /usr/local/nvidia and
sets no library path; CUDA and Deep Learning Containers images put /usr/local/nvidia/lib64 on it),
installs labkit with a CUDA build of its framework pinned at or above pyproject's minimums (whose
wheels bring the image's only copy of CUDA and cuDNN), libibverbs for the gIB NCCL plugin of
GPUDirect-RDMA machines, and Google's ``google-reduction-server`` NCCL plugin for jobs with a
Reduction Server pool (kept off the loader path on those RDMA machines: `labkit.vertex.nccl`). `labkit image` builds it with Cloud Build
(`build_plan` says exactly how) and pushes it to Artifact Registry as
``REGION-docker.pkg.dev/PROJECT/labkit/labkit-<framework>:<tag>``, where the tag is a digest of
everything that goes into the image (`image_tag`): edited code names a new image, which `submit`
checks exists before any machine is started. The image is built for amd64 (`IMAGE_ARCH`).

A prebuilt image can still be named (`image_uri=...`): `check_image` refuses one whose framework
is older than the minimum or that is past its end of availability, naming both.

The GPUs labkit's images run on (`check_image_gpu`): each image carries one CUDA build of its
framework (`image_build`), and a build has kernels for some GPUs only (`ACCELERATOR_CAPABILITY`,
`labkit.core.cuda_compat.runs_on`). torch 2.7.1 from PyTorch's CUDA 12.8 index has none for
Pascal (P4, P100) or Volta (V100), so a job asking for those on labkit's torch image is refused
when its spec is built, before any VM is billed; an image built on the CUDA 12.6 wheels
(``labkit image --torch-cuda cu126``, tagged ``...-cu126``) runs them but not Blackwell.
TensorFlow 2.20's wheels carry sm_60-sm_89 and PTX for 9.0, which covers every GPU Vertex
offers. Other images (yours, Vertex's prebuilt ones) are left alone: labkit cannot know their
builds. The driver each build needs is `labkit.core.cuda_compat.driver_needed`.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import os
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from labkit import __version__
from labkit.core import gcp
from labkit.core.config import ParameterError
from labkit.core.cuda_compat import describe_archs, runs_on
from labkit.vertex.machines import check_machine

# labkit's own minimum versions (pyproject.toml's extras say the same; a test checks).
FRAMEWORK_MINIMUMS = {"torch": "2.6", "tensorflow": "2.16", "keras": "3.0",
                      "google-cloud-aiplatform": "1.62"}
# TrainConfig.framework -> the package whose version matters, and labkit's image name.
FRAMEWORK_PACKAGES = {"torch": "torch", "tf": "tensorflow"}
IMAGE_REPOSITORY = "labkit"
PLACEHOLDER_PROJECT = "YOUR_PROJECT"
DEFAULT_REGION = "us-central1"
# Overrides where labkit's images live: "REGION-docker.pkg.dev/PROJECT/REPOSITORY".
IMAGE_REGISTRY_ENV = "LABKIT_IMAGE_REGISTRY"
PREBUILT_SOURCE = ("https://cloud.google.com/vertex-ai/docs/supported-frameworks-list "
                   "(read 2026-11-23)")
IMAGE_ARCH = "amd64"  # labkit's Dockerfile pins --platform=linux/amd64; prebuilt images are amd64
# What the Dockerfile copies into the image, besides labkit/ (its digest names the image).
IMAGE_INPUTS = ("Dockerfile", "cloudbuild.yaml", "pyproject.toml", "README.md", "LICENSE")


@dataclass(frozen=True)
class PrebuiltImage:
    """A Vertex prebuilt training image: its framework version and the month it stops being
    available (``YYYY-MM``; the service no longer runs it from then on)."""

    name: str  # e.g. "pytorch-gpu.2-4.py310"
    package: str  # "torch" or "tensorflow"
    version: str
    end_of_availability: str

    def uri(self, location: str = "us") -> str:
        return f"{location}-docker.pkg.dev/vertex-ai/training/{self.name}:latest"


PREBUILT_IMAGES = {p.name: p for p in (
    PrebuiltImage("pytorch-gpu.2-4.py310", "torch", "2.4", "2026-07"),
    PrebuiltImage("pytorch-cpu.2-4.py310", "torch", "2.4", "2026-07"),
    PrebuiltImage("tf-gpu.2-17.py310", "tensorflow", "2.17", "2026-07"),
    PrebuiltImage("tf-cpu.2-17.py310", "tensorflow", "2.17", "2026-07"),
)}


def version_tuple(version: str) -> tuple[int, ...]:
    """"2.6.0+cu124" -> (2, 6, 0); enough for comparing release numbers."""
    out = []
    for part in version.split("+")[0].split("."):
        digits = "".join(c for c in part if c.isdigit())
        if not digits:
            break
        out.append(int(digits))
        if not part.isdigit():
            break
    return tuple(out)


def meets_minimum(package: str, version: str) -> bool:
    return version_tuple(version) >= version_tuple(FRAMEWORK_MINIMUMS[package])


def prebuilt(image_uri: str) -> PrebuiltImage | None:
    """The table entry of a Vertex prebuilt training image (any location), else None."""
    head, _, tail = image_uri.partition("-docker.pkg.dev/vertex-ai/training/")
    if not tail or "/" in head:
        return None
    return PREBUILT_IMAGES.get(tail.split("@")[0].split(":")[0])


def check_image(image_uri: str, today: dt.date | None = None) -> None:
    """Refuse a prebuilt image whose framework is older than labkit needs or that is past its
    end of availability; other images (labkit's own, custom ones) pass."""
    p = prebuilt(image_uri)
    if p is None:
        return
    if not meets_minimum(p.package, p.version):
        raise ParameterError("image_uri", image_uri,
                             f"has {p.package} {p.version}; labkit needs {p.package}>="
                             f"{FRAMEWORK_MINIMUMS[p.package]} (use labkit's image: `labkit image`)")
    today = today or dt.date.today()
    if today.isoformat()[:7] >= p.end_of_availability:
        raise ParameterError("image_uri", image_uri,
                             f"reached its end of availability in {p.end_of_availability} "
                             f"({PREBUILT_SOURCE}); use labkit's image (`labkit image`)")


def image_name(framework: str) -> str:
    if framework not in FRAMEWORK_PACKAGES:
        raise ParameterError("framework", framework, f"must be one of {sorted(FRAMEWORK_PACKAGES)}")
    return f"labkit-{framework}"


def registry(project: str | None = None, region: str | None = None,
             env: Mapping[str, str] | None = None) -> str:
    """Where labkit's images live: $LABKIT_IMAGE_REGISTRY, else the Artifact Registry repository
    ``labkit`` of the configured project and region (placeholders when none is configured)."""
    env = os.environ if env is None else env
    if env.get(IMAGE_REGISTRY_ENV) and not (project or region):
        return env[IMAGE_REGISTRY_ENV].rstrip("/")
    if not (project and region):
        ctx = gcp.detect(dict(env))
        project, region = project or ctx.project, region or ctx.region
    return f"{region or DEFAULT_REGION}-docker.pkg.dev/{project or PLACEHOLDER_PROJECT}/{IMAGE_REPOSITORY}"


def image_tag(framework: str, source: str | os.PathLike | None = None, torch_cuda: str | None = None) -> str:
    """The tag of labkit's image for `framework`: ``src-`` and 16 hex digits of a SHA-256 over
    everything the Dockerfile puts into the image (`IMAGE_INPUTS` and every file under labkit/)
    and the framework, so any edit names a new image. Outside a source tree (an installed
    labkit) the package version. A torch image built on other CUDA wheels than the default
    (`torch_cuda`, e.g. "cu126") ends in ``-cu126``, which is how `image_build` knows it."""
    suffix = _variant_suffix(framework, torch_cuda)
    root = Path(source) if source else source_root()
    if not (root / "Dockerfile").is_file() or not (root / "labkit").is_dir():
        return __version__ + suffix
    files = [root / name for name in IMAGE_INPUTS if (root / name).is_file()]
    files += sorted(p for p in (root / "labkit").rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    return _digest_tag(framework, root, tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size)
                                              for p in files)) + suffix


def _variant_suffix(framework: str, torch_cuda: str | None) -> str:
    if torch_cuda in (None, DEFAULT_TORCH_CUDA):
        return ""
    torch_index(torch_cuda)  # a known variant
    if framework != "torch":
        raise ParameterError("torch_cuda", torch_cuda, f"applies to the torch image, not framework {framework!r}")
    return f"-{torch_cuda}"


@functools.lru_cache(maxsize=8)
def _digest_tag(framework: str, root: Path, files: tuple[tuple[str, int, int], ...]) -> str:
    """Cached on the files' names, times and sizes: a spec builder calls this often."""
    digest = hashlib.sha256(f"framework={framework}\n".encode())
    for name, _, _ in files:
        path = Path(name)
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return "src-" + digest.hexdigest()[:16]


def labkit_image(framework: str, *, project: str | None = None, region: str | None = None,
                 tag: str | None = None, env: Mapping[str, str] | None = None,
                 torch_cuda: str | None = None) -> str:
    """The URI of labkit's image for `framework` ("torch" or "tf"); `tag` defaults to
    `image_tag` (a digest of the sources it is built from, and the torch CUDA variant)."""
    tag = tag or image_tag(framework, torch_cuda=torch_cuda)
    return f"{registry(project, region, env)}/{image_name(framework)}:{tag}"


def is_labkit_image(image_uri: str) -> bool:
    """Whether `image_uri` is one of labkit's own images (any registry, tag or digest)."""
    name = image_uri.split("@", 1)[0].rsplit(":", 1)[0] if "/" in image_uri else image_uri
    return name.rsplit("/", 1)[-1] in {image_name(f) for f in FRAMEWORK_PACKAGES}


def image_arch(image_uri: str) -> str | None:
    """The CPU architecture an image is built for, where labkit knows it (its own images and
    Vertex's prebuilt ones: amd64); None for other images."""
    return IMAGE_ARCH if is_labkit_image(image_uri) or prebuilt(image_uri) is not None else None


def default_image(framework: str, env: Mapping[str, str] | None = None) -> str:
    """The image a job runs when none is named: labkit's own (no prebuilt image has a framework
    new enough, see the module docstring)."""
    return labkit_image(framework, env=env)


# ---------------------------------------------------------------- the GPUs an image runs on

READ_ON = "2026-11-29"
# Compute capability of each GPU Vertex AI offers (https://developer.nvidia.com/cuda-gpus and
# https://developer.nvidia.com/cuda-legacy-gpus, read 2026-11-29); labkit.hardware.gpus agrees
# where it lists the same GPU (a test checks).
ACCELERATOR_CAPABILITY = {
    "NVIDIA_TESLA_P4": "6.1", "NVIDIA_TESLA_P100": "6.0", "NVIDIA_TESLA_V100": "7.0",
    "NVIDIA_TESLA_T4": "7.5", "NVIDIA_TESLA_A100": "8.0", "NVIDIA_A100_80GB": "8.0", "NVIDIA_L4": "8.9",
    "NVIDIA_H100_80GB": "9.0", "NVIDIA_H100_MEGA_80GB": "9.0", "NVIDIA_H200_141GB": "9.0",
    "NVIDIA_B200": "10.0", "NVIDIA_GB200": "10.0", "NVIDIA_RTX_PRO_6000": "12.0",
}
# What a refusal suggests instead, first ones first (where the build has kernels for them).
_SUGGESTED = ("NVIDIA_TESLA_T4", "NVIDIA_L4", "NVIDIA_TESLA_A100", "NVIDIA_H100_80GB", "NVIDIA_B200")
PYTORCH_INDEX = "https://download.pytorch.org/whl/"
# The CUDA 12.8 builds of torch 2.7 dropped Maxwell, Pascal and Volta: PyTorch's wheel build script
# lists 7.5;8.0;8.6;9.0;10.0;12.0 for 12.8 and 5.0;6.0;7.0;7.5;8.0;8.6;9.0 for 12.6 (sm_70 was put
# back into the 12.8 builds from 2.8 on: "we would like to keep sm_70 architecture see
# https://github.com/pytorch/pytorch/issues/157517"). PyPI's torch 2.7.1 wheel (the 12.6 build)
# was checked: its libtorch_python.so carries "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90" (read
# 2026-11-29); the 12.8 wheels (download.pytorch.org) could not be read from here. TensorFlow
# 2.20.0's wheel states its own: tensorflow/python/platform/build_info.py, cuda_compute_capabilities
# ['sm_60', 'sm_70', 'sm_80', 'sm_89', 'compute_90'], CUDA 12.5.1 (read from PyPI 2026-11-29).
TORCH_ARCH_SOURCE = ("https://github.com/pytorch/pytorch/blob/00c7a380b8369d08e02dd400aa76dc6c0738b589/"
                     ".ci/manywheel/build_cuda.sh and https://github.com/pytorch/pytorch/issues/160269")
TF_ARCH_SOURCE = ("https://github.com/tensorflow/tensorflow/blob/0071ad1d1f9e35ead7169c50dbe754ce5c27cae1/"
                  ".bazelrc (HERMETIC_CUDA_COMPUTE_CAPABILITIES, \"the same as the official TensorFlow builds\")")


@dataclass(frozen=True)
class FrameworkBuild:
    """The CUDA build of the framework in one of labkit's images: `archs` as
    ``torch.cuda.get_arch_list()`` writes them (machine code ``sm_XY``, PTX ``compute_XY``)."""

    package: str  # "torch" or "tensorflow"
    version: str
    cuda: str
    archs: tuple[str, ...]
    source: str
    variant: str = ""  # the torch wheel index's name ("cu128"); "" for TensorFlow

    @property
    def name(self) -> str:
        return f"{self.package} {self.version}" + (f"+{self.variant}" if self.variant else f" (CUDA {self.cuda})")

    def runs(self, accelerator_type: str) -> bool:
        return runs_on(self.archs, ACCELERATOR_CAPABILITY[accelerator_type])


TORCH_VERSION = "2.7.1"  # the Dockerfile's ARG TORCH_VERSION (a test keeps them equal)
DEFAULT_TORCH_CUDA = "cu128"  # the Dockerfile's ARG TORCH_INDEX: Blackwell needs CUDA 12.8
TORCH_BUILDS = {
    "cu128": FrameworkBuild("torch", TORCH_VERSION, "12.8",
                            ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"), TORCH_ARCH_SOURCE, "cu128"),
    "cu126": FrameworkBuild("torch", TORCH_VERSION, "12.6",
                            ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"), TORCH_ARCH_SOURCE,
                            "cu126"),
}
TF_BUILD = FrameworkBuild("tensorflow", "2.20.0", "12.5",
                          ("sm_60", "sm_70", "sm_80", "sm_89", "compute_90"), TF_ARCH_SOURCE)


def torch_index(torch_cuda: str) -> str:
    """PyTorch's wheel index for a CUDA variant ("cu126" -> .../whl/cu126)."""
    if torch_cuda not in TORCH_BUILDS:
        raise ParameterError("torch_cuda", torch_cuda, f"must be one of {', '.join(TORCH_BUILDS)}")
    return PYTORCH_INDEX + torch_cuda


def image_build(image_uri: str) -> FrameworkBuild | None:
    """The framework build inside `image_uri` when it is one of labkit's images named by tag
    (``labkit-torch:TAG`` is the CUDA 12.8 build, ``labkit-torch:TAG-cu126`` the 12.6 one,
    ``labkit-tf:TAG`` TensorFlow's); None for any other image, and for one named by digest."""
    if not is_labkit_image(image_uri) or "@" in image_uri:
        return None
    name, _, tag = image_uri.rpartition(":")
    if name.rsplit("/", 1)[-1] == image_name("tf"):
        return TF_BUILD
    variant = tag.rsplit("-", 1)[-1] if "-" in tag else ""
    return TORCH_BUILDS.get(variant, TORCH_BUILDS[DEFAULT_TORCH_CUDA])


def check_image_gpu(image_uri: str, accelerator_type: str | None, field: str = "accelerator_type", *,
                    machine_type: str | None = None, accelerator_count: int | None = None) -> None:
    """Refuse a GPU that the framework build in labkit's image `image_uri` has no kernels for:
    the job would pass ``--device cuda`` and fail at its first kernel, after the VMs were billed.
    One line names the GPU, the build and what to choose instead. Images whose build labkit
    does not know, TPUs and CPU machines pass. Given `machine_type`, a request the machine rules
    refuse anyway (`check_machine`, no GPU count) is left to those checks and their words: the
    refusal here is only for a job that would otherwise be built."""
    if not accelerator_type or accelerator_type not in ACCELERATOR_CAPABILITY:
        return
    build = image_build(image_uri)
    if build is None:
        return
    if machine_type is not None:
        try:
            check_machine(machine_type, accelerator_type, accelerator_count or 0)
        except ParameterError:
            return
        if not accelerator_count:
            return
    if build.runs(accelerator_type):
        return
    instead = [a for a in _SUGGESTED if build.runs(a)][:3]
    other = [v for v, b in TORCH_BUILDS.items() if build.package == "torch" and v != build.variant and b.runs(accelerator_type)]
    rebuild = ""
    if other and other[0] == DEFAULT_TORCH_CUDA:
        rebuild = f", or run labkit's default torch image ({TORCH_BUILDS[other[0]].name}: `labkit image`)"
    elif other:
        rebuild = (f", or build labkit's image on the {other[0]} wheels (`labkit image --torch-cuda {other[0]}`, "
                   f"tagged ...-{other[0]}) and pass it as image_uri")
    raise ParameterError(field, accelerator_type,
                         f"names a GPU of compute capability {ACCELERATOR_CAPABILITY[accelerator_type]}, which "
                         f"{build.name} in {image_uri} has no kernels for (it has {describe_archs(build.archs)}): "
                         f"the job's first CUDA kernel would fail after its VMs were billed; choose "
                         f"{', '.join(instead)}{rebuild} ({build.source}, read {READ_ON})")


# ---------------------------------------------------------------- building labkit's image

def source_root() -> Path:
    """The labkit source tree (pyproject.toml, Dockerfile, cloudbuild.yaml beside labkit/)."""
    return Path(__file__).resolve().parents[2]


@dataclass
class BuildPlan:
    """How to build and push labkit's image with Cloud Build: the commands, in order, and what
    is missing to run them here (nothing when `ready`)."""

    image: str
    framework: str
    source: Path
    commands: list[list[str]]
    missing: list[str] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return not self.missing

    def text(self) -> str:
        lines = [f"labkit image for {self.framework}: {self.image}"]
        lines += ["  " + shlex.join(c) for c in self.commands]
        if self.missing:
            lines.append("dry run (nothing built); to build, provide:")
            lines += [f"- {m}" for m in self.missing]
        return "\n".join(lines)


def build_plan(framework: str = "torch", *, project: str | None = None, region: str | None = None,
               tag: str | None = None, env: Mapping[str, str] | None = None,
               source: str | os.PathLike | None = None, torch_cuda: str | None = None) -> BuildPlan:
    """The Cloud Build commands that build labkit's image for `framework` from the source tree
    and push it to Artifact Registry: create the repository (once), then build with the
    Dockerfile (cloudbuild.yaml passes the framework, and for `torch_cuda` other than the
    default "cu128" PyTorch's wheel index, as build arguments)."""
    env = dict(os.environ if env is None else env)
    ctx = gcp.detect(env)
    project, region = project or ctx.project, region or ctx.region
    root = Path(source) if source else source_root()
    image = labkit_image(framework, project=project or PLACEHOLDER_PROJECT, region=region or DEFAULT_REGION,
                         tag=tag or image_tag(framework, root, torch_cuda), env=env)
    where = ["--project", project or PLACEHOLDER_PROJECT]
    substitutions = f"_IMAGE={image},_FRAMEWORK={framework}"
    if _variant_suffix(framework, torch_cuda):
        substitutions += f",_TORCH_INDEX={torch_index(torch_cuda)}"
    commands = [
        ["gcloud", "artifacts", "repositories", "create", IMAGE_REPOSITORY,
         "--repository-format=docker", f"--location={region or DEFAULT_REGION}", *where],
        ["gcloud", "builds", "submit", str(root), "--config", str(root / "cloudbuild.yaml"),
         f"--substitutions={substitutions}", f"--region={region or DEFAULT_REGION}", *where],
    ]
    missing = []
    for name in ("Dockerfile", "cloudbuild.yaml", "pyproject.toml"):
        if not (root / name).is_file():
            missing.append(f"source: {root / name} (labkit image builds from a labkit source tree)")
    missing += [m for m in ctx.missing() if not m.startswith("bucket")]
    missing += list(ctx.notes)
    if shutil.which("gcloud", path=env.get("PATH")) is None:
        missing.append("gcloud: install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install)")
    return BuildPlan(image, framework, root, commands, missing)


def build(plan: BuildPlan) -> int:
    """Run the plan's commands (the repository is created only when it does not exist yet);
    returns the exit status of the build."""
    import subprocess

    if not plan.ready:
        raise RuntimeError("cannot build labkit's image here; missing:\n- " + "\n- ".join(plan.missing))
    create, submit = plan.commands
    describe = ["gcloud", "artifacts", "repositories", "describe", *create[4:5],
                *[a for a in create if a.startswith("--location")], *create[-2:]]
    if subprocess.call(describe, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) != 0:
        code = subprocess.call(create)
        if code:
            return code
    return subprocess.call(submit)
