"""A notebook's `parameters` cell: its names and defaults, and the check every way of running a
notebook makes before anything starts (`labkit run`, `labkit course`, a Vertex notebook job).

`check_parameters` refuses a name the notebook does not declare, a value whose type contradicts
the default, and a value outside the domain of a parameter every course notebook shares and
validates the same way when it runs (`scale` is one of `labkit.core.config.SCALES`, `device` one
of `labkit.core.placement.DEVICES`), so `-p scale huge` fails before a kernel starts, or a
job is submitted, rather than in the notebook's first cell.

A value's kind comes from the parameter's default. For a default of None it comes from the
parameter's annotation (`steps: Optional[int] = None`), else from the same name's default in
the other course notebooks beside it (a name means one thing across the course: `steps` is an
integer everywhere), else the value must at least be a single value, not a list or a dict.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

from labkit.core.config import SCALES, ParameterError
from labkit.core.placement import DEVICES

# Parameters whose meaning is the same in every notebook that declares them: name -> allowed values.
SHARED_DOMAINS: dict[str, tuple[Any, ...]] = {"scale": SCALES, "device": DEVICES}
_ANNOTATED = {"int": 0, "float": 0.0, "str": "", "bool": False}  # papermill's type name -> an example


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
    return {name: default for name, (default, _) in _inspect(path).items()}


def _one_parameters_cell(path: str | os.PathLike) -> None:
    """Papermill injects the given values after the first cell tagged ``parameters``: a second
    one would then run after them and put its own defaults back, silently."""
    import nbformat

    tagged = [i for i, cell in enumerate(nbformat.read(str(path), as_version=4).cells)
              if "parameters" in cell.get("metadata", {}).get("tags", [])]
    if len(tagged) > 1:
        raise ParameterError("notebook", str(path), f"has {len(tagged)} cells tagged 'parameters' (cells "
                             f"{', '.join(map(str, tagged))}): values given with -p would be overwritten "
                             f"by the later one; keep the tag on one cell")


def _inspect_with_kernel(papermill, path: str | os.PathLike) -> dict:
    """papermill's view of the parameters; a notebook whose metadata names no kernel is read as
    the Python notebook it runs as (labkit runs it in its own kernel)."""
    import json
    import tempfile

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # papermill says what is wrong with it
        return papermill.inspect_notebook(str(path))
    metadata = data.get("metadata") if isinstance(data, dict) else None
    if not isinstance(metadata, dict) or (metadata.get("kernelspec") or {}).get("name"):
        return papermill.inspect_notebook(str(path))
    metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    with tempfile.TemporaryDirectory(prefix="labkit-inspect-") as tmp:
        copy = Path(tmp) / Path(path).name
        copy.write_text(json.dumps(data), encoding="utf-8")
        return papermill.inspect_notebook(str(copy))


def _inspect(path: str | os.PathLike) -> dict[str, tuple[Any, str]]:
    """Each parameter's default and papermill's name for its annotated type ("None" if none)."""
    import papermill
    from nbformat.reader import NotJSONError

    try:
        params = _inspect_with_kernel(papermill, path)
    except NotJSONError as e:
        raise ParameterError("notebook", str(path), "is not a Jupyter notebook: its file is not JSON") from e
    except (KeyError, AttributeError, TypeError, ValueError) as e:  # JSON, but not nbformat's
        raise ParameterError("notebook", str(path), f"is not a Jupyter notebook ({e})") from e
    out = {}
    for name, info in params.items():
        default = info.get("default")
        try:
            value = ast.literal_eval(default) if default is not None else None
        except (ValueError, SyntaxError):
            value = default
        out[name] = (value, str(info.get("inferred_type_name") or "None"))
    return out


def check_parameters(path: str | os.PathLike, parameters: dict[str, Any],
                     declared: dict[str, Any] | None = None) -> None:
    """Refuse names the notebook does not declare, values outside a shared parameter's domain,
    and values whose kind contradicts the default (a string or 1.5 where the default is an int,
    say), before a kernel is started or a job built. `declared`: the notebook's parameters when
    already read. See the module's note for defaults of None."""
    annotations = {name: kind for name, (_, kind) in _inspect(path).items()} if parameters else {}
    declared = notebook_parameters(path) if declared is None else declared
    if parameters:
        _one_parameters_cell(path)
    notebook = Path(path).name
    for name, value in parameters.items():
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none"
            raise ParameterError(name, value, f"is not a parameter of {notebook} (it has: {known})")
        check_shared_domain(name, value, notebook)
        default, like = declared[name], None
        if default is None:
            default = _example_of(annotations.get(name, "None"))
            like = f"its annotation {annotations.get(name)}"
            if default is None:
                default = _course_default(Path(path), name)
                like = f"{name!r} in the other course notebooks"
        problem = type_problem(default, value, like if default is not None else None)
        if problem is None and default is None and isinstance(value, (list, tuple, dict, set)):
            problem = ("must be a single value (a number, a string, True/False or None) like its "
                       "default None")
        if problem:
            raise ParameterError(name, value, f"of {notebook} {problem}")


def _example_of(annotation: str) -> Any:
    """A value of the kind papermill names ("int", "Optional[float]"), None if not a plain kind."""
    kind = annotation.strip()
    if kind.startswith("Optional[") and kind.endswith("]"):
        kind = kind[len("Optional["):-1].strip()
    return _ANNOTATED.get(kind)


def _course_default(path: Path, name: str) -> Any:
    """The default another course notebook beside `path` (`NN_name.ipynb`) gives `name` (None
    when none gives one, or they disagree on its kind)."""
    kinds = {}
    for other in sorted(path.parent.glob("[0-9][0-9]_*.ipynb")):
        if other.resolve() == path.resolve():
            continue
        try:
            default = notebook_parameters(other).get(name)
        except ParameterError:
            continue
        if default is not None:
            kinds.setdefault(_kind(default), default)
    return next(iter(kinds.values())) if len(kinds) == 1 else None


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number" if isinstance(value, float) else "int"
    return type(value).__name__


def check_shared_domain(name: str, value: Any, notebook: str = "the notebook") -> None:
    """Refuse a value of a shared parameter (`SHARED_DOMAINS`) that its notebook would refuse."""
    allowed = SHARED_DOMAINS.get(name)
    if allowed is not None and value not in allowed:
        raise ParameterError(name, value, f"of {notebook} must be one of "
                             + ", ".join(map(repr, allowed)))


def type_problem(default: Any, value: Any, like: str | None = None) -> str | None:
    """Why `value` cannot replace a parameter whose default is `default` (None: it can). The
    kind of the default decides: a bool takes True/False, an int an integer (not a bool, not
    1.5), a float any number, a string a string; None and containers take anything. `like`
    says where the kind came from (default: "its default <default>")."""
    if default is None or value is None:
        return None
    like = like or f"its default {default!r}"
    if isinstance(default, bool):
        return None if isinstance(value, bool) else f"must be True or False like {like}"
    if isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else f"must be an integer like {like}"
    if isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else f"must be a number like {like}"
    if isinstance(default, str) and not isinstance(value, str):
        return f"must be a string like {like}"
    return None
