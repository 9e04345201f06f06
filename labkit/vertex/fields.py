"""Reading a job spec written either way the API accepts: proto field names (``worker_pool_specs``)
or the REST form (``workerPoolSpecs``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def field_of(obj: Mapping[str, Any], snake: str) -> Any:
    """A field under its proto name or its REST (camelCase) name."""
    head, *rest = snake.split("_")
    camel = head + "".join(w.title() for w in rest)
    return obj.get(snake, obj.get(camel))
