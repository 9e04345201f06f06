"""The Cloud Storage requests real clients make, answered from a `BucketStore`.

The JSON API as https://cloud.google.com/storage/docs/json_api/v1 describes it (read
2026-11-28), as far as google-cloud-storage, gcsfs, ``gcloud storage`` and TensorFlow's own
``gs://`` file system use it:

- buckets: get, list, insert;
- objects: get (metadata, or the bytes with ``alt=media``, ranges included), list (prefix,
  delimiter, ``includeTrailingDelimiter``, offsets, paging), delete, patch (answered with the
  object as it is: metadata other than the bytes is not kept), copyTo, rewriteTo, compose;
- uploads (``/upload/storage/v1/b/B/o``): ``uploadType=media``, ``multipart`` and ``resumable``
  (chunks with ``Content-Range``, status queries answered 308 with the ``Range`` received);
- downloads under ``/download/storage/v1/...`` and the plain ``/BUCKET/OBJECT`` form that
  TensorFlow reads through ``storage.googleapis.com``;
- batches (``/batch/storage/v1``, ``multipart/mixed``), as google-cloud-storage's ``batch()``.

Errors carry the API's JSON error body (code, message, reason). ``ifGenerationMatch`` is
honoured on writes and deletes. Anything else gets 501 naming the call, so a client that needs
more fails loudly instead of being answered wrongly.
"""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from labkit.vertex.storage.store import BucketStore, ObjectInfo, StoreError

_JSON_PREFIXES = ("/storage/v1/", "/upload/storage/v1/", "/download/storage/v1/", "/batch/storage/v1")
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
STATS_PATH = "/_labkit/stats"  # GET: `labkit.vertex.storage.network.Counts` as JSON
_CONTENT_RANGE = re.compile(r"^bytes (?:(\d+)-(\d+)|\*)/(\d+|\*)$")


class Uploads:
    """Resumable upload sessions: id -> (bucket, name, staged file, total size or None)."""

    def __init__(self) -> None:
        self.sessions: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()

    def start(self, store: BucketStore, bucket: str, name: str, total: int | None,
              preconditions: dict[str, str | None]) -> str:
        fd, staged = store.staged_file()
        os.close(fd)
        upload_id = secrets.token_hex(12)
        with self.lock:
            self.sessions[upload_id] = {"bucket": bucket, "name": name, "staged": staged,
                                        "total": total, "pre": preconditions}
        return upload_id

    def get(self, upload_id: str) -> dict[str, Any]:
        with self.lock:
            session = self.sessions.get(upload_id)
        if session is None:
            raise StoreError(404, f"No such upload session: {upload_id}", "notFound")
        return session

    def end(self, upload_id: str) -> None:
        with self.lock:
            session = self.sessions.pop(upload_id, None)
        if session and os.path.exists(session["staged"]):
            os.unlink(session["staged"])


