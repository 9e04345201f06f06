"""Run by Python at start-up in the replicas of an emulated Vertex job (the emulator puts this
folder first on PYTHONPATH): fsspec's ``gs://`` then reads and writes the local folder that
stands in for Cloud Storage (``LABKIT_LOCAL_GCS``), so a replica finds its bucket the way it
would on Vertex. The sitecustomize this one shadows, if any, runs afterwards."""

import importlib.machinery
import importlib.util
import os
import sys

if os.environ.get("LABKIT_LOCAL_GCS"):
    try:
        from labkit.core.gcs import register_local_gcs

        register_local_gcs()
    except ImportError:  # fsspec missing: gs:// fails as it would without gcsfs
        pass


def _run_shadowed() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_run_shadowed()
