"""Reading a Chrome trace (what torch.profiler exports, and what Perfetto opens) into a Timeline.

Only complete events (`"ph": "X"`) matter. Steps are the profiler's `ProfilerStep#N` ranges;
CPU ops (`cat: cpu_op`), user annotations (`record_function`, DataLoader and optimizer ranges)
and device activity (`kernel`, `gpu_memcpy`, `gpu_memset`) become events.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from labkit.profiling.phases import Event, Timeline

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def read_chrome_trace(path: str | os.PathLike) -> dict:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"trace file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not a JSON Chrome trace ({e})") from None
    if isinstance(data, list):  # the bare-array form of the format
        data = {"traceEvents": data}
    if "traceEvents" not in data:
        raise ValueError(f"{path}: no 'traceEvents' (not a Chrome trace)")
    return data


def timeline_from_chrome_trace(path: str | os.PathLike) -> Timeline:
    data = read_chrome_trace(path)
    tl = Timeline(source=str(path))
    for ev in data["traceEvents"]:
        if ev.get("ph") != "X" or "dur" not in ev:
            continue
        name, cat = str(ev.get("name", "")), str(ev.get("cat", ""))
        start = float(ev["ts"])
        event_end = start + float(ev["dur"])
        tid = ev.get("tid", 0)
        if name.startswith("ProfilerStep#"):
            tl.steps.append(Event(name, start, event_end, "step", tid))
        elif cat in GPU_CATEGORIES:
            tl.events.append(Event(name, start, event_end, "gpu", tid))
        elif cat == "cpu_op":
            tl.events.append(Event(name, start, event_end, "cpu_op", tid))
        elif cat in ("user_annotation", "gpu_user_annotation"):
            if cat == "user_annotation":
                tl.events.append(Event(name, start, event_end, "annotation", tid))
    tl.steps.sort(key=lambda e: e.start)
    if not tl.steps:
        raise ValueError(f"{path}: no ProfilerStep#N ranges; call prof.step() once per training step")
    return tl
