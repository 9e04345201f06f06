"""The layout planner (`parallelism.plan`, `decide` its answer): the expected layout over the
reference models and 1 to 512 GPUs, the memory margin, the overlap model, notebook 10's tables
as views of the one answer (and where they change, the assumption that differs), and the
pipeline bubble's verdict in the direction it went."""

from __future__ import annotations

import pytest

from labkit.core import parallelism
from labkit.core.parallelism import GIB, INTERCONNECTS, Margin, decide, plan
from labkit.course import model_parallel as mp

RATE = 400.0  # TFLOP/s per GPU: a planning rate near labkit's measured H100 one
GPUS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
MODELS = parallelism.reference_models()
LINK_IDS = ["A3", "nvlink-ethernet", "pcie-ethernet"]


@pytest.mark.parametrize("link", INTERCONNECTS, ids=LINK_IDS)
@pytest.mark.parametrize("gib", (24, 40, 80))
def test_gpt2_small_is_plain_data_parallel_on_any_gpu_count(link, gib):
    for n in GPUS:
        d = decide(MODELS["GPT-2 small"], n, gib, link, effective_tflops=RATE)
        assert (d["mode"], d["tp"], d["pp"], d["dp"]) == ("ddp", 1, 1, n), (n, d["rule"])


# (model, GPUs, GiB, interconnect): the mode chosen
EXPECTED = {
    ("7B", 1, 80, 0): "none fits",
    ("7B", 8, 40, 0): "zero3",   # ZeRO-1 needs ~38 GiB: inside 40, outside the margin
    ("7B", 8, 40, 2): "zero2",   # on PCIe ZeRO-3's gathers no longer hide
    ("7B", 8, 80, 0): "zero3",
    ("7B", 64, 80, 1): "zero2",
    ("70B", 8, 80, 0): "none fits",
    ("70B", 64, 80, 0): "zero3",
    ("70B", 64, 80, 1): "tp",     # 100 Gb/s: ZeRO-3's traffic would be exposed; tp stays on NVLink
    ("70B", 64, 80, 2): "pp",     # PCIe inside the node too: tensor parallelism's all-reduces are slow
    ("70B", 64, 40, 0): "tp+pp",  # ZeRO-3 fits only in two micro-steps, each gathering again
    ("70B", 512, 80, 0): "zero3",
}


@pytest.mark.parametrize("case, mode", EXPECTED.items(), ids=lambda x: str(x))
def test_expected_layouts(case, mode):
    model, n, gib, link = case
    d = decide(MODELS[model], n, gib, INTERCONNECTS[link], effective_tflops=RATE)
    assert d["mode"] == mode, d["rule"]


@pytest.mark.parametrize("model", ["7B", "70B"])
def test_large_models_get_a_sharded_layout_that_fits_the_margin(model):
    for n in GPUS:
        for gib in (40, 80):
            for link in INTERCONNECTS:
                p = plan(MODELS[model], n, gib, link, effective_tflops=RATE)
                c = p.choice
                if c is None:  # nothing fits: then no layout weighed fits
                    assert not any(x.fits for x in p.candidates)
                    continue
                assert c.mode != "ddp" and c.total_bytes <= p.usable_gib * GIB < gib * GIB
                # nothing the choice was made among is more than TIE faster
                assert min(x.step_s for x in p.considered()) >= c.step_s / (1 + parallelism.TIE) - 1e-12
    # 7B fits from 2 GPUs of 80 GB, 70B from 64 of 40 GB
    assert decide(MODELS["7B"], 2, 80, INTERCONNECTS[0], effective_tflops=RATE)["mode"] != "none fits"
    assert decide(MODELS["70B"], 64, 40, INTERCONNECTS[0], effective_tflops=RATE)["mode"] != "none fits"


def test_a_layout_fits_only_within_the_margin():
    m = parallelism.MARGIN
    assert m.usable_gib(80) == pytest.approx((80 - m.context_gib) * (1 - m.fragmentation))
    assert "GiB" in m.text() and f"{m.fragmentation:.0%}" in m.text()
    # 7B on 8 × 40 GB: ZeRO-1 needs less than the GPU's 40 GiB but more than the usable share
    zero1 = next(c for c in plan(MODELS["7B"], 8, 40, INTERCONNECTS[0], effective_tflops=RATE).candidates
                 if c.dp_mode == "zero1" and c.model_parallel == 1)  # one sequence per micro-batch: the leanest
    assert m.usable_gib(40) * GIB < zero1.total_bytes < 40 * GIB and not zero1.fits
    bare = plan(MODELS["7B"], 8, 40, INTERCONNECTS[0], effective_tflops=RATE, margin=Margin(0.0, 0.0))
    assert next(c for c in bare.candidates if c.label() == zero1.label()).fits


