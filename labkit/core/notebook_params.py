"""A notebook's `parameters` cell: its names and defaults, and the check every way of running a
notebook makes before anything starts (`labkit run`, `labkit course`, a Vertex notebook job).

`check_parameters` refuses a name the notebook does not declare, a value whose type contradicts
the default, and a value outside the domain of a parameter every course notebook shares and
validates the same way when it runs (`scale` is one of `labkit.core.config.SCALES`, `device` one
of `labkit.core.train_config.DEVICES`), so `-p scale huge` fails before a kernel starts, or a
job is submitted, rather than in the notebook's first cell.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

from labkit.core.config import SCALES, ParameterError

# Parameters whose meaning is the same in every notebook that declares them: name -> allowed values.
SHARED_DOMAINS: dict[str, tuple[Any, ...]] = {"scale": SCALES, "device": ("auto", "cpu", "cuda")}


def parse_value(text: str) -> Any:
    """A `-p name value` string as Python: numbers, True/False/None (any case), lists, dicts;
    anything else stays a string, so `-p scale smoke` needs no quotes."""
    lowered = text.strip().lower()
    if lowered in ("true", "false", "none", "null"):
        return {"true": True, "false": False, "none": None, "null": None}[lowered]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def notebook_parameters(path: str | os.PathLike) -> dict[str, Any]:
    """Names and defaults of the notebook's `parameters` cell (empty if it has none). Raises
    ParameterError naming the file when it is not a notebook."""
    import papermill
    from nbformat.reader import NotJSONError

    try:
        params = papermill.inspect_notebook(str(path))
    except NotJSONError as e:
        raise ParameterError("notebook", str(path), "is not a Jupyter notebook: its file is not JSON") from e
    except (KeyError, AttributeError, TypeError, ValueError) as e:  # JSON, but not nbformat's
        raise ParameterError("notebook", str(path), f"is not a Jupyter notebook ({e})") from e
    out = {}
    for name, info in params.items():
        default = info.get("default")
        try:
            out[name] = ast.literal_eval(default) if default is not None else None
        except (ValueError, SyntaxError):
            out[name] = default
    return out


def check_parameters(path: str | os.PathLike, parameters: dict[str, Any],
                     declared: dict[str, Any] | None = None) -> None:
    """Refuse names the notebook does not declare, and values whose type contradicts the default
    (a string or 1.5 where the default is an int, say), before a kernel is started. `declared`:
    the notebook's parameters when already read."""
    declared = notebook_parameters(path) if declared is None else declared
    notebook = Path(path).name
    for name, value in parameters.items():
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none"
            raise ParameterError(name, value, f"is not a parameter of {notebook} (it has: {known})")
        problem = type_problem(declared[name], value)
        if problem:
            raise ParameterError(name, value, f"of {notebook} {problem}")
        check_shared_domain(name, value, notebook)


def check_shared_domain(name: str, value: Any, notebook: str = "the notebook") -> None:
    """Refuse a value of a shared parameter (`SHARED_DOMAINS`) that its notebook would refuse."""
    allowed = SHARED_DOMAINS.get(name)
    if allowed is not None and value not in allowed:
        raise ParameterError(name, value, f"of {notebook} must be one of "
                             + ", ".join(map(repr, allowed)))


def type_problem(default: Any, value: Any) -> str | None:
    """Why `value` cannot replace a parameter whose default is `default` (None: it can). The
    kind of the default decides: a bool takes True/False, an int an integer (not a bool, not
    1.5), a float any number, a string a string; None and containers take anything."""
    if default is None or value is None:
        return None
    if isinstance(default, bool):
        return None if isinstance(value, bool) else f"must be True or False like its default {default!r}"
    if isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else f"must be an integer like its default {default!r}"
    if isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else f"must be a number like its default {default!r}"
    if isinstance(default, str) and not isinstance(value, str):
        return f"must be a string like its default {default!r}"
    return None
