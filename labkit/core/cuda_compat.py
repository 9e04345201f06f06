"""Whether a CUDA build runs on a GPU and a driver: two NVIDIA rules, framework-free.

* Kernels (`runs_on`). A build lists the GPU code it carries the way
  ``torch.cuda.get_arch_list()`` writes it: ``sm_XY`` is machine code (a cubin) and runs only on
  GPUs of the same major version X with a minor version >= Y; ``compute_XY`` is PTX, which the
  driver compiles for any GPU of compute capability >= X.Y. TensorFlow's build configuration
  states the rule: "PTX is forward compatible beyond the current compute capability major
  release while SASS is only forward compatible inside the current major release. Example: sm_80
  kernels can run on sm_89 GPUs but not on sm_90 GPUs" (`TF_BAZELRC`, read 2026-11-29). An
  architecture-specific target (``sm_90a``) runs on that compute capability only.
* Driver (`driver_needed`, `driver_verdict`). NVIDIA's CUDA release notes (`CUDA_RELEASE_NOTES`,
  read 2026-11-29): Table 3 gives the driver each toolkit ships with (CUDA 12.8 GA: >= 570.26;
  12.6 GA: >= 560.28.03; 13.0 GA: >= 580.65.06), which runs everything; Table 2 and the minor
  version compatibility page (`MINOR_VERSION_COMPAT`) let a CUDA 12.x build run "with limited
  feature-set" on any driver >= 525 (13.x: >= 580; 11.x: >= 450.80.02).

`labkit.vertex.images.check_image_gpu` refuses a job whose GPU labkit's image has no kernels for;
`labkit doctor` checks the running torch against this machine's GPU and driver.
"""

from __future__ import annotations

import re

READ_ON = "2026-11-29"
TF_BAZELRC = ("https://github.com/tensorflow/tensorflow/blob/0071ad1d1f9e35ead7169c50dbe754ce5c27cae1/"
              ".bazelrc (build:cuda_clang)")
CUDA_RELEASE_NOTES = "https://docs.nvidia.com/cuda/archive/13.2.2/cuda-toolkit-release-notes/index.html"
MINOR_VERSION_COMPAT = "https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html"

# Table 3: CUDA release -> the Linux x86_64 driver it ships with (GA releases).
TOOLKIT_DRIVER = {
    "11.8": "520.61.05", "12.0": "525.60.13", "12.1": "530.30.02", "12.2": "535.54.03",
    "12.3": "545.23.06", "12.4": "550.54.14", "12.5": "555.42.02", "12.6": "560.28.03",
    "12.8": "570.26", "12.9": "575.51.03", "13.0": "580.65.06", "13.1": "590.44.01",
    "13.2": "595.45.04",
}
# Table 2: CUDA major version -> the oldest driver minor version compatibility accepts.
MINOR_COMPAT_DRIVER = {"11": "450.80.02", "12": "525", "13": "580"}

_ARCH = re.compile(r"^(sm|compute)_(\d+?)(\d)([a-z]?)$")


def version_key(version: str) -> tuple[int, ...]:
    """"570.124.06" -> (570, 124, 6); non-numeric parts end the key."""
    out = []
    for part in version.strip().split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def capability(value: str | tuple[int, int]) -> tuple[int, int]:
    """"8.9" or (8, 9) -> (8, 9)."""
    if isinstance(value, tuple):
        return value
    major, _, minor = str(value).partition(".")
    return int(major), int(minor or 0)


def parse_arch(arch: str) -> tuple[str, tuple[int, int], str] | None:
    """"sm_90" -> ("sm", (9, 0), ""), "compute_120" -> ("compute", (12, 0), ""), "sm_90a" ->
    ("sm", (9, 0), "a"); None for anything else."""
    m = _ARCH.match(arch.strip())
    if not m:
        return None
    return m.group(1), (int(m.group(2)), int(m.group(3))), m.group(4)


def runs_on(archs: tuple[str, ...] | list[str], cc: str | tuple[int, int]) -> bool:
    """Whether a build carrying `archs` has code for a GPU of compute capability `cc`."""
    major, minor = capability(cc)
    for arch in archs:
        parsed = parse_arch(arch)
        if parsed is None:
            continue
        kind, (a_major, a_minor), suffix = parsed
        if suffix == "a":  # architecture-specific code: that compute capability only
            if (a_major, a_minor) == (major, minor):
                return True
        elif kind == "sm" and a_major == major and a_minor <= minor:
            return True
        elif kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


def describe_archs(archs: tuple[str, ...] | list[str]) -> str:
    """"sm_75-sm_120 (+PTX compute_120)": the range of machine code and any PTX."""
    sm = sorted((parse_arch(a) for a in archs if a.startswith("sm_") and parse_arch(a)), key=lambda p: p[1])
    ptx = [a for a in archs if a.startswith("compute_")]
    names = [f"sm_{p[1][0]}{p[1][1]}{p[2]}" for p in sm]
    text = f"{names[0]}-{names[-1]}" if len(names) > 1 else (names[0] if names else "no machine code")
    return text + (f" (+PTX {', '.join(ptx)})" if ptx else "")


def driver_needed(cuda: str) -> tuple[str | None, str | None]:
    """(the driver CUDA `cuda` ships with, the oldest one minor version compatibility accepts);
    None where the tables do not say."""
    key = ".".join(cuda.split(".")[:2])
    return TOOLKIT_DRIVER.get(key), MINOR_COMPAT_DRIVER.get(cuda.split(".")[0])


def driver_verdict(cuda: str, driver: str) -> tuple[bool | None, str]:
    """(runs?, one line): whether driver `driver` runs a CUDA `cuda` build, and how (fully, or
    under minor version compatibility); None when the tables do not know `cuda`."""
    full, compat = driver_needed(cuda)
    have = version_key(driver)
    if full and have >= version_key(full):
        return True, f"driver {driver} runs CUDA {cuda} (it needs >= {full})"
    if compat and have >= version_key(compat):
        return True, (f"driver {driver} runs CUDA {cuda} under minor version compatibility (>= {compat}, "
                      f"\"with limited feature-set\"); CUDA {cuda}'s own driver is >= {full or '?'}")
    if full or compat:
        return False, (f"driver {driver} is too old for CUDA {cuda}: it needs >= {full or compat}"
                       + (f" (>= {compat} under minor version compatibility)" if compat and full else "")
                       + f" ({CUDA_RELEASE_NOTES}, read {READ_ON})")
    return None, f"no driver table entry for CUDA {cuda}"
