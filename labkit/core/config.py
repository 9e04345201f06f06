"""Notebook parameters: validation with errors that name the parameter, and `scale` resolution.

Every notebook's first code cell (tagged `parameters`) holds plain values that papermill can
override with `-p name value`. The next cell hands them to a config dataclass whose
`__post_init__` checks each one with the helpers below, so a bad value fails at once with a
message that names it instead of deep inside a training loop.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal, TypeVar

Scale = Literal["smoke", "full"]
SCALES = ("auto", "smoke", "full")
T = TypeVar("T")


class ParameterError(ValueError):
    """A notebook or CLI parameter has a bad value; `.name` is the parameter's name."""

    def __init__(self, name: str, value: Any, problem: str):
        self.name = name
        self.value = value
        super().__init__(f"parameter {name!r} {problem} (got {value!r})")


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    choices = tuple(choices)
    if value not in choices:
        raise ParameterError(name, value, "must be one of " + ", ".join(map(repr, choices)))
    return value


def check_int(
    name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None,
    allow_none: bool = False,
) -> int | None:
    if value is None and allow_none:
        return None
    # bool is an int subclass; papermill turns "true" into True, which is never a size.
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ParameterError(name, value, "must be an integer" + (" or None" if allow_none else ""))
    if minimum is not None and value < minimum:
        raise ParameterError(name, value, f"must be >= {minimum}")
    if maximum is not None and value > maximum:
        raise ParameterError(name, value, f"must be <= {maximum}")
    return value


def parse_int(text: str) -> int:
    """An integer command-line value, also in the form Vertex AI's tuning service writes a
    DISCRETE or INTEGER value it holds as a double (``--batch-size=32.0``); ``32.5`` is refused.
    Named ``int`` so argparse's message reads "invalid int value: '32.5'"."""
    value = text.strip() if isinstance(text, str) else text
    try:
        return int(value)
    except (TypeError, ValueError):
        pass
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"not an integer: {text!r}") from None
    if not math.isfinite(number) or not number.is_integer():
        raise ValueError(f"not an integer: {text!r}")
    return int(number)


parse_int.__name__ = "int"


def check_float(
    name: str, value: Any, *, minimum: float | None = None, maximum: float | None = None,
    allow_none: bool = False,
) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ParameterError(name, value, "must be a finite number")
    if minimum is not None and value < minimum:
        raise ParameterError(name, value, f"must be >= {minimum}")
    if maximum is not None and value > maximum:
        raise ParameterError(name, value, f"must be <= {maximum}")
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ParameterError(name, value, "must be True or False")
    return value


def check_str(name: str, value: Any, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not allow_empty and not value):
        raise ParameterError(name, value, "must be a non-empty string")
    return value


def check_path(name: str, value: Any, *, file: bool = False) -> str | None:
    """An optional output path: None (no output), or a non-empty string; with `file`, not one
    that ends in a separator (that names a folder: the file would be written as its name
    without the slash, or fail after the run)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ParameterError(name, value, "must be a path (an empty one would mean no output at all; "
                             "leave the setting out for that)")
    if file and value.endswith(("/", "\\")):
        raise ParameterError(name, value, "ends with a separator, so it names a folder; give a file "
                             "path, e.g. " + value.rstrip("/\\") + "/metrics.json")
    return value


def resolve_scale(scale: str) -> Scale:
    """'auto' → 'full' when a GPU is visible, else the 'smoke' sizes CI uses on 2 CPU cores."""
    check_choice("scale", scale, SCALES)
    if scale != "auto":
        return scale  # type: ignore[return-value]
    from labkit.core import devices

    return "full" if devices.detect().has_gpu else "smoke"


def by_scale(scale: Scale, *, smoke: T, full: T) -> T:
    """Pick a size for the resolved scale: `by_scale(s, smoke=64, full=50_000)`."""
    check_choice("scale", scale, ("smoke", "full"))
    return smoke if scale == "smoke" else full
