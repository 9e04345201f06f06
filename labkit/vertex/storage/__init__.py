"""A local Cloud Storage for emulated jobs: buckets are folders (`store`), served on loopback
through the JSON API the real clients speak (`api`), to TensorFlow's ``gs://`` through an HTTPS
proxy (`tls`), started and pointed at by `server.LocalStorage`, with the latency and stream
rate it answers with (`network`). Framework-free: the standard
library, plus `cryptography` (or the ``openssl`` command) for the proxy's certificate."""

from labkit.vertex.storage.server import LocalStorage
from labkit.vertex.storage.store import BucketStore, StoreError

__all__ = ["BucketStore", "LocalStorage", "StoreError"]
