"""How many Reduction Server replicas a job needs.

Vertex AI's distributed-training page (read 2026-11-26): "make sure that the total network
bandwidth of the third worker pool matches or exceeds the total network bandwidth of the first
and second worker pools", with ``n1-highcpu-16`` recommended for reducers (32 Gbps each); its
examples: 5 ``n1-highmem-96`` nodes with 8 V100 (100 Gbps each) need 16 ``n1-highcpu-16``
reducers, and 8 ``a2-megagpu-16g`` nodes need at least 25. Reduction Server is for "distributed
training with GPU workers", and the training image needs the ``google-reduction-server``
package (labkit's image has it). Per-machine bandwidth: `labkit.vertex.machines.network_gbps`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from labkit.core.config import ParameterError
from labkit.vertex.machines import (
    DISTRIBUTED_TRAINING,
    GPU_NETWORK_BANDWIDTH,
    cite,
    network_gbps,
)


@dataclass(frozen=True)
class ReducerSizing:
    """The bandwidth of the training nodes and of one reducer, and the reducers that match it."""

    worker_gbps: float
    nodes: int
    reducer_gbps: float
    needed: int

    def text(self) -> str:
        return (f"{self.nodes} training node(s) x {self.worker_gbps:g} Gbps need {self.needed} reducer(s) "
                f"x {self.reducer_gbps:g} Gbps ({cite(DISTRIBUTED_TRAINING)}; bandwidths: "
                f"{cite(GPU_NETWORK_BANDWIDTH)})")


def size_reducers(nodes: int, machine_type: str, accelerator_type: str | None,
                  reducer_machine_type: str, accelerator_count: int = 0) -> ReducerSizing:
    """The reducers whose total bandwidth matches `nodes` training nodes of `machine_type`."""
    if not accelerator_type:
        raise ParameterError("reduction_server_count", "set", "needs GPU training nodes: Reduction "
                             f"Server serves NCCL all-reduce between GPUs ({cite(DISTRIBUTED_TRAINING)})")
    worker = network_gbps(machine_type, accelerator_type, accelerator_count)
    reducer = network_gbps(reducer_machine_type)
    if worker is None:
        raise ParameterError("machine_type", machine_type, "has no network bandwidth in labkit's "
                             "table, so a Reduction Server pool cannot be sized for it")
    if reducer is None:
        raise ParameterError("reduction_server_machine_type", reducer_machine_type,
                             "must be a general-purpose N1 or N2 machine (e.g. n1-highcpu-16, "
                             f"32 Gbps) ({cite(DISTRIBUTED_TRAINING)})")
    return ReducerSizing(worker, nodes, reducer, math.ceil(nodes * worker / reducer - 1e-9))


def check_reducers(count: int | str, nodes: int, machine_type: str, accelerator_type: str | None,
                   reducer_machine_type: str, accelerator_count: int = 0) -> int:
    """The reducer count to use: `count` when it meets the bandwidth rule, the rule's count for
    "auto"; fewer than the rule is refused with the figures."""
    sizing = size_reducers(nodes, machine_type, accelerator_type, reducer_machine_type, accelerator_count)
    if count == "auto":
        return sizing.needed
    if count < sizing.needed:
        raise ParameterError("reduction_server_count", count,
                             f"is too few: {sizing.text()}; pass {sizing.needed} or 'auto'")
    return count
