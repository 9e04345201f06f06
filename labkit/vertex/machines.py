"""Which accelerators each Vertex AI machine type carries, how many, and its boot disk.

One table, `SERIES`, from Google's documented machine series (read 2026-11-23):
https://cloud.google.com/compute/docs/gpus (GPU models per machine series, N1 GPU counts and
vCPU limits), https://cloud.google.com/compute/docs/accelerator-optimized-machines (A2, A3, A4,
G2, G4 machine types and their fixed GPU counts) and https://cloud.google.com/vertex-ai/docs/
training/configure-compute (TPU machine types for custom training). Accelerator-optimized
machine types come with a fixed number of GPUs of one model; N1 machines take T4, V100, P100 or
P4 GPUs in the listed counts, up to a vCPU limit per count.

Boot disks (the ``DiskSpec`` of aiplatform_v1, https://cloud.google.com/python/docs/reference/
aiplatform/latest/google.cloud.aiplatform_v1.types.DiskSpec, read 2026-11-23): "pd-ssd",
"pd-standard" or "hyperdisk-balanced"; the default is pd-ssd, and hyperdisk-balanced for A3
Ultra, whose machines (like A4 and A4X) boot only from Hyperdisk.

`check_machine(machine_type, accelerator_type, accelerator_count)` refuses a pairing the table
does not allow, naming both values; `boot_disk_type(machine_type)` is the family's default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from labkit.core.config import ParameterError

BOOT_DISK_TYPES = ("pd-ssd", "pd-standard", "hyperdisk-balanced")
HYPERDISK_ONLY = ("hyperdisk-balanced",)


@dataclass(frozen=True)
class Series:
    """A machine series: its machine types, the accelerator they carry and how many.

    `fixed`: machine type -> its accelerator count (accelerator-optimized and TPU types).
    `attachable`: for general-purpose machines, accelerator -> {count: max vCPUs}.
    `prefixes`: general-purpose machine types this series covers (e.g. "n1-standard-")."""

    name: str
    accelerator: str | None = None
    fixed: dict[str, int] = field(default_factory=dict)
    attachable: dict[str, dict[int, int]] = field(default_factory=dict)
    prefixes: tuple[str, ...] = ()
    boot_disks: tuple[str, ...] = BOOT_DISK_TYPES

    @property
    def default_boot_disk(self) -> str:
        return "pd-ssd" if "pd-ssd" in self.boot_disks else self.boot_disks[0]

    def covers(self, machine_type: str) -> bool:
        return machine_type in self.fixed or machine_type.startswith(self.prefixes or ("\0",))


def _sizes(prefix: str, counts: dict[int, int]) -> dict[str, int]:
    return {f"{prefix}{size}": count for size, count in counts.items()}


SERIES: tuple[Series, ...] = (
    Series("N1", attachable={
        "NVIDIA_TESLA_T4": {1: 48, 2: 48, 4: 96},
        "NVIDIA_TESLA_V100": {1: 12, 2: 24, 4: 48, 8: 96},
        "NVIDIA_TESLA_P100": {1: 16, 2: 32, 4: 96},
        "NVIDIA_TESLA_P4": {1: 24, 2: 48, 4: 96},
    }, prefixes=("n1-standard-", "n1-highmem-", "n1-highcpu-")),
    Series("A2 Standard", "NVIDIA_TESLA_A100",
           {"a2-highgpu-1g": 1, "a2-highgpu-2g": 2, "a2-highgpu-4g": 4, "a2-highgpu-8g": 8,
            "a2-megagpu-16g": 16}),
    Series("A2 Ultra", "NVIDIA_A100_80GB",
           {"a2-ultragpu-1g": 1, "a2-ultragpu-2g": 2, "a2-ultragpu-4g": 4, "a2-ultragpu-8g": 8}),
    Series("G2", "NVIDIA_L4", _sizes("g2-standard-", {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2,
                                                      48: 4, 96: 8})),
    Series("G4", "NVIDIA_RTX_PRO_6000", _sizes("g4-standard-", {48: 1, 96: 2, 192: 4, 384: 8})),
    Series("A3 High", "NVIDIA_H100_80GB",
           {"a3-highgpu-1g": 1, "a3-highgpu-2g": 2, "a3-highgpu-4g": 4, "a3-highgpu-8g": 8}),
    Series("A3 Mega", "NVIDIA_H100_MEGA_80GB", {"a3-megagpu-8g": 8}),
    Series("A3 Ultra", "NVIDIA_H200_141GB", {"a3-ultragpu-8g": 8}, boot_disks=HYPERDISK_ONLY),
    Series("A4", "NVIDIA_B200", {"a4-highgpu-8g": 8}, boot_disks=HYPERDISK_ONLY),
    Series("A4X", "NVIDIA_GB200", {"a4x-highgpu-4g": 4}, boot_disks=HYPERDISK_ONLY),
    Series("TPU v2", "TPU_V2", {"cloud-tpu": 8}),
    Series("TPU v3", "TPU_V3", {"cloud-tpu": 8}),
    Series("TPU v4", "TPU_V4_POD", {"ct4p-hightpu-4t": 4}),
    Series("TPU v5e", "TPU_V5_LITEPOD",
           {"ct5lp-hightpu-1t": 1, "ct5lp-hightpu-4t": 4, "ct5lp-hightpu-8t": 8}),
)


def series_of(machine_type: str, accelerator_type: str | None = None) -> Series | None:
    """The series a machine type belongs to (the one carrying `accelerator_type` when several
    share the machine type, as TPU v2 and v3 share ``cloud-tpu``); None when not in the table."""
    found = [s for s in SERIES if s.covers(machine_type)]
    for s in found:
        if accelerator_type is None or s.accelerator in (None, accelerator_type) or \
                accelerator_type in s.attachable:
            return s
    return found[0] if found else None


def machines_for(accelerator_type: str) -> list[str]:
    """Machine types (or prefixes, for general-purpose series) that carry `accelerator_type`."""
    out: list[str] = []
    for s in SERIES:
        if s.accelerator == accelerator_type:
            out += list(s.fixed)
        elif accelerator_type in s.attachable:
            out += [p + "*" for p in s.prefixes]
    return out


def _vcpus(machine_type: str) -> int | None:
    m = re.search(r"-(\d+)$", machine_type)
    return int(m.group(1)) if m else None


def check_machine(machine_type: str, accelerator_type: str | None, accelerator_count: int,
                  where: str = "") -> None:
    """Refuse an accelerator the machine type does not carry, or a count it does not come with
    (ParameterError naming the machine type and the accelerator). `where` prefixes the
    parameter name (e.g. ``worker_pool_specs[1].machine_spec.``)."""
    if not accelerator_type:
        s = series_of(machine_type)
        if s is not None and s.fixed and s.accelerator:
            raise ParameterError(f"{where}accelerator_type", accelerator_type,
                                 f"must be {s.accelerator} with machine_type {machine_type!r} "
                                 f"({s.name} carries {s.fixed[machine_type]} of them)")
        return
    s = series_of(machine_type, accelerator_type)
    known = ", ".join(machines_for(accelerator_type)) or "none in labkit's table"
    if s is None or (s.accelerator != accelerator_type and accelerator_type not in s.attachable):
        carried = f"; {machine_type} carries {s.accelerator}" if s is not None and s.accelerator else ""
        raise ParameterError(f"{where}accelerator_type", accelerator_type,
                             f"does not run on machine_type {machine_type!r}{carried} "
                             f"(machine types for {accelerator_type}: {known})")
    if s.fixed:
        want = s.fixed[machine_type]
        if accelerator_count != want:
            raise ParameterError(f"{where}accelerator_count", accelerator_count,
                                 f"must be {want}: machine_type {machine_type!r} comes with exactly "
                                 f"{want} x {accelerator_type}")
        return
    limits = s.attachable[accelerator_type]
    if accelerator_count not in limits:
        raise ParameterError(f"{where}accelerator_count", accelerator_count,
                             f"must be one of {sorted(limits)} for {accelerator_type} on "
                             f"machine_type {machine_type!r}")
    vcpus = _vcpus(machine_type)
    if vcpus is not None and vcpus > limits[accelerator_count]:
        raise ParameterError(f"{where}machine_type", machine_type,
                             f"has {vcpus} vCPUs; {accelerator_count} x {accelerator_type} allow "
                             f"at most {limits[accelerator_count]}")


def boot_disk_type(machine_type: str) -> str:
    """The default boot disk of `machine_type`: hyperdisk-balanced on the machines that boot
    only from Hyperdisk (A3 Ultra, A4, A4X), else pd-ssd."""
    s = series_of(machine_type)
    return s.default_boot_disk if s is not None else "pd-ssd"


def check_boot_disk(machine_type: str, disk_type: str, where: str = "") -> None:
    """Refuse a boot disk type Vertex does not offer, or one the machine cannot boot from."""
    if disk_type not in BOOT_DISK_TYPES:
        raise ParameterError(f"{where}boot_disk_type", disk_type,
                             f"must be one of {', '.join(BOOT_DISK_TYPES)}")
    s = series_of(machine_type)
    if s is not None and disk_type not in s.boot_disks:
        raise ParameterError(f"{where}boot_disk_type", disk_type,
                             f"is not offered on machine_type {machine_type!r} ({s.name} boots "
                             f"from {', '.join(s.boot_disks)})")
