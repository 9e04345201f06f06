"""Writing datasets as sharded TFRecord files, and the record payloads both engines parse.

Payload (one `tf.train.Example` per sample, see `labkit.data.example`):

- images: `index` int64 (the sample id; proves sharding has no duplicates and no gaps),
  `label` int64, `image` bytes (uint8 H×W×C, row-major), `shape` int64 [H, W, C].
- tokens: `index` int64, `tokens` bytes (block_size + 1 ids as little-endian int32).

Shards are named `{prefix}-{i:05d}-of-{n:05d}.tfrecord` (`.gz` / `.zz` when compressed) and
written through fsspec, so `out_dir` may be local, a `/gcs/bucket/...` mount or `gs://bucket/...`.

A shard set is the shards plus `{prefix}-manifest.json` beside them (kind, compression, shard
names, records per shard, total, each shard's SHA-256 as stored, and for images and tokens the
sample index its first record holds), written last: a folder whose manifest is there holds a
complete set. Writing into a folder that already holds a set with the same prefix either
refuses (`if_exists="error"`) or replaces the old set whole (`"replace"`: the old manifest is
removed first, stale shards after the new ones are written), so old and new shards never mix
and the glob `{prefix}-*` never picks up a stale shard. `verify_shards` reads every record
(both CRCs) and checks the shards against the manifest: missing, extra and short shards, a
shard whose records hold other samples than the manifest places there (a shard copied over its
neighbour), and a shard whose bytes are not the ones written (a same-named shard of another
seed): each shard gets one line, for the first of these it shows. A write that fails (a full
disk, an unreachable bucket) names the file and the cause and removes what it wrote.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from labkit.core.config import check_choice, check_int, check_str
from labkit.core.gcs import unmounted, unreachable
from labkit.core.lease import Lease
from labkit.core.progress import progress
from labkit.data.example import ExampleDecodeError, decode_example, encode_example, example_layout
from labkit.data.synthetic import SyntheticImages, SyntheticTokens
from labkit.data.tfrecord import (
    CorruptRecordError,
    RecordWriter,
    expand_paths,
    is_pattern,
    is_remote,
    iter_record_chunks,
    normalize_compression,
    open_binary,
)

SUFFIX = {"": ".tfrecord", "GZIP": ".tfrecord.gz", "ZLIB": ".tfrecord.zz"}
MANIFEST_SUFFIX = "-manifest.json"
IF_EXISTS = ("error", "replace")
INDEXED_KINDS = ("images", "tokens", "encoded_images", "table")  # records that carry their `index`


class ShardSetExistsError(FileExistsError):
    """The output folder already holds a shard set with this prefix (and replacing it was not
    asked for). `.folder`, `.prefix` and `.names` (the files of the old set) say which."""

    def __init__(self, folder: str, prefix: str, names: set[str], advice: str):
        self.folder, self.prefix, self.names = folder, prefix, sorted(names)
        super().__init__(f"{folder} already holds a shard set with prefix {prefix!r} ({len(names)} "
                         f"files, e.g. {self.names[0]}): {advice}")


class ManifestError(ValueError):
    """A manifest is missing where one is required, or is not a labkit shard manifest."""


def manifest_name(prefix: str) -> str:
    return prefix + MANIFEST_SUFFIX


def _shard_pattern(prefix: str) -> re.Pattern:
    """Names of the shards a writer with this prefix makes (any count, any compression)."""
    return re.compile(re.escape(prefix) + r"-\d{5}-of-\d{5}\.tfrecord(\.gz|\.zz)?")


@dataclass(frozen=True)
class ShardConfig:
    """How a dataset is cut into files: `records_per_shard` samples per file (the last one may
    be shorter), optional "GZIP"/"ZLIB" compression, and the file-name `prefix`."""

    records_per_shard: int = 256
    compression: str | None = None
    prefix: str = "data"

    def __post_init__(self) -> None:
        check_int("records_per_shard", self.records_per_shard, minimum=1)
        normalize_compression(self.compression)
        check_str("prefix", self.prefix)
        if "/" in self.prefix:
            raise ValueError(f"parameter 'prefix' must be a file-name prefix, not a path (got {self.prefix!r})")


@dataclass(frozen=True)
class ShardSet:
    """What was written: the shard paths in order and their record counts."""

    paths: list[str]
    counts: list[int]
    kind: str
    compression: str
    bytes_written: int

    @property
    def num_records(self) -> int:
        return sum(self.counts)


def image_example(index: int, image: np.ndarray, label: int) -> bytes:
    """The record payload of one image sample."""
    return encode_example({"index": index, "label": int(label), "image": image.tobytes(),
                           "shape": list(image.shape)})


def token_example(index: int, tokens: np.ndarray) -> bytes:
    """The record payload of one token sequence."""
    return encode_example({"index": index, "tokens": tokens.astype("<i4").tobytes()})


def write_shards(
    out_dir: str | os.PathLike, num_records: int, make_record: Callable[[int], bytes],
    config: ShardConfig, *, kind: str = "raw", if_exists: str = "replace",
) -> ShardSet:
    """Write records `make_record(0..num_records-1)` into shards of `config.records_per_shard`,
    then the manifest. A set with the same prefix already in `out_dir` is replaced whole
    (`if_exists="replace"`) or refused with ShardSetExistsError (`"error"`). An `out_dir` that
    is a file or cannot be written is refused (an OSError naming it) before anything is written,
    and so is a folder another writer holds (`labkit.core.lease.LeaseHeld`, naming it: two
    writers would mix their shards). Shows a progress bar (`labkit.core.progress`)."""
    check_int("num_records", num_records, minimum=1)
    check_choice("if_exists", if_exists, IF_EXISTS)
    out = os.fspath(out_dir)
    comp = normalize_compression(config.compression)
    fs = ShardFolder(out)
    fs.make_writable()
    with Lease(out, name="OUT_DIR"):  # one writer per folder: a second one is refused, naming this one
        old = fs.shard_set_files(config.prefix)
        if old and if_exists == "error":
            raise ShardSetExistsError(out, config.prefix, old, 'write with if_exists="replace" to replace '
                                      "it whole, or choose another folder or prefix")
        manifest_path = join_path(out, manifest_name(config.prefix))
        if manifest_name(config.prefix) in old:  # from here on the folder holds no complete set
            fs.remove(manifest_path)
        n = math.ceil(num_records / config.records_per_shard)
        paths, counts, digests, firsts, total = [], [], [], [], 0
        path = manifest_path
        try:
            with progress(num_records, f"write {kind} shards", unit="record") as bar:
                for s in range(n):
                    path = join_path(out, f"{config.prefix}-{s:05d}-of-{n:05d}{SUFFIX[comp]}")
                    lo, hi = s * config.records_per_shard, min(num_records, (s + 1) * config.records_per_shard)
                    paths.append(path)
                    digest = HashingWriter(open_binary(path, "wb"))
                    with RecordWriter(path, comp, opener=lambda _p, f=digest: f) as w:
                        for i in range(lo, hi):
                            w.write(make_record(i))
                    counts.append(hi - lo)
                    digests.append(digest.hexdigest())
                    firsts.append(lo)
                    total += w.bytes_written
                    bar.update(hi - lo)
            path = manifest_path
            new = {os.path.basename(p) for p in paths}
            for name in sorted(old - new - {manifest_name(config.prefix)}):
                fs.remove(join_path(out, name))
            manifest = {"kind": kind, "compression": comp, "num_records": num_records,
                        "shards": [os.path.basename(p) for p in paths], "counts": counts,
                        "sha256": digests, "shard_config": asdict(config)}
            if kind in INDEXED_KINDS:  # each shard's records hold samples first_index, first_index + 1, ...
                manifest["first_index"] = firsts
            with open_binary(manifest_path, "wb") as f:
                f.write(json.dumps(manifest, indent=1).encode())
        except OSError as e:
            for written in paths:  # an incomplete set: its shards only take space
                with contextlib.suppress(OSError):
                    fs.remove(written)
            raise named_error(e, f"cannot write {path}") from e
        return ShardSet(paths, counts, kind, comp, total)


class HashingWriter:
    """A binary file that hashes every byte written through it: the shard's SHA-256 as stored
    (after compression), which the manifest pins."""

    def __init__(self, f):
        self._f, self._sha = f, hashlib.sha256()

    def write(self, data) -> int:
        n = self._f.write(data)
        self._sha.update(memoryview(data)[:n] if isinstance(n, int) else data)
        return n

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


class _HashingReader:
    """A binary file read through (`readinto` and `read`) hashing every byte: a shard's digest
    taken while its records are verified, without reading it twice."""

    def __init__(self, f):
        self._f, self._sha = f, hashlib.sha256()

    def readinto(self, view) -> int:
        n = self._f.readinto(view)
        if n:
            self._sha.update(view[:n])
        return n

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(size)
        self._sha.update(data)
        return data

    def close(self) -> None:
        self._f.close()

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


def named_error(error: OSError, where: str) -> OSError:
    """`error` as an OSError of the same kind whose message says `where` and its cause on one
    line. Some OSError subclasses (aiohttp's, for one) cannot be built from a message alone:
    those become a plain OSError."""
    cause = error.strerror or (str(error).strip().splitlines() or [type(error).__name__])[0]
    message = f"{where}: {cause}"
    try:
        named = type(error)(message)
    except TypeError:
        named = OSError(message)
    if not isinstance(named, OSError) or str(named) != message:
        named = OSError(message)
    named.errno = error.errno
    return named


def write_image_shards(out_dir, dataset: SyntheticImages, config: ShardConfig = ShardConfig(), *,
                       if_exists: str = "replace") -> ShardSet:
    """Every sample of a SyntheticImages dataset as image Examples in shards."""
    def make(i: int) -> bytes:
        image, label = dataset[i]
        return image_example(i, image, label)

    return write_shards(out_dir, len(dataset), make, config, kind="images", if_exists=if_exists)


def write_token_shards(out_dir, dataset: SyntheticTokens, config: ShardConfig = ShardConfig(), *,
                       if_exists: str = "replace") -> ShardSet:
    """Every sequence of a SyntheticTokens dataset as token Examples in shards."""
    return write_shards(out_dir, len(dataset), lambda i: token_example(i, dataset[i]), config,
                        kind="tokens", if_exists=if_exists)


def write_raw_shards(out_dir, records: Iterable[bytes], num_records: int, config: ShardConfig, *,
                     if_exists: str = "replace") -> ShardSet:
    """Opaque records (benchmarks: fixed-size random payloads) in shards."""
    it = iter(records)
    return write_shards(out_dir, num_records, lambda _i: next(it), config, kind="raw", if_exists=if_exists)


def join_path(directory: str, name: str) -> str:
    return directory.rstrip("/") + "/" + name if is_remote(directory) else os.path.join(directory, name)


class ShardFolder:
    """The few file-system operations a shard set needs, on a local folder (a /gcs/ mount
    included) or an fsspec URL."""

    def __init__(self, path: str):
        self.path = path
        self.remote = is_remote(path)
        if self.remote:
            import fsspec

            self.fs, self.root = fsspec.core.url_to_fs(path)
        elif path.startswith("file://"):
            self.path = path[len("file://"):]

    def is_dir(self) -> bool:
        return self.fs.isdir(self.root) if self.remote else os.path.isdir(self.path)

    def names(self) -> list[str]:
        if self.remote:
            try:
                listed = self.fs.ls(self.root, detail=False)
            except FileNotFoundError:  # a prefix with no objects yet: an empty folder
                return []
            return sorted(os.path.basename(p.rstrip("/")) for p in listed)
        return sorted(os.listdir(self.path))

    def remove(self, path: str) -> None:
        if self.remote:
            self.fs.rm(path)
        else:
            os.remove(path)

    def make_writable(self) -> None:
        """Create the folder if needed and prove a file can be written in it, or raise an
        OSError naming the folder and the cause, before any shard is written. A ``/gcs/`` path
        with no Cloud Storage mount here, or a ``gs://`` bucket that cannot be reached, is
        refused at once (not after a minute of retries)."""
        where = f"cannot write shards into {self.path}"
        reason = unmounted(self.path) or unreachable(self.path)
        if reason:
            raise OSError(f"{where}: {reason}")
        probe_name = f".labkit-write-test-{os.getpid()}"
        if self.remote:
            probe = self.root.rstrip("/") + "/" + probe_name
            try:
                self.fs.makedirs(self.root, exist_ok=True)
                self.fs.pipe_file(probe, b"")
                self.fs.rm(probe)
            except OSError as e:
                raise named_error(e, where) from None
            return
        probe = os.path.join(self.path, probe_name)
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise NotADirectoryError(f"{where}: it is a file, not a folder")
        try:
            os.makedirs(self.path, exist_ok=True)
            with open(probe, "wb"):
                pass
            os.remove(probe)
        except OSError as e:
            raise named_error(e, where) from None

    def shard_set_files(self, prefix: str) -> set[str]:
        """The names in the folder that belong to a shard set with this prefix."""
        pattern = _shard_pattern(prefix)
        return {n for n in self.names() if n == manifest_name(prefix) or pattern.fullmatch(n)}


def read_manifest(path: str | os.PathLike) -> dict:
    """A shard set's manifest, checked: kind, compression, shard names, counts and total."""
    path = os.fspath(path)
    try:
        with open_binary(path, "rb") as f:
            man = json.loads(f.read())
    except FileNotFoundError:
        raise ManifestError(f"no shard manifest at {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ManifestError(f"{path} is not a labkit shard manifest (not JSON: {e})") from None
    shards, counts = (man.get("shards"), man.get("counts")) if isinstance(man, dict) else (None, None)
    if (not isinstance(shards, list) or not isinstance(counts, list) or len(shards) != len(counts)
            or not all(isinstance(n, str) and n and "/" not in n for n in shards)
            or not all(isinstance(c, int) and c >= 0 for c in counts)
            or man.get("num_records") != sum(counts)):
        raise ManifestError(f"{path} is not a labkit shard manifest (it needs 'shards', 'counts' of "
                            f"the same length and 'num_records' equal to their sum)")
    try:
        man["compression"] = normalize_compression(man.get("compression"))
    except ValueError:
        raise ManifestError(f"{path}: unknown compression {man.get('compression')!r}") from None
    digests = man.get("sha256")
    if not isinstance(digests, list) or len(digests) != len(shards) or not all(isinstance(d, str) for d in digests):
        raise ManifestError(f"{path}: 'sha256' must list one digest per shard")
    firsts = man.get("first_index")
    if man.get("kind") in INDEXED_KINDS and (
            not isinstance(firsts, list) or len(firsts) != len(shards)
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in firsts)):
        raise ManifestError(f"{path}: 'first_index' must list one sample index per shard")
    return man


def load_shard_set(directory: str | os.PathLike, prefix: str = "data") -> ShardSet:
    """The shard set a writer left in `directory`, from its manifest (the exact file list, in
    order: safer than a glob, which also matches files that belong to no set)."""
    d = os.fspath(directory)
    man = read_manifest(join_path(d, manifest_name(prefix)))
    return ShardSet([join_path(d, n) for n in man["shards"]], list(man["counts"]), man.get("kind", "raw"),
                    man["compression"], 0)


@dataclass
class VerifyReport:
    """What `verify_shards` found: files and records read (both CRCs checked) and one line per
    problem (a corrupt record with its file and byte offset, a missing, extra or short shard)."""

    files: int = 0
    records: int = 0
    nbytes: int = 0
    manifests: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_shards(paths: str | os.PathLike | Sequence[str | os.PathLike],
                  compression: str | None = None) -> VerifyReport:
    """Read every record of the shards, checking both CRCs, and check them against their
    manifest. A folder is checked against every `*-manifest.json` in it (missing, extra and
    short shards are problems; a folder with no manifest or no shards is bad input). Files and
    globs have their CRCs checked, and their record count too when a manifest beside them lists
    them. Problems are collected in the report; bad input raises (FileNotFoundError,
    ManifestError, or ParameterError for a bad `compression`)."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise ValueError("no shard folder, file or pattern given")
    comp = None if compression is None else normalize_compression(compression)
    report = VerifyReport()
    for item in items:
        path = os.fspath(item)
        folder = ShardFolder(path)
        if not is_pattern(path) and folder.is_dir():
            _verify_folder(folder, comp, report)
            continue
        unlisted = []
        for file in expand_paths(path):
            listed = _listing(file)
            want_comp = comp if comp is not None else (listed[0] if listed else "")
            checked = verify_file(file, want_comp, report)
            if listed and checked is not None and checked.count != listed[1]:
                report.problems.append(_count_problem(file, checked.count, listed[1], listed[2]))
            unlisted += [] if listed else [file]
        report.problems += _incomplete_sets(unlisted)
    return report


_NUMBERED = re.compile(r"^(?P<set>.*)-(?P<i>\d{5})-of-(?P<n>\d{5})(?P<ext>\.tfrecord(\.gz|\.zz)?)$")


def _incomplete_sets(files: list[str]) -> list[str]:
    """Files no manifest lists, named ``PREFIX-00003-of-00025.tfrecord``: the shards of a set of
    25 that is not all there (a write that was interrupted before its manifest), one line per set."""
    sets: dict[tuple[str, int, str], set[int]] = {}
    for file in files:
        m = _NUMBERED.match(file)
        if m:
            sets.setdefault((m["set"], int(m["n"]), m["ext"]), set()).add(int(m["i"]))
    return [f"{prefix}-*-of-{n:05d}{ext}: {len(have)} of the set's {n} shards are here and no manifest lists "
            f"them (a write that did not finish?); missing e.g. {prefix}-{min(set(range(n)) - have):05d}-of-{n:05d}{ext}"
            for (prefix, n, ext), have in sorted(sets.items()) if set(range(n)) - have]


def _listing(file: str) -> tuple[str, int, str] | None:
    """(compression, record count, manifest name) of a shard as a manifest beside it lists it."""
    directory, name = os.path.split(file.rstrip("/"))
    folder = ShardFolder(directory or ".")
    try:
        manifests = [n for n in folder.names() if n.endswith(MANIFEST_SUFFIX)]
    except OSError:
        return None
    for m in manifests:
        try:
            man = read_manifest(join_path(directory or ".", m))
        except ManifestError:
            continue
        if name in man["shards"]:
            return man["compression"], man["counts"][man["shards"].index(name)], m
    return None


def _verify_folder(folder: ShardFolder, comp: str | None, report: VerifyReport) -> None:
    names = folder.names()
    manifests = [n for n in names if n.endswith(MANIFEST_SUFFIX)]
    shard_files = [n for n in names if ".tfrecord" in n and not n.startswith(".")]
    if not manifests:
        if not shard_files:
            raise FileNotFoundError(f"{folder.path} holds no TFRecord shards and no shard manifest")
        files = f"{len(shard_files)} TFRecord file" + ("s" if len(shard_files) != 1 else "")
        raise ManifestError(f"{folder.path} holds {files} but no "
                            f"*{MANIFEST_SUFFIX} to check them against (name the files to check "
                            f"their CRCs only)")
    listed: set[str] = set()
    for m in manifests:
        man = read_manifest(join_path(folder.path, m))
        report.manifests.append(join_path(folder.path, m))
        shard_comp = comp if comp is not None else man["compression"]
        digests = man["sha256"]
        firsts = man.get("first_index") if man.get("kind") in INDEXED_KINDS else None
        for i, (name, want) in enumerate(zip(man["shards"], man["counts"], strict=True)):
            listed.add(name)
            path = join_path(folder.path, name)
            if name not in names:
                report.problems.append(f"{path}: missing (listed in {m} with {want} records)")
                continue
            checked = verify_file(path, shard_comp, report, first_index=None if firsts is None else firsts[i])
            if checked is None:
                continue
            if checked.count != want:
                report.problems.append(_count_problem(path, checked.count, want, m))
            elif checked.misplaced:
                report.problems.append(f"{path}: {checked.misplaced}, where {m} places samples "
                                       f"{firsts[i]}..{firsts[i] + want - 1} (a copy of another shard?)")
            elif checked.sha256 != digests[i]:
                report.problems.append(f"{path}: its contents are not the ones written: SHA-256 "
                                       f"{checked.sha256[:12]}..., {m} says {digests[i][:12]}... "
                                       f"(replaced by another shard set's file of the same name?)")
    for name in shard_files:
        if name not in listed:
            report.problems.append(f"{join_path(folder.path, name)}: extra shard, listed in no manifest "
                                   f"({', '.join(manifests)})")


def _count_problem(path: str, got: int, want: int, manifest: str) -> str:
    what = "short" if got < want else "long"
    return f"{path}: {what}: {got} records, {manifest} says {want}"


@dataclass(frozen=True)
class _Checked:
    """One shard read through: its record count, the SHA-256 of its bytes as stored, and, when
    its records were checked against the sample indices expected, the first one out of place."""

    count: int
    sha256: str
    misplaced: str | None = None


def verify_file(path: str, comp: str, report: VerifyReport, *,
                 first_index: int | None = None) -> _Checked | None:
    """Records in one file with both CRCs checked (and, from `first_index`, each record's
    sample index); None (and a problem) when one is corrupt."""
    count = nbytes = 0
    reader: _HashingReader | None = None

    def opener(p: str):
        nonlocal reader
        reader = _HashingReader(open_binary(p, "rb"))
        return reader

    places = _Places(first_index) if first_index is not None else None
    try:
        for buf, runs in iter_record_chunks(path, compression=comp, opener=opener):
            for first, stride, length, n in runs:
                if places is not None:
                    places.check(buf, first, stride, length, n)
                count += n
                nbytes += length * n
    except CorruptRecordError as e:
        report.problems.append(f"{e} (after {count} good records)")
        return None
    report.files += 1
    report.records += count
    report.nbytes += nbytes
    return _Checked(count, reader.hexdigest() if reader is not None else "",
                    places.problem if places is not None else None)


class _Places:
    """Checks that consecutive records hold samples `first`, `first + 1`, ... (their `index`
    feature), a run of same-layout records at a time; keeps the first record out of place."""

    def __init__(self, first: int):
        self.next = first
        self.record = 0
        self.problem: str | None = None
        self._layout = None

    def check(self, buf, first: int, stride: int, length: int, n: int) -> None:
        if self.problem is not None:
            return
        view = memoryview(buf)
        if self._layout is None:
            self._layout = example_layout(view[first:first + length], varints=("index",)) or False
        layout = self._layout
        if layout and layout.size == length and n > 1:
            rows = np.ndarray((n, length), np.uint8, buf, first, (stride, 1))
            if layout.leading_matches(rows) == n:
                got = layout.int64_column(rows, "index")
                want = np.arange(self.next, self.next + n)
                wrong = np.flatnonzero(got != want)
                if len(wrong):
                    self._out_of_place(int(wrong[0]), int(got[wrong[0]]))
                    return
                self.next += n
                self.record += n
                return
        for s in range(first, first + n * stride, stride):
            try:
                index = int(np.asarray(decode_example(view[s:s + length]).get("index", [-1])).ravel()[0])
            except (ExampleDecodeError, IndexError, ValueError, TypeError):
                index = -1
            if index != self.next:
                self._out_of_place(0, index)
                return
            self.next += 1
            self.record += 1

    def _out_of_place(self, offset: int, found: int) -> None:
        self.record += offset
        self.next += offset
        held = f"sample {found}" if found >= 0 else "no sample index"
        self.problem = f"record {self.record} holds {held}"
