"""`labkit data shard` on a learner's own files (real JPEG and PNG files written with Pillow, real
CSV, JSON Lines and Parquet tables), and the readers of the shards it writes."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from labkit.data import own_shards
from labkit.data.example import decode_example
from labkit.data.images import ImageReadConfig, decode_images, iter_image_batches
from labkit.data.shards import ShardSetExistsError, verify_shards
from labkit.data.sources import SourceError
from labkit.data.tfrecord import read_records

CLASSES = ("cat", "dog", "fox")


def photo(rng, h: int, w: int, label: int) -> np.ndarray:
    """A smooth picture (gradients, a disc whose colour is the class) with a little noise: what
    JPEG is made for, so decoders agree closely."""
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    img = np.stack([x * 200, y * 200, (x + y) * 100], -1)
    cy, cx, r = rng.uniform(0.3, 0.7) * h, rng.uniform(0.3, 0.7) * w, min(h, w) / 4
    img[(np.mgrid[0:h, 0:w][0] - cy) ** 2 + (np.mgrid[0:h, 0:w][1] - cx) ** 2 < r * r] = [(80, 200, 40)[label], 60, 200 - 60 * label]
    return np.clip(img + rng.normal(0, 4, img.shape), 0, 255).astype(np.uint8)


def write_folder(root, per_class: int = 10, seed: int = 0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    for label, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            img = Image.fromarray(photo(rng, int(rng.integers(48, 96)), int(rng.integers(48, 96)), label))
            img.save(root / name / (f"{i:03d}.png" if i % 4 == 0 else f"{i:03d}.jpg"), quality=90)
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp("photos") / "photos")


@pytest.fixture(scope="module")
def shards(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    own_shards.shard_source(folder, out, shard_mb=0.02)
    return out


def test_every_image_is_kept_as_its_own_bytes_with_its_class(folder, shards):
    man = json.loads((shards / "data-manifest.json").read_text())
    assert man["kind"] == "encoded_images" and man["classes"] == list(CLASSES)
    assert len(man["shards"]) >= 8 and man["num_records"] == 30
    seen = {}
    for record in read_records(sorted(shards.glob("data-*.tfrecord"))):
        ex = decode_example(record)
        name = bytes(ex["name"][0]).decode()
        seen[name] = int(ex["index"][0])
        assert bytes(ex["image"][0]) == (folder / name).read_bytes()  # no re-encode
        assert int(ex["label"][0]) == CLASSES.index(name.split("/")[0])
        assert bytes(ex["format"][0]) == (b"png" if name.endswith(".png") else b"jpeg")
    assert len(seen) == 30 and sorted(seen.values()) == list(range(30))
    assert verify_shards(shards).ok
    # shuffled before cutting: the first shards do not hold one class only
    labels = [int(decode_example(r)["label"][0]) for r in read_records(sorted(shards.glob("data-0000[0-3]-*")))]
    assert len(set(labels)) > 1, labels


def test_shards_are_sized_by_bytes(folder, tmp_path):
    sizes = [p.stat().st_size for p in folder.rglob("*.*g")]
    out = own_shards.shard_source(folder, tmp_path / "big", shard_mb=sum(sizes) * 1.1 / 3e6, min_shards=1)  # 10%: record framing
    assert len(out.paths) == 3
    written = [p.stat().st_size for p in sorted((tmp_path / "big").glob("data-*.tfrecord"))]
    assert max(written) < 1.5 * min(written)
    assert own_shards.plan_counts([10] * 10, 25, min_shards=1) == [3, 2, 3, 2]
    assert own_shards.plan_counts([10] * 10, 1000, min_shards=4) == [3, 2, 3, 2]
    assert own_shards.plan_counts([100], 1, min_shards=8) == [1]


def test_an_interrupted_write_resumes_without_duplicates_or_gaps(folder, tmp_path, monkeypatch):
    out = tmp_path / "out"
    real = own_shards._PlannedWrite._write_shard
    calls = []

    def failing(self, s, data):
        calls.append(s)
        if s == 5:
            raise OSError(28, "No space left on device")
        return real(self, s, data)

    monkeypatch.setattr(own_shards._PlannedWrite, "_write_shard", failing)
    with pytest.raises(OSError, match="run the same command again"):
        own_shards.shard_source(folder, out, shard_mb=0.02, workers=1)
    assert not (out / "data-manifest.json").exists() and (out / "data-plan.json").exists()
    assert not list(out.glob(".*partial*"))
    done_before = {p.name for p in out.glob("data-*.tfrecord")}
    monkeypatch.setattr(own_shards._PlannedWrite, "_write_shard", real)
    # another source is refused while the unfinished write is there
    other = write_folder(tmp_path / "other", per_class=2, seed=1)
    with pytest.raises(ShardSetExistsError, match="unfinished write"):
        own_shards.shard_source(other, out, shard_mb=0.02)
    result = own_shards.shard_source(folder, out, shard_mb=0.02)
    assert result.kept == len(done_before) > 0
    report = verify_shards(out)
    assert report.ok, report.problems
    assert report.records == 30 and not (out / "data-plan.json").exists()
    indices = sorted(int(decode_example(r)["index"][0]) for r in read_records(sorted(out.glob("data-*.tfrecord"))))
    assert indices == list(range(30))


def test_a_csv_of_paths_and_labels(folder, tmp_path):
    rows = ["file,species"] + [f"photos/{p.relative_to(folder)},{p.parent.name}" for p in sorted(folder.rglob("*.jpg"))]
    (tmp_path / "photos").symlink_to(folder)
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    out = own_shards.shard_source(tmp_path / "labels.csv", tmp_path / "out", labels="csv:species")
    assert out.classes == list(CLASSES) and out.num_records == len(rows) - 1
    with pytest.raises(SourceError, match="no column 'label'"):
        own_shards.shard_source(tmp_path / "labels.csv", tmp_path / "o2", labels="csv:label")


@pytest.mark.parametrize("kind", ["csv", "jsonl", "parquet"])
def test_tables_become_one_record_per_row(tmp_path, kind):
    rows = [{"age": i, "score": i / 4, "city": f"c{i % 3}"} for i in range(50)]
    src = tmp_path / f"rows.{kind}"
    if kind == "csv":
        src.write_text("age,score,city\n" + "".join(f"{r['age']},{r['score']},{r['city']}\n" for r in rows))
    elif kind == "jsonl":
        src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), src)
    out = own_shards.shard_source(src, tmp_path / "out", shuffle=False)
    assert out.kind == "table" and out.columns == {"age": "int64", "score": "float", "city": "bytes"}
    got = [decode_example(r) for r in read_records(out.paths)]
    assert [int(g["age"][0]) for g in got] == list(range(50))
    assert [float(g["score"][0]) for g in got] == [r["score"] for r in rows]
    assert [bytes(g["city"][0]).decode() for g in got] == [r["city"] for r in rows]
    assert verify_shards(tmp_path / "out").ok


def test_bad_input_names_the_path(tmp_path):
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    (tmp_path / "empty" / "cls" / "notes.txt").write_text("x")
    with pytest.raises(SourceError, match="holds no .jpg"):
        own_shards.shard_source(tmp_path / "empty", tmp_path / "o", format="images")
    (tmp_path / "fake" / "cls").mkdir(parents=True)
    (tmp_path / "fake" / "cls" / "a.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(SourceError, match=r"a\.jpg: is named as a JPEG file"):
        own_shards.shard_source(tmp_path / "fake", tmp_path / "o")
    assert not [p for p in (tmp_path / "o").iterdir() if "partial" in p.name or p.suffix == ".tfrecord"]
    (tmp_path / "t.csv").write_text("index,b\n1,2\n")
    with pytest.raises(SourceError, match="'index' is reserved"):
        own_shards.shard_source(tmp_path / "t.csv", tmp_path / "o")


@pytest.mark.slow
def test_the_cli_shards_refuses_and_verifies(folder, tmp_path):
    def labkit(*args):
        return subprocess.run([sys.executable, "-m", "labkit", "data", *args], capture_output=True, text=True)

    ok = labkit("shard", str(folder), str(tmp_path / "s"), "--shard-mb", "0.05")
    assert ok.returncode == 0 and "30 records (3 classes)" in ok.stdout, ok.stdout + ok.stderr
    again = labkit("shard", str(folder), str(tmp_path / "s"))
    assert again.returncode == 2 and "--overwrite" in again.stdout and "Traceback" not in again.stderr
    for args, says in [(["--labels", "csv:"], "--labels"), (["--shard-mb", "-1"], "--shard-mb"),
                       (["--format", "video"], "--format")]:
        bad = labkit("shard", str(folder), str(tmp_path / "b"), *args)
        assert bad.returncode == 2 and says in bad.stdout and "Traceback" not in bad.stderr, bad.stdout + bad.stderr
    assert labkit("verify", str(tmp_path / "s")).returncode == 0


def test_the_numpy_reader_decodes_every_image_once(shards, folder):
    from PIL import Image

    batches = list(iter_image_batches(shards, ImageReadConfig(image_size=32, batch_size=8)))
    assert [b["image"].shape for b in batches][:1] == [(8, 32, 32, 3)]
    index = np.concatenate([b["index"] for b in batches])
    assert sorted(index) == list(range(30))
    # row i is the file's own image, resized and cropped
    names = {int(decode_example(r)["index"][0]): bytes(decode_example(r)["name"][0]).decode()
             for r in read_records(sorted(shards.glob("data-*.tfrecord")))}
    first = batches[0]
    source = folder / names[int(first["index"][0])]
    with Image.open(source) as im:
        im = im.convert("RGB")
        w, h = im.size
        s = 32 / min(w, h)
        im = im.resize((max(32, round(w * s)), max(32, round(h * s))), Image.BILINEAR)
        left, top = (im.size[0] - 32) // 2, (im.size[1] - 32) // 2
        plain = np.asarray(im.crop((left, top, left + 32, top + 32)))
    assert np.array_equal(first["image"][0], decode_images([source.read_bytes()], 32)[0])
    assert np.abs(first["image"][0].astype(int) - plain).mean() < 8  # JPEG's reduced-scale decode
    threaded = list(iter_image_batches(shards, ImageReadConfig(image_size=32, batch_size=8, decode_threads=3)))
    assert all(np.array_equal(a["image"], b["image"]) for a, b in zip(batches, threaded, strict=True))


@pytest.mark.slow
def test_torch_loader_ranks_and_workers_read_each_record_once(shards):
    pytest.importorskip("torch")
    from labkit.data.images import image_loader
    from labkit.data.torch_loader import LoaderConfig

    seen = []
    for rank in range(2):
        for batch in image_loader(shards, ImageReadConfig(image_size=24, batch_size=4),
                                  LoaderConfig(num_workers=2, rank=rank, world_size=2)):
            assert batch["image"].shape[1:] == (24, 24, 3) and str(batch["image"].dtype) == "torch.uint8"
            seen += batch["index"].tolist()
    assert sorted(seen) == list(range(30))


@pytest.mark.slow
def test_tf_data_reads_the_same_images(shards):
    tf = pytest.importorskip("tensorflow")
    from labkit.data.tf_pipeline import make_tf_image_dataset

    ds = make_tf_image_dataset(shards, image_size=32, batch_size=8)
    assert ds.options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.FILE
    got = list(ds.as_numpy_iterator())
    index = np.concatenate([b["index"] for b in got])
    assert sorted(index) == list(range(30))
    mine = list(iter_image_batches(shards, ImageReadConfig(image_size=32, batch_size=8)))
    ours = np.concatenate([b["image"] for b in mine])[np.argsort(np.concatenate([b["index"] for b in mine]))]
    theirs = np.concatenate([b["image"] for b in got])[np.argsort(index)]
    labels = np.concatenate([b["label"] for b in got])[np.argsort(index)]
    assert np.array_equal(labels, np.concatenate([b["label"] for b in mine])[np.argsort(np.concatenate([b["index"] for b in mine]))])
    # two decoders and two resamplers: the same pictures, not the same bits
    assert np.abs(ours.astype(int) - theirs).mean() < 6


def test_the_recipe_reads_what_labkits_reader_reads(shards):
    pytest.importorskip("torch")
    from labkit.course.own_data import recipe_agrees

    assert recipe_agrees(shards, image_size=40, batch_size=7) == (30, True)


@pytest.mark.slow
def test_from_a_bucket_to_a_bucket(folder, tmp_path):
    """gs:// on both sides, through the local Cloud Storage server a job's replicas use."""
    import shutil

    from labkit.core.launcher import child_env
    from labkit.vertex.storage import LocalStorage

    shutil.copytree(folder, tmp_path / "buckets" / "bkt" / "photos")
    with LocalStorage(tmp_path / "buckets", tmp_path / "state") as server:
        env = child_env(server.client_env())
        for args in (["shard", "gs://bkt/photos", "gs://bkt/shards", "--shard-mb", "0.05"],
                     ["verify", "gs://bkt/shards"], ["stage", "gs://bkt/shards", str(tmp_path / "local")]):
            done = subprocess.run([sys.executable, "-m", "labkit", "data", *args], env=env, capture_output=True,
                                  text=True, timeout=300)
            assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    man = json.loads((tmp_path / "buckets" / "bkt" / "shards" / "data-manifest.json").read_text())
    assert man["num_records"] == 30 and man["classes"] == list(CLASSES)
    assert not (tmp_path / "buckets" / "bkt" / "shards" / "data-plan.json").exists()
    assert verify_shards(tmp_path / "local").records == 30


def test_staging_copies_checks_and_resumes(shards, tmp_path):
    from labkit.data.stage import stage

    first = stage(shards, tmp_path / "local", workers=4)
    assert first.files == len(json.loads((shards / "data-manifest.json").read_text())["shards"]) and first.kept == 0
    assert verify_shards(tmp_path / "local").ok
    again = stage(shards, tmp_path / "local", workers=4)
    assert again.kept == again.files and again.nbytes == 0
    # a shard that is not the one its manifest lists is refused, and nothing half-copied stays
    bad = tmp_path / "bad"
    import shutil

    shutil.copytree(shards, bad)
    victim = sorted(bad.glob("data-*.tfrecord"))[2]
    victim.write_bytes(victim.read_bytes()[:-1] + b"\0")
    with pytest.raises(OSError, match="not the ones its manifest lists"):
        stage(bad, tmp_path / "from-bad", workers=2)
    assert not list((tmp_path / "from-bad").glob("*partial*"))
    assert not (tmp_path / "from-bad" / "data-manifest.json").exists()
