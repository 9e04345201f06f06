"""Hardware: this machine's measured ceilings, the catalog of machines a Vertex AI job can ask
for (each price the whole machine's, with its rate card, source and read date) and the prices
read from it, the roofline, the Spot preemption model, the time-and-cost estimator, the
repository's own benchmark results (`results`) and the sourced facts about Spot and Vertex AI
(`facts`). Framework-free at import; torch is used lazily by the benchmarks. These modules
return data; the course layer (`labkit.course`) draws and tabulates it."""

from labkit.hardware.bench import BenchConfig, Ceilings, measure_ceilings
from labkit.hardware.catalog import CATALOG_PATH, CatalogEntry, CatalogError, load_catalog
from labkit.hardware.cost import (
    CostAssumptions,
    Estimate,
    EstimateTable,
    Workload,
    estimate_costs,
    mfu_from_measurement,
    pareto_front,
)
from labkit.hardware.machines import (
    Price,
    catalog_price,
    match_gpu,
    price_for_this_machine,
    target_machine,
)
from labkit.hardware.roofline import Roofline, matmul_intensity
from labkit.hardware.spot import SpotModel, young_daly_interval

__all__ = [
    "BenchConfig", "Ceilings", "measure_ceilings", "CATALOG_PATH", "CatalogEntry", "CatalogError",
    "load_catalog", "CostAssumptions", "Estimate", "EstimateTable", "SpotModel", "Workload",
    "estimate_costs", "mfu_from_measurement", "pareto_front", "Roofline", "matmul_intensity",
    "Price", "catalog_price", "match_gpu", "price_for_this_machine", "target_machine",
    "young_daly_interval",
]
