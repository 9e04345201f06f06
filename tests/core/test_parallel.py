"""Parallel modes: the settings and their one-line errors, the process layout, the memory and
communication calculator, and the pieces of the torch modes that run in one process."""

from __future__ import annotations

import pytest

from labkit.core import parallelism
from labkit.core.config import ParameterError
from labkit.core.models import GPTConfig
from labkit.core.stats import NO_DIFFERENCE
from labkit.core.train_config import TrainConfig, from_argv, to_argv


def test_parallel_fields_round_trip_through_flags():
    c = TrainConfig(model="gpt", parallel="pp", pp_degree=2, microbatches=2, pp_schedule="gpipe",
                    batch_size=8)
    assert from_argv(to_argv(c)) == c
    assert "--parallel" in to_argv(c, changed_only=True)
    z = TrainConfig(parallel="zero3", reshard_after_forward=False, sharding_backend="deepspeed")
    assert from_argv(to_argv(z)) == z


@pytest.mark.parametrize("kwargs, field, words", [
    (dict(parallel="tp"), "parallel", "needs --model gpt"),
    (dict(parallel="pp", model="cnn"), "parallel", "needs --model gpt"),
    (dict(parallel="tp", model="gpt", sharding_backend="deepspeed"), "sharding_backend", "zero1, zero2 or zero3"),
    (dict(parallel="zero2", grad_compression="fp16"), "grad_compression", "needs --parallel ddp"),
    (dict(tp_degree=2), "tp_degree", "needs --parallel tp"),
    (dict(parallel="pp", model="gpt", grad_accum=2), "grad_accum", "--microbatches"),
    (dict(parallel="zero3", precision="fp16"), "precision", "bf16"),
    (dict(parallel="bogus"), "parallel", "must be one of"),
])
def test_bad_settings_name_the_field(kwargs, field, words):
    with pytest.raises(ParameterError, match=field) as e:
        TrainConfig(**kwargs)
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kwargs, world, field, words", [
    (dict(parallel="tp", tp_degree=3), 4, "tp_degree", "must divide the 4 processes"),
    (dict(parallel="pp", pp_degree=3), 4, "pp_degree", "must divide the 4 processes"),
    (dict(parallel="pp", microbatches=3, batch_size=8), 2, "microbatches", "per-replica batch 8"),
    (dict(parallel="pp", pp_degree=2, microbatches=8, batch_size=8), 4, "microbatches", "per-replica batch 4"),
    (dict(parallel="zero1", batch_size=9), 2, "batch_size", "2 data-parallel"),
    (dict(parallel="zero3"), 1, "parallel", "several processes"),
])
def test_degrees_and_batches_are_checked_against_the_processes(kwargs, world, field, words):
    c = TrainConfig(model="gpt", **kwargs)
    with pytest.raises(ParameterError, match=field) as e:
        c.check_world_size(world)
    assert words in str(e.value)


