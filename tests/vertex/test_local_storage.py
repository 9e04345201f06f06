"""The emulated job's Cloud Storage (`labkit.vertex.storage`): a real server on loopback that the
real clients reach through their own emulator and proxy settings, over a plain folder that the
replicas' /gcs mount shows too."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from labkit.vertex.storage import BucketStore, LocalStorage, StoreError


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    root = tmp_path_factory.mktemp("buckets")
    (root / "bkt").mkdir()
    with LocalStorage(root, tmp_path_factory.mktemp("state")) as server:
        yield server


def run_client(code: str, storage: LocalStorage, timeout: int = 120) -> str:
    """Run `code` in a fresh interpreter with the environment every replica gets."""
    from labkit.core.launcher import child_env

    env = child_env(storage.client_env())
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_objects_are_the_files_of_the_bucket_folder(tmp_path):
    store = BucketStore(tmp_path / "gcs", tmp_path / "staging")
    store.create_bucket("bkt")
    store.write("bkt", "a/b/c.txt", b"hello")
    assert (tmp_path / "gcs/bkt/a/b/c.txt").read_bytes() == b"hello"
    assert store.list("bkt", "a/", "/") == ([], ["a/b/"])
    assert store.list("bkt", "a/b") == (["a/b/c.txt"], [])  # a string prefix, as the API means it
    store.make_folder("bkt", "m/")  # TensorFlow's makedirs writes such markers
    assert store.list("bkt", "m/") == (["m/"], [])
    store.write("bkt", "m/x", b"1")
    store.delete("bkt", "m/x")
    assert store.list("bkt", "m/") == (["m/"], [])  # a marker outlives its objects
    store.delete("bkt", "a/b/c.txt")
    assert not (tmp_path / "gcs/bkt/a").exists()  # a folder exists only through its objects
    with pytest.raises(StoreError, match="cannot be held"):
        store.write("bkt", "x/../y", b"")
    with pytest.raises(StoreError, match="does not exist"):
        store.write("nobucket", "x", b"")
    with pytest.raises(StoreError) as precondition:
        store.write("bkt", "once", b"1")
        store.check_generation("bkt", "once", "0")
    assert precondition.value.code == 412


def test_google_cloud_storage_and_gcsfs_read_and_write_the_folder(storage):
    """Each client as a replica would use it: nothing but the environment points it here."""
    out = run_client("""
        import fsspec
        from google.cloud import storage
        client = storage.Client()
        bucket = client.bucket("bkt")
        bucket.blob("gcs/small.txt").upload_from_string(b"from google-cloud-storage")
        big = bucket.blob("gcs/big.bin", chunk_size=256 * 1024)  # a resumable upload in chunks
        big.upload_from_string(bytes(range(256)) * 4096)
        assert big.reload() is None and big.size == 1 << 20
        with client.batch():
            bucket.delete_blob("gcs/small.txt")
        fs = fsspec.filesystem("gs")
        fs.pipe("bkt/fsspec/x.txt", b"from gcsfs")
        with fs.open("bkt/fsspec/big.bin", "wb", block_size=5 * 2**20) as f:
            f.write(b"z" * (6 * 2**20))
        fs.mv("bkt/fsspec/x.txt", "bkt/fsspec/y.txt")
        print(sorted(fs.ls("bkt/fsspec")), fs.cat("bkt/fsspec/y.txt"), fs.cat_file("bkt/gcs/big.bin", 256, 260))
        print([b.name for b in client.list_blobs("bkt", prefix="gcs/")])
    """, storage)
    first, second = out.strip().splitlines()
    assert first == "['bkt/fsspec/big.bin', 'bkt/fsspec/y.txt'] b'from gcsfs' b'\\x00\\x01\\x02\\x03'"
    assert second == "['gcs/big.bin']"
    folder = storage.root / "bkt"
    assert (folder / "fsspec/big.bin").stat().st_size == 6 * 2**20 and not (folder / "gcs/small.txt").exists()


@pytest.mark.slow
def test_tensorflow_gs_reaches_the_folder_through_the_proxy(storage):
    """TensorFlow's own gs:// has no endpoint setting: its libcurl goes through the https proxy
    and trusts the job's CA; model files, summaries and renames all land in the folder."""
    pytest.importorskip("tensorflow")
    run_client("""
        import os
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
        import tensorflow as tf
        tf.io.gfile.makedirs("gs://bkt/tf/sub")
        with tf.io.gfile.GFile("gs://bkt/tf/sub/a.txt", "w") as f:
            f.write("from tensorflow")
        tf.io.gfile.rename("gs://bkt/tf/sub/a.txt", "gs://bkt/tf/sub/b.txt")
        writer = tf.summary.create_file_writer("gs://bkt/tf/logs")
        with writer.as_default():
            tf.summary.scalar("loss", 0.5, step=1)
        writer.flush()
        assert tf.io.gfile.GFile("gs://bkt/tf/sub/b.txt").read() == "from tensorflow"
        tf.io.gfile.rmtree("gs://bkt/tf/sub")
    """, storage)
    folder = storage.root / "bkt" / "tf"
    assert [p.name for p in folder.iterdir()] == ["logs"]  # rmtree removed the folder and its marker
    assert next((folder / "logs").iterdir()).name.startswith("events.out.tfevents")


def test_the_proxy_answers_googles_storage_hosts_and_loopback_stays_direct(storage):
    from labkit.vertex.storage.tls import intercepted

    assert intercepted("storage.googleapis.com") and intercepted("bkt.storage.googleapis.com")
    assert not intercepted("pypi.org") and storage.intercepts_tensorflow
    env = storage.client_env({"no_proxy": "example.internal"})
    assert env["no_proxy"].split(",") == ["127.0.0.1", "localhost", "::1", "example.internal"]
    assert env["STORAGE_EMULATOR_HOST"] == storage.endpoint and env["CURL_CA_BUNDLE"] == storage.ca_bundle


def test_without_a_certificate_a_storage_host_is_refused_not_reached(tmp_path):
    """Where no certificate can be made, a client must not go on to the real Cloud Storage."""
    import socket
    import threading

    from labkit.vertex.storage.server import ApiServer
    from labkit.vertex.storage.tls import ProxyServer

    api = ApiServer(("127.0.0.1", 0), BucketStore(tmp_path / "gcs", tmp_path / "staging"))
    proxy = ProxyServer(("127.0.0.1", 0), api, None)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        with socket.create_connection(proxy.server_address, timeout=10) as s:
            s.sendall(b"CONNECT storage.googleapis.com:443 HTTP/1.1\r\nHost: storage.googleapis.com\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 403")
    finally:
        proxy.shutdown()
        proxy.server_close()
        api.server_close()
