"""Notebook 03's helpers: data written twice, the findings (numbers and verdicts) drawn from the
measurements, the in-memory cache, the reading rates, and a tiny end-to-end ladder on each
framework."""

from __future__ import annotations

import statistics

import pytest

from labkit.core.config import ParameterError
from labkit.core.stats import NO_DIFFERENCE, Spread
from labkit.course.input_pipeline import findings
from labkit.course.input_pipeline.ladder import (
    INPUT_RUNGS,
    CachedBatches,
    InputLadder,
    InputLadderConfig,
    InputRung,
    write_ladder_data,
)
from labkit.course.input_pipeline.read_rates import (
    ReadRates,
    best_torch_mechanism,
    corruption_demo,
    workers_to_feed,
    write_bench_shards,
)
from labkit.course.tables import table
from labkit.data import read_records

TINY = InputLadderConfig(num_samples=12, image_size=8, records_per_shard=4, batch_size=4, num_workers=2,
                    prefetch=2, open_latency_ms=1.0, bandwidth_mb_s=100.0, repeats=1)


def test_ladder_data_is_the_same_dataset_twice(tmp_path):
    data = write_ladder_data(tmp_path, TINY)
    assert len(data.small_files.paths) == 12 and len(data.shards.paths) == 3
    assert sorted(read_records(data.small_files.paths)) == sorted(read_records(data.shards.paths))


def test_corruption_demo_names_file_and_offset(tmp_path):
    data = write_ladder_data(tmp_path, TINY)
    message = corruption_demo(data.shards.paths[0], str(tmp_path / "bad.tfrecord"))
    assert "bad.tfrecord" in message and "byte offset" in message and "CRC" in message


def test_cached_batches_replay_without_the_source():
    calls = []

    def source():
        calls.append(1)
        yield from ([1], [2], [3])

    class Once:
        def __iter__(self):
            return source()

    cached = CachedBatches(Once())
    assert list(cached) == [[1], [2], [3]] and list(cached) == [[1], [2], [3]]
    assert len(calls) == 1


def _ladder(engine, rates):
    return InputLadder(engine, [InputRung(engine, key, 100, 100 / r, f) for key, r, f in
                                zip(INPUT_RUNGS, rates, [0.9, 0.5, 0.4, 0.2, 0.05], strict=True)])


def test_the_ladder_findings_are_computed_from_the_numbers():
    lad = _ladder("torch", [10, 50, 40, 100, 150])
    assert lad.best.key == "cache" and lad.speedup() == pytest.approx(15)
    found = findings.ladder_findings(lad, TINY)
    assert found.naive.key == "naive" and found.best.key == "cache" and found.speedup == pytest.approx(15)
    assert [s.after.key for s in found.steps] == list(INPUT_RUNGS)[1:]
    shards = found.step("shards")
    assert shards.ratio == pytest.approx(5) and shards.verdict == "fewer than 3 epochs: no verdict"
    assert not shards.measured and shards.reason is None and found.not_faster == ()
    assert not found.workers_cost_more  # slower (40 < 50), but one epoch each: no verdict
    assert (found.epochs, found.steps_per_epoch) == (1, 3)  # 12 samples in batches of 4
    raw = ReadRates({"raw": 6.0, "crc32c": 6.0, "torch_batch": 2.4, "tf_data": 1.2}, {})
    assert raw.ceiling == pytest.approx(3.0)
    rows = table(lad.rows(), title="torch").splitlines()
    assert rows[0] == "torch" and rows[1].startswith("rung") and "15" in rows[-1]
    assert "ceiling 1/(1/raw+1/crc)" in table(raw.rows())


def _measured(engine, epochs, waits):
    return InputLadder(engine, [InputRung(engine, k, 100, statistics.median(e), waits[k], e) for k, e in epochs.items()])


def test_a_rung_that_did_not_help_gets_a_reason_from_what_it_adds():
    epochs = {"naive": (10.0, 10.5, 11.0), "shards": (5.0, 5.2, 5.4), "parallel_reads": (5.1, 5.3, 5.5),
              "prefetch": (3.0, 3.1, 3.2), "cache": (3.05, 3.1, 3.15)}
    waits = {"naive": 0.9, "shards": 0.6, "parallel_reads": 0.6, "prefetch": 0.1, "cache": 0.1}
    for engine in ("torch", "tf"):
        found = findings.ladder_findings(_measured(engine, epochs, waits), TINY)
        flat = found.not_faster
        assert [s.after.key for s in flat] == ["parallel_reads", "cache"]
        assert flat[0].reason == findings.HELPERS_SHARE_CORES and flat[0].verdict == NO_DIFFERENCE
        assert (flat[0].before.data_fraction, flat[0].after.data_fraction) == (0.6, 0.6)
        assert flat[1].reason == findings.LITTLE_TO_WIN  # it waited 10% before it
        assert found.step("prefetch").verdict == "faster" and found.step("prefetch").reason is None
        assert not found.workers_cost_more  # no measurable difference, not slower


