"""Notebook 03's reads from Cloud Storage (`labkit.course.cloud_reads`): the four ways against the
local server playing a latency, the rules computed from their rows, and a bucket of one's own."""

from __future__ import annotations

import numpy as np
import pytest

from labkit.course import cloud_reads
from labkit.course.cloud_reads import CloudFigures


def result(*, stage_s=2.0, epochs=None, probe=None, fractions=None, workers=2):
    epochs = epochs or {"files": 10.0, "gcsfs": 3.0, "mount": 2.5, "staged": 1.5}
    fractions = fractions or {"files": 0.9, "gcsfs": 0.3, "mount": 0.25, "staged": 0.1}
    return {"figures": [3.0, 1000.0], "workers": workers, "stage_s": stage_s, "stage_mb": 1.0, "stage_requests": 9,
            "ways": {k: {"images": 100, "epochs_s": [s, s * 1.01, s * 0.99], "data_fraction": fractions[k],
                         "requests": 1} for k, s in epochs.items()},
            "probe": probe or [{"mb": 0.1, "mb_per_s": [20.0] * 3}, {"mb": 8.0, "mb_per_s": [500.0] * 3},
                               {"mb": 32.0, "mb_per_s": [520.0] * 3}]}


def test_rule_reads_the_rows():
    r = cloud_reads.rule(result(), appetite=1000.0)
    assert r.staging_pays_after == pytest.approx(2.0 / (2.5 - 1.5))   # copy / time saved per epoch
    assert r.readers_per_gpu == 50                                     # 1000 / (100/2.5 img/s / 2 readers)
    assert r.shard_mb == 8.0                                           # 500 is within 10% of 520
    assert r.under_target == ("staged",)
    assert "staging pays after 2.0 epochs" in r.text(1000.0)


def test_rule_when_streaming_is_no_slower():
    r = cloud_reads.rule(result(epochs={"files": 5.0, "gcsfs": 1.0, "mount": 1.0, "staged": 1.2}), appetite=None)
    assert r.staging_pays_after is None and r.readers_per_gpu is None
    assert "staging does not pay" in r.text(None)


def test_cited_figures_are_derived_from_the_benchmark_table():
    f = cloud_reads.cited_figures()
    assert f.request_ms == pytest.approx(30 / 9947.74 * 1e3, abs=0.05) and f.stream_mb_s == pytest.approx(1343, abs=1)
    assert "github.com/GoogleCloudPlatform/gcsfuse" in f.text() and "read 2026" in f.text()


def test_a_bucket_url_that_is_not_one_is_refused(tmp_path):
    with pytest.raises(ValueError, match="bucket_url"):
        cloud_reads.compare_ways(tmp_path, tmp_path, tmp_path / "w", figures=cloud_reads.cited_figures(), image_size=8,
                                 batch_size=4, workers=1, repeats=3, bucket_url="/gcs/bucket")


@pytest.fixture(scope="module")
def own_images(tmp_path_factory):
    """A class-per-folder JPEG set as a learner has one, and its shards."""
    from PIL import Image

    from labkit.data.own_shards import shard_source

    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for label, name in enumerate(("cat", "dog")):
        (root / name).mkdir()
        for i in range(12):
            pixels = np.clip(rng.normal(60 + 120 * label, 30, (40, 48, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i:03d}.jpg", quality=90)
    shards = tmp_path_factory.mktemp("shards")
    shard_source(root, shards, min_shards=4, overwrite=True)
    return root, shards


@pytest.mark.slow
def test_four_ways_against_the_local_server(own_images, tmp_path):
    photos, shards = own_images
    figures = CloudFigures(request_ms=30.0, stream_mb_s=200.0, source="test")
    res = cloud_reads.compare_ways(shards, photos, tmp_path, figures=figures, image_size=16, batch_size=8, workers=2,
                                   repeats=3, probe_mb=(0.05,))
    ways = res["ways"]
    assert set(ways) == set(cloud_reads.WAYS) and all(w["images"] == 24 for w in ways.values())
    assert ways["files"]["requests"] >= 24 and ways["staged"]["requests"] == 0
    assert 0 < ways["mount"]["requests"] <= ways["gcsfs"]["requests"] < ways["files"]["requests"]
    assert res["stage_requests"] >= 4  # every shard and the manifest, through the server
    # every whole-object read waited the played latency: no faster than 0.05 MB per 30 ms
    assert max(res["probe"][0]["mb_per_s"]) <= 0.05 / 0.030
    assert [r["way"] for r in cloud_reads.rows(res)] == list(cloud_reads.WAYS.values())
    assert cloud_reads.comparison(res, "mount", "staged") is not None


@pytest.mark.slow
def test_a_bucket_of_ones_own(own_images, tmp_path, monkeypatch):
    """`bucket_url` reads the bucket this environment reaches: here the local server, named the
    way a real job's clients would be pointed at an emulator."""
    from labkit.vertex.storage import LocalStorage

    photos, shards = own_images
    (tmp_path / "root" / "mine").mkdir(parents=True)
    with LocalStorage(tmp_path / "root", tmp_path / "state") as server:
        for key, value in server.client_env({}).items():
            monkeypatch.setenv(key, value)
        res = cloud_reads.compare_ways(shards, photos, tmp_path / "w", figures=cloud_reads.cited_figures(),
                                       image_size=16, batch_size=8, workers=1, repeats=3, probe_mb=(0.01,),
                                       bucket_url="gs://mine/run/")
    assert res["figures"] is None and "MB/s the figures predict" not in cloud_reads.probe_rows(res)[0]
    assert len(list((tmp_path / "root" / "mine" / "run").glob("labkit-03-*/shards/*-manifest.json"))) == 1
    assert all(w["images"] == 24 for w in res["ways"].values())