def test_exposed_seconds_hides_all_but_the_tail_while_compute_lasts():
    f = parallelism.exposed_seconds
    assert f(1.0, 10.0, 0.1) == pytest.approx(0.1)      # compute-bound: only the last bucket
    assert f(10.0, 2.0, 0.1) == pytest.approx(8.2)      # communication-bound: 10 − 0.9·2
    assert f(3.0, 100.0, 1.0) == pytest.approx(3.0)     # one bucket: nothing overlaps
    assert f(0.0, 1.0, 0.5) == 0.0


def test_ddp_reduction_overlaps_backward_except_the_last_bucket():
    gpt2 = MODELS["GPT-2 small"]
    shape = parallelism.GPTShape.of(gpt2)
    # the tied token table's gradient completes last and is larger than a 25 MiB bucket
    tail = shape.embedding / shape.total
    slow = plan(gpt2, 64, 80, INTERCONNECTS[0], effective_tflops=1.0).choice  # compute dwarfs the all-reduce
    assert slow.dp_mode == "ddp" and slow.dp_exposed_s == pytest.approx(tail * slow.dp_s)
    fast = plan(gpt2, 64, 80, INTERCONNECTS[0], effective_tflops=1e9).choice  # nothing to hide behind
    assert fast.dp_exposed_s == pytest.approx(fast.dp_s, rel=1e-3)
    # the bytes are the calculator's (checked against the engine's counted collectives)
    for c in plan(gpt2, 8, 80, INTERCONNECTS[0], effective_tflops=RATE).candidates:
        if c.model_parallel == 1 and c.micro_batches == 1:
            e = parallelism.estimate(gpt2, parallelism.Layout(c.dp_mode, 8), precision=parallelism.MIXED)
            assert c.sent_bytes == pytest.approx(e.comm_bytes_per_step), c.dp_mode


def test_zero3_gathers_hide_behind_compute_so_it_can_beat_zero2():
    p = plan(MODELS["7B"], 8, 80, INTERCONNECTS[0], effective_tflops=RATE)
    pure = {c.dp_mode: c for c in p.candidates if c.model_parallel == 1 and c.fits}
    z2, z3 = pure["zero2"], pure["zero3"]
    assert z3.sent_bytes == pytest.approx(1.5 * z2.sent_bytes)  # ZeRO-3 sends more ...
    assert z3.exposed_s < 0.1 * z3.comm_s < z2.exposed_s        # ... but leaves far less of it exposed
    assert p.choice is z3


def test_every_table_on_the_page_is_a_view_of_the_one_answer():
    link = INTERCONNECTS[0]
    rows = parallelism.plan_table(gpus=(8, 64), gpu_gib=80, link=link, effective_tflops=RATE)
    decisions = mp.decision_rows(gpus=(8, 64), gpu_gib=(40, 80), effective_tflops=RATE)
    grid = mp.grid_rows(gpus=(8, 64), gpu_gib=(40, 80), link=link, effective_tflops=RATE)
    for name, cfg in MODELS.items():
        for n in (8, 64):
            for gib in (40, 80):
                for each in INTERCONNECTS:
                    d = decide(cfg, n, gib, each, effective_tflops=RATE)
                    row = next(r for r in decisions if (r["model"], r["gpus"], r["GiB"], r["interconnect"])
                               == (name, n, gib, each.name))
                    assert (row["mode"], row["layout"], row["step_s"]) == (d["mode"], d["layout"], d["step_s"])
            d = decide(cfg, n, 80, link, effective_tflops=RATE)
            chosen = [r for r in rows if (r["model"], r["gpus"]) == (name, n) and r["chosen"]]
            assert [r["layout"] for r in chosen] == ([] if d["mode"] == "none fits" else [d["layout"]])
            summary = next(s for s in mp.plan_summary(rows) if (s["model"], s["gpus"]) == (name, n))
            assert summary["chosen"] == d["layout"]
            for gib in (40, 80):
                g = next(r for r in grid if (r["model"], r["gpus"], r["GiB"]) == (name, n, gib))
                assert g["layout"] == decide(cfg, n, gib, link, effective_tflops=RATE)["layout"]
    check = mp.view_check(rows, decisions, grid)
    assert check.clashes == () and check.shared == len(grid) + sum(r["chosen"] for r in rows)
    # cells that change name the assumption that changes
    assert check.by_interconnect and all(c.reason == mp.STEP_TIMES for c in check.by_interconnect)
    assert all(len({d["GiB"] for d in c.cells}) == 1 < len({d["layout"] for d in c.cells})
               for c in check.by_interconnect)  # the memory held, the layout changing
    big = next(c for c in check.by_memory if (c.model, c.gpus) == ("70B", 64))
    assert (big.smaller["GiB"], big.larger["GiB"]) == (40, 80) and big.smaller["layout"] != big.larger["layout"]
    assert big.reason in (mp.OVER_MEMORY, mp.ANOTHER_SPLIT, mp.SMALLER_MICRO_BATCHES)
    if big.reason == mp.OVER_MEMORY:  # the reason is the numbers'
        assert big.larger["GiB_per_rank"] > big.smaller["usable_GiB"]
    # and the check can fail: a table that disagreed would be named
    wrong = [dict(g, layout="ddp over 64 GPUs") if g["model"] == "70B" else g for g in grid]
    clashes = mp.view_check(rows, decisions, wrong).clashes
    assert clashes and all((c.table, c.model, c.layout) == ("layout table", "70B", "ddp over 64 GPUs") for c in clashes)
    assert {c.decided for c in clashes} == {r["layout"] for r in grid if r["model"] == "70B"}


