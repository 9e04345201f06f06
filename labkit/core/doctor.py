"""`labkit doctor`: what this environment has, and what that means for the course.

Besides versions, devices and the cloud configuration, two checks that matter inside a training
container (labkit's image on a Vertex GPU machine, a Workbench VM):

* `cuda_check`: the running torch's CUDA version, the NVIDIA driver's version (NVML, else
  nvidia-smi), whether that driver runs that CUDA (`labkit.core.cuda_compat.driver_verdict`), and
  whether this torch build has kernels for each GPU's compute capability
  (``torch.cuda.get_arch_list()`` against ``get_device_capability``). A machine without a GPU
  says "no GPU".
* `nccl_net_plugin`: the NCCL network plugin NCCL would open, found as NCCL finds it (NCCL's
  src/plugin/net.cc and plugin_open.cc, `NCCL_PLUGIN_SOURCE`, read 2026-11-29): each name in
  NCCL_NET_PLUGIN (comma-separated; "none" disables external plugins), else ``libnccl-net.so``,
  opened with dlopen on the loader path, a bare name ``X`` also as ``libnccl-net-X.so``. It
  reports the file that loads and its plugin API version (``ncclNetPlugin_vN``), or that there
  is none (NCCL then uses its built-in IB and socket transports), or dlopen's error (say, a
  missing libibverbs). Nothing is initialized: no GPU or network is needed.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from importlib import metadata

from labkit.core import cuda_compat, devices, gcp
from labkit.core.frameworks import Frameworks, has_torch

NCCL_PLUGIN_SOURCE = ("https://github.com/NVIDIA/nccl/blob/0456df2069b703b3331f510d664321be19d24612/"
                      "src/plugin/net.cc")
NCCL_NET_DEFAULT = "libnccl-net.so"
_NET_API_VERSIONS = range(12, 1, -1)  # ncclNetPlugin_v12 ... _v2

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


# ---------------------------------------------------------------- CUDA: torch, driver, kernels

def driver_version() -> str | None:
    """The NVIDIA driver's version: NVML's nvmlSystemGetDriverVersion (libnvidia-ml.so.1 comes
    with the driver), else ``nvidia-smi``; None where there is no driver."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        nvml = None
    if nvml is not None:
        try:
            if nvml.nvmlInit_v2() == 0:
                buf = ctypes.create_string_buffer(96)
                try:
                    if nvml.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(96)) == 0:
                        return buf.value.decode()
                finally:
                    nvml.nvmlShutdown()
        except (AttributeError, OSError):
            pass
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    return out.strip().splitlines()[0].strip() if out.strip() else None


@dataclass(frozen=True)
class CudaCheck:
    """torch's CUDA build against this machine's driver and GPUs. `kernels` holds, per GPU,
    (name, compute capability, whether the build has kernels for it; None: unknown)."""

    torch: str | None = None  # torch.__version__
    cuda: str | None = None  # torch.version.cuda (None: a CPU-only build)
    driver: str | None = None
    arch_list: tuple[str, ...] = ()
    kernels: tuple[tuple[str, str | None, bool | None], ...] = ()
    driver_ok: bool | None = None
    driver_text: str = ""

    @property
    def has_gpu(self) -> bool:
        return bool(self.kernels)

    def lines(self) -> list[str]:
        build = f"torch {self.torch} (CUDA {self.cuda or 'none: a CPU-only build'})" if self.torch else "no torch"
        if not self.has_gpu:
            return [f"{'cuda':<11} no GPU; {build}" + (f", driver {self.driver}" if self.driver else "")]
        out = [f"{'cuda':<11} {build}, driver {self.driver or 'unknown'}"
               + (f": {self.driver_text}" if self.driver_text else "")]
        for name, cc, ok in self.kernels:
            verdict = {True: "has kernels", False: "NO kernels", None: "kernels unknown"}[ok]
            where = f" ({cuda_compat.describe_archs(self.arch_list)})" if self.arch_list else ""
            out.append(f"{'kernels':<11} {name}, compute capability {cc or '?'}: this build {verdict}{where}")
        return out

    def problems(self) -> list[str]:
        out = []
        if self.driver_ok is False:
            out.append(f"NVIDIA {self.driver_text}: update the driver, or install a torch built for an "
                       "older CUDA (README: \"Which torch for which driver\").")
        for name, cc, ok in self.kernels:
            if ok is False:
                out.append(f"torch {self.torch} has no kernels for {name} (compute capability {cc}; it has "
                           f"{cuda_compat.describe_archs(self.arch_list)}): CUDA work fails with \"no kernel "
                           "image is available\"; install a torch build for this GPU (README: \"Which torch "
                           "for which driver\") or use another GPU.")
        return out


