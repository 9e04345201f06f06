"""The NCCL and PyTorch variables that matter in a Vertex AI GPU job: what each does, when to
set it, its default, and where that is written. Data only; `labkit.vertex.specs.PoolConfig`
(`env=`) and `training_job(env=...)` pass any of them to the job's containers.

GPUDirect-RDMA machines (A3 Ultra, A4, A4X) run Google's NCCL/gIB. Its page (`GIB_PAGE`, read
2026-11-29) asks for two things in the runtime environment, "/usr/local/gib/scripts/set_nccl_env.sh
is sourced" and "The /usr/local/gib/lib64 directory is in your LD_LIBRARY_PATH", and says "Don't
install older NCCL implementations like NCCL/FastSocket (A2), NCCL/TCPX (A3), NCCL/TCPXO (A3 Mega)
or RxDM packages or their related environment variables" on those machines. labkit's image has
Google's Reduction Server plugin (`google-reduction-server`, from the same google-fast-socket
package repository) for jobs with a reducer pool; its Dockerfile moves the plugin's
``libnccl-net*.so`` out of the system library folders into `REDUCTION_SERVER_LIB_DIR`, which only
the image's LD_LIBRARY_PATH names. `gib_loader_path_step` is the job's set-up step on those
machines: /usr/local/gib/lib64 first, that folder dropped, so the only NCCL net plugin NCCL can
open there is gIB's (NCCL opens ``libnccl-net.so``, or what NCCL_NET_PLUGIN names, with dlopen and
the loader path: `NCCL_PLUGIN_SOURCE`). The gIB plugin is an IB-verbs transport and needs
libibverbs in the image (NCCL itself dlopens "libibverbs.so" / "libibverbs.so.1",
`NCCL_IBV_SOURCE`): the Dockerfile installs libibverbs1 and ibverbs-providers (the mlx5 driver of
the machines' ConnectX NICs).

They act only where NCCL runs: between GPUs. A CPU job (this course's emulated jobs on a machine
without GPUs) uses gloo, which reads none of them; what a variable changes (all-reduce bus
bandwidth with and without it, say) can only be measured on GPU machines.

Every entry names the page it comes from (read 2026-11-26). Where the page read did not state a
default, the entry says so rather than guess. NVIDIA's own advice applies to the whole table:
variables in its "Debugging" section "should not be used in production nor retained in scripts,
or only as workaround, and removed as soon as the issue is resolved. Keeping them set may result
in sub-optimal behavior, crashes, or hangs" (`NCCL_ENV`).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from labkit.vertex.machines import CONFIGURE_COMPUTE

READ_ON = "2026-11-26"
NCCL_ENV = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
NCCL_LOGGING = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting/logging.html"
NCCL_NVLS_ISSUE = "https://github.com/NVIDIA/nccl/issues/1031"  # a maintainer on NVLS
NVLS_DEFAULT_PR = "https://github.com/NVIDIA/JAX-Toolbox/pull/1708"
NCCL_2_18_1 = "https://docs.nvidia.com/deeplearning/nccl/release-notes/rel_2-18-1.html"
TORCH_NCCL_ENV = "https://docs.pytorch.org/docs/stable/torch_nccl_environment_variables.html"
GCE_GPUDIRECT = "https://docs.cloud.google.com/compute/docs/gpus/gpudirect"
TCPXO_SLURM = ("https://docs.cloud.google.com/cluster-toolkit/docs/machine-learning/"
               "a3-mega-enable-gpudirect-tcpxo")
DGXC_GCP_TCPXO = "https://docs.nvidia.com/dgx-cloud/run-ai/1.2/appendix-gcp.html"
# Where NVIDIA's page leaves a default out, NCCL's source states it: NCCL_PARAM(name, "VAR", default).
NCCL_IB_SOURCE = "https://github.com/NVIDIA/nccl/blob/master/src/transport/net_ib/init.cc"
NCCL_SEARCH_SOURCE = "https://github.com/NVIDIA/nccl/blob/master/src/graph/search.cc"
NOT_STATED = "not stated on the page read"
GIB_PAGE = "https://docs.cloud.google.com/ai-hypercomputer/docs/nccl/test-vms"
NCCL_PLUGIN_SOURCE = ("https://github.com/NVIDIA/nccl/blob/0456df2069b703b3331f510d664321be19d24612/src/plugin/net.cc "
                      "and https://github.com/NVIDIA/nccl/blob/081eafafc98385c45e38d5f5a35b3175735a5847/"
                      "src/plugin/plugin_open.cc")
NCCL_IBV_SOURCE = ("https://github.com/NVIDIA/nccl/blob/0386f730c2573b40fa0e3ce54033c4fd541ed58c/"
                   "src/misc/ibvsymbols.cc")
GIB_LIB_DIR = "/usr/local/gib/lib64"
GIB_ENV_SCRIPT = "/usr/local/gib/scripts/set_nccl_env.sh"
# Where labkit's Dockerfile moves the Reduction Server plugin (a test keeps the two equal).
REDUCTION_SERVER_LIB_DIR = "/opt/google-reduction-server/lib"

_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


@dataclass(frozen=True)
class EnvVar:
    """One variable: `name`, `what` it does, `when` to set it, its `default`, and `source`
    (the URL the three come from, read `READ_ON`)."""

    name: str
    what: str
    when: str
    default: str
    source: str

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"EnvVar.name {self.name!r} is not an environment variable name")
        for field in ("what", "when", "default"):
            if not getattr(self, field).strip():
                raise ValueError(f"EnvVar.{field} of {self.name} is empty")
        if not self.source.startswith("https://"):
            raise ValueError(f"EnvVar.source of {self.name} must be an https:// URL, got {self.source!r}")


VARIABLES: tuple[EnvVar, ...] = (
    EnvVar("NCCL_DEBUG",
           "NCCL's log level: VERSION (the version at start), WARN (warnings and errors), INFO "
           "(detailed operational information: topology, transports, rings), TRACE",
           "INFO to see which network and transport a job chose, or why it hangs; WARN is NVIDIA's "
           "'production minimum'",
           NOT_STATED, NCCL_LOGGING),
    EnvVar("NCCL_DEBUG_SUBSYS",
           "filters NCCL's log output by subsystem (e.g. INIT, NET, COLL)",
           "with NCCL_DEBUG=INFO, to keep only the part of the log you are reading",
           NOT_STATED, NCCL_LOGGING),
    EnvVar("NCCL_SOCKET_IFNAME",
           "which IP interfaces NCCL uses: a list of name prefixes ('eth'), '^' excludes "
           "('^docker'), '=' matches a whole name ('=eth0')",
           "when NCCL picks the wrong interface (a log that shows it on a slow or unreachable one)",
           "unset: NCCL chooses the interfaces itself", NCCL_ENV),
    EnvVar("NCCL_IB_DISABLE",
           "1 stops NCCL from using the InfiniBand/RoCE transport; it falls back to IP sockets",
           "only to rule the RDMA network out while debugging; it is the fast path on RDMA machines",
           f"0: InfiniBand/RoCE used where present (NCCL's source, {NCCL_IB_SOURCE})", NCCL_ENV),
    EnvVar("NCCL_P2P_DISABLE",
           "1 disables the peer-to-peer transport (CUDA direct access between GPUs over NVLink or PCI)",
           "a debugging switch for suspected GPU-to-GPU faults; it removes NVLink from the path",
           "unset: P2P in use", NCCL_ENV),
    EnvVar("NCCL_P2P_LEVEL",
           "the farthest GPU distance at which P2P is used: LOC (never), NVL, PIX, PXB, PHB, SYS",
           "rarely: to keep P2P off paths that are slow or broken on a given machine",
           "unset: 'NCCL will attempt to optimally select a value'", NCCL_ENV),
    EnvVar("NCCL_NVLS_ENABLE",
           "NVLink SHARP (NVLS): an all-reduce offload over NVLink, within a node",
           "0 turns it off; the TCPXO set-up NVIDIA documents for A3 Mega on Google Cloud sets 0 "
           f"({DGXC_GCP_TCPXO})",
           f"on where the system supports it ({NVLS_DEFAULT_PR})", NCCL_NVLS_ISSUE),
    EnvVar("NCCL_CROSS_NIC",
           "whether NCCL may use different NICs on different nodes for the same ring or tree",
           f"set by the machine's NCCL set-up (the A3 Mega TCPXO set-up sets 0: {DGXC_GCP_TCPXO}); "
           "leave it to that set-up",
           "2: the same NIC for a ring or tree where possible, others where that is faster "
           f"(0 always the same, 1 any; NCCL's source, {NCCL_SEARCH_SOURCE})", NCCL_ENV),
    EnvVar("NCCL_ALGO",
           "forces the collective algorithms (Ring, Tree, NVLS, ...) instead of NCCL's choice",
           "do not set it in a job: NVIDIA lists it with the debugging variables, 'keeping them set "
           "may result in sub-optimal behavior, crashes, or hangs'; a machine's own NCCL set-up "
           "may set it (A3 Mega TCPXO sets Ring,Tree)",
           "unset: NCCL chooses per call", NCCL_ENV),
    EnvVar("NCCL_PROTO",
           "forces the protocols (Simple, LL, LL128) instead of NCCL's choice",
           f"do not set it in a job, as NCCL_ALGO; one documented workaround, NCCL_PROTO=^LL128 for "
           f"a 2.18.1 issue on HGX H100 ({NCCL_2_18_1})",
           "unset: NCCL chooses per call", NCCL_ENV),
    EnvVar("TORCH_NCCL_ASYNC_ERROR_HANDLING",
           "what PyTorch does when its watchdog sees an NCCL error: 0 nothing, 1 abort the "
           "communicator and tear the process down, 2 only abort, 3 tear down without aborting",
           "keep the default so a failed collective ends the process and Vertex can restart the job "
           "(restartJobOnWorkerRestart) instead of hanging until the timeout",
           "3", TORCH_NCCL_ENV),
    EnvVar("TORCH_NCCL_BLOCKING_WAIT",
           "whether wait() on a collective blocks (then a collective past init_process_group's "
           "timeout raises in the calling thread)",
           "to debug a hang at a known call; it costs the overlap of communication with compute",
           NOT_STATED, TORCH_NCCL_ENV),
    EnvVar("NCCL_FASTRAK_IFNAME",
           "GPUDirect-TCPXO (A3 Mega, a3-megagpu-8g): the NICs the TCPXO plugin sends GPU data on "
           "(eth1..eth8 in NVIDIA's A3 Mega set-up); NCCL_FASTRAK_CTRL_DEV names the control NIC (eth0)",
           "with the TCPXO NCCL net plugin and its Receive Data Path Manager (RxDM) running beside "
           f"the job ({TCPXO_SLURM}); A3 High/Edge use GPUDirect-TCPX instead ({GCE_GPUDIRECT})",
           "unset: no TCPXO", DGXC_GCP_TCPXO),
    EnvVar("NCCL_FASTRAK_NUM_FLOWS",
           "GPUDirect-TCPXO: flows per connection (2 in NVIDIA's A3 Mega set-up, beside "
           "NCCL_FASTRAK_USE_SNAP=1, NCCL_FASTRAK_USE_LLCM=1, NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY="
           "/dev/aperture_devices)",
           "as the machine's TCPXO set-up gives them; copy the whole set, not one variable",
           "unset: no TCPXO", DGXC_GCP_TCPXO),
    EnvVar("LD_LIBRARY_PATH",
           "where the loader finds libraries: the GPU driver is mounted under /usr/local/nvidia and "
           "TCPXO's NCCL net plugin must be found there too (NVIDIA's A3 Mega set-up: "
           "/usr/lib/x86_64-linux-gnu:/usr/local/nvidia/lib64, prepended to)",
           "on a TCPXO/TCPX machine, so NCCL loads the plugin; on Vertex's RDMA machines (A3 Ultra, "
           f"A4, A4X) {GIB_LIB_DIR} must be on it and set_nccl_env.sh sourced ({GIB_PAGE}; "
           f"{CONFIGURE_COMPUTE}): labkit's multi-node jobs there do both",
           "the image's own", DGXC_GCP_TCPXO),
)


def gib_loader_path_step(lib_dir: str = GIB_LIB_DIR, drop: str = REDUCTION_SERVER_LIB_DIR) -> str:
    """The shell step (bash) that puts `lib_dir` first on LD_LIBRARY_PATH and takes `drop` off
    it, so NCCL opens gIB's net plugin and no other (see the module docstring). Empty entries are
    dropped too: an empty entry would search the working directory."""
    return (f'{{ p={lib_dir}; for d in ${{LD_LIBRARY_PATH//:/ }}; do [ "$d" = {drop} ] || p="$p:$d"; done; '
            f'export LD_LIBRARY_PATH="$p"; }}')

BY_NAME = {v.name: v for v in VARIABLES}


def rows(compact: bool = True) -> list[dict[str, str]]:
    """The table as rows: name, what, when (`compact`), or every field."""
    if compact:
        return [{"variable": v.name, "what it does": v.what, "when to set it": v.when} for v in VARIABLES]
    return [asdict(v) for v in VARIABLES]


def sources() -> list[str]:
    """The pages the table comes from, each once, with the read date."""
    seen = dict.fromkeys(v.source for v in VARIABLES)
    return [f"{url} (read {READ_ON})" for url in seen]
