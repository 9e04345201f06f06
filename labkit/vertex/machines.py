"""The machines Vertex AI offers for training, what each carries, and how it boots.

Everything here is read from Vertex AI's own page "Configure compute resources for serverless
training" (`CONFIGURE_COMPUTE`, read 2026-11-26), unless a rule names another source:

* `TRAINING_MACHINE_TYPES`: the machine types a worker pool may ask for (its list "Machine
  types", plus the TPU VM types of its TPU sections). ``n1-standard-2`` or ``n1-highcpu-8``, say,
  are Compute Engine machines that training does not offer.
* `GPU_COUNTS`: its table "Valid numbers of GPUs for each machine type": machine type ->
  {accelerator: allowed counts}. An N1 machine takes P4, P100, T4 or V100 GPUs in the counts its
  row allows (1 T4 on ``n1-standard-32`` is not one of them; nor are 4 P100 on ``n1-standard-96``:
  "4 NVIDIA_TESLA_P100 GPUs only provide up to 64 virtual CPUs and up to 208 GB of memory");
  accelerator-optimized machines come with a fixed number of one GPU.
* TPUs: ``cloud-tpu`` with TPU_V2 or TPU_V3 (8 chips, or a Pod slice of a multiple of 32); TPU
  v5e, v6e and 7x VMs are described by machine type and ``tpu_topology`` (`TPU_TOPOLOGIES`), not by
  an accelerator type; "you must only use a single worker pool [...] with only one replica".
  TPU v4 is not offered for training.
* Boot disks: "pd-ssd", "pd-standard" or "hyperdisk-balanced", "an integer between 100 and
  64,000" GB; hyperdisk-balanced is the default of ``a3-ultragpu-8g`` and ``a4-highgpu-8g``, and
  Compute Engine's A4X machines boot only from Hyperdisk (`HYPERDISK_ONLY`).
* GPUDirect-RDMA machines (A3 Ultra, A4, A4X) need ``source /usr/local/gib/scripts/set_nccl_env.sh``
  before the training command (`needs_nccl_env_script`). GB200 (A4X) capacity comes only through
  shared reservations. A4X runs on Arm (`machine_arch`): Compute Engine's release note of
  2025-09-10 calls it "the first GPU VM to run on Arm".
* Network bandwidth per machine (`network_gbps`), for sizing a Reduction Server pool: Compute
  Engine's "Networking and GPU machines" page gives each GPU series' maximum total bandwidth
  (A4X 2,000 Gbps, A4 and A3 Ultra 3,600, A3 Mega 1,800, A3 High 1,000, G4 400, A2 and G2 100;
  N1 with T4 or V100 up to 100, with P4 or P100 32) and, per machine type, smaller figures for
  the smaller machines of a series (`MACHINE_GBPS`; those per-type rows were not in the stored
  copy read for this table and are unverified); the Reduction Server section of Vertex AI's
  distributed-training page gives 32 Gbps for ``n1-highcpu-16`` and 100 Gbps for an
  ``n1-highmem-96`` with 8 V100 (general-purpose N1/N2 machines: 2 Gbps per vCPU up to 32).
* The VM network of a GPUDirect machine (`vm_network_gbps`, `GPUDIRECT_NICS`): the totals above
  add the GPU NICs to the host NIC(s), and only the host NICs carry traffic to machines without
  GPUs, such as Reduction Server reducers. This page's "GPUDirect Networking" section (read
  2026-11-29): ``a3-megagpu-8g`` "Up to 200 Gbps bandwidth on the primary NIC" and "8 secondary
  NICs each supporting up to 200 Gbps for GPU data transfer" (GPUDirect-TCPXO);
  ``a3-ultragpu-8g`` and ``a4-highgpu-8g`` "2 host NICs providing a bandwidth of 400 Gbps" and
  "8 NICs offering up to 3200 Gbps for GPU data transfer"; ``a4x-highgpu-4g`` "2 host NICs
  providing a bandwidth of 400 Gbps" and "6 NICs offering up to 2400 Gbps" (GPUDirect-RDMA). It
  names no GPUDirect stack for ``a3-highgpu-8g`` (`gpudirect_on_vertex`); GKE's GPUDirect-TCPX
  page (`GKE_GPUDIRECT_TCPX`) gives that machine "Up to 200 Gbps bandwidth on the primary NIC"
  and up to four secondary NICs of 200 Gbps for GPU data, the rest of its 1,000 Gbps.

`check_machine(machine_type, accelerator_type, accelerator_count, tpu_topology=None)` refuses what
the tables do not allow, naming the field, the value and the rule's source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from labkit.core.config import ParameterError

READ_ON = "2026-11-26"
CONFIGURE_COMPUTE = ("https://docs.cloud.google.com/gemini-enterprise-agent-platform/"
                     "machine-learning/training/configure-compute")
DISTRIBUTED_TRAINING = ("https://docs.cloud.google.com/gemini-enterprise-agent-platform/"
                        "machine-learning/training/distributed-training")
GPU_NETWORK_BANDWIDTH = "https://docs.cloud.google.com/compute/docs/gpus/gpu-network-bandwidth"
# Read as quoted in kubernetes-sigs/kro, examples/gcp/gke-gpudirect-tcpx-a3mega/README.md.
GKE_GPUDIRECT_TCPX = "https://cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-tcpx"
A4X_ON_ARM = ("https://docs.cloud.google.com/compute/docs/release-notes (2025-09-10: A4X, \"the "
              "first GPU VM to run on Arm\")")
A4X_HYPERDISK = "https://docs.cloud.google.com/compute/docs/accelerator-optimized-machines#a4x-vms"


def cite(url: str) -> str:
    return f"{url}, read {READ_ON}"


BOOT_DISK_TYPES = ("pd-ssd", "pd-standard", "hyperdisk-balanced")
BOOT_DISK_GB = (100, 64_000)
HYPERDISK_ONLY = ("a3-ultragpu-8g", "a4-highgpu-8g", "a4x-highgpu-4g")

TRAINING_MACHINE_TYPES: tuple[str, ...] = (
    "a4x-highgpu-4g", "a4-highgpu-8g", "a3-ultragpu-8g", "a3-megagpu-8g", "a3-highgpu-1g",
    "a3-highgpu-2g", "a3-highgpu-4g", "a3-highgpu-8g", "a2-ultragpu-1g", "a2-ultragpu-2g",
    "a2-ultragpu-4g", "a2-ultragpu-8g", "a2-highgpu-1g", "a2-highgpu-2g", "a2-highgpu-4g",
    "a2-highgpu-8g", "a2-megagpu-16g",
    "e2-standard-4", "e2-standard-8", "e2-standard-16", "e2-standard-32", "e2-highmem-2",
    "e2-highmem-4", "e2-highmem-8", "e2-highmem-16", "e2-highcpu-16", "e2-highcpu-32",
    *(f"n4-{kind}-{n}" for kind in ("standard", "highmem", "highcpu") for n in (2, 4, 8, 16, 32, 48, 64, 80)),
    "n2-standard-4", "n2-standard-8", "n2-standard-16", "n2-standard-32", "n2-standard-48",
    "n2-standard-64", "n2-standard-80", "n2-highmem-2", "n2-highmem-4", "n2-highmem-8",
    "n2-highmem-16", "n2-highmem-32", "n2-highmem-48", "n2-highmem-64", "n2-highmem-80",
    "n2-highcpu-16", "n2-highcpu-32", "n2-highcpu-48", "n2-highcpu-64", "n2-highcpu-80",
    "n1-standard-4", "n1-standard-8", "n1-standard-16", "n1-standard-32", "n1-standard-64",
    "n1-standard-96", "n1-highmem-2", "n1-highmem-4", "n1-highmem-8", "n1-highmem-16",
    "n1-highmem-32", "n1-highmem-64", "n1-highmem-96", "n1-highcpu-16", "n1-highcpu-32",
    "n1-highcpu-64", "n1-highcpu-96",
    "c2-standard-4", "c2-standard-8", "c2-standard-16", "c2-standard-30", "c2-standard-60",
    "ct5lp-hightpu-1t", "ct5lp-hightpu-4t", "ct5lp-hightpu-8t",
    "m1-ultramem-40", "m1-ultramem-80", "m1-ultramem-160", "m1-megamem-96",
    "g2-standard-4", "g2-standard-8", "g2-standard-12", "g2-standard-16", "g2-standard-24",
    "g2-standard-32", "g2-standard-48", "g2-standard-96",
    "g4-standard-48", "g4-standard-96", "g4-standard-192", "g4-standard-384",
    "cloud-tpu",
    # The TPU v6e and 7x sections of the page.
    "ct6e-standard-1t", "ct6e-standard-4t", "ct6e-standard-8t", "tpu7x-standard-4t",
)

P4, P100, T4, V100 = "NVIDIA_TESLA_P4", "NVIDIA_TESLA_P100", "NVIDIA_TESLA_T4", "NVIDIA_TESLA_V100"


def _n1(p4: tuple[int, ...], p100: tuple[int, ...], t4: tuple[int, ...], v100: tuple[int, ...]):
    return {k: v for k, v in ((P4, p4), (P100, p100), (T4, t4), (V100, v100)) if v}


_SMALL, _LARGE, _HUGE = (1, 2, 4), (2, 4), (4,)
GPU_COUNTS: dict[str, dict[str, tuple[int, ...]]] = {
    "a3-megagpu-8g": {"NVIDIA_H100_MEGA_80GB": (8,)},
    **{f"a3-highgpu-{n}g": {"NVIDIA_H100_80GB": (n,)} for n in (1, 2, 4, 8)},
    "a3-ultragpu-8g": {"NVIDIA_H200_141GB": (8,)},
    "a4-highgpu-8g": {"NVIDIA_B200": (8,)},
    "a4x-highgpu-4g": {"NVIDIA_GB200": (4,)},
    **{f"a2-ultragpu-{n}g": {"NVIDIA_A100_80GB": (n,)} for n in (1, 2, 4, 8)},
    **{f"a2-highgpu-{n}g": {"NVIDIA_TESLA_A100": (n,)} for n in (1, 2, 4, 8)},
    "a2-megagpu-16g": {"NVIDIA_TESLA_A100": (16,)},
    **{f"n1-standard-{n}": _n1(_SMALL, _SMALL, _SMALL, (1, 2, 4, 8)) for n in (4, 8)},
    "n1-standard-16": _n1(_SMALL, _SMALL, _SMALL, (2, 4, 8)),
    "n1-standard-32": _n1(_LARGE, _LARGE, _LARGE, (4, 8)),
    **{f"n1-standard-{n}": _n1(_HUGE, (), _HUGE, (8,)) for n in (64, 96)},
    **{f"n1-highmem-{n}": _n1(_SMALL, _SMALL, _SMALL, (1, 2, 4, 8)) for n in (2, 4, 8)},
    "n1-highmem-16": _n1(_SMALL, _SMALL, _SMALL, (2, 4, 8)),
    "n1-highmem-32": _n1(_LARGE, _LARGE, _LARGE, (4, 8)),
    **{f"n1-highmem-{n}": _n1(_HUGE, (), _HUGE, (8,)) for n in (64, 96)},
    "n1-highcpu-16": _n1(_SMALL, _SMALL, _SMALL, (2, 4, 8)),
    "n1-highcpu-32": _n1(_LARGE, _LARGE, _LARGE, (4, 8)),
    "n1-highcpu-64": _n1(_HUGE, _HUGE, _HUGE, (8,)),
    "n1-highcpu-96": _n1(_HUGE, (), _HUGE, (8,)),
    **{f"g2-standard-{n}": {"NVIDIA_L4": (c,)} for n, c in ((4, 1), (8, 1), (12, 1), (16, 1), (24, 2),
                                                            (32, 1), (48, 4), (96, 8))},
    **{f"g4-standard-{n}": {"NVIDIA_RTX_PRO_6000": (c,)} for n, c in ((48, 1), (96, 2), (192, 4), (384, 8))},
}

# TPU VM machine type -> {topology: TPU chips}; the chips are spread over the VMs the topology needs.
_V5E_V6E = {"2x4": 8, "4x4": 16, "4x8": 32, "8x8": 64, "8x16": 128, "16x16": 256}
TPU_TOPOLOGIES: dict[str, dict[str, int]] = {
    "ct5lp-hightpu-1t": {"1x1": 1},
    "ct5lp-hightpu-4t": {"2x2": 4, **_V5E_V6E},
    "ct5lp-hightpu-8t": {"2x4": 8},
    "ct6e-standard-1t": {"1x1": 1},
    "ct6e-standard-4t": {"2x2": 4, **_V5E_V6E},
    "ct6e-standard-8t": {"2x4": 8},
    "tpu7x-standard-4t": {"2x2x1": 4, "2x2x2": 8, "2x2x4": 16, "2x4x4": 32, "4x4x4": 64, "4x4x8": 128,
                          "4x8x8": 256, "8x8x8": 512, "8x8x16": 1024},
}
# The chip a TPU VM machine type carries, for pricing (the accelerator type it would have).
TPU_CHIPS = {"ct5lp": "TPU_V5_LITEPOD", "ct6e": "TPU_V6E", "tpu7x": "TPU_7X"}
CLOUD_TPU = ("TPU_V2", "TPU_V3")

# Reduction Server sizing (`network_gbps`): each GPU series' maximum total network bandwidth.
SERIES_GBPS = {"a4x": 2000, "a4": 3600, "a3-ultragpu": 3600, "a3-megagpu": 1800, "a3-highgpu": 1000,
               "g4": 400, "a2": 100, "g2": 100}
# Smaller machines of a series (see the module docstring: unverified per-type figures).
MACHINE_GBPS = {"a2-highgpu-1g": 24, "a2-highgpu-2g": 32, "a2-highgpu-4g": 50, "a2-ultragpu-1g": 24,
                "a2-ultragpu-2g": 32, "a2-ultragpu-4g": 50, "a3-highgpu-1g": 25, "a3-highgpu-2g": 50,
                "a3-highgpu-4g": 100, "g2-standard-4": 10, "g2-standard-8": 16, "g2-standard-12": 16,
                "g2-standard-16": 32, "g2-standard-24": 32, "g2-standard-32": 32, "g2-standard-48": 50,
                "g4-standard-48": 50, "g4-standard-96": 100, "g4-standard-192": 200}
# N1 with T4 or V100: by GPU count (up to 100 Gbps); with P4 or P100: at most 32 Gbps.
N1_GPU_GBPS = {T4: {1: 24, 2: 32, 4: 50}, V100: {1: 24, 2: 32, 4: 50, 8: 100}}


@dataclass(frozen=True)
class GpuNics:
    """A GPUDirect machine's network: its host NIC(s), the VM network every VM talks through, and
    the GPU NICs its GPUDirect stack sends GPU data on (see the module docstring)."""

    stack: str
    host_gbps: float
    gpu_gbps: float
    vertex_sets_up: bool  # Vertex's configure-compute page lists the stack for this machine
    source: str


GPUDIRECT_NICS = {
    "a3-highgpu-8g": GpuNics("GPUDirect-TCPX", 200, 4 * 200, False, GKE_GPUDIRECT_TCPX),
    "a3-megagpu-8g": GpuNics("GPUDirect-TCPXO", 200, 8 * 200, True, CONFIGURE_COMPUTE),
    "a3-ultragpu-8g": GpuNics("GPUDirect-RDMA", 400, 3200, True, CONFIGURE_COMPUTE),
    "a4-highgpu-8g": GpuNics("GPUDirect-RDMA", 400, 3200, True, CONFIGURE_COMPUTE),
    "a4x-highgpu-4g": GpuNics("GPUDirect-RDMA", 400, 2400, True, CONFIGURE_COMPUTE),
}


def is_tpu_vm(machine_type: str) -> bool:
    """A TPU VM described by machine type and topology (TPU v5e, v6e, 7x)."""
    return machine_type in TPU_TOPOLOGIES


def is_tpu(machine_type: str) -> bool:
    return machine_type == "cloud-tpu" or is_tpu_vm(machine_type)


def needs_accelerator(machine_type: str) -> bool:
    """The page's machine types "marked with asterisks": they are used only with their GPUs or TPUs."""
    return machine_type in GPU_COUNTS and not machine_type.startswith("n1-") or is_tpu(machine_type)


