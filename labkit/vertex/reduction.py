"""Whether a job should have a Reduction Server, and how many reducers: `plan_reducers`.

What Vertex AI's distributed-training page says (`DISTRIBUTED_TRAINING`, read 2026-11-29):

* Reduction Server "is an all-reduce algorithm that can increase throughput and reduce latency
  for distributed training". Its prerequisites: "distributed training with GPU workers", code
  "configured for multi-host data-parallel training with GPUs using NCCL all-reduce", and a
  training image with NCCL 2.7 or later and the ``google-reduction-server`` package (labkit's
  image has it). The reducers are CPU machines ("You do not use GPUs for the Reduction Server
  nodes"), and "each worker needs to connect to all of the reducer hosts".
* Sizing, given as advice: "make sure that the total network bandwidth of the third worker pool
  matches or exceeds the total network bandwidth of the first and second worker pools"; "We
  recommend that you use the n1-highcpu-16 machine type" (32 Gbps); 5 ``n1-highmem-96`` nodes
  with 8 V100 (100 Gbps each) "might use 16" ``n1-highcpu-16``; 8 ``a2-megagpu-16g`` nodes
  "should use at least 25".

Where it helps (`applicability`): the reducers are reached over the training VMs' VM network,
so they help where the GPUs' traffic between nodes crosses that network anyway: A2, G2, G4, N1
with T4 or V100, and A3 High (Vertex's configure-compute page names no GPUDirect stack for it).
Not on the machines Vertex sets up with GPUDirect (A3 Mega: TCPXO; A3 Ultra, A4, A4X: RDMA;
`labkit.vertex.machines.gpudirect_on_vertex`): their GPUs send over GPU NICs the reducers cannot
reach, so going through the reducers would move all-reduce onto the host NICs, with 6 to 8
times less bandwidth, and on the RDMA machines labkit's job set-up leaves gIB as NCCL's only net plugin
(`labkit.vertex.nccl`), so the reducers would have nothing to do. Nor on one node (no all-reduce
between nodes) or without GPUs (no NCCL).

Sizing (`size_reducers`): ceil(nodes x the VM-network Gbps of one training node / the Gbps of one
reducer), from `labkit.vertex.machines.vm_network_gbps`: what goes through the NIC the reducers
share, never a GPUDirect machine's total with its GPU NICs (4 ``a3-highgpu-8g``: 25 reducers on
200 Gbps each, not 125 on 1,000).

The rule is advice, so a user's own count is kept: `check_reducers` (what the job builders call)
returns it and warns (`ReductionServerWarning`, one line) when it is below the rule or where the
Reduction Server does not help; "auto" takes the rule's count, or none where it does not help,
and says why. `price_plan` prices the reducers against the training pools from the machine price
list that `labkit.vertex.pricing.estimate_cost` uses.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace

from labkit.core.config import ParameterError, check_int
from labkit.hardware.catalog import CatalogError, load_machine_prices, machine_price
from labkit.vertex.machines import (
    CONFIGURE_COMPUTE,
    DISTRIBUTED_TRAINING,
    GPU_NETWORK_BANDWIDTH,
    GPUDIRECT_NICS,
    gpudirect_on_vertex,
    network_gbps,
    vm_network_gbps,
)

READ_ON = "2026-11-29"
REDUCTION_SERVER_MACHINE_TYPE = "n1-highcpu-16"  # the page's recommendation
FIELD = "reduction_server_count"


def cite(url: str) -> str:
    return f"{url}, read {READ_ON}"


class ReductionServerWarning(UserWarning):
    """Advice on a Reduction Server pool the job keeps: fewer reducers than Vertex's bandwidth
    rule, or reducers on a machine where they do not help."""


@dataclass(frozen=True)
class ReducerSizing:
    """The rule's count: the training nodes' VM-network bandwidth and one reducer's."""

    worker_gbps: float
    nodes: int
    reducer_gbps: float
    needed: int
    machine_type: str = ""
    reducer_machine_type: str = REDUCTION_SERVER_MACHINE_TYPE
    total_gbps: float | None = None  # the machine's whole bandwidth, GPU NICs included

    def text(self) -> str:
        machine = f" {self.machine_type}" if self.machine_type else ""
        usable = ""
        nics = GPUDIRECT_NICS.get(self.machine_type)
        if nics and self.total_gbps and self.total_gbps > self.worker_gbps:
            usable = (f" on the host NIC(s) the reducers share (its {self.total_gbps:,.0f} Gbps total "
                      f"adds {nics.gpu_gbps:,.0f} Gbps of {nics.stack} GPU NICs: {nics.source})")
        return (f"Vertex's rule: the reducers' total bandwidth matches or exceeds the training nodes' "
                f"({cite(DISTRIBUTED_TRAINING)}): {self.nodes} x{machine} x {self.worker_gbps:,.0f} Gbps"
                f"{usable} = {self.nodes * self.worker_gbps:,.0f} Gbps -> {self.needed} reducer(s) x "
                f"{self.reducer_machine_type} x {self.reducer_gbps:g} Gbps (bandwidths: {GPU_NETWORK_BANDWIDTH})")


