"""`labkit data write` / `labkit data verify`, through the real command: exit 0 when all is
well, 1 when verify finds problems (one per line), 2 for bad input (one line, no traceback)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from labkit.cli import main
from labkit.data import ReadConfig, read_batches
from tests.conftest import REPO


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out.strip().splitlines(), out.err


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
    code, lines, _ = _run(capsys, "data", "verify", str(tmp_path))  # compression from the manifest
    assert code == 0 and "all CRCs good against 1 manifest" in lines[-1]


def test_verify_reports_corruption_with_offset(tmp_path, capsys):
    main(["data", "write", "tokens", str(tmp_path), "--num-samples", "3", "--block-size", "8"])
    (shard,) = tmp_path.glob("*.tfrecord")
    raw = bytearray(shard.read_bytes())
    raw[20] ^= 1
    shard.write_bytes(bytes(raw))
    assert main(["data", "verify", str(shard)]) == 1
    out = capsys.readouterr().out
    assert str(shard) in out and "byte offset 0" in out


@pytest.mark.parametrize("damage", ["emptied", "cut at a record boundary", "deleted", "stale extra"])
def test_verify_folder_lists_each_problem_on_a_line(tmp_path, capsys, damage):
    main(["data", "write", "images", str(tmp_path), "--num-samples", "12", "--image-size", "4",
          "--records-per-shard", "4"])
    capsys.readouterr()
    shard = tmp_path / "data-00001-of-00003.tfrecord"
    raw = shard.read_bytes()
    if damage == "emptied":
        shard.write_bytes(b"")
    elif damage == "cut at a record boundary":
        shard.write_bytes(raw[: len(raw) // 2])
    elif damage == "deleted":
        shard.unlink()
    else:
        (tmp_path / "data-00003-of-00004.tfrecord").write_bytes(raw)
    code, lines, _ = _run(capsys, "data", "verify", str(tmp_path))
    assert code == 1 and len(lines) == 2 and "1 problem" in lines[1]
    want = {"emptied": "short: 0 records", "cut at a record boundary": "short: 2 records",
            "deleted": "missing", "stale extra": "data-00003-of-00004.tfrecord: extra shard"}[damage]
    assert want in lines[0]


def test_rewrite_refuses_then_overwrite_replaces_whole(tmp_path, capsys):
    base = ["data", "write", "images", str(tmp_path), "--num-samples", "12", "--image-size", "4"]
    assert main([*base, "--records-per-shard", "3"]) == 0  # 4 shards
    capsys.readouterr()
    code, lines, _ = _run(capsys, *base, "--records-per-shard", "6")
    assert code == 2 and len(lines) == 1
    assert "already holds a shard set with prefix 'data'" in lines[0] and "--overwrite" in lines[0]
    assert len(list(tmp_path.glob("data-*.tfrecord"))) == 4  # untouched
    assert main([*base, "--records-per-shard", "6", "--overwrite"]) == 0
    assert sorted(p.name for p in tmp_path.glob("data-*.tfrecord")) == [
        "data-00000-of-00002.tfrecord", "data-00001-of-00002.tfrecord"]  # the glob sees the new set only
    capsys.readouterr()
    assert main(["data", "verify", str(tmp_path)]) == 0


# Bad input: (argv after `labkit data`, text the one line must hold). "{d}" is a fresh folder.
BAD_INPUT = [
    (["write", "images", "{d}/out", "--records-per-shard", "0"], "--records-per-shard must be >= 1 (got 0)"),
    (["write", "images", "{d}/out", "--num-samples", "0"], "--num-samples must be >= 1 (got 0)"),
    (["write", "tokens", "{d}/out", "--num-samples", "0"], "--num-samples must be >= 1 (got 0)"),
    (["write", "images", "{d}/out", "--compression", "LZ4"], "--compression must be 'GZIP', 'ZLIB' or none (got 'LZ4')"),
    (["write", "images", "{d}/a-file"], "{d}/a-file: it is a file, not a folder"),
    (["write", "images", "{d}/a-file/sub"], "cannot write shards into {d}/a-file/sub"),
    (["verify", "{d}/empty"], "{d}/empty holds no TFRecord shards and no shard manifest"),
    (["verify", "{d}/no-manifest"], "{d}/no-manifest holds 1 TFRecord file but no *-manifest.json"),
    (["verify", "{d}/bad-manifest"], "data-manifest.json is not a labkit shard manifest"),
    (["verify", "{d}/missing"], "not found: {d}/missing"),
    (["verify", "{d}/*.nothing"], "no TFRecord shard matches"),
    (["verify", "{d}/no-manifest", "--compression", "LZ4"], "--compression must be"),
]


@pytest.fixture
def bad_inputs(tmp_path):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "no-manifest").mkdir()
    (tmp_path / "no-manifest" / "x.tfrecord").write_bytes(b"")
    (tmp_path / "bad-manifest").mkdir()
    (tmp_path / "bad-manifest" / "data-manifest.json").write_text("[1, 2")
    return tmp_path


@pytest.mark.parametrize("argv,want", BAD_INPUT, ids=[" ".join(a[:1] + a[2:]) for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(bad_inputs, capsys, argv, want):
    d = str(bad_inputs)
    code, lines, err = _run(capsys, "data", *[a.replace("{d}", d) for a in argv])
    assert code == 2 and len(lines) == 1 and not err, (lines, err)
    assert want.replace("{d}", d) in lines[0]
    assert not (bad_inputs / "out").exists()  # refused before anything was written


def test_gzip_shard_verified_without_compression_says_gzip(tmp_path, capsys):
    main(["data", "write", "images", str(tmp_path), "--num-samples", "4", "--image-size", "4",
          "--compression", "GZIP"])
    capsys.readouterr()
    lone = tmp_path / "lone.tfrecord"  # not listed by the manifest: no compression to take from it
    shutil.copy(tmp_path / "data-00000-of-00001.tfrecord.gz", lone)
    code, lines, _ = _run(capsys, "data", "verify", str(lone))
    assert code == 1 and 'compression="GZIP"' in lines[0] and "offset 0" in lines[0]


def _as_unprivileged(cmd):
    """The command as a process that respects file permissions (root, without the capability
    that lets it write anywhere), or None where that cannot be arranged."""
    if os.geteuid() != 0:
        return cmd
    setpriv = shutil.which("setpriv")
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search", *cmd] if setpriv else None


def test_write_into_a_read_only_folder_as_a_subprocess(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    cmd = _as_unprivileged([sys.executable, "-m", "labkit", "data", "write", "images", str(ro / "out"),
                            "--num-samples", "4"])
    if cmd is None:
        pytest.skip("running as root without setpriv: permission bits cannot be enforced")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        ro.chmod(0o755)
    assert r.returncode == 2, r.stderr
    out = r.stdout.strip()
    assert "\n" not in out and str(ro / "out") in out and out.endswith("Permission denied")
    assert r.stderr == ""


def test_verify_missing_path_as_a_subprocess(tmp_path):
    r = subprocess.run([sys.executable, "-m", "labkit", "data", "verify", str(tmp_path / "none.tfrecord")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not found" in r.stdout and r.stderr == ""
