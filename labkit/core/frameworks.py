"""Which optional frameworks are installed, without importing them.

The course must run on a torch-only image (Vertex's prebuilt PyTorch containers) or a TF-only one,
so every framework-specific column asks here first and says plainly why it is skipped.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

_INSTALL_HINT = {
    "torch": "pip install 'labkit[torch]'",
    "tensorflow": "pip install 'labkit[tf]'",
    "google.cloud.aiplatform": "pip install 'labkit[vertex]'",
    "deepspeed": "pip install 'labkit[deepspeed]'",
}
_DISPLAY_NAME = {
    "torch": "PyTorch",
    "tensorflow": "TensorFlow",
    "google.cloud.aiplatform": "google-cloud-aiplatform",
    "deepspeed": "DeepSpeed",
}


class FrameworkMissing(ImportError):
    """Raised when a feature needs a framework this environment does not have."""


def is_installed(module: str) -> bool:
    """True when `module` can be imported (checked with find_spec, nothing is imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing
        return False


def has_torch() -> bool:
    return is_installed("torch")


def has_tf() -> bool:
    return is_installed("tensorflow")


def has_aiplatform() -> bool:
    return is_installed("google.cloud.aiplatform")


def missing_reason(module: str) -> str:
    """A sentence a notebook can print when it skips a column for lack of `module`."""
    name = _DISPLAY_NAME.get(module, module)
    hint = _INSTALL_HINT.get(module, f"pip install {module}")
    return f"{name} is not installed in this environment ({hint}), so its column is skipped."


def require(module: str) -> None:
    """Raise FrameworkMissing with an install hint unless `module` is importable."""
    if not is_installed(module):
        raise FrameworkMissing(missing_reason(module).replace(", so its column is skipped", ""))


@dataclass(frozen=True)
class Frameworks:
    """What this environment can run; notebooks branch on these flags, never on ImportError."""

    torch: bool
    tensorflow: bool
    aiplatform: bool

    @classmethod
    def detect(cls) -> Frameworks:
        return cls(torch=has_torch(), tensorflow=has_tf(), aiplatform=has_aiplatform())
