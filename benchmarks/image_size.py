"""How big labkit's training image is, from everything its Dockerfile pip-installs, resolved and
measured without building it (no Docker, no GPU).

    python benchmarks/image_size.py                        # both images -> benchmarks/results/image_size.json
    python benchmarks/image_size.py --framework torch --out runs/size.json

For each framework it runs the Dockerfile's two pip installs (the framework pinned by the
Dockerfile's ARGs, then labkit with the image's extras) as one dry run for the image's Python
(Ubuntu 24.04: CPython 3.12, manylinux x86_64): ``pip install --dry-run --report
--only-binary=:all:``, which also shows every dependency has a wheel (the image has no compiler).
Each resolved wheel is then looked up in PyPI's JSON API (``/pypi/NAME/json``; a wheel from
another index: its server's Content-Length) for its size (`wheel_bytes`: what pip downloads) and
its zip directory is read with HTTP range requests for the bytes it unpacks to
(`installed_bytes`: what the image's layer holds).

The torch image's torch comes from PyTorch's CUDA 12.8 index. Where that index cannot be reached
(only PyPI can be from some machines), PyPI's torch of the same version is measured instead: its
Linux wheel is the CUDA 12.6 build, whose nvidia-*-cu12 12.6 libraries stand in for the 12.8 ones;
the result says which was measured. Not measured: the Ubuntu base and the apt layer (Python,
libibverbs, the Reduction Server plugin), which are not on PyPI.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPI = "https://pypi.org"
PYTHON = "3.12"  # Ubuntu 24.04's python3, the image's interpreter
GLIBC = (2, 39)  # Ubuntu 24.04's glibc: wheels tagged manylinux_2_X with X <= 39 install
EXTRAS = {"torch": "torch,vertex,data,tune", "tf": "tf,vertex,data,tune"}  # as the Dockerfile's pip lines
TIMEOUT_S = 60


# ---------------------------------------------------------------- pure parts (tested)

def dockerfile_args(text: str) -> dict[str, str]:
    """The Dockerfile's ``ARG NAME=value`` defaults."""
    return dict(re.findall(r"^ARG ([A-Z_]+)=(\S+)$", text, re.M))


def requirements(framework: str, args: dict[str, str], source: str = ".") -> list[str]:
    """What the Dockerfile installs for `framework`, as pip requirement strings."""
    first = {"torch": f"torch=={args['TORCH_VERSION']}",
             "tf": f"tensorflow[and-cuda]=={args['TENSORFLOW_VERSION']}"}[framework]
    return [first, f"{source}[{EXTRAS[framework]}]"]


def platform_args(glibc: tuple[int, int] = GLIBC, python: str = PYTHON) -> list[str]:
    """pip's target-platform flags for the image: every manylinux tag its glibc accepts."""
    tags = [f"manylinux_2_{m}_x86_64" for m in range(glibc[1], 4, -1)]
    tags += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    abi = "cp" + python.replace(".", "")
    return [a for t in tags for a in ("--platform", t)] + [
        "--python-version", python, "--implementation", "cp", "--abi", abi, "--only-binary=:all:"]


def resolved(report: dict) -> list[dict]:
    """One row per package pip would install: name, version, wheel file name and URL (None for
    the local project, which is built from source)."""
    rows = []
    for item in report["install"]:
        url = item["download_info"]["url"]
        local = url.startswith("file:")
        rows.append({"name": item["metadata"]["name"], "version": item["metadata"]["version"],
                     "filename": None if local else url.rsplit("/", 1)[-1].split("#")[0],
                     "url": None if local else url})
    return rows


def wheel_size(project_json: dict, version: str, filename: str) -> int | None:
    """A file's size from PyPI's JSON API answer for a project (or for one of its versions)."""
    files = project_json.get("urls", []) if project_json.get("info", {}).get("version") == version else []
    files = files + project_json.get("releases", {}).get(version, [])
    return next((f["size"] for f in files if f["filename"] == filename), None)


def unpacked_bytes(wheel) -> int:
    """The bytes a wheel (a seekable file) unpacks to: the sum of its zip entries' sizes."""
    with zipfile.ZipFile(wheel) as z:
        return sum(i.file_size for i in z.infolist())


def summarize(rows: list[dict]) -> dict:
    """Totals over `rows` (wheel_bytes / installed_bytes per package; None = not measured), the
    share of NVIDIA's CUDA libraries (nvidia-* packages) and the largest packages."""
    def total(key, keep=lambda r: True):
        return sum(r[key] or 0 for r in rows if keep(r))

    nvidia = lambda r: r["name"].lower().startswith("nvidia-")  # noqa: E731
    largest = sorted(rows, key=lambda r: -(r["installed_bytes"] or r["wheel_bytes"] or 0))[:8]
    return {"packages": len(rows), "wheel_bytes": total("wheel_bytes"),
            "installed_bytes": total("installed_bytes"),
            "nvidia_wheel_bytes": total("wheel_bytes", nvidia),
            "nvidia_installed_bytes": total("installed_bytes", nvidia),
            "unmeasured": sorted(r["name"] for r in rows if r["wheel_bytes"] is None),
            "largest": [{k: r[k] for k in ("name", "version", "wheel_bytes", "installed_bytes")} for r in largest]}