def machine_arch(machine_type: str) -> str:
    """"arm64" for A4X (Grace CPUs), else "amd64"."""
    return "arm64" if machine_type.startswith("a4x-") else "amd64"


def needs_nccl_env_script(machine_type: str) -> bool:
    """GPUDirect-RDMA machines, whose multi-node jobs must first source Google's NCCL set-up."""
    return machine_type in HYPERDISK_ONLY


def needs_reservation(machine_type: str, accelerator_type: str | None) -> bool:
    """GB200 capacity is obtained only through shared reservations (the page's "+" mark)."""
    return accelerator_type == "NVIDIA_GB200" or machine_type.startswith("a4x-")


def tpu_chips(machine_type: str, tpu_topology: str | None) -> tuple[str, int] | None:
    """(chip type, chips) of a TPU VM pool replica, or None for other machines."""
    if not is_tpu_vm(machine_type) or tpu_topology not in TPU_TOPOLOGIES[machine_type]:
        return None
    return TPU_CHIPS[machine_type.split("-")[0]], TPU_TOPOLOGIES[machine_type][tpu_topology]


def _vcpus(machine_type: str) -> int | None:
    m = re.search(r"-(\d+)$", machine_type)
    return int(m.group(1)) if m else None


def network_gbps(machine_type: str, accelerator_type: str | None = None,
                 accelerator_count: int = 0) -> float | None:
    """The maximum network bandwidth of one machine, in Gbps (None: not known to labkit)."""
    if machine_type in MACHINE_GBPS:
        return float(MACHINE_GBPS[machine_type])
    for prefix, gbps in SERIES_GBPS.items():
        if machine_type.startswith(prefix + "-"):
            return float(gbps)
    if machine_type.startswith("n1-") and accelerator_type in N1_GPU_GBPS:
        by_count = N1_GPU_GBPS[accelerator_type]
        return float(by_count.get(accelerator_count, max(by_count.values())))
    if machine_type.startswith(("n1-", "n2-")):
        vcpus = _vcpus(machine_type)
        return float(min(2 * vcpus, 32)) if vcpus else None
    return None


