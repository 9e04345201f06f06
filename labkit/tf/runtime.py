"""Process-level TensorFlow set-up: which devices TF may use, and quiet logs.

TensorFlow by default maps (almost) all memory of every visible GPU when it first touches one.
In a notebook that also runs PyTorch on that GPU this starves torch, so labkit either hides the
GPUs from TF (CPU runs, CI) or switches on memory growth (TF takes memory as it needs it). Both
must happen before TF initialises its devices; `configure` is idempotent and called by every
labkit.tf entry point first.
"""

from __future__ import annotations

import os

# Set before tensorflow is imported anywhere through labkit: TF's C++ INFO lines drown output.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_configured: str | None = None


def configure(device: str = "auto") -> str:
    """Make TF use the CPU only (`device="cpu"`) or the GPUs with memory growth ("auto"/"cuda").
    Returns what TF got: "cpu" or "gpu". Safe to call again; the first call decides."""
    global _configured
    import tensorflow as tf

    if _configured is not None:
        return _configured
    gpus = tf.config.list_physical_devices("GPU")
    try:
        if device == "cpu" or not gpus:
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
        from labkit.core.config import ParameterError

        raise ParameterError("device", device, "needs a GPU that TensorFlow can use, and it sees none "
                             "(on a GPU machine install TensorFlow's CUDA build: pip install 'labkit[tf-gpu]')")
    return _configured


def sees_gpu() -> bool:
    """Whether TensorFlow can use a GPU here (its CUDA build and a driver it loads). A plain
    `pip install tensorflow` on a GPU machine gives False: its CUDA libraries come with the
    `tensorflow[and-cuda]` extra (`labkit[tf-gpu]`)."""
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))