def size_reducers(nodes: int, machine_type: str, accelerator_type: str | None,
                  reducer_machine_type: str = REDUCTION_SERVER_MACHINE_TYPE,
                  accelerator_count: int = 0) -> ReducerSizing:
    """The reducers whose total bandwidth matches the VM network of `nodes` training nodes."""
    if not _is_gpu(accelerator_type):
        raise ParameterError(FIELD, "set", "needs GPU training nodes: Reduction Server serves NCCL "
                             f"all-reduce between GPUs ({cite(DISTRIBUTED_TRAINING)})")
    worker = vm_network_gbps(machine_type, accelerator_type, accelerator_count)
    if worker is None:
        raise ParameterError("machine_type", machine_type, "has no network bandwidth in labkit's "
                             "table, so a Reduction Server pool cannot be sized for it")
    reducer = _reducer_gbps(reducer_machine_type)
    return ReducerSizing(worker, nodes, reducer, math.ceil(nodes * worker / reducer - 1e-9), machine_type,
                         reducer_machine_type, network_gbps(machine_type, accelerator_type, accelerator_count))


@dataclass(frozen=True)
class ReducerPlan:
    """What a job gets: `count` reducers (0: none), whether they help there and why, the rule's
    sizing (None where it cannot apply), and the one-line `warning` a kept choice earns."""

    requested: int | str
    count: int
    nodes: int
    machine_type: str
    accelerator_type: str | None
    accelerator_count: int
    reducer_machine_type: str
    helps: bool
    reason: str
    sizing: ReducerSizing | None = None
    warning: str | None = None

    def text(self) -> str:
        verdict = "helps" if self.helps else "does not help"
        out = [f"Reduction Server on {self.nodes} x {self.machine_type}: {verdict}: {self.reason}"]
        if self.sizing is not None:
            out.append(self.sizing.text())
        asked = "auto" if self.requested == "auto" else f"your count, {self.requested}"
        out.append(f"plan: {self.count} x {self.reducer_machine_type} ({asked})" if self.count
                   else f"plan: no reducers ({asked})")
        if self.warning:
            out.append(f"warning: {self.warning}")
        return "\n".join(out)


def applicability(nodes: int, machine_type: str, accelerator_type: str | None) -> tuple[bool, str]:
    """(helps, why): whether reducers can speed up this job's all-reduce between nodes."""
    if not _is_gpu(accelerator_type):
        return False, (f"no GPUs, so no NCCL all-reduce for it to serve: it is for \"distributed training "
                       f"with GPU workers\" ({cite(DISTRIBUTED_TRAINING)})")
    if nodes < 2:
        return False, "one node has no all-reduce between nodes for reducers to carry"
    nics = gpudirect_on_vertex(machine_type)
    if nics is not None:
        idle = (" and labkit's set-up for multi-node RDMA jobs leaves gIB as NCCL's only net plugin, "
                "so the reducers would have nothing to do" if nics.stack == "GPUDirect-RDMA" else "")
        return False, (f"Vertex sets it up with {nics.stack}: its GPUs send to each other over GPU NICs "
                       f"({nics.gpu_gbps:,.0f} Gbps) the CPU reducers cannot reach, so going through the "
                       f"reducers would move all-reduce onto its {nics.host_gbps:,.0f} Gbps host NIC(s)"
                       f"{idle} ({cite(CONFIGURE_COMPUTE)})")
    return True, ("its GPUs' traffic between nodes crosses the VM network the reducers share (Vertex "
                  f"names no GPUDirect stack for {machine_type}: {cite(CONFIGURE_COMPUTE)}; "
                  f"prerequisites: {cite(DISTRIBUTED_TRAINING)})")


def plan_reducers(count: int | str, nodes: int, machine_type: str, accelerator_type: str | None,
                  reducer_machine_type: str = REDUCTION_SERVER_MACHINE_TYPE,
                  accelerator_count: int = 0) -> ReducerPlan:
    """The reducers for `nodes` nodes of `machine_type`: "auto" sizes them by Vertex's rule where
    they help (none elsewhere, saying why); a count of the user's own is kept, with a warning when
    it is below the rule or where they do not help. A negative or non-integer count, a reducer
    machine that is not N1/N2, or reducers for a job without GPUs or with one node are refused
    (ParameterError naming the field)."""
    auto = isinstance(count, str) and count == "auto"
    if not auto:
        if isinstance(count, str):
            raise ParameterError(FIELD, count, "must be a number of reducers (>= 0) or 'auto'")
        count = check_int(FIELD, count, minimum=0)
    helps, reason = applicability(nodes, machine_type, accelerator_type)
    plan = ReducerPlan(count, 0, nodes, machine_type, accelerator_type, accelerator_count,
                       reducer_machine_type, helps, reason)
    if count == 0:
        return plan
    _reducer_gbps(reducer_machine_type)  # refuse a machine that cannot be a reducer, whatever the count
    if not _is_gpu(accelerator_type) or nodes < 2:
        if auto:
            return _with(plan, warning=f"{FIELD}='auto': no reducers: {reason}")
        need = "replica_count >= 2" if _is_gpu(accelerator_type) else "GPU training nodes"
        raise ParameterError(FIELD, count, f"needs {need}: {reason}")
    sizing = size_reducers(nodes, machine_type, accelerator_type, reducer_machine_type, accelerator_count)
    plan = _with(plan, sizing=sizing)
    if not helps:
        if auto:
            return _with(plan, warning=f"{FIELD}='auto': no reducers on {machine_type}: {reason}")
        return _with(plan, count=count, warning=f"{FIELD}={count} kept, but on {machine_type} it does not "
                                                f"help: {reason}")
    if auto:
        return _with(plan, count=sizing.needed)
    if count < sizing.needed:
        return _with(plan, count=count, warning=(
            f"{FIELD}={count} kept, below Vertex's bandwidth rule for {nodes} x {machine_type}: "
            f"{sizing.needed} x {reducer_machine_type} ({nodes} x {sizing.worker_gbps:,.0f} Gbps / "
            f"{sizing.reducer_gbps:g} Gbps); the reducers may limit all-reduce "
            f"({cite(DISTRIBUTED_TRAINING)})"))
    return _with(plan, count=count)