def judge(torch_version: str | None, cuda: str | None, driver: str | None, archs: tuple[str, ...],
          gpus: tuple[devices.GPU, ...]) -> CudaCheck:
    """The verdicts for a torch build (`cuda`, `archs` as torch.cuda.get_arch_list() gives them)
    on `gpus` under `driver`; no archs means the kernels are unknown."""
    kernels = tuple((g.name, g.compute_capability,
                     cuda_compat.runs_on(archs, g.compute_capability) if archs and g.compute_capability else None)
                    for g in gpus)
    ok, text = (None, "")
    if gpus and cuda and driver:
        ok, text = cuda_compat.driver_verdict(cuda, driver)
    return CudaCheck(torch_version, cuda, driver, tuple(archs), kernels, ok, text)


def cuda_check(gpus: tuple[devices.GPU, ...] | None = None) -> CudaCheck:
    """Check the installed torch against `gpus` (default: this machine's) and the driver."""
    gpus = devices.detect().gpus if gpus is None else gpus
    version = cuda = None
    archs: tuple[str, ...] = ()
    if has_torch():
        import torch

        version, cuda = torch.__version__, torch.version.cuda
        if gpus and torch.cuda.is_available():
            archs = tuple(torch.cuda.get_arch_list())
    return judge(version, cuda, driver_version() if gpus else None, archs, gpus)


# ---------------------------------------------------------------- NCCL's network plugin

@dataclass(frozen=True)
class NcclPlugin:
    """The NCCL net plugin NCCL would open here. `status`: "loads" (`path`, `api`), "none" (no
    such library on the loader path), "fails" (`error`: dlopen's message) or "disabled"
    (NCCL_NET_PLUGIN=none). `tried` lists the names dlopen was given; `on_path` the
    libnccl-net*.so files found on the loader path."""

    requested: str
    status: str
    tried: tuple[str, ...] = ()
    path: str | None = None
    api: int | None = None
    error: str | None = None
    on_path: tuple[str, ...] = field(default_factory=tuple)

    def line(self) -> str:
        if self.status == "loads":
            api = f", NCCL net plugin API v{self.api}" if self.api else ", but it exports no ncclNetPlugin_v* symbol"
            return f"{self.path or self.tried[-1]} loads{api}"
        if self.status == "disabled":
            return "external plugins disabled (NCCL_NET_PLUGIN=none): NCCL's built-in IB and socket transports"
        if self.status == "fails":
            return f"{self.tried[-1]} does not load: {self.error}"
        return (f"none on the loader path ({', '.join(self.tried)}): NCCL uses its built-in IB and "
                "socket transports")


def plugin_candidates(name: str) -> list[str]:
    """The names NCCL hands dlopen for one NCCL_NET_PLUGIN entry: the entry itself, then, for a
    bare word that is not already ``lib*.so``, ``libnccl-net-<word>.so``."""
    out = [name]
    if "/" not in name and not (name.startswith("lib") and name.endswith(".so")):
        out.append(f"libnccl-net-{name}.so")
    return out


def _loaded_path(handle_name: str) -> str | None:
    """The file a library opened under `handle_name` came from (from /proc/self/maps)."""
    if os.path.isabs(handle_name):
        return os.path.realpath(handle_name)
    base = os.path.basename(handle_name)
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
    except OSError:
        return None
    hits = sorted(p for p in paths if os.path.basename(p) == base or os.path.basename(p).startswith(base + "."))
    return hits[0] if hits else None


