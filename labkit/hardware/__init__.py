"""Hardware: this machine's measured ceilings, the Vertex accelerator catalog, the roofline, and
the time-and-cost estimator. Framework-free at import; torch is used lazily by the benchmarks."""

from labkit.hardware.bench import BenchConfig, Ceilings, measure_ceilings
from labkit.hardware.catalog import CATALOG_PATH, CatalogEntry, CatalogError, load_catalog
from labkit.hardware.cost import (
    CostAssumptions,
    Estimate,
    EstimateTable,
    SpotModel,
    Workload,
    estimate_costs,
    mfu_from_measurement,
    pareto_front,
)
from labkit.hardware.roofline import Roofline, matmul_intensity

__all__ = [
    "BenchConfig", "Ceilings", "measure_ceilings", "CATALOG_PATH", "CatalogEntry", "CatalogError",
    "load_catalog", "CostAssumptions", "Estimate", "EstimateTable", "SpotModel", "Workload",
    "estimate_costs", "mfu_from_measurement", "pareto_front", "Roofline", "matmul_intensity",
]
