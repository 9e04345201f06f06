"""The CPU-bound input case of notebook 05: real image decoding in the loader, and the speed
verdict of a fix from repeated runs (fed fixed measurements here: unit tests time nothing). What
a loader-worker sweep shows is tested in tests/course/test_profiling.py."""

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
