"""The local Cloud Storage of an emulated job: a server process on loopback, and what a
replica's environment needs to reach it.

`LocalStorage(root, workdir)` starts ``python -m labkit.vertex.storage`` (a process of its own, so
a replica's large uploads never compete with the emulator for one interpreter) and waits until
it listens. `client_env()` is what every replica gets, each setting the one its client
documents for an emulator or a proxy:

- ``STORAGE_EMULATOR_HOST`` (google-cloud-storage, gcsfs), and ``FSSPEC_GS_TOKEN=anon`` so gcsfs
  does not spend seconds looking for credentials a local server does not check;
- ``CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE`` (``gcloud storage``);
- ``https_proxy`` + ``CURL_CA_BUNDLE`` + ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` (TensorFlow's own
  ``gs://``: `labkit.vertex.storage.tls`), with ``no_proxy`` keeping loopback (the replicas'
  own gRPC and gloo addresses) direct.

The server ends with the process that started it (`labkit.core.launcher.Process`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

from labkit.vertex.storage.api import STATS_PATH, StorageHandler, Uploads
from labkit.vertex.storage.network import Counts, Network
from labkit.vertex.storage.store import BucketStore

READY_TIMEOUT_S = 60.0
LOOPBACK = ("127.0.0.1", "localhost", "::1")
TOKEN = "labkit-emulated-storage"  # TensorFlow sends it as its bearer token; nothing checks it


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, store: BucketStore, network: Network | None = None):
        super().__init__(address, StorageHandler)
        self.store = store
        self.uploads = Uploads()
        self.network = network or Network()
        self.counts = Counts()


def serve(root: Path, state: Path, ready_file: Path, network: Network | None = None) -> None:
    """Serve the buckets under `root` until killed, answering as `network` says; write the
    ports to `ready_file`."""
    import threading

    from labkit.vertex.storage.tls import ProxyServer, make_authority

    store = BucketStore(root, state / "staging")
    api = ApiServer(("127.0.0.1", 0), store, network)
    made = make_authority(state / "tls")
    proxy = ProxyServer(("127.0.0.1", 0), api, made[:2] if made else None)
    for server in (api, proxy):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    info = {"port": api.server_address[1], "proxy_port": proxy.server_address[1],
            "ca_bundle": str(made[2]) if made else None, "pid": os.getpid()}
    tmp = ready_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, ready_file)
    while True:
        time.sleep(3600)


def server_stats(endpoint: str) -> dict[str, int]:
    """The counts (`labkit.vertex.storage.network.Counts`) of the local server at `endpoint`
    (``http://127.0.0.1:PORT``, as ``STORAGE_EMULATOR_HOST`` names it to a replica)."""
    import urllib.request

    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, never a proxy
    with direct.open(endpoint + STATS_PATH, timeout=30) as reply:
        return json.loads(reply.read())


class LocalStorage:
    """A running local Cloud Storage over the bucket folders in `root`; its working files
    (upload staging, the job's certificate authority) live in `state`. `network` sets the
    latency and stream rate it answers with (default: none added)."""

    def __init__(self, root: str | os.PathLike, state: str | os.PathLike, network: Network | None = None):
        from labkit.core.launcher import Process, ProcessSpec, child_env

        self.root, self.state = Path(root).resolve(), Path(state).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.state.mkdir(parents=True, exist_ok=True)
        ready = self.state / "ready.json"
        ready.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "labkit.vertex.storage", "--root", str(self.root),
                "--state", str(self.state), "--ready-file", str(ready), *(network or Network()).argv()]
        self.process = Process(ProcessSpec("local Cloud Storage", argv, child_env(),
                                           log_path=self.state / "server.log"))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.process.tail(800).strip().splitlines()
                self.process.close()
                raise RuntimeError("the local Cloud Storage server did not start"
                                   + (f": {tail[-1]}" if tail else ""))
            time.sleep(0.02)
        info = json.loads(ready.read_text())
        self.port, self.proxy_port, self.ca_bundle = info["port"], info["proxy_port"], info["ca_bundle"]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def intercepts_tensorflow(self) -> bool:
        """Whether TensorFlow's ``gs://`` reaches this server (a certificate could be made);
        if not, its requests to Google's storage hosts are refused instead."""
        return self.ca_bundle is not None

    def client_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The variables that point every Cloud Storage client at this server."""
        base = os.environ if base is None else base
        proxy = f"http://127.0.0.1:{self.proxy_port}"
        keep = [h for h in (base.get("no_proxy") or base.get("NO_PROXY") or "").split(",") if h]
        no_proxy = ",".join(dict.fromkeys([*LOOPBACK, *keep]))
        # gcsfs would otherwise ask the Storage Control gRPC API each bucket's layout (minutes
        # of retries against a JSON-only server); its flag turns that experiment off.
        env = {"STORAGE_EMULATOR_HOST": self.endpoint, "FSSPEC_GS_TOKEN": "anon",
               "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
               "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": f"{self.endpoint}/storage/v1/",
               "https_proxy": proxy, "HTTPS_PROXY": proxy, "no_proxy": no_proxy, "NO_PROXY": no_proxy,
               "GOOGLE_AUTH_TOKEN_FOR_TESTING": TOKEN}
        if self.ca_bundle:
            env |= {"CURL_CA_BUNDLE": self.ca_bundle, "REQUESTS_CA_BUNDLE": self.ca_bundle,
                    "SSL_CERT_FILE": self.ca_bundle}
        return env

    def stats(self) -> dict[str, int]:
        """Requests answered so far, downloads among them and their bytes."""
        return server_stats(self.endpoint)

    def close(self) -> None:
        self.process.close()

    def __enter__(self) -> LocalStorage:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit.vertex.storage",
                                     description="Serve local bucket folders as Cloud Storage on loopback.")
    parser.add_argument("--root", required=True, help="folder holding one folder per bucket")
    parser.add_argument("--state", required=True, help="folder for upload staging and certificates")
    parser.add_argument("--ready-file", required=True, help="written with the ports once listening")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="wait before answering each request")
    parser.add_argument("--stream-mb-s", type=float, default=None, help="cap on each download's rate (MB/s)")
    args = parser.parse_args(argv)
    serve(Path(args.root), Path(args.state), Path(args.ready_file), Network(args.latency_ms, args.stream_mb_s))
    return 0
