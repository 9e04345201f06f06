"""The course run's report: `summary.md` (for people) and `summary.json` (for code) of what
this machine measured, beside the executed notebooks `labkit course` wrote."""

from __future__ import annotations

import json
import platform
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from labkit.course.tables import table
from labkit.notebooks import NotebookRun


def _machine_line() -> str:
    from labkit.core import devices

    info = devices.detect()
    gpus = ", ".join(f"{g.name} ({g.memory_gib:.0f} GiB)" for g in info.gpus) or "no GPU"
    return f"{info.cpu_count} CPU cores ({info.cpu_model}), {gpus}, Python {platform.python_version()}"


def write_report(runs: list[NotebookRun], out: Path) -> Path:
    """summary.md (for people) and summary.json (for code) beside the executed notebooks."""
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = _machine_line()
    rows = [{"notebook": f"[{r.notebook.stem}]({r.output.name})",
             "status": "ok" if r.ok else f"failed: {r.error[:120]}", "time": f"{r.seconds:.0f}s",
             "key figures measured in this run": "<br>".join(f.text() for f in r.figures) or "—"} for r in runs]
    lines = [
        "# Course run summary", "",
        f"- when: {when}", f"- machine: {machine}",
        f"- notebooks: {sum(r.ok for r in runs)} of {len(runs)} succeeded, "
        f"{sum(r.seconds for r in runs) / 60:.1f} minutes in all", "",
        table(rows, markdown=True),
    ]
    md = out / "summary.md"
    md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    data = {
        "when": when, "machine": machine,
        "runs": [{
            "notebook": r.notebook.name, "output": str(r.output), "ok": r.ok, "error": r.error,
            "seconds": r.seconds, "parameters": r.parameters,
            "figures": [asdict(f) for f in r.figures],
        } for r in runs],
    }
    (out / "summary.json").write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    return md