class StorageHandler(BaseHTTPRequestHandler):
    """One connection to the local Cloud Storage. The server (or TLS proxy) provides
    ``store`` (a `BucketStore`) and ``uploads`` (`Uploads`) as attributes."""

    protocol_version = "HTTP/1.1"
    server_version = "labkit-local-storage"
    # Headers and body leave as separate writes; with Nagle's algorithm on, a small reply then
    # waits for the client's delayed ACK (40 ms on Linux) on every kept-alive request.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
        if os.environ.get("LABKIT_STORAGE_LOG"):
            print(f"{self.command} {self.path} -> {format % args}", flush=True)

    # ------------------------------------------------------------ plumbing

    @property
    def store(self) -> BucketStore:
        return self.server.store  # type: ignore[attr-defined]

    @property
    def uploads(self) -> Uploads:
        return self.server.uploads  # type: ignore[attr-defined]

    def base_url(self) -> str:
        scheme = "https" if getattr(self.connection, "server_hostname", None) is not None or \
            type(self.connection).__name__ == "SSLSocket" else "http"
        return f"{scheme}://{self.headers.get('Host', 'localhost')}"

    def body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = io.BytesIO()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out.getvalue()
                out.write(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def body_to(self, f, offset: int) -> int:
        """Stream the request body into file `f` from `offset`; returns the bytes written."""
        f.seek(offset)
        f.truncate()
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = self.body()
            f.write(data)
            return len(data)
        left = int(self.headers.get("Content-Length") or 0)
        written = left
        while left > 0:
            chunk = self.rfile.read(min(1 << 20, left))
            if not chunk:
                break
            f.write(chunk)
            left -= len(chunk)
        return written - left

    def send(self, code: int, payload: Any = None, headers: dict[str, str] | None = None,
             content_type: str = "application/json; charset=UTF-8") -> None:
        data = b"" if payload is None else payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(code)
        if payload is not None:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD" and data:
            self.wfile.write(data)

    def error(self, code: int, message: str, reason: str = "invalid") -> None:
        self.send(code, {"error": {"code": code, "message": message,
                                   "errors": [{"message": message, "domain": "global", "reason": reason}]}})

    def object_json(self, info: ObjectInfo) -> dict[str, Any]:
        crc, md5 = self.store.hashes(info)
        quoted = quote(info.name, safe="")
        base = self.base_url()
        return {"kind": "storage#object", "id": f"{info.bucket}/{info.name}/{info.generation}",
                "selfLink": f"{base}/storage/v1/b/{info.bucket}/o/{quoted}",
                "mediaLink": f"{base}/download/storage/v1/b/{info.bucket}/o/{quoted}"
                             f"?generation={info.generation}&alt=media",
                "name": info.name, "bucket": info.bucket, "generation": str(info.generation),
                "metageneration": "1", "contentType": "application/octet-stream",
                "storageClass": "STANDARD", "size": str(info.size), "md5Hash": md5, "crc32c": crc,
                "etag": f"CL{info.generation}", "timeCreated": info.updated, "updated": info.updated,
                "timeStorageClassUpdated": info.updated}

    def bucket_json(self, bucket: str) -> dict[str, Any]:
        when = ObjectInfo(bucket, "", 0, self.store.bucket_created(bucket), self.store.root).updated
        return {"kind": "storage#bucket", "id": bucket, "name": bucket, "projectNumber": "0",
                "metageneration": "1", "location": "US-CENTRAL1", "locationType": "region",
                "storageClass": "STANDARD", "etag": "CAE=", "timeCreated": when, "updated": when,
                "selfLink": f"{self.base_url()}/storage/v1/b/{bucket}"}

    # ------------------------------------------------------------ dispatch

    def do_GET(self) -> None:
        self.dispatch()

    def do_HEAD(self) -> None:
        self.dispatch()

    def do_POST(self) -> None:
        self.dispatch()

    def do_PUT(self) -> None:
        self.dispatch()

    def do_DELETE(self) -> None:
        self.dispatch()

    def do_PATCH(self) -> None:
        self.dispatch()

    def dispatch(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        if url.path == STATS_PATH:  # the server's own counts, neither delayed nor counted
            return self.send(200, self.server.counts.snapshot())  # type: ignore[attr-defined]
        if not isinstance(self, _SubRequest):  # a batch is one request on the wire
            self.server.counts.add("requests")  # type: ignore[attr-defined]
            self.server.network.wait_for_request()  # type: ignore[attr-defined]
        try:
            if url.path.startswith("/batch/storage/v1"):
                self.batch()
            elif url.path.startswith(_JSON_PREFIXES):
                self.json_api(url.path, query)
            else:
                self.xml_read(url.path, query)
        except StoreError as e:
            self.error(e.code, str(e), e.reason)
        except (ValueError, KeyError, json.JSONDecodeError) as e:
            self.error(400, f"{type(e).__name__}: {e}")

    def json_api(self, path: str, query: dict[str, str]) -> None:
        kind = path.lstrip("/").split("/", 1)[0]  # storage, upload or download
        rest = path.split("/storage/v1/", 1)[1]
        # Split before unquoting: an object name's slashes arrive as %2F.
        segs = rest.split("/")
        method = self.command
        if segs[0] != "b":
            raise StoreError(501, f"{method} {path} is not emulated by the local Cloud Storage",
                             "notImplemented")
        if kind == "upload" and len(segs) == 3 and segs[2] == "o" and method in ("POST", "PUT", "DELETE"):
            return self.upload(unquote(segs[1]), query)
        if len(segs) == 1:
            return self.buckets(query)
        bucket = unquote(segs[1])
        if len(segs) == 2 and method == "GET":
            return self.send(200, self.bucket_json(self.store.require_bucket(bucket).name))
        if len(segs) == 3 and segs[2] == "o" and method == "GET":
            return self.list_objects(bucket, query)
        if len(segs) >= 4 and segs[2] == "o":
            tail = segs[3:]
            if len(tail) == 2 and tail[1] == "compose" and method == "POST":
                return self.compose(bucket, unquote(tail[0]))
            if len(tail) == 4 and tail[1] == "moveTo" and tail[2] == "o" and method == "POST":
                return self.move(bucket, unquote(tail[0]), unquote(tail[3]))
            if len(tail) == 6 and tail[1] in ("copyTo", "rewriteTo") and tail[2] == "b" \
                    and tail[4] == "o" and method == "POST":
                return self.copy(bucket, unquote(tail[0]), unquote(tail[3]), unquote(tail[5]),
                                 rewrite=tail[1] == "rewriteTo")
            return self.one_object(bucket, unquote("/".join(tail)), query, download=kind == "download")
        raise StoreError(501, f"{method} {path} is not emulated by the local Cloud Storage", "notImplemented")

    # ------------------------------------------------------------ buckets

    def buckets(self, query: dict[str, str]) -> None:
        if self.command == "GET":
            items = [self.bucket_json(b) for b in self.store.buckets()]
            return self.send(200, {"kind": "storage#buckets", **({"items": items} if items else {})})
        if self.command == "POST":
            name = json.loads(self.body() or b"{}").get("name", "")
            self.store.create_bucket(name)
            return self.send(200, self.bucket_json(name))
        raise StoreError(501, f"{self.command} on buckets is not emulated", "notImplemented")

    # ------------------------------------------------------------ objects

    def one_object(self, bucket: str, name: str, query: dict[str, str], download: bool) -> None:
        if self.command in ("GET", "HEAD"):
            self.store.check_generation(bucket, name, query.get("ifGenerationMatch"),
                                        query.get("ifGenerationNotMatch"))
            info = self.store.info(bucket, name)
            if download or query.get("alt") == "media":
                return self.media(info)
            return self.send(200, self.object_json(info))
        if self.command == "DELETE":
            self.store.check_generation(bucket, name, query.get("ifGenerationMatch"))
            self.store.delete(bucket, name)
            return self.send(204)
        if self.command in ("PATCH", "PUT"):
            self.body()
            return self.send(200, self.object_json(self.store.info(bucket, name)))
        raise StoreError(501, f"{self.command} on an object is not emulated", "notImplemented")

    def media(self, info: ObjectInfo) -> None:
        crc, md5 = self.store.hashes(info)
        headers = {"x-goog-generation": str(info.generation), "x-goog-metageneration": "1",
                   "x-goog-stored-content-length": str(info.size), "x-goog-storage-class": "STANDARD",
                   "x-goog-stored-content-encoding": "identity", "ETag": f'"{md5}"',
                   "Accept-Ranges": "bytes", "Last-Modified": self.date_time_string(info.generation / 1e9)}
        start, end, code = 0, info.size, 200
        wanted = self.headers.get("Range")
        if wanted:
            m = _RANGE.match(wanted.strip())
            if not m or (not m.group(1) and not m.group(2)):
                raise StoreError(400, f"Invalid Range header: {wanted}")
            if m.group(1):
                start = int(m.group(1))
                end = min(info.size, int(m.group(2)) + 1) if m.group(2) else info.size
            else:
                start = max(0, info.size - int(m.group(2)))
            if start >= info.size and info.size > 0 or start > end:
                return self.send(416, {"error": {"code": 416, "message": "Requested range not satisfiable"}},
                                 {"Content-Range": f"bytes */{info.size}"})
            code = 206
            headers["Content-Range"] = f"bytes {start}-{max(start, end - 1)}/{info.size}"
        else:
            headers["x-goog-hash"] = f"crc32c={crc},md5={md5}"
        self.send_response(code)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            counts, started = self.server.counts, time.perf_counter()  # type: ignore[attr-defined]
            counts.add("media_requests")
            for chunk in self.server.network.pace(self.store.read(info, start, end), started):  # type: ignore[attr-defined]
                self.wfile.write(chunk)
                counts.add("media_bytes", len(chunk))

    def list_objects(self, bucket: str, query: dict[str, str]) -> None:
        prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
        names, prefixes = self.store.list(
            bucket, prefix, delimiter, include_trailing=query.get("includeTrailingDelimiter") == "true",
            start_offset=query.get("startOffset", ""), end_offset=query.get("endOffset", ""))
        entries = sorted([(n, "item") for n in names] + [(p, "prefix") for p in prefixes])
        token = query.get("pageToken", "")
        if token:
            entries = [e for e in entries if e[0] > token]
        page = int(query.get("maxResults") or 1000)
        out: dict[str, Any] = {"kind": "storage#objects"}
        if len(entries) > page:
            entries = entries[:page]
            out["nextPageToken"] = entries[-1][0]
        items = []
        for name, kind in entries:
            if kind == "item":
                try:
                    items.append(self.object_json(self.store.info(bucket, name)))
                except StoreError:  # deleted while listing
                    continue
        found_prefixes = [n for n, kind in entries if kind == "prefix"]
        if items:
            out["items"] = items
        if found_prefixes:
            out["prefixes"] = found_prefixes
        self.send(200, out)

    def copy(self, src_bucket: str, src: str, dst_bucket: str, dst: str, *, rewrite: bool) -> None:
        self.body()
        query = {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}
        self.store.check_generation(dst_bucket, dst, query.get("ifGenerationMatch"))
        info = self.store.copy(src_bucket, src, dst_bucket, dst)
        if not rewrite:
            return self.send(200, self.object_json(info))
        self.send(200, {"kind": "storage#rewriteResponse", "totalBytesRewritten": str(info.size),
                        "objectSize": str(info.size), "done": True, "resource": self.object_json(info)})

    def move(self, bucket: str, src: str, dst: str) -> None:
        """objects.move: a rename within the bucket."""
        self.body()
        query = {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}
        self.store.check_generation(bucket, dst, query.get("ifGenerationMatch"))
        info = self.store.copy(bucket, src, bucket, dst)
        self.store.delete(bucket, src)
        self.send(200, self.object_json(info))

    def compose(self, bucket: str, dst: str) -> None:
        body = json.loads(self.body() or b"{}")
        sources = [s["name"] for s in body.get("sourceObjects", [])]
        if not sources:
            raise StoreError(400, "compose: sourceObjects is empty")
        self.send(200, self.object_json(self.store.compose(bucket, sources, dst)))

    # ------------------------------------------------------------ uploads

    def preconditions(self, query: dict[str, str]) -> dict[str, str | None]:
        return {"match": query.get("ifGenerationMatch")}

    def upload(self, bucket: str, query: dict[str, str]) -> None:
        self.store.require_bucket(bucket)
        kind = query.get("uploadType", "media")
        if "upload_id" in query:
            return self.resume(query["upload_id"])
        if kind == "media":
            name = query.get("name") or ""
            self.store.check_generation(bucket, name, query.get("ifGenerationMatch"))
            fd, staged = self.store.staged_file()
            with os.fdopen(fd, "wb") as f:
                self.body_to(f, 0)
            return self.send(200, self.object_json(self.store.commit(bucket, name, staged)))
        if kind == "multipart":
            meta, data = self.multipart(self.body())
            name = meta.get("name") or query.get("name") or ""
            self.store.check_generation(bucket, name, query.get("ifGenerationMatch"))
            return self.send(200, self.object_json(self.store.write(bucket, name, data)))
        if kind == "resumable":
            body = self.body()
            meta = json.loads(body) if body.strip() else {}
            name = meta.get("name") or query.get("name") or ""
            self.store.path_of(bucket, name)  # a name the bucket folder can hold
            total = self.headers.get("X-Upload-Content-Length")
            upload_id = self.uploads.start(self.store, bucket, name, int(total) if total else None,
                                           self.preconditions(query))
            location = (f"{self.base_url()}/upload/storage/v1/b/{quote(bucket, safe='')}/o"
                        f"?uploadType=resumable&upload_id={upload_id}")
            return self.send(200, {}, {"Location": location, "X-GUploader-UploadID": upload_id})
        raise StoreError(400, f"uploadType={kind} is not an upload type")

    def resume(self, upload_id: str) -> None:
        session = self.uploads.get(upload_id)
        if self.command == "DELETE":
            self.uploads.end(upload_id)
            return self.send(499)
        staged = session["staged"]
        size = os.path.getsize(staged)
        header = self.headers.get("Content-Range")
        total = session["total"]
        offset = size
        if header:
            m = _CONTENT_RANGE.match(header.strip())
            if not m:
                raise StoreError(400, f"Invalid Content-Range: {header}")
            if m.group(3) != "*":
                total = int(m.group(3))
            if m.group(1) is not None:
                offset = int(m.group(1))
                if offset > size:
                    raise StoreError(400, f"upload {upload_id}: bytes from {offset} sent, only {size} received")
        elif int(self.headers.get("Content-Length") or 0):
            offset, total = 0, int(self.headers["Content-Length"])
        with open(staged, "r+b") as f:
            size = offset + self.body_to(f, offset)
        if total is None or size < total:
            headers = {"Range": f"bytes=0-{size - 1}"} if size else {}
            return self.send(308, None, headers)
        if size > total:
            raise StoreError(400, f"upload {upload_id}: {size} bytes received for an object of {total}")
        with self.uploads.lock:
            self.uploads.sessions.pop(upload_id, None)
        self.store.check_generation(session["bucket"], session["name"], session["pre"].get("match"))
        info = self.store.commit(session["bucket"], session["name"], staged)
        self.send(200, self.object_json(info))

    def multipart(self, body: bytes) -> tuple[dict[str, Any], bytes]:
        """(metadata, bytes) of a ``multipart/related`` upload (CRLF or bare LF line ends, as
        clients write them)."""
        m = re.search(r'boundary="?([^";]+)"?', self.headers.get("Content-Type", ""))
        if not m:
            raise ValueError("multipart upload without a boundary in its Content-Type")
        parts = body.split(b"--" + m.group(1).encode())[1:]
        parts = [p for p in parts if not p.startswith(b"--")]
        if len(parts) < 2:
            raise ValueError("multipart upload needs a metadata part and a media part")

        def content(part: bytes) -> bytes:
            data = (re.split(rb"\r?\n\r?\n", part, maxsplit=1) + [b""])[1]
            # The line break before the next boundary belongs to the boundary.
            return data[:-2] if data.endswith(b"\r\n") else data[:-1] if data.endswith(b"\n") else data

        return json.loads(content(parts[0]) or b"{}"), content(parts[1])

    # ------------------------------------------------------------ XML-style reads and batches

    def xml_read(self, path: str, query: dict[str, str]) -> None:
        bucket, _, name = path.lstrip("/").partition("/")
        if self.command not in ("GET", "HEAD") or not bucket or not name:
            raise StoreError(501, f"{self.command} {path} is not emulated by the local Cloud Storage",
                             "notImplemented")
        self.media(self.store.info(unquote(bucket), unquote(name)))

    def batch(self) -> None:
        ctype = self.headers.get("Content-Type", "")
        m = re.search(r'boundary="?([^";]+)"?', ctype)
        if not m:
            raise StoreError(400, "batch request without a multipart boundary")
        boundary = m.group(1).encode()
        body = self.body()
        replies = []
        for part in body.split(b"--" + boundary):
            if part.strip() in (b"", b"--"):
                continue
            head, inner = (re.split(rb"\r?\n\r?\n", part.lstrip(b"\r\n"), maxsplit=1) + [b""])[:2]
            content_id = re.search(rb"Content-ID:\s*<?([^>\r\n]+)>?", head, re.I)
            replies.append((content_id.group(1).decode() if content_id else "", self.sub_request(inner)))
        out_boundary = "batch_" + secrets.token_hex(8)
        chunks = []
        for content_id, reply in replies:
            chunks.append(f"--{out_boundary}\r\nContent-Type: application/http\r\n"
                          f"Content-ID: <response-{content_id}>\r\n\r\n".encode() + reply + b"\r\n")
        chunks.append(f"--{out_boundary}--\r\n".encode())
        self.send(200, b"".join(chunks), content_type=f"multipart/mixed; boundary={out_boundary}")

    def sub_request(self, raw: bytes) -> bytes:
        """Run one request of a batch through this handler's logic; its HTTP reply as bytes."""
        return _SubRequest(raw, self).reply()


class _SubRequest(StorageHandler):
    """A request inside a batch, handled by the same code as a real one."""

    def __init__(self, raw: bytes, outer: StorageHandler):  # noqa: D107 - no socket to set up
        self.server = outer.server
        self.connection = outer.connection
        self.rfile = io.BytesIO(raw.lstrip(b"\r\n"))
        self.wfile = io.BytesIO()
        self.client_address = outer.client_address
        self.outer_headers = outer.headers
        self.close_connection = True
        self.raw_requestline = self.rfile.readline(65537)
        self.request_version = "HTTP/1.1"

    def base_url(self) -> str:
        return f"{'https' if type(self.connection).__name__ == 'SSLSocket' else 'http'}://" \
               f"{self.outer_headers.get('Host', 'localhost')}"

    def reply(self) -> bytes:
        if not self.parse_request():
            return self.wfile.getvalue()
        self.dispatch()
        return self.wfile.getvalue()
