"""Shared fixtures and the rules for the `gpu` and `cloud` markers.

Collecting the tests imports no framework: a test module that needs torch, TensorFlow or the
Vertex AI client imports it in a module-scoped autouse fixture (`global` names, then
`pytest.importorskip`), so a run that selects none of its tests (`make check -k ...`) never pays
for it. The CUDA probe behind `gpu` runs only when a `gpu` test is about to run.

What keeps the fast tier fast besides: leases skip their settling pause (`_no_lease_settle`),
each pytest-xdist worker's frameworks compute on its share of the cores
(`_frameworks_share_the_cores`), and a finished process exits without a last walk of its heap
(`pytest_unconfigure`).
"""

from __future__ import annotations

import functools
import gc
import os
import sys
import textwrap
from pathlib import Path

import pytest

from labkit.core import devices, gcp, gcs, lease

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO / "notebooks"
RESULTS_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "results"  # made-up results files
# The test whose lease keeps `lease.SETTLE_S` (see `_no_lease_settle`): the lease's own first one.
KEEP_LEASE_SETTLE = frozenset({"test_the_lease_names_its_holder_and_goes_when_released"})
SHIPPED_SETTLE_S = lease.SETTLE_S


def recipe_env(**extra: str) -> dict[str, str]:
    """Environment for a recipe run as a learner runs it: this checkout importable, one thread
    per process (several share the cores), and no rendezvous variables of an enclosing job."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def launch_output(r) -> str:
    """What a failed recipe or torchrun launch printed that explains it: the workers' own lines
    first ("[rankN]: ..." under torchrun, their tracebacks), then the end of stdout and stderr.
    torchrun's closing ChildFailedError report, all a plain tail shows, names no cause."""
    workers = [line for line in r.stderr.splitlines() if line.startswith("[rank")]
    return "\n".join(workers[-60:] + ["---"]) + "\n" + r.stdout[-2000:] + r.stderr[-2000:]


def child_pids(pid: int) -> list[int]:
    """Processes whose parent is `pid` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def pytest_collection_modifyitems(config, items):
    no_cloud = pytest.mark.skip(reason="needs Google Cloud credentials, project, region and bucket")
    cloud_ready = gcp.detect().ready  # environment and gcloud's files: no import, no network
    for item in items:
        if "cloud" in item.keywords and not cloud_ready:
            item.add_marker(no_cloud)


@functools.cache
def _cuda_visible() -> bool:
    return devices.cuda_available()  # imports torch: asked once, by the first `gpu` test to run


def pytest_runtest_setup(item):
    if "gpu" in item.keywords and not _cuda_visible():
        pytest.skip("needs a CUDA GPU (none visible to torch here)")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """The run is over: set every object aside from the collector before the interpreter exits.
    Its shutdown collections would otherwise walk torch's, TensorFlow's and the Vertex AI client's
    objects for seconds (3 s with all three loaded), and a pytest-xdist run waits for each
    worker to exit. Objects are still freed as their references go; only cycles are left."""
    gc.freeze()


@pytest.fixture(scope="session", autouse=True)
def _no_folder_under_gcs():
    """A test must never write under /gcs on a machine without a Cloud Storage mount there: the
    files would stay on that machine's disk (labkit refuses such paths; the emulator maps them
    to a folder of its own)."""
    mount = Path(gcs.GCS_MOUNT)
    before = set(mount.iterdir()) if mount.is_dir() else set()
    yield
    after = set(mount.iterdir()) if mount.is_dir() else set()
    if after - before and not os.path.ismount(mount):
        pytest.fail(f"the tests left {sorted(map(str, after - before))} under {mount}", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _no_lease_settle():
    """Every lease taken in this process (a checkpoint folder, a shard set, a course run), from
    module fixtures too, skips the pause before its read-back: the pause lets a writer racing on
    Cloud Storage land, no test races one, and the fast tier's 190-odd takes slept 39 s."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lease, "SETTLE_S", 0.0)
        yield


@pytest.fixture(autouse=True)
def _lease_settle_as_shipped(request):
    """The tests in `KEEP_LEASE_SETTLE` take their leases with the shipped pause."""
    if request.node.originalname in KEEP_LEASE_SETTLE:
        request.getfixturevalue("monkeypatch").setattr(lease, "SETTLE_S", SHIPPED_SETTLE_S)


def _threads_per_worker() -> int | None:
    """Each pytest-xdist worker's share of the cores, or None outside xdist (one process)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, devices.usable_cpu_count() // workers) if workers > 1 else None


THREADS_PER_WORKER = _threads_per_worker()


@pytest.fixture(autouse=True)
def _frameworks_share_the_cores():
    """Under pytest-xdist, torch and TensorFlow in a worker compute on its share of the cores, as
    `recipe_env` gives a recipe's processes: each would otherwise start a thread per core, and
    workers' threads that outnumber the cores wait on each other at every parallel op (the
    framework tests took nearly three times the CPU). Set in-process, once a test module has
    imported the framework: subprocesses and notebook kernels keep their defaults. A test may
    set its own count; the next test starts from this share again."""
    if THREADS_PER_WORKER is None:
        return
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads") and torch.get_num_threads() != THREADS_PER_WORKER:
        torch.set_num_threads(THREADS_PER_WORKER)
    tf = sys.modules.get("tensorflow")
    if tf is not None and hasattr(tf, "config") and tf.config.threading.get_intra_op_parallelism_threads() == 0:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(THREADS_PER_WORKER)
        except RuntimeError:
            pass  # TensorFlow already ran an op in this worker: its pool is fixed now


@pytest.fixture
def hide_frameworks(tmp_path):
    """Environment for a subprocess in which the named top-level modules cannot be imported, as
    on an image that lacks them (e.g. Vertex's torch-only container): `env = hide_frameworks("tensorflow")`."""

    def make(*modules: str) -> dict[str, str]:
        site = tmp_path / ("hidden-" + "-".join(modules))  # one per set: several may run at once
        site.mkdir(exist_ok=True)
        # A None entry in sys.modules is Python's own "not importable" marker: `import x`
        # raises ModuleNotFoundError and importlib.util.find_spec("x") returns None, exactly as
        # when the package is absent (libraries that probe for it keep working).
        (site / "sitecustomize.py").write_text(textwrap.dedent(f"""
            import sys
            for _name in {tuple(modules)!r}:
                sys.modules[_name] = None
        """))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO), env.get("PYTHONPATH", "")])
        return env

    return make


@pytest.fixture
def python() -> str:
    return sys.executable
