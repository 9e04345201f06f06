"""The course's Jupyter kernel: its name, and whether it is registered here.

Every course notebook names the kernel `KERNEL_NAME` ("labkit", shown as "Python (labkit)"),
which `make setup` registers in the course's environment (`python -m ipykernel install
--sys-prefix --name labkit --display-name "Python (labkit)"`; `--user` on Vertex AI Workbench),
so JupyterLab, papermill, nbval and `labkit run` all start the interpreter that has labkit.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

KERNEL_NAME = "labkit"
KERNEL_DISPLAY_NAME = "Python (labkit)"


class KernelNotFound(FileNotFoundError):
    """The Jupyter kernel a notebook names is not registered in this environment."""


def kernel_install_command(*, user: bool = False) -> str:
    """The command that registers the course kernel for this environment's Python."""
    where = "--user" if user else "--sys-prefix"
    return (f'python -m ipykernel install {where} --name {KERNEL_NAME} '
            f'--display-name "{KERNEL_DISPLAY_NAME}"')


def kernel_spec(name: str = KERNEL_NAME):
    """The registered kernel spec called `name` (jupyter_client's KernelSpec), or None."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        return KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        return None


def notebook_kernel(path: str | os.PathLike) -> str | None:
    """The kernel name a notebook's metadata asks for (None if it names none)."""
    import nbformat

    nb = nbformat.read(os.fspath(path), as_version=4)
    return nb.metadata.get("kernelspec", {}).get("name")


def require_kernel(path: str | os.PathLike) -> str:
    """The kernel `path` names, after checking it is registered here (KernelNotFound, with the
    command that registers it, when not)."""
    name = notebook_kernel(path) or KERNEL_NAME
    if kernel_spec(name) is None:
        hint = (f"; register it with `{kernel_install_command()}` (or run `make setup`)"
                if name == KERNEL_NAME else "")
        raise KernelNotFound(f"{Path(path).name} names the Jupyter kernel {name!r}, which is not "
                             f"registered in this environment{hint}")
    return name


def ensure_kernel() -> bool:
    """Register the course kernel for this Python (in `sys.prefix`) unless it exists; True if
    it was registered now. For containers that pip-install labkit and then run a notebook."""
    if kernel_spec() is not None:
        return False
    from ipykernel.kernelspec import install

    install(kernel_name=KERNEL_NAME, display_name=KERNEL_DISPLAY_NAME, prefix=sys.prefix)
    return True
