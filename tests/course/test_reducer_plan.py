"""Notebook 06's Reduction Server helpers: the plan's job and the machines compared."""

from __future__ import annotations

import warnings

from labkit.course.multinode import reducer_job, reducer_rows
from labkit.vertex.reduction import plan_reducers

OUT = "gs://bkt/run"


def test_reducer_rows_propose_reducers_only_where_they_help_and_price_them():
    rows = {r["machine"]: r for r in reducer_rows(4)}
    a100, h100 = rows["4 x a2-highgpu-8g"], rows["4 x a3-highgpu-8g"]
    assert (a100["helps"], a100["reducers (auto)"]) == ("yes", 13)
    assert (h100["helps"], h100["reducers (auto)"]) == ("yes", 25)
    assert h100["Gbps per node (all NICs)"] == 1000 and h100["Gbps the reducers can use"] == 200
    for name in ("4 x a3-megagpu-8g", "4 x a3-ultragpu-8g"):
        assert (rows[name]["helps"], rows[name]["reducers (auto)"], rows[name]["reducers $/h"]) == ("no", 0, 0)
    for row in rows.values():
        assert row["training $/h"] > 0
    assert 0 < h100["reducers $/h"] < h100["training $/h"] / 10


def test_reducer_job_builds_the_plans_pools_without_a_second_warning():
    plan = plan_reducers(2, 4, "a2-highgpu-8g", "NVIDIA_TESLA_A100", accelerator_count=8)
    assert plan.warning and "kept, below" in plan.warning and "warning: " in plan.text()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = reducer_job(plan, {"model": "gpt"}, output_uri=OUT)
    p0, p1, p2 = spec["worker_pool_specs"]
    assert (p1["replica_count"], p2["replica_count"]) == (3, 2)
    assert p2["machine_spec"] == {"machine_type": "n1-highcpu-16"}
    none = plan_reducers("auto", 4, "a3-megagpu-8g", "NVIDIA_H100_MEGA_80GB", accelerator_count=8)
    assert len(reducer_job(none, {"model": "gpt"}, output_uri=OUT)["worker_pool_specs"]) == 2