def vm_network_gbps(machine_type: str, accelerator_type: str | None = None,
                    accelerator_count: int = 0) -> float | None:
    """The bandwidth of one machine's VM network, in Gbps: what it can send to a machine without
    GPUs, such as a Reduction Server reducer. A GPUDirect machine's host NICs only; elsewhere the
    machine's whole `network_gbps`. None: not known to labkit."""
    nics = GPUDIRECT_NICS.get(machine_type)
    return float(nics.host_gbps) if nics else network_gbps(machine_type, accelerator_type, accelerator_count)


def gpudirect_on_vertex(machine_type: str) -> GpuNics | None:
    """The NICs of a machine Vertex AI sets up with a GPUDirect stack (A3 Mega, A3 Ultra, A4,
    A4X), whose GPUs send to each other over GPU NICs rather than the VM network; else None."""
    nics = GPUDIRECT_NICS.get(machine_type)
    return nics if nics and nics.vertex_sets_up else None


def _training_types_near(machine_type: str) -> str:
    """The offered machine types of the same series (n1-highcpu-*), else of the same family."""
    series = machine_type.rsplit("-", 1)[0] + "-"
    same = [m for m in TRAINING_MACHINE_TYPES if m.startswith(series)] or \
        [m for m in TRAINING_MACHINE_TYPES if m.split("-")[0] == machine_type.split("-")[0]]
    return ", ".join(same[:8]) + (", ..." if len(same) > 8 else "") if same else "see the page"