def test_layout_defaults_and_rank_positions():
    tp = parallelism.Layout.of(TrainConfig(model="gpt", parallel="tp", batch_size=8), 4)
    assert (tp.dp, tp.tp, tp.pp) == (1, 4, 1)
    grid = parallelism.Layout.of(TrainConfig(model="gpt", parallel="pp", pp_degree=2, batch_size=8,
                                             microbatches=2), 4)
    assert (grid.dp, grid.pp) == (2, 2)
    assert [(grid.dp_rank(r), grid.mp_rank(r)) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    with pytest.raises(ParameterError, match="tp_degree.*2 heads"):
        parallelism.Layout("tp", 4, tp=4).check_model(GPTConfig())
    with pytest.raises(ParameterError, match="pp_degree.*2 blocks"):
        parallelism.Layout("pp", 4, pp=4).check_model(GPTConfig())


def test_calculator_shards_what_each_zero_stage_shards():
    cfg = GPTConfig()
    p = parallelism.GPTShape.of(cfg).total
    est = {m: parallelism.estimate(cfg, parallelism.Layout(m, 4)) for m in ("ddp", "zero1", "zero2", "zero3")}
    assert (est["ddp"].params_bytes, est["ddp"].grads_bytes, est["ddp"].optimizer_bytes) == (4 * p, 4 * p, 8 * p)
    assert est["zero1"].optimizer_bytes == 2 * p and est["zero1"].grads_bytes == 4 * p
    assert est["zero2"].grads_bytes == p and est["zero2"].params_bytes == 4 * p
    assert est["zero3"].total_bytes == est["ddp"].total_bytes / 4
    # ring all-reduce of the gradients: 2(N-1)/N of them; zero3 gathers the weights twice
    assert est["ddp"].comm_bytes_per_step == pytest.approx(2 * 3 / 4 * 4 * p)
    assert est["zero3"].comm_bytes_per_step == pytest.approx(1.5 * est["ddp"].comm_bytes_per_step)
    no_reshard = parallelism.estimate(cfg, parallelism.Layout("zero3", 4), reshard_after_forward=False)
    assert no_reshard.comm_bytes_per_step == pytest.approx(est["ddp"].comm_bytes_per_step)


def test_calculator_counts_the_smoke_gpt_exactly():
    pytest.importorskip("torch")
    from labkit.torch.models import build_model, count_parameters

    cfg = GPTConfig()
    assert parallelism.GPTShape.of(cfg).total == count_parameters(build_model(cfg))
    stages = [parallelism.stage_params(parallelism.GPTShape.of(cfg), 2, s) for s in (0, 1)]
    shape = parallelism.GPTShape.of(cfg)
    assert sum(stages) == shape.total + shape.vocab_embedding  # the head's copy on the last stage


def test_plan_table_and_decisions_cover_the_reference_models():
    rows = parallelism.plan_table(gpus=(8, 64), gpu_gib=80)  # no rate: memory only, nothing chosen
    names = {r["model"] for r in rows}
    assert names == {"GPT-2 small", "7B", "70B"}
    assert not any(r["chosen"] for r in rows) and all(r["step_s"] is None for r in rows)
    fits: dict[tuple, bool] = {}
    for r in rows:  # a mode fits when one of its layouts does
        key = (r["model"], r["gpus"], r["mode"])
        fits[key] = fits.get(key, False) or r["fits"]
    assert fits[("GPT-2 small", 8, "ddp")] and not fits[("70B", 8, "ddp")]
    assert fits[("70B", 64, "zero3")] and not fits[("7B", 8, "ddp")]
    link = parallelism.INTERCONNECTS[0]
    assert parallelism.decide(GPTConfig.gpt2_small(), 8, 80, link, effective_tflops=400.0)["mode"] == "ddp"
    assert parallelism.decide(parallelism.reference_models()["70B"], 8, 80, link, effective_tflops=400.0)["mode"] == "none fits"
    assert parallelism.pipeline_bubble(2, 4) == pytest.approx(0.2)


def test_pipeline_plans_use_only_the_sequences_a_replica_has():
    # 70B on 64 GPUs at 8,192 tokens per GPU: 128 sequences of 4,096 on one 64-stage pipeline,
    # so at most 128 micro-batches (8 per stage would ask for 512).
    assert parallelism.layouts_for(64, stages=80, batch=128)["pp"].microbatches == 128
    for n in (8, 64):
        for cfg in parallelism.reference_models().values():
            batch = 8192 * n // cfg.block_size
            pp = parallelism.layouts_for(n, stages=cfg.n_layer, batch=batch)["pp"]
            per_replica = batch // pp.dp
            assert 1 <= pp.microbatches <= per_replica and per_replica % pp.microbatches == 0
    assert [parallelism.pipeline_microbatches(2, s) for s in (None, 40, 7, 3)] == [16, 10, 7, 3]
    with pytest.raises(ValueError, match="at least one sequence"):
        parallelism.pipeline_microbatches(4, 0)


def test_ring_bytes_per_collective():
    pytest.importorskip("torch")
    from labkit.torch.comm_count import sent_bytes

    assert sent_bytes("all_reduce", 1000, 4) == 1500
    assert sent_bytes("reduce_scatter", 1000, 4) == 750
    assert sent_bytes("all_gather", 250, 4) == 750
    assert sent_bytes("send", 10, 2) == 10 and sent_bytes("recv", 10, 2) == 0
    assert sent_bytes("all_reduce", 1000, 1) == 0


def test_head_grouped_rows_give_each_rank_whole_heads():
    torch = pytest.importorskip("torch")
    from labkit.torch.parallel.tp import head_grouped

    d, heads, t = 8, 4, 2
    order = head_grouped(d, heads, t)
    assert sorted(order.tolist()) == list(range(3 * d))
    rows = torch.arange(3 * d)[order].view(t, 3, heads // t, d // heads)
    # rank 1's slice: q, k, v rows of heads 2 and 3
    assert rows[1, 0].flatten().tolist() == list(range(4, 8))
    assert rows[1, 2].flatten().tolist() == list(range(2 * d + 4, 2 * d + 8))


def test_pipeline_stages_split_the_blocks():
    pytest.importorskip("torch")
    from labkit.torch.parallel.pp import stage_blocks

    assert [list(stage_blocks(5, 2, s)) for s in (0, 1)] == [[0, 1, 2], [3, 4]]
    assert [len(stage_blocks(12, 4, s)) for s in range(4)] == [3, 3, 3, 3]


def test_deepspeed_config_names_the_stage():
    pytest.importorskip("torch")
    from labkit.torch.parallel.deepspeed import deepspeed_config

    c = deepspeed_config("zero2", 32, 16, 1.0)
    assert c["zero_optimization"] == {"stage": 2} and c["train_batch_size"] == 32
    assert c["gradient_clipping"] == 1.0


def test_the_deepspeed_mode_file_imports_the_real_deepspeed():
    """`labkit.torch.parallel.deepspeed` shares DeepSpeed's name: the `import deepspeed` it runs
    must reach the installed package, not the file itself."""
    pytest.importorskip("torch")
    real = pytest.importorskip("deepspeed")
    from labkit.torch.parallel import deepspeed as mode

    namespace = {"__name__": mode.__name__, "__package__": mode.__package__}
    exec("import deepspeed", namespace)  # the statement DeepSpeedZero runs, in the file's package
    assert namespace["deepspeed"] is real and real is not mode
    assert callable(namespace["deepspeed"].initialize)


def _result(mode, losses, held, sent, step_s=0.1, bubble=None, steps=None):
    from labkit.course.model_parallel import ModeResult

    run = {"memory_by_rank": [{"params_bytes": held, "grads_bytes": 0, "optimizer_bytes": 0}] * mode.nproc,
           "comm_bytes_by_rank": [sent] * mode.nproc, "parallel": {"pp": 2, "microbatches": 4}, "device": "cpu"}
    if bubble:
        run["pipeline_bubble"] = {"measured_by_rank": bubble, "theory": 0.2}
    return ModeResult(mode, losses, steps or [1.0] + [step_s] * 3, run)


def test_mode_table_compares_with_ddp_and_one_process():
    from labkit.course import model_parallel as mp

    ref = _result(mp.Mode("single", 1), [4.0, 2.0], 0, 0)
    results = [_result(mp.Mode("ddp"), [4.0, 2.0], 1000, 100),
               _result(mp.Mode("zero3"), [4.0, 2.002], 500, 150, step_s=0.2),
               _result(mp.Mode("pp", pp_schedule="gpipe"), [4.0, 2.0], 600, 50, bubble=[0.5, 0.3])]
    rows = {r["mode"]: r for r in mp.mode_table(ref, results)}
    assert rows["zero3 [2]"]["vs_ddp"] == 0.5 and rows["zero3 [2]"]["sent_vs_ddp"] == 1.5
    assert rows["zero3 [2]"]["step_vs_ddp"] == pytest.approx(2.0)
    assert rows["zero3 [2]"]["loss_gap"] == pytest.approx(1e-3)
    bubble = mp.bubble_rows(results)[0]
    assert (bubble["measured"], bubble["theory"]) == (0.3, 0.2)  # the stage that sets the pace
    # what the runs show, as numbers and verdicts from the same rows
    found = mp.findings(ref, results)
    assert [(m.mode, m.value) for m in found.memory] == [("ddp [2]", 1.0), ("zero3 [2]", 0.5),
                                                         ("pp gpipe m=4 [2]", 0.6)]
    assert found.least_memory == mp.ModeFigure("zero3 [2]", 0.5) and found.memory_floor == 0.5
    assert found.most_sent == mp.ModeFigure("zero3 [2]", 1.5) and not found.most_sent_carries_activations
    assert found.slowest.mode == "zero3 [2]" and found.slowest.value == pytest.approx(2.0)
    assert found.slowest_steps.ratio == pytest.approx(2.0) and found.slowest_verdict == "slower"  # ms, all apart
    assert found.largest_gap.mode == "zero3 [2]" and found.largest_gap.value == pytest.approx(1e-3)
    assert found.losses_verdict == mp.SAME_LOSSES and (found.nproc, found.device) == (2, "cpu")


def test_findings_give_verdicts_only_the_runs_support():
    from labkit.course import model_parallel as mp

    ref = _result(mp.Mode("single", 1), [4.0, 2.0], 0, 0)
    # tensor parallelism's steps overlap DDP's: slowest by the median, not measurably slower
    results = [_result(mp.Mode("ddp"), [4.0, 2.0], 1000, 100, steps=[1.0, 0.10, 0.30, 0.11]),
               _result(mp.Mode("tp"), [4.0, 2.01], 600, 400, steps=[1.0, 0.12, 0.13, 0.14])]
    found = mp.findings(ref, results)
    assert found.slowest.mode == "tp [2]" and found.slowest_verdict == NO_DIFFERENCE
    assert found.most_sent_carries_activations  # tensor parallelism sends activations
    assert found.largest_gap.value == pytest.approx(5e-3) and found.losses_verdict == mp.DIFFERENT_LOSSES
    few = [_result(mp.Mode("ddp"), [4.0, 2.0], 1000, 100, steps=[1.0, 0.1]),
           _result(mp.Mode("zero1"), [4.0, 2.0], 800, 100, steps=[1.0, 0.2])]
    assert mp.findings(ref, few).slowest_steps is None  # one timed step each: no verdict
    assert "no verdict" in mp.findings(ref, few).slowest_verdict
    with pytest.raises(ParameterError, match="no DDP run on 2 processes"):
        mp.findings(ref, results[1:])


def test_course_modes_and_decisions():
    from labkit.course import model_parallel as mp

    modes = mp.course_modes(2, four=True, deepspeed=False)
    labels = [m.label for m in modes]
    assert "zero3 (no reshard) [2]" in labels and "tp [2×2]" in labels and "pp gpipe m=4 [2]" in labels
    assert not any("deepspeed" in x for x in labels)
    rows = mp.decision_rows(gpus=(8,), gpu_gib=(80,))
    assert {r["model"] for r in rows} == {"GPT-2 small", "7B", "70B"}


def test_doctor_reports_whether_optional_libraries_import():
    from labkit.core import doctor

    assert doctor.import_check("labkit_no_such_module") == "not installed"
    assert doctor.import_check("json") == "imports"
    report = doctor.collect()
    assert set(report.imports) == {"deepspeed", "horovod.torch"}
    assert "import horovod.torch" in report.text()


def test_tf_refuses_torch_parallel_settings_and_missing_deepspeed_is_one_line(monkeypatch):
    with pytest.raises(ParameterError, match="parallel.*torch engine setting"):
        TrainConfig(framework="tf", parallel="zero1")
    with pytest.raises(ParameterError, match="grad_compression.*torch engine setting"):
        TrainConfig(framework="tf", grad_compression="fp16")
    monkeypatch.setattr(parallelism, "is_installed", lambda name: False)
    with pytest.raises(ParameterError, match="sharding_backend.*not installed.*labkit\\[deepspeed\\]"):
        TrainConfig(parallel="zero2", sharding_backend="deepspeed").check_world_size(2)


def test_tp_pp_dp_layouts_are_feasible_and_the_choice_follows_its_rules():
    models = parallelism.reference_models()
    big = models["70B"]
    batch = 8192 * 64 // big.block_size
    layouts = parallelism.grids(big, 64, batch)
    assert layouts and all(g.tp * g.pp * g.dp == 64 for g in layouts)
    assert all(big.n_head % g.tp == 0 and g.tp <= 8 and g.pp <= big.n_layer for g in layouts)
    assert all(batch % g.dp == 0 and 1 <= g.microbatches <= batch // g.dp for g in layouts)
    assert any(g.tp > 1 and g.pp > 1 and g.dp > 1 for g in layouts)  # combinations are considered
    # 70B on 64 × 40 GB: no layout with DDP or ZeRO-1 fits below tp·pp = 32; the choice is one of
    # those (or pure data parallelism), and it fits within the margin
    link = parallelism.INTERCONNECTS[0]
    p = parallelism.plan(big, 64, 40, link, effective_tflops=400.0)
    mp_fits = [c.model_parallel for c in p.candidates if c.fits and c.dp_mode in ("ddp", "zero1")]
    assert p.needed_mp == min(mp_fits) == 32
    assert p.choice.model_parallel in (1, 32) and p.choice.total_bytes <= p.usable_gib * parallelism.GIB
    assert "smallest tp·pp that fits is 32" in p.rule()
    # a model that fits one GPU stays data parallel; one that fits nowhere says why in one line
    assert parallelism.decide(models["GPT-2 small"], 8, 80, link, effective_tflops=400.0)["layout"] == "ddp over 8 GPUs"
    none = parallelism.decide(big, 8, 80, link, effective_tflops=400.0)
    assert none["layout"] == "none fits" and "leanest needs" in none["rule"] and "\n" not in none["rule"]


def test_the_notebook_tables_are_summaries_with_the_whole_a_file_away(tmp_path):
    from labkit.course import model_parallel as mp
    from labkit.course import tables

    plan = parallelism.plan_table(gpus=(8, 64), gpu_gib=80)
    summary = mp.plan_summary(plan)
    assert len(summary) == 6 and len(plan) > 20
    row = next(r for r in summary if r["model"] == "70B" and r["gpus"] == 64)
    assert "zero3" in row["modes that fit"]
    path = tables.write_csv(plan, tmp_path / "plan.csv")
    assert len(path.read_text().splitlines()) == len(plan) + 1
    grid = mp.grid_rows(gpus=(64,), gpu_gib=(40,), effective_tflops=400.0)
    link = parallelism.INTERCONNECTS[0]
    big = parallelism.decide(parallelism.reference_models()["70B"], 64, 40, link, effective_tflops=400.0)
    assert [r["layout"] for r in grid if r["model"] == "70B"] == [big["layout"]]