# ---------------------------------------------------------------- network parts

class _RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file through HTTP range requests."""

    def __init__(self, url: str, size: int):
        self.url, self.size, self.pos = url, size, 0

    def seekable(self):
        return True

    def readable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=io.SEEK_SET):
        self.pos = {io.SEEK_SET: offset, io.SEEK_CUR: self.pos + offset, io.SEEK_END: self.size + offset}[whence]
        return self.pos

    def readinto(self, buffer):
        end = min(self.pos + len(buffer), self.size)
        if end <= self.pos:
            return 0
        request = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end - 1}"})
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
            data = answer.read()
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
        return json.load(answer)


def pypi_json(name: str, version: str) -> dict:
    """PyPI's JSON API for one release; the project's whole answer where the per-release URL
    is not served."""
    try:
        return _get_json(f"{PYPI}/pypi/{name}/{version}/json")
    except urllib.error.HTTPError:
        return _get_json(f"{PYPI}/pypi/{name}/json")


def reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=20):
            return True
    except (urllib.error.URLError, OSError):
        return False


def dry_run(reqs: list[str], extra_index: str | None) -> tuple[dict, list[str]]:
    """pip's dry-run report for `reqs` on the image's platform, and the command that made it.
    pip's own configuration files are ignored: the result must not depend on this machine's."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed",
               "--quiet", "--report", str(report), "--index-url", f"{PYPI}/simple"]
        if extra_index:
            cmd += ["--extra-index-url", extra_index]
        cert = os.environ.get("PIP_CERT") or os.environ.get("REQUESTS_CA_BUNDLE")
        if cert:
            cmd += ["--cert", cert]
        cmd += platform_args() + reqs
        env = dict(os.environ, PIP_CONFIG_FILE=os.devnull)
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, timeout=1800)
        return json.loads(report.read_text()), cmd


def measure_row(row: dict, unpacked: bool) -> dict:
    out = dict(row, wheel_bytes=None, installed_bytes=None)
    if row["url"] is None:
        return out
    if "pythonhosted.org" in row["url"]:
        out["wheel_bytes"] = wheel_size(pypi_json(row["name"], row["version"]), row["version"], row["filename"])
    else:  # another index (PyTorch's): the size its server gives
        with urllib.request.urlopen(urllib.request.Request(row["url"], method="HEAD"), timeout=TIMEOUT_S) as answer:
            out["wheel_bytes"] = int(answer.headers["Content-Length"])
    if unpacked and out["wheel_bytes"]:
        out["installed_bytes"] = unpacked_bytes(io.BufferedReader(_RangeFile(row["url"], out["wheel_bytes"]),
                                                                  buffer_size=1 << 20))
    return out


def measure(framework: str, unpacked: bool = True) -> dict:
    args = dockerfile_args((ROOT / "Dockerfile").read_text())
    extra = args.get("TORCH_INDEX") if framework == "torch" else None
    source = "not applicable"
    if extra:
        source = f"{extra} (the image's own torch)"
        if not reachable(extra + "/torch/"):
            source = (f"PyPI's torch {args['TORCH_VERSION']} (its CUDA 12.6 Linux build): {extra} could "
                      "not be reached from here, so the CUDA 12.6 wheels stand in for the 12.8 ones")
            extra = None
    report, cmd = dry_run(requirements(framework, args), extra)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        rows = list(pool.map(lambda r: measure_row(r, unpacked), resolved(report)))
    shown = [w for w in cmd[2:] if not w.endswith("report.json")]
    if "--cert" in shown:  # this machine's CA file is not part of the measurement
        del shown[shown.index("--cert"):shown.index("--cert") + 2]
    return {"requirements": requirements(framework, args), "torch_measured": source,
            "command": " ".join(shown).replace("--report", "--report REPORT.json"),
            **summarize(rows),
            "resolved": sorted((r["name"], r["version"], r["wheel_bytes"], r["installed_bytes"]) for r in rows)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--framework", choices=("torch", "tf", "both"), default="both")
    p.add_argument("--no-unpacked", action="store_true", help="sum the wheels' sizes only")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "image_size.json"))
    a = p.parse_args(argv)
    frameworks = ("torch", "tf") if a.framework == "both" else (a.framework,)
    pip_version = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True,
                                 text=True).stdout.split()[1]
    result = {"date": dt.date.today().isoformat(), "pip": pip_version, "python_target": PYTHON,
              "glibc_target": ".".join(map(str, GLIBC)),
              "command": " ".join(["python benchmarks/image_size.py", *(argv or sys.argv[1:])]),
              "not_measured": "the ubuntu:24.04 base and the apt layer (python3, libibverbs, "
                              "google-reduction-server): Ubuntu's archive is not on PyPI",
              "images": {f: measure(f, not a.no_unpacked) for f in frameworks}}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    for f, r in result["images"].items():
        print(f"labkit-{f}: {r['packages']} packages, {r['wheel_bytes'] / 1e9:.2f} GB of wheels, "
              f"{r['installed_bytes'] / 1e9:.2f} GB installed (NVIDIA's CUDA libraries "
              f"{r['nvidia_installed_bytes'] / 1e9:.2f} GB); torch measured: {r['torch_measured']}")
    print(f"written to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