def check_machine(machine_type: str, accelerator_type: str | None, accelerator_count: int,
                  where: str = "", tpu_topology: str | None = None) -> None:
    """Refuse a machine type training does not offer, an accelerator it does not carry or a
    count its row does not allow, and a TPU VM without a supported topology (ParameterError
    naming the field; `where` prefixes it, e.g. ``worker_pool_specs[1].machine_spec.``)."""
    source = f"({cite(CONFIGURE_COMPUTE)})"
    if machine_type not in TRAINING_MACHINE_TYPES:
        raise ParameterError(f"{where}machine_type", machine_type,
                             f"is not a machine type Vertex AI offers for training "
                             f"(offered: {_training_types_near(machine_type)}) {source}")
    if is_tpu_vm(machine_type):
        if accelerator_type or accelerator_count:
            raise ParameterError(f"{where}accelerator_type", accelerator_type,
                                 f"must be unset on {machine_type}: a TPU VM is described by "
                                 f"machine_type and tpu_topology {source}")
        allowed = TPU_TOPOLOGIES[machine_type]
        if tpu_topology not in allowed:
            raise ParameterError(f"{where}tpu_topology", tpu_topology,
                                 f"must be one of {', '.join(allowed)} for {machine_type} {source}")
        return
    if tpu_topology:
        raise ParameterError(f"{where}tpu_topology", tpu_topology,
                             f"applies to TPU VM machine types ({', '.join(TPU_TOPOLOGIES)}), not "
                             f"{machine_type} {source}")
    if machine_type == "cloud-tpu":
        if accelerator_type not in CLOUD_TPU:
            raise ParameterError(f"{where}accelerator_type", accelerator_type,
                                 f"must be TPU_V2 or TPU_V3 on cloud-tpu {source}")
        if not (accelerator_count == 8 or (accelerator_count >= 32 and accelerator_count % 32 == 0)):
            raise ParameterError(f"{where}accelerator_count", accelerator_count,
                                 f"must be 8 (one TPU) or a multiple of 32 (a Pod slice) for "
                                 f"{accelerator_type} {source}")
        return
    rows = GPU_COUNTS.get(machine_type, {})
    if not accelerator_type:
        if needs_accelerator(machine_type):
            (gpu, counts), = rows.items()
            raise ParameterError(f"{where}accelerator_type", accelerator_type,
                                 f"must be {gpu} with machine_type {machine_type!r} (it comes with "
                                 f"{counts[0]} of them) {source}")
        return
    if accelerator_type not in rows:
        carriers = [m for m, r in GPU_COUNTS.items() if accelerator_type in r]
        carried = f"; {machine_type} carries {', '.join(rows)}" if rows else ""
        raise ParameterError(f"{where}accelerator_type", accelerator_type,
                             f"does not run on machine_type {machine_type!r}{carried} (machine types "
                             f"for {accelerator_type}: {', '.join(carriers) or 'none for training'}) {source}")
    counts = rows[accelerator_type]
    if accelerator_count not in counts:
        fixed = len(counts) == 1 and not machine_type.startswith("n1-")
        problem = (f"must be {counts[0]}: machine_type {machine_type!r} comes with exactly {counts[0]} x "
                   f"{accelerator_type}" if fixed else
                   f"must be one of {list(counts)} for {accelerator_type} on machine_type {machine_type!r}")
        raise ParameterError(f"{where}accelerator_count", accelerator_count, f"{problem} {source}")


