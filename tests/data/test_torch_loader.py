"""The torch reading path: DataLoader workers × DDP ranks read every record exactly once."""

from __future__ import annotations

import itertools
import os
import sys
import textwrap

import numpy as np
import pytest

from labkit.data import (
    ImageDatasetConfig,
    ReadConfig,
    ShardConfig,
    SyntheticImages,
    write_image_shards,
)
from labkit.data.reader import assign_shards
from labkit.data.torch_loader import LoaderConfig, make_loader


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    global torch
    torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("shards")
    ds = SyntheticImages(ImageDatasetConfig(num_samples=53, image_size=4, num_classes=3))
    return ds, write_image_shards(d, ds, ShardConfig(records_per_shard=7))  # 8 shards, last has 4


@pytest.mark.parametrize("num_files,n", [(8, 4), (8, 3), (3, 5), (1, 2), (5, 1)])
@pytest.mark.parametrize("mode", ["auto", "file", "record"])
def test_assignment_is_a_partition(num_files, n, mode):
    files = [f"f{i}" for i in range(num_files)]
    counts = {f: 6 + i for i, f in enumerate(files)}
    seen = []
    for k in range(n):
        a = assign_shards(files, n, k, mode, epoch=3, shuffle_files=True, seed=1)
        for f, off in zip(a.files, a.offsets, strict=True):
            seen += [(f, i) for i in range(counts[f]) if i % a.every == off]
    assert sorted(seen) == sorted((f, i) for f in files for i in range(counts[f]))


def test_shuffled_file_order_changes_with_epoch():
    files = [f"f{i}" for i in range(20)]
    a0 = assign_shards(files, 1, 0, epoch=0, shuffle_files=True).files
    a1 = assign_shards(files, 1, 0, epoch=1, shuffle_files=True).files
    assert sorted(a0) == sorted(files) and a0 != a1


def _ids(loader):
    return [int(i) for b in loader for i in b["index"]]


def test_single_process_reads_everything_in_order(shards):
    ds, s = shards
    batches = list(make_loader(s.paths, ReadConfig(batch_size=16)))
    assert [len(b["index"]) for b in batches] == [16, 16, 16, 5]
    assert _ids(batches) == list(range(53))
    want, labels = ds.batch(range(53))
    got = torch.cat([b["image"] for b in batches]).numpy()
    np.testing.assert_array_equal(got, want)
    assert batches[0]["image"].dtype == torch.uint8 and batches[0]["label"].dtype == torch.int64


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("mechanism", ["batch", "sample"])
def test_ranks_times_workers_no_duplicates_no_gaps(shards, mechanism):
    _, s = shards
    world, workers = 2, 2
    all_ids = []
    for rank in range(world):
        cfg = LoaderConfig(num_workers=workers, rank=rank, world_size=world, mechanism=mechanism,
                           prefetch_factor=2, persistent_workers=True, shuffle_files=True)
        loader = make_loader(s.paths, ReadConfig(batch_size=5, shuffle_buffer=8, seed=3), cfg)
        loader.dataset.set_epoch(1)
        ids = _ids(loader)
        assert len(ids) == len(set(ids))
        all_ids += ids
    assert sorted(all_ids) == list(range(53))


def test_dataset_split_for_each_worker_without_processes(shards):
    _, s = shards
    # record-level split (8 files over 3 readers): still exact
    seen = []
    for rank, world in itertools.product(range(3), [3]):
        cfg = LoaderConfig(rank=rank, world_size=world)
        seen += [int(i) for b in make_loader(s.paths, ReadConfig(batch_size=4), cfg).dataset for i in b["index"]]
    assert sorted(seen) == list(range(53))


def test_loader_config_errors():
    with pytest.raises(ValueError, match="num_workers"):
        LoaderConfig(num_workers=-1)
    with pytest.raises(ValueError, match="prefetch_factor"):
        LoaderConfig(num_workers=0, prefetch_factor=2)
    with pytest.raises(ValueError, match="rank"):
        LoaderConfig(rank=2, world_size=2)
    with pytest.raises(ValueError, match="mechanism"):
        LoaderConfig(mechanism="dali")