def test_weighed_rows_list_the_plans_layouts_fastest_first():
    rows = mp.weighed_rows("70B", 64, 40, effective_tflops=RATE)
    d = decide(MODELS["70B"], 64, 40, INTERCONNECTS[0], effective_tflops=RATE)
    assert [r["layout"] for r in rows if r["chosen"]] == [d["layout"]]
    fitting = [r["step_s"] for r in rows if r["fits"]]
    assert fitting == sorted(fitting) and len(rows) == d["layouts_weighed"]
    assert all(not r["weighed"] or r["fits"] for r in rows)


# ---------------------------------------------------------------- the pipeline bubble


def _pipeline(idle_by_rank: list[float], pp: int = 2, microbatches: int = 4) -> mp.ModeResult:
    run = {"parallel": {"pp": pp, "microbatches": microbatches},
           "pipeline_bubble": {"measured_by_rank": idle_by_rank,
                               "theory": parallelism.pipeline_bubble(pp, microbatches)}}
    return mp.ModeResult(mp.Mode("pp", len(idle_by_rank)), [1.0], [0.1], run)


def test_unequal_stages_lower_the_busiest_stages_bubble():
    assert parallelism.busiest_stage_bubble([1, 1, 1], 6) == pytest.approx(parallelism.pipeline_bubble(3, 6))
    assert parallelism.busiest_stage_bubble([0.5, 1], 4) == pytest.approx(1 - 4 / 4.5)
    assert parallelism.busiest_stage_bubble([0.5, 1], 4) < parallelism.pipeline_bubble(2, 4)


def test_a_bubble_above_theory_is_explained_by_sends_and_the_schedules_own_work():
    row = mp.bubble_rows([_pipeline([0.5, 0.3])])[0]
    assert row["measured"] == pytest.approx(0.3) and row["difference"] == pytest.approx(0.1)
    assert row["expected"] < row["theory"] and row["unexplained"] > 0
    (found,) = mp.bubble_findings([_pipeline([0.5, 0.3])])
    assert found.row() == row and not found.equal_work and found.verdict == mp.BUBBLE_ABOVE


def test_a_bubble_below_theory_from_unequal_stages_says_so():
    # stage 0 does half the busiest stage's work: the busiest waits only for stage 0's fill/drain
    expected = 1 - 4 / 4.5
    idle = [1 - 0.5 * (1 - expected), expected]
    (found,) = mp.bubble_findings([_pipeline(idle)])
    assert found.difference < 0 and found.expected == pytest.approx(expected)
    assert found.stage_work == pytest.approx((0.5, 1.0)) and not found.equal_work
    assert found.verdict == mp.BUBBLE_AS_EXPECTED  # the unequal stages explain it all


def test_a_bubble_below_even_the_stage_aware_expectation_names_the_clock():
    # equal stages, 4 ranks (2 replicas × 2 stages): each stage's idle share is its replicas' mean
    row = mp.bubble_rows([_pipeline([0.10, 0.14, 0.14, 0.10])])[0]
    assert row["per_stage"] == "0.12, 0.12" and row["expected"] == pytest.approx(0.2)
    assert row["difference"] < 0 and row["unexplained"] < 0
    (found,) = mp.bubble_findings([_pipeline([0.10, 0.14, 0.14, 0.10])])
    assert found.idle_by_stage == pytest.approx((0.12, 0.12)) and found.equal_work
    assert found.verdict == mp.BUBBLE_BELOW


def test_a_bubble_within_the_tolerance_is_a_match_and_a_stage_without_figures_is_left_out():
    near = mp.bubble_findings([_pipeline([0.21, 0.21])])[0]  # equal stages, 0.01 over (p−1)/(m+p−1)
    assert abs(near.unexplained) <= mp.BUBBLE_TOLERANCE and near.verdict == mp.BUBBLE_AS_EXPECTED
    assert mp.bubble_findings([_pipeline([0.3, None])]) == []
