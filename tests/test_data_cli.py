"""`labkit data write` / `labkit data verify`, through the real command."""

from __future__ import annotations

import subprocess
import sys

from labkit.cli import main
from labkit.data import ReadConfig, read_batches


def test_write_then_verify(tmp_path, capsys):
    assert main(["data", "write", "images", str(tmp_path), "--num-samples", "10", "--image-size", "4",
                 "--records-per-shard", "4", "--compression", "GZIP"]) == 0
    assert "10 images records in 3 shards" in capsys.readouterr().out
    files = sorted(tmp_path.glob("data-*.tfrecord.gz"))
    assert len(files) == 3
    (batch,) = read_batches(files, ReadConfig(batch_size=16, compression="GZIP"))
    assert batch["index"].tolist() == list(range(10))
    assert main(["data", "verify", str(tmp_path / "data-*.tfrecord.gz"), "--compression", "GZIP"]) == 0
    assert "10 records" in capsys.readouterr().out


def test_verify_reports_corruption_with_offset(tmp_path, capsys):
    main(["data", "write", "tokens", str(tmp_path), "--num-samples", "3", "--block-size", "8"])
    (shard,) = tmp_path.glob("*.tfrecord")
    raw = bytearray(shard.read_bytes())
    raw[20] ^= 1
    shard.write_bytes(bytes(raw))
    assert main(["data", "verify", str(shard)]) == 1
    out = capsys.readouterr().out
    assert str(shard) in out and "byte offset 0" in out


def test_verify_missing_path_as_a_subprocess(tmp_path):
    r = subprocess.run([sys.executable, "-m", "labkit", "data", "verify", str(tmp_path / "none.tfrecord")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "not found" in r.stdout
