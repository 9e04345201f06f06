"""Running notebooks, and what a running notebook needs; framework-free, below the course layer.

    execute      one notebook headless with papermill (`labkit run`, a Vertex notebook job)
    course_run   every course notebook in order (`labkit course`)
    kernel       the course's Jupyter kernel: its name, whether it is registered
    stderr       a kernel's C/C++ and child-process stderr to the notebook's log file, on request
                 (`route_kernel_stderr()`, first thing in every course notebook); stray stderr
                 found in an executed notebook
    artifacts    where a notebook writes the files it makes
    figures      key figures: a measured result a notebook states and a runner reads back
    markdown     text a Markdown output shows as written (no dollar-sign math)

Importing this package has no side effect: file descriptor 2 changes only when a notebook calls
`route_kernel_stderr()`.
"""

from labkit.notebooks.artifacts import ARTIFACTS_ENV, artifacts_dir
from labkit.notebooks.course_run import course_notebooks, course_parameters, run_course
from labkit.notebooks.execute import NotebookRun, run_notebook, timestamp
from labkit.notebooks.figures import KeyFigure, key_comparison, key_figure, key_ratio
from labkit.notebooks.kernel import KERNEL_DISPLAY_NAME, KERNEL_NAME, KernelNotFound
from labkit.notebooks.stderr import STDERR_TAG, kernel_log_path, route_kernel_stderr

__all__ = [
    "ARTIFACTS_ENV", "KERNEL_DISPLAY_NAME", "KERNEL_NAME", "STDERR_TAG", "KeyFigure", "KernelNotFound",
    "NotebookRun", "artifacts_dir", "course_notebooks", "course_parameters", "kernel_log_path",
    "key_comparison", "key_figure", "key_ratio", "route_kernel_stderr", "run_course", "run_notebook", "timestamp",
]