def test_empty_shard_list_is_a_clear_error():
    with pytest.raises(ValueError, match="empty"):
        make_loader([])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_real_ddp_gloo_ranks_with_workers(shards, tmp_path):
    """Two real processes in a gloo process group, each with two loader workers: the rank and
    world size come from torch.distributed; together they read every record exactly once."""
    _, s = shards
    script = tmp_path / "ddp_ids.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, torch.distributed as dist
        from labkit.data import ReadConfig
        from labkit.data.torch_loader import LoaderConfig, make_loader
        dist.init_process_group("gloo")
        loader = make_loader({s.paths!r}, ReadConfig(batch_size=4),
                             LoaderConfig(num_workers=2, persistent_workers=True))
        ids = [int(i) for b in loader for i in b["index"]]
        with open(sys.argv[1] + f"/ids-{{dist.get_rank()}}.txt", "w") as f:
            f.write(" ".join(map(str, ids)))
        dist.destroy_process_group()
    """))
    import socket
    import subprocess

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
                   RANK=str(rank), PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
        procs.append(subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env))
    assert [p.wait(timeout=200) for p in procs] == [0, 0]
    ids = [list(map(int, (tmp_path / f"ids-{r}.txt").read_text().split())) for r in range(2)]
    assert ids[0] and ids[1] and not set(ids[0]) & set(ids[1])
    assert sorted(ids[0] + ids[1]) == list(range(53))


def test_missing_shard_is_reported_before_any_worker_starts(tmp_path):
    with pytest.raises(FileNotFoundError, match="gone.tfrecord"):
        make_loader([str(tmp_path / "gone.tfrecord")], loader=LoaderConfig(num_workers=2))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_corrupt_shard_in_a_worker_surfaces_as_corrupt_record_error(shards, tmp_path):
    from labkit.data import CorruptRecordError

    _, s = shards
    bad = tmp_path / "bad.tfrecord"
    raw = bytearray(open(s.paths[0], "rb").read())
    raw[-10] ^= 0xFF  # inside the last record's payload
    bad.write_bytes(bytes(raw))
    loader = make_loader([str(bad)], ReadConfig(batch_size=2), LoaderConfig(num_workers=1))
    with pytest.raises(CorruptRecordError, match=r"bad.tfrecord at byte offset \d+: data CRC"):
        list(loader)


def test_not_a_tfrecord_is_a_clear_error(tmp_path):
    from labkit.data import CorruptRecordError

    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"PK\x03\x04 this is a zip file, not a TFRecord" * 4)
    with pytest.raises(CorruptRecordError, match="junk.bin at byte offset 0.*not a TFRecord"):
        list(make_loader([str(junk)]))


@pytest.mark.gpu
def test_pinned_batches_with_workers(shards):
    _, s = shards
    loader = make_loader(s.paths, ReadConfig(batch_size=8),
                         LoaderConfig(num_workers=2, pin_memory=True, prefetch_factor=2))
    batch = next(iter(loader))
    assert batch["image"].is_pinned() and batch["image"].to("cuda", non_blocking=True).shape[0] == 8


def test_pooled_batches_are_reused_only_once_released(shards):
    _, s = shards
    loader = make_loader(s.paths, ReadConfig(batch_size=4))
    it = iter(loader)
    kept = next(it)
    kept_view = kept["image"][1:3]  # a view keeps the storage (and the pooled array) alive
    kept_copy = kept_view.clone()
    del kept
    ptrs = set()
    for b in it:  # drop each batch before the next
        ptrs.add(b["image"].data_ptr())
        del b
    assert torch.equal(kept_view, kept_copy)  # never overwritten while referenced
    assert kept_view.data_ptr() not in ptrs
    assert len(ptrs) < 12  # released batches were reused (13 batches in all)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_spawned_workers_with_injected_latency(shards):
    """Workers started with "spawn" (macOS/Windows default) get the pickled dataset and opener."""
    from labkit.data import StorageLatency

    _, s = shards
    cfg = LoaderConfig(num_workers=2, multiprocessing_context="spawn", world_size=1, rank=0)
    opener = StorageLatency(open_latency_ms=1, bandwidth_mb_s=None).opener()
    ids = _ids(make_loader(s.paths, ReadConfig(batch_size=8), cfg, opener=opener))
    assert sorted(ids) == list(range(53))


def test_thread_mechanism_reads_everything_and_reraises(shards, tmp_path):
    from labkit.data import CorruptRecordError

    _, s = shards
    loader = make_loader(s.paths, ReadConfig(batch_size=8), LoaderConfig(mechanism="thread", prefetch_factor=3))
    assert _ids(loader) == list(range(53))
    assert _ids(loader) == list(range(53))  # iterable again (a new thread per pass)
    it = iter(loader)
    next(it)
    it.close()  # stopping early releases the reader thread
    bad = tmp_path / "bad.tfrecord"
    raw = bytearray(open(s.paths[0], "rb").read())
    raw[-10] ^= 0xFF
    bad.write_bytes(bytes(raw))
    with pytest.raises(CorruptRecordError, match="bad.tfrecord"):
        list(make_loader([str(bad)], ReadConfig(batch_size=2), LoaderConfig(mechanism="thread")))
    with pytest.raises(ValueError, match="num_workers=0"):
        LoaderConfig(mechanism="thread", num_workers=2)