def boot_disk_type(machine_type: str) -> str:
    """The default boot disk of `machine_type`: hyperdisk-balanced on the machines that boot
    only from Hyperdisk (A3 Ultra, A4, A4X), else pd-ssd."""
    return "hyperdisk-balanced" if machine_type in HYPERDISK_ONLY else "pd-ssd"


def check_boot_disk(machine_type: str, disk_type: str, where: str = "",
                    size_gb: int | None = None) -> None:
    """Refuse a boot disk type Vertex does not offer, one the machine cannot boot from, or a
    size outside 100 to 64,000 GB."""
    if disk_type not in BOOT_DISK_TYPES:
        raise ParameterError(f"{where}boot_disk_type", disk_type,
                             f"must be one of {', '.join(BOOT_DISK_TYPES)} ({cite(CONFIGURE_COMPUTE)})")
    if machine_type in HYPERDISK_ONLY and disk_type != "hyperdisk-balanced":
        raise ParameterError(f"{where}boot_disk_type", disk_type,
                             f"is not offered on machine_type {machine_type!r}, which boots only from "
                             f"hyperdisk-balanced ({cite(CONFIGURE_COMPUTE)}; {A4X_HYPERDISK})")
    low, high = BOOT_DISK_GB
    if size_gb is not None and not low <= size_gb <= high:
        raise ParameterError(f"{where}boot_disk_size_gb", size_gb,
                             f"must be between {low} and {high:,} GB ({cite(CONFIGURE_COMPUTE)})")
