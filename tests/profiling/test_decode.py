"""The CPU-bound input case of notebook 05: real image decoding in the loader, and the verdicts
computed from a loader-worker sweep (fed fixed measurements here: unit tests time nothing)."""

from __future__ import annotations

import io

import pytest

from labkit.core.config import ParameterError


def test_encoded_images_decode_back_to_their_size():
    from PIL import Image

    from labkit.profiling.workload import encoded_images

    for kind in ("jpeg", "png"):
        blobs = encoded_images(kind, 32, count=3)
        assert len(blobs) == 3 and len(set(blobs)) == 3
        assert Image.open(io.BytesIO(blobs[0])).size == (32, 32)


def test_decode_workload_trains_on_decoded_pixels():
    pytest.importorskip("torch")
    from labkit.profiling.workload import WorkloadConfig, make_loader, run_workload

    cfg = WorkloadConfig(decode="jpeg", image_size=16, batch_size=4, width=8, depth=1, steps=2)
    x, y = next(iter(make_loader(cfg, 8, 2)))
    assert tuple(x.shape) == (4, 8) and float(x.min()) >= 0 and float(x.max()) <= 1 and len(y) == 4
    assert run_workload(cfg)["steps"] == 2
    with pytest.raises(ParameterError, match="decode"):
        WorkloadConfig(decode="webp")


def _row(workers, runs, vs):
    import statistics

    return {"workers": workers, "samples_per_s": statistics.median(runs), "runs": runs, "vs previous": vs,
            "speedup": statistics.median(runs) / 100.0, "range": f"{min(runs)}–{max(runs)}"}


def test_decode_verdict_says_where_workers_stopped_paying_off():
    from labkit.course.profiling import decode_verdict

    rows = [_row(0, [100, 101, 99], "reference"), _row(1, [130, 131, 129], "faster"),
            _row(2, [170, 171, 169], "faster"), _row(4, [168, 175, 165], "no measurable difference here")]
    text = decode_verdict(rows, cores=2)
    assert "up to 2 worker(s)" in text and "(4 workers) was no measurable difference here" in text
    assert "2 usable core(s)" in text and "1.70× 0 workers" in text


def test_decode_verdict_when_no_count_paid_off():
    from labkit.course.profiling import decode_verdict

    rows = [_row(0, [100, 101, 99], "reference"), _row(1, [99, 100, 102], "no measurable difference here")]
    assert "No number of workers was measurably faster" in decode_verdict(rows, cores=2)


def test_before_after_speed_verdict_comes_from_repeated_runs():
    from labkit.course.profiling import timed_comparison

    calls = []

    def rate(value):
        def run():
            calls.append(value)
            return value
        return run

    c = timed_comparison(rate(100.0), rate(250.0), repeats=3)
    assert calls == [100.0, 250.0] * 4  # one discarded run of each, then three in turns
    assert c.winner == "b" and c.speedup() == pytest.approx(2.5)
    same = timed_comparison(rate(100.0), rate(100.0), repeats=3)
    assert same.winner is None
