"""`labkit doctor`: what this environment has, and what that means for the course."""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass
from importlib import metadata

from labkit.core import devices, gcp
from labkit.core.frameworks import Frameworks

_PACKAGES = ("labkit", "torch", "tensorflow", "keras", "tf-keras", "google-cloud-aiplatform",
             "deepspeed", "horovod", "papermill", "numpy")
# Optional distributed libraries: whether each one imports here (installed is not enough: a
# Horovod built without its torch extension installs and then fails to import horovod.torch).
_IMPORT_CHECKS = ("deepspeed", "horovod.torch")


def import_check(module: str) -> str:
    """"imports", "not installed", or the error importing `module` raised (one line). What the
    import prints (DeepSpeed logs its accelerator choice to stdout) is swallowed: `labkit doctor
    --json` prints JSON only."""
    import contextlib
    import importlib
    import io

    from labkit.core.frameworks import is_installed

    if not is_installed(module.split(".")[0]):
        return "not installed"
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any failure is the answer
        return f"fails: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return "imports"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        # The CPU wheel of TensorFlow is distributed as tensorflow-cpu.
        if dist == "tensorflow":
            return _version("tensorflow-cpu")
        return None


@dataclass(frozen=True)
class DoctorReport:
    python: str
    packages: dict[str, str | None]
    frameworks: Frameworks
    devices: devices.DeviceInfo
    cloud: gcp.CloudContext
    imports: dict[str, str] | None = None

    def advice(self) -> list[str]:
        """What the findings mean for running the course here."""
        out = []
        d = self.devices
        if d.has_gpu:
            g = d.gpus[0]
            out.append(f"GPU found ({len(d.gpus)}× {g.name}): notebooks with scale='auto' use real sizes.")
            if not g.has_bf16_tensor_cores:
                out.append("This GPU predates Ampere: bf16 and TF32 are not accelerated; fp16 is.")
        else:
            out.append(f"No GPU: notebooks with scale='auto' use smoke sizes (about a minute each on "
                       f"{d.cpu_count} CPU cores); GPU figures are shown as dated references.")
        if d.tpu:
            out.append(f"TPU found ({d.tpu}): the course trains on CPU/GPU; notebook 01 covers when a TPU pays off.")
        fw = self.frameworks
        if not fw.torch:
            out.append("PyTorch missing: the torch columns are skipped (pip install 'labkit[torch]').")
        if not fw.tensorflow:
            out.append("TensorFlow missing: the TF columns are skipped (pip install 'labkit[tf]').")
        if not fw.aiplatform:
            out.append("google-cloud-aiplatform missing: job specs cannot be validated or submitted "
                       "(pip install 'labkit[vertex]').")
        imports = self.imports or {}
        if imports.get("deepspeed", "imports") != "imports":
            out.append("DeepSpeed " + imports["deepspeed"] + ": --sharding-backend deepspeed and its "
                       "notebook 10 rows are skipped (pip install 'labkit[deepspeed]').")
        if imports.get("horovod.torch", "imports") != "imports":
            out.append("Horovod " + imports["horovod.torch"] + ": the course teaches its ring "
                       "all-reduce through DDP and torchrun instead (notebook 02 says why).")
        if self.cloud.ready:
            out.append(f"Google Cloud configured (project {self.cloud.project}, region "
                       f"{self.cloud.region}): cloud cells can submit real Vertex jobs.")
        else:
            out.append("Google Cloud not fully configured: cloud cells run in dry-run mode "
                       "(specs are built and validated, nothing is submitted). Missing:")
            out.extend(f"  - {m}" for m in self.cloud.missing())
        out.extend(f"Note: {n}" for n in self.cloud.notes)
        return out

    def to_dict(self) -> dict:
        return {"python": self.python, "packages": self.packages,
                "frameworks": asdict(self.frameworks), "devices": asdict(self.devices),
                "cloud": asdict(self.cloud) | {"ready": self.cloud.ready}, "advice": self.advice()}

    def text(self) -> str:
        d = self.devices
        lines = [f"python      {self.python}"]
        for name, version in self.packages.items():
            lines.append(f"{name:<11} {version or 'not installed'}")
        mem = f", {d.memory_bytes / 2**30:.0f} GiB RAM" if d.memory_bytes else ""
        lines.append(f"cpu         {d.cpu_count} cores ({d.cpu_model}){mem}")
        for g in d.gpus:
            cc = f", compute capability {g.compute_capability}" if g.compute_capability else ""
            lines.append(f"gpu {g.index:<7} {g.name}, {g.memory_gib:.1f} GiB{cc}")
        if not d.gpus:
            lines.append("gpu         none")
        lines.append(f"tpu         {d.tpu or 'none'}")
        for module, status in (self.imports or {}).items():
            lines.append(f"{'import ' + module:<11} {status}")
        c = self.cloud
        lines.append(f"gcp         project={c.project or '-'} region={c.region or '-'} "
                     f"bucket={c.bucket or '-'} credentials={c.credentials or '-'}"
                     + (" (running inside a Vertex job)" if c.on_vertex else ""))
        lines.append("")
        lines.extend(self.advice())
        return "\n".join(lines)


def collect() -> DoctorReport:
    return DoctorReport(
        python=platform.python_version(),
        packages={p: _version(p) for p in _PACKAGES},
        frameworks=Frameworks.detect(),
        devices=devices.detect(),
        cloud=gcp.detect(),
        imports={m: import_check(m) for m in _IMPORT_CHECKS},
    )