def plugins_on_path(env: dict[str, str] | None = None) -> tuple[str, ...]:
    """libnccl-net*.so files in LD_LIBRARY_PATH's folders and the loader's cache (ldconfig -p)."""
    env = os.environ if env is None else env
    found = []
    for folder in (env.get("LD_LIBRARY_PATH") or "").split(":"):
        if folder and os.path.isdir(folder):
            found += [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if n.startswith("libnccl-net")]
    ldconfig = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
    if ldconfig:
        try:
            out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=20).stdout
        except (subprocess.SubprocessError, OSError):
            out = ""
        found += [line.rsplit("=>", 1)[-1].strip() for line in out.splitlines()
                  if line.strip().startswith("libnccl-net") and "=>" in line]
    return tuple(dict.fromkeys(found))


def nccl_net_plugin(env: dict[str, str] | None = None) -> NcclPlugin:
    """Open the NCCL net plugin as NCCL would (see the module docstring) and say what happened.
    The loader path is this process's (dlopen reads LD_LIBRARY_PATH at start); `env` gives
    NCCL_NET_PLUGIN."""
    env = os.environ if env is None else env
    requested = env.get("NCCL_NET_PLUGIN")
    on_path = plugins_on_path(env)
    if requested is not None and requested.strip().lower() == "none":
        return NcclPlugin("none", "disabled", on_path=on_path)
    names = [n for n in (requested or NCCL_NET_DEFAULT).split(",") if n.strip()] or [NCCL_NET_DEFAULT]
    tried: list[str] = []
    for name in names:
        for candidate in plugin_candidates(name.strip()):
            tried.append(candidate)
            try:
                lib = ctypes.CDLL(candidate)
            except OSError as e:
                message = str(e)
                if candidate in message and "No such file or directory" in message:
                    continue  # not there: NCCL tries the next name too
                return NcclPlugin(requested or NCCL_NET_DEFAULT, "fails", tuple(tried),
                                  error=message, on_path=on_path)
            api = next((v for v in _NET_API_VERSIONS if hasattr(lib, f"ncclNetPlugin_v{v}")), None)
            return NcclPlugin(requested or NCCL_NET_DEFAULT, "loads", tuple(tried), _loaded_path(candidate),
                              api, on_path=on_path)
    return NcclPlugin(requested or NCCL_NET_DEFAULT, "none", tuple(tried), on_path=on_path)


@dataclass(frozen=True)
class DoctorReport:
    python: str
    packages: dict[str, str | None]
    frameworks: Frameworks
    devices: devices.DeviceInfo
    cloud: gcp.CloudContext
    imports: dict[str, str] | None = None
    cuda: CudaCheck | None = None
    nccl: NcclPlugin | None = None

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
        if self.cuda:
            out.extend(self.cuda.problems())
        if self.nccl and self.nccl.status == "fails":
            out.append(f"NCCL's network plugin does not load ({self.nccl.error}): multi-node NCCL "
                       "falls back to its own transports, or fails where the machine's set-up asks for "
                       "the plugin (NCCL_NET=gIB on A3 Ultra / A4).")
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
                "cloud": asdict(self.cloud) | {"ready": self.cloud.ready},
                "cuda": asdict(self.cuda) if self.cuda else None,
                "nccl_net_plugin": asdict(self.nccl) | {"line": self.nccl.line()} if self.nccl else None,
                "advice": self.advice()}

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
        if self.cuda:
            lines.extend(self.cuda.lines())
        if self.nccl:
            lines.append(f"{'nccl net':<11} {self.nccl.line()}")
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
    found = devices.detect()
    return DoctorReport(
        python=platform.python_version(),
        packages={p: _version(p) for p in _PACKAGES},
        frameworks=Frameworks.detect(),
        devices=found,
        cloud=gcp.detect(),
        imports={m: import_check(m) for m in _IMPORT_CHECKS},
        cuda=cuda_check(found.gpus),
        nccl=nccl_net_plugin(),
    )