def check_reducers(count: int | str, nodes: int, machine_type: str, accelerator_type: str | None,
                   reducer_machine_type: str = REDUCTION_SERVER_MACHINE_TYPE,
                   accelerator_count: int = 0) -> int:
    """The reducer count a job builder uses (`plan_reducers`); the plan's warning, if any, is
    issued as a `ReductionServerWarning` pointing at the caller of the job builder."""
    plan = plan_reducers(count, nodes, machine_type, accelerator_type, reducer_machine_type, accelerator_count)
    if plan.warning:
        warnings.warn(plan.warning, ReductionServerWarning, stacklevel=4)
    return plan.count


@dataclass(frozen=True)
class PlanCost:
    """USD per hour of a plan's training pools (all nodes) and of its reducers, from the machine
    price list; None where the list has no price."""

    training_usd_hr: float | None
    reducers_usd_hr: float | None
    plan: ReducerPlan
    spot: bool = False
    source: str = ""

    @property
    def reducers_share(self) -> float | None:
        """The reducers' part of the whole job's cost per hour (0 without reducers)."""
        if self.training_usd_hr is None or self.reducers_usd_hr is None:
            return None
        return self.reducers_usd_hr / (self.training_usd_hr + self.reducers_usd_hr)

    def text(self) -> str:
        p, kind = self.plan, "Spot" if self.spot else "on-demand"
        gpus = f" with {p.accelerator_count} x {p.accelerator_type}" if p.accelerator_type else ""
        reducers = (f"reducers {p.count} x {p.reducer_machine_type}: {_usd(self.reducers_usd_hr)}" if p.count
                    else "no reducers: $0.00/h")
        line = f"{reducers} vs training pools {p.nodes} x {p.machine_type}{gpus}: {_usd(self.training_usd_hr)} ({kind}"
        share = self.reducers_share
        line += f"; the reducers are {share:.1%} of the job)" if share is not None and p.count else ")"
        return line + (f"; prices: {self.source}" if self.source else "")


def price_plan(plan: ReducerPlan, spot: bool = False) -> PlanCost:
    """The plan's cost per hour: training nodes and reducers, each at its machine's price."""
    try:
        prices = load_machine_prices()
    except CatalogError:  # no figure rather than a wrong one
        return PlanCost(None, None, plan, spot)
    train = machine_price(prices, plan.machine_type, plan.accelerator_type, plan.accelerator_count)
    reducer = machine_price(prices, plan.reducer_machine_type)
    train_hr = train.hourly(spot) if train else None
    reducer_hr = reducer.hourly(spot) if reducer else None
    sources = dict.fromkeys(part.cite() for q in (train, reducer) if q for part in q.parts)
    return PlanCost(None if train_hr is None else plan.nodes * train_hr,
                    0.0 if plan.count == 0 else None if reducer_hr is None else plan.count * reducer_hr,
                    plan, spot, "; ".join(sources))


def _is_gpu(accelerator_type: str | None) -> bool:
    return bool(accelerator_type) and str(accelerator_type).startswith("NVIDIA_")


def _reducer_gbps(machine_type: str) -> float:
    """One reducer's bandwidth; the page asks for general-purpose N1/N2 machines."""
    gbps = network_gbps(machine_type) if machine_type.startswith(("n1-", "n2-")) else None
    if gbps is None:
        raise ParameterError("reduction_server_machine_type", machine_type,
                             "must be a general-purpose N1 or N2 machine (e.g. n1-highcpu-16, "
                             f"32 Gbps) ({cite(DISTRIBUTED_TRAINING)})")
    return gbps


def _with(plan: ReducerPlan, **changes) -> ReducerPlan:
    return replace(plan, **changes)


def _usd(value: float | None) -> str:
    return "not priced" if value is None else f"${value:,.2f}/h"
