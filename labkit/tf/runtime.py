"""Process-level TensorFlow set-up: which devices TF may use, and quiet logs.

TensorFlow by default maps (almost) all memory of every visible GPU when it first touches one.
In a notebook that also runs PyTorch on that GPU this starves torch, so labkit either hides the
GPUs from TF (CPU runs, CI) or switches on memory growth (TF takes memory as it needs it). Both
must happen before TF initialises its devices; `configure` is idempotent and called by every
labkit.tf entry point first. Whether a `device` choice gets the GPUs is `labkit.core.placement`'s
rule for one process (a TF process drives all the GPUs it sees), applied to the GPUs TensorFlow
sees (a plain `pip install tensorflow` sees none even where torch does).
"""

from __future__ import annotations

import os

from labkit.core.config import ParameterError
from labkit.core.placement import place

# Set before tensorflow is imported anywhere through labkit: TF's C++ INFO lines drown output.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_configured: str | None = None
_NO_TF_GPU = ("needs a GPU that TensorFlow can use, and it sees none (on a GPU machine install "
              "TensorFlow's CUDA build: pip install 'labkit[tf-gpu]')")


def configure(device: str = "auto") -> str:
    """Make TF use the CPU only or the GPUs with memory growth, as `labkit.core.placement` places
    one process for `device` on the GPUs TF sees. Returns what TF got: "cpu" or "gpu". Safe to
    call again; the first call decides. `device="cuda"` without a GPU TF can use: ParameterError."""
    global _configured
    import tensorflow as tf

    if _configured is not None:
        return _configured
    gpus = tf.config.list_physical_devices("GPU")
    try:
        on_gpu = place(1, len(gpus), device=device).on_gpu
    except ParameterError:
        if device != "cuda":
            raise
        raise ParameterError("device", device, _NO_TF_GPU) from None  # what TF needs, not torch
    try:
        if not on_gpu:
            tf.config.set_visible_devices([], "GPU")
            _configured = "cpu"
        else:
            # Growth instead of the default grab-everything, so torch keeps what it holds.
            for gpu in gpus:
                tf.config.experimental.set_memory_growth(gpu, True)
            _configured = "gpu"
    except RuntimeError:
        # Devices were initialised earlier in this process (by user code); keep what exists.
        _configured = "gpu" if tf.config.get_visible_devices("GPU") else "cpu"
    if device == "cuda" and _configured != "gpu":
        raise ParameterError("device", device, _NO_TF_GPU)
    return _configured


def sees_gpu() -> bool:
    """Whether TensorFlow can use a GPU here (its CUDA build and a driver it loads). A plain
    `pip install tensorflow` on a GPU machine gives False: its CUDA libraries come with the
    `tensorflow[and-cuda]` extra (`labkit[tf-gpu]`)."""
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))
