"""Display functions for the notebooks: a plain-text table and the time-vs-cost plot."""

from __future__ import annotations

from labkit.hardware.cost import EstimateTable


def _cell(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v == 0:
            return "0"
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
    return str(v)


def format_table(rows: list[dict[str, object]]) -> str:
    """Rows of dicts as an aligned text table (missing values shown as '-')."""
    if not rows:
        return "(no rows)"
    cols = list(rows[0])
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def plot_time_cost(table: EstimateTable, ax=None, title: str = ""):
    """Hours per run against $ per run for every option, on-demand (circles) and Spot
    (triangles), with the Pareto front drawn through the options nobody beats on both."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    for e in table.estimates:
        ax.scatter(e.hours_per_run, e.on_demand_per_run, marker="o")
        ax.annotate(e.name, (e.hours_per_run, e.on_demand_per_run), textcoords="offset points",
                    xytext=(4, 3), fontsize=8)
        if e.spot_per_run is not None:
            ax.scatter(e.spot_hours_per_run, e.spot_per_run, marker="^", color="gray")
    front = table.pareto()
    ax.plot([p[2] for p in front], [p[3] for p in front], "k--", lw=1, label="Pareto front")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("hours per run")
    ax.set_ylabel("$ per run (o on-demand, ^ Spot)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return ax