def test_a_rung_that_cut_the_wait_within_the_noise_is_not_said_to_have_missed_it():
    epochs = {"naive": (10.0, 10.5, 11.0), "shards": (5.0, 5.2, 5.4), "parallel_reads": (3.0, 3.1, 3.2),
              "prefetch": (2.0, 2.1, 2.2), "cache": (1.5, 1.9, 2.6)}
    waits = {"naive": 0.9, "shards": 0.6, "parallel_reads": 0.5, "prefetch": 0.35, "cache": 0.0}
    (cache,) = findings.ladder_findings(_measured("torch", epochs, waits), TINY).not_faster
    assert cache.after.key == "cache" and cache.reason == findings.WITHIN_NOISE


def test_a_wait_the_rung_did_not_cut_is_said_so():
    epochs = {"naive": (10.0, 10.5, 11.0), "shards": (10.1, 10.4, 11.1), "parallel_reads": (3.0, 3.1, 3.2),
              "prefetch": (2.0, 2.1, 2.2), "cache": (1.0, 1.1, 1.2)}
    waits = {"naive": 0.9, "shards": 0.88, "parallel_reads": 0.5, "prefetch": 0.35, "cache": 0.0}
    (shards,) = findings.ladder_findings(_measured("torch", epochs, waits), TINY).not_faster
    assert shards.after.key == "shards" and shards.reason == findings.WAIT_NOT_CUT


def test_torch_workers_started_afresh_each_epoch_are_said_to_cost_more_only_when_measurably_slower():
    epochs = {"naive": (10.0, 10.5, 11.0), "shards": (5.0, 5.2, 5.4), "parallel_reads": (7.0, 7.1, 7.2),
              "prefetch": (3.0, 3.1, 3.2), "cache": (1.0, 1.1, 1.2)}
    waits = dict.fromkeys(epochs, 0.5)
    assert findings.ladder_findings(_measured("torch", epochs, waits), TINY).workers_cost_more
    assert not findings.ladder_findings(_measured("tf", epochs, waits), TINY).workers_cost_more


def test_the_best_mechanism_against_the_runner_up():
    mech = {"sample + collate": Spread((90.0, 100.0, 110.0)), "batch, in-process": Spread((300.0, 310.0, 320.0)),
            "batch, background thread": Spread((390.0, 400.0, 410.0))}
    assert best_torch_mechanism(mech) == "batch, background thread"
    found = findings.mechanism_findings(mech)
    assert (found.best, found.runner_up, found.worst) == ("batch, background thread", "batch, in-process",
                                                          "sample + collate")
    assert found.best_over_worst == pytest.approx(4.0) and found.verdict == "faster"
    mech["batch, in-process"] = Spread((380.0, 395.0, 405.0))  # overlaps the best's passes
    assert findings.mechanism_findings(mech).verdict == NO_DIFFERENCE
    one_pass = {k: Spread((v.median,)) for k, v in mech.items()}
    assert findings.mechanism_findings(one_pass).comparison is None
    assert "no verdict" in findings.mechanism_findings(one_pass).verdict
    with pytest.raises(ParameterError, match="mechanisms"):
        findings.mechanism_findings({"batch, in-process": Spread((1.0,))})


def test_workers_to_feed():
    assert workers_to_feed(images_per_s=8000, image_bytes=150_000, gb_per_s=0.5) == 3
    assert workers_to_feed(images_per_s=8000, image_bytes=150_000, gb_per_s=float("nan")) == 0


def test_bench_shards(tmp_path):
    s = write_bench_shards(tmp_path, record_kb=10, total_mb=1, shards=4)
    assert s.num_records == 100 and len(s.paths) == 4
    assert all(len(r) == 10_000 for r in read_records(s.paths))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_tiny_torch_ladder(tmp_path):
    pytest.importorskip("torch")
    from labkit.course.input_pipeline.ladder import torch_ladder
    from labkit.course.input_pipeline.step_probe import torch_image_step

    lad = torch_ladder(write_ladder_data(tmp_path, TINY), torch_image_step(10, width=4, device="cpu"))
    assert [r.key for r in lad.rungs] == list(INPUT_RUNGS)
    assert all(r.samples == 12 and 0 <= r.data_fraction <= 1 for r in lad.rungs)
    assert all(len(r.epochs_s) == TINY.repeats and r.seconds in r.epochs_s for r in lad.rungs)
    assert lad.verdict("naive", "shards") == "fewer than 3 epochs: no verdict"  # TINY runs one epoch each


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_tiny_mechanism_comparison(tmp_path):
    pytest.importorskip("torch")
    from labkit.course.input_pipeline.read_rates import compare_mechanisms

    mech = compare_mechanisms(write_ladder_data(tmp_path, TINY), repeats=1)
    assert len(mech) == 4 and all(len(v.values) == 3 and v.median > 0 for v in mech.values())


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_tiny_tf_ladder(tmp_path):
    pytest.importorskip("tensorflow")
    from labkit.course.input_pipeline.ladder import tf_ladder
    from labkit.course.input_pipeline.step_probe import tf_image_step

    lad = tf_ladder(write_ladder_data(tmp_path, TINY), tf_image_step(10, width=4))
    assert [r.key for r in lad.rungs] == list(INPUT_RUNGS)
    assert all(r.samples == 12 for r in lad.rungs)
