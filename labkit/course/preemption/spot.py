"""Notebook 07's Spot trade-off: checkpoint interval against expected lost work against cost.

`tradeoff` prices a job at each checkpoint interval with `labkit.hardware.spot.SpotModel` (the
one model of preemption overhead: lost work and restarts stretch the wall time, checkpoint
writes add their own), so the cheapest interval and the Spot saving are numbers, not advice.
`sensitivity` shows how that saving moves with the assumed preemption rate and the interval, and
`sensitivity_findings` the rates at which that changes what Spot is worth (numbers; the notebook
writes the sentences).
`time_checkpoint_write` measures what writing a checkpoint costs (at a size that measures
bandwidth, not latency), to this machine's disk or to a ``gs://`` folder. A Spot job checkpoints
to Cloud Storage, so the interval comes from Cloud Storage's write rate (`WriteRate`):
`cloud_write_rate` measures it through ``gs://`` when this environment has credentials and a
bucket, and otherwise takes Cloud Storage FUSE's published write benchmark
(`published_cloud_rate`); `checkpoint_interval` turns a rate into the write time, the Young/Daly
interval and the cheapest interval of a table, and `interval_rows` / `interval_headline` set the
Cloud Storage figure beside the local disk's. `capacity_options` compares on-demand, Spot and
DWS flex-start for one job, each price and rule with its source.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from labkit.core import gcp, gcs, stats
from labkit.core.config import ParameterError, check_float
from labkit.course.plots import finish, new_figure
from labkit.hardware import facts
from labkit.hardware.spot import SpotModel, young_daly_interval

# Cloud Storage FUSE's published sequential-write benchmark: the path a Vertex job's checkpoint
# takes to its bucket through /gcs/. Files of 1 GiB (the size of a model's full state), 10 fio
# jobs writing at once: 4,624.59 MB/s in all, so 462 MB/s per writer. A best case: a
# c4-standard-192 with 200 Gbps networking and the bucket in its region.
GCSFUSE_WRITE_MB_S = 4624.59
GCSFUSE_WRITE_WRITERS = 10
GCSFUSE_WRITE_SOURCE = ("https://github.com/GoogleCloudPlatform/gcsfuse/blob/master/docs/benchmarks.md, "
                        "Sequential Writes, 1 GiB files, 10 jobs: 4,624.59 MB/s (gcsfuse v3.4.3 on a "
                        "c4-standard-192 with 200 Gbps networking, bucket in the VM's region; read 2026-11-29)")
ROUND_INTERVALS_S = (60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0)


@dataclass
class SpotScenario:
    """A job needing `work_hours` of uninterrupted compute, its prices per hour, and how Spot
    treats it (`spot`; the checkpoint interval is what `tradeoff` varies)."""

    work_hours: float
    on_demand_usd_hr: float
    spot_usd_hr: float
    spot: SpotModel

    def __post_init__(self) -> None:
        check_float("work_hours", self.work_hours, minimum=0.0)
        check_float("on_demand_usd_hr", self.on_demand_usd_hr, minimum=0.0)
        check_float("spot_usd_hr", self.spot_usd_hr, minimum=0.0)


@dataclass
class TradeoffRow:
    interval_s: float
    checkpoint_overhead: float  # fraction of time spent writing checkpoints
    lost_per_preemption_s: float
    expected_preemptions: float
    wall_hours: float
    spot_cost: float
    on_demand_cost: float  # same checkpoints, no preemptions, on-demand price

    @property
    def saving(self) -> float:
        return 1.0 - self.spot_cost / self.on_demand_cost if self.on_demand_cost else float("nan")


def row(s: SpotScenario, interval_s: float) -> TradeoffRow:
    """The job with a checkpoint every `interval_s` seconds, on Spot and on-demand."""
    model = replace(s.spot, checkpoint_every_min=interval_s / 60)
    busy = s.work_hours * (1 + model.checkpoint_overhead)
    wall = model.wall_hours(s.work_hours)
    return TradeoffRow(interval_s, model.checkpoint_overhead, model.lost_per_preemption_s,
                       model.preemptions_per_hour * wall, wall, wall * s.spot_usd_hr,
                       busy * s.on_demand_usd_hr)


def tradeoff(s: SpotScenario, intervals_s: list[float]) -> list[TradeoffRow]:
    return [row(s, i) for i in intervals_s]


def table_rows(rows: list[TradeoffRow]) -> list[dict[str, Any]]:
    """The trade-off as rows for `labkit.course.tables.table`, in the units a reader compares."""
    return [{"interval (min)": r.interval_s / 60, "checkpoint overhead (%)": 100 * r.checkpoint_overhead,
             "lost per preemption (min)": r.lost_per_preemption_s / 60, "preemptions": r.expected_preemptions,
             "wall h": r.wall_hours, "Spot $": r.spot_cost, "on-demand $": r.on_demand_cost,
             "saving (%)": 100 * r.saving} for r in rows]


def sensitivity(s: SpotScenario, rates_per_hour: Sequence[float],
                intervals_s: Sequence[float]) -> list[dict[str, Any]]:
    """How the Spot saving depends on what the notebook assumes: per preemption rate (one row
    each), the saving (%) with hard kills at every checkpoint interval (None: the job never
    finishes, restarts eat every hour), the cheapest of those intervals, and what a SIGTERM
    checkpoint then saves in dollars and brings the saving to."""
    rows = []
    for rate in rates_per_hour:
        at = replace(s, spot=replace(s.spot, preemptions_per_hour=rate))
        hard = tradeoff(at, list(intervals_s))
        best = min(hard, key=lambda r: r.spot_cost)
        soft = row(replace(at, spot=replace(at.spot, checkpoint_on_sigterm=True)), best.interval_s)
        out: dict[str, Any] = {"preemptions/h": rate}
        for r in hard:
            out[f"saving at {r.interval_s / 60:g} min (%)"] = 100 * r.saving if math.isfinite(r.spot_cost) else None
        finite = math.isfinite(best.spot_cost)
        out |= {"cheapest interval (min)": best.interval_s / 60 if finite else None,
                "SIGTERM checkpoint saves $": (best.spot_cost - soft.spot_cost) if finite else None,
                "saving with it (%)": 100 * soft.saving if math.isfinite(soft.spot_cost) else None}
        rows.append(out)
    return rows


# The SIGTERM checkpoint "pays" from the rate where it saves this share of the on-demand bill.
WORTH_SHARE = 0.01


@dataclass(frozen=True)
class SensitivityFindings:
    """What a `sensitivity` grid shows, as rates (preemptions per hour; None: at no rate of the
    grid): from which the SIGTERM checkpoint saves at least `WORTH_SHARE` of the on-demand bill
    (`sigterm_pays_from`; `sigterm_most_usd`, the most it saves at any rate), from which a job
    with hard kills never finishes at any interval of the grid, and from which Spot with the
    SIGTERM checkpoint no longer saves."""

    on_demand_usd: float
    sigterm_pays_from: float | None
    sigterm_most_usd: float
    never_finishes_from: float | None
    stops_saving_from: float | None


def sensitivity_findings(rows: list[dict[str, Any]], on_demand_usd: float) -> SensitivityFindings:
    """The rates at which a `sensitivity` grid changes what Spot is worth (`SensitivityFindings`)."""
    if not rows:
        raise ParameterError("rows", rows, "an empty grid has no findings")
    gains = [(r["preemptions/h"], r["SIGTERM checkpoint saves $"] or 0.0) for r in rows]
    pays = [rate for rate, usd in gains if usd >= WORTH_SHARE * on_demand_usd]
    never = [r["preemptions/h"] for r in rows
             if all(v is None for k, v in r.items() if k.startswith("saving at"))]
    lost = [r["preemptions/h"] for r in rows if not (r["saving with it (%)"] or 0) > 0]
    return SensitivityFindings(on_demand_usd, min(pays, default=None), max(usd for _, usd in gains),
                               min(never, default=None), min(lost, default=None))


@dataclass(frozen=True)
class CheckpointWrite:
    """Timed writes of `nbytes` through labkit's checkpoint commit (the files, then the marker)."""

    seconds: stats.Spread
    nbytes: int

    @property
    def bandwidth(self) -> float:
        """Bytes per second, from the median write."""
        return self.nbytes / self.seconds.median


def time_checkpoint_write(checkpoint_dir: str, *, to: str | None = None, min_bytes: int = 64 * 2**20,
                          repeats: int = 3) -> CheckpointWrite:
    """Write the newest committed checkpoint of `checkpoint_dir` again, `repeats` times, with its
    commit marker: each time to a fresh folder under `to` (a local folder or a ``gs://`` address,
    written through fsspec as the engines write checkpoints), or to a temporary local folder when
    `to` is None; each folder is removed once timed. A small checkpoint is written with its bytes
    repeated into one more file up to `min_bytes`: a write of a few hundred KB times the
    storage's latency, not the bandwidth a GB-sized checkpoint gets."""
    from labkit.core import checkpoint

    ckpt = checkpoint.load(checkpoint_dir)
    if ckpt is None:
        raise FileNotFoundError(f"{checkpoint_dir}: no committed checkpoint to time")
    files = dict(ckpt.files)
    size = sum(len(b) for b in files.values())
    if 0 < size < min_bytes:
        own = b"".join(files.values())
        files["ballast.bin"] = (own * -(-(min_bytes - size) // len(own)))[:min_bytes - size]
    times = []
    for i in range(repeats):
        if to is None:
            with tempfile.TemporaryDirectory(prefix="labkit-ckpt-") as tmp:
                times.append(_timed_save(tmp, ckpt, files))
        else:
            folder = f"{to.rstrip('/')}/write-{i}"
            try:
                times.append(_timed_save(folder, ckpt, files))
            finally:
                _remove(folder)
    return CheckpointWrite(stats.Spread(tuple(times)), sum(len(b) for b in files.values()))


def _timed_save(folder: str, ckpt, files: dict[str, bytes]) -> float:
    from labkit.core import checkpoint

    start = time.perf_counter()
    checkpoint.save(folder, ckpt.step, files, ckpt.meta)
    return time.perf_counter() - start


def _remove(folder: str) -> None:
    import fsspec

    fs, path = fsspec.core.url_to_fs(folder)
    if fs.exists(path):
        fs.rm(path, recursive=True)


@dataclass(frozen=True)
class WriteRate:
    """How fast a checkpoint reaches `place` ("Cloud Storage", "local disk"), in bytes per
    second, and how that is known (`how`: what was measured, or the page it comes from)."""

    place: str
    bytes_per_s: float
    how: str
    measured: bool

    def __post_init__(self) -> None:
        if check_float("bytes_per_s", self.bytes_per_s) <= 0:
            raise ParameterError("bytes_per_s", self.bytes_per_s, "a write rate must be above 0")

    @property
    def label(self) -> str:
        """E.g. "Cloud Storage (published)", "local disk (measured)"."""
        return f"{self.place} ({'measured' if self.measured else 'published'})"

    def seconds(self, nbytes: float) -> float:
        """How long `nbytes` take to write at this rate."""
        return nbytes / self.bytes_per_s


def measured_rate(place: str, write: CheckpointWrite, where: str) -> WriteRate:
    """A `WriteRate` from timed writes (the median)."""
    return WriteRate(place, write.bandwidth, f"measured: {write.nbytes / 1e6:.0f} MB {where}, "
                     f"{write.seconds.text()} s per write", True)


def published_cloud_rate(why_not_measured: str = "") -> WriteRate:
    """Cloud Storage's write rate per writer from Cloud Storage FUSE's published benchmark."""
    per_writer = GCSFUSE_WRITE_MB_S / GCSFUSE_WRITE_WRITERS
    how = (f"published: {GCSFUSE_WRITE_MB_S:,.2f} MB/s over {GCSFUSE_WRITE_WRITERS} writers = "
           f"{per_writer:,.0f} MB/s per writer, a best case; {GCSFUSE_WRITE_SOURCE}")
    return WriteRate("Cloud Storage", per_writer * 1e6,
                     how + (f"; not measured here: {why_not_measured}" if why_not_measured else ""), False)


def cloud_unmeasurable(cloud: gcp.CloudContext, env: Mapping[str, str] | None = None) -> str | None:
    """Why Cloud Storage's write rate cannot be measured from here (None: it can): no bucket or
    no credentials (`labkit.core.gcp`), ``gs://`` pointed at a stand-in, or no connection."""
    env = os.environ if env is None else env
    if not cloud.bucket:
        return "no bucket here (set LABKIT_BUCKET to a gs://bucket you can write)"
    if not cloud.credentials:
        return "no Google Cloud credentials here (`gcloud auth application-default login`)"
    if env.get(gcs.LOCAL_GCS_ENV) or env.get("STORAGE_EMULATOR_HOST"):
        return "gs:// reaches a local stand-in for Cloud Storage here, not Cloud Storage"
    return gcs.unreachable(cloud.bucket, env)


def cloud_write_rate(checkpoint_dir: str, cloud: gcp.CloudContext, *, env: Mapping[str, str] | None = None,
                     repeats: int = 3, min_bytes: int = 64 * 2**20) -> WriteRate:
    """Cloud Storage's write rate for the checkpoint in `checkpoint_dir`: measured through
    ``gs://`` under a new ``labkit-07-write-TIME-PID`` folder of `cloud.bucket` (removed after)
    when `cloud_unmeasurable` finds nothing missing, else `published_cloud_rate`, saying why."""
    why = cloud_unmeasurable(cloud, env)
    if why is None:
        probe = f"{cloud.bucket.rstrip('/')}/labkit-07-write-{int(time.time())}-{os.getpid()}"
        try:
            write = time_checkpoint_write(checkpoint_dir, to=probe, min_bytes=min_bytes, repeats=repeats)
        except Exception as e:  # noqa: BLE001 - any failure (auth, permission, network) means: not measured
            why = f"writing to {probe} failed ({type(e).__name__}: {str(e).strip()[:160]})"
        else:
            return measured_rate("Cloud Storage", write, f"to {probe} through gcsfs")
    return published_cloud_rate(why)


@dataclass(frozen=True)
class IntervalChoice:
    """The checkpoint interval for hard kills when a `checkpoint_bytes` checkpoint is written at
    `rate`: `scenario` carries that write time, `young_daly_s` is √(2·C·M), `rows` price the
    round intervals and the Young/Daly one."""

    rate: WriteRate
    checkpoint_bytes: float
    scenario: SpotScenario
    young_daly_s: float
    rows: list[TradeoffRow]

    @property
    def write_s(self) -> float:
        return self.scenario.spot.checkpoint_write_s

    @property
    def cheapest(self) -> TradeoffRow:
        return min(self.rows, key=lambda r: r.spot_cost)


def checkpoint_interval(s: SpotScenario, checkpoint_bytes: float, rate: WriteRate,
                        intervals_s: Sequence[float] = ROUND_INTERVALS_S) -> IntervalChoice:
    """Write `checkpoint_bytes` at `rate`, without a SIGTERM checkpoint (hard kills): the
    Young/Daly interval and the trade-off at `intervals_s` and at that interval."""
    check_float("checkpoint_bytes", checkpoint_bytes, minimum=0.0)
    write_s = rate.seconds(checkpoint_bytes)
    hard = replace(s, spot=replace(s.spot, checkpoint_write_s=write_s, checkpoint_on_sigterm=False))
    best = young_daly_interval(write_s, s.spot.preemptions_per_hour)
    candidates = set(intervals_s) | ({float(round(best))} if math.isfinite(best) and best >= 1 else set())
    return IntervalChoice(rate, checkpoint_bytes, hard, best, tradeoff(hard, sorted(candidates)))


def interval_rows(choices: Sequence[IntervalChoice]) -> list[dict[str, Any]]:
    """One row per write rate: the rate, the write time, Young/Daly and the cheapest interval."""
    return [{"checkpoint written to": c.rate.label, "MB/s": c.rate.bytes_per_s / 1e6,
             f"{c.checkpoint_bytes / 1e9:g} GB write (s)": c.write_s,
             "Young/Daly (min)": c.young_daly_s / 60, "cheapest interval (min)": c.cheapest.interval_s / 60,
             "Spot $ at it": c.cheapest.spot_cost} for c in choices]


def interval_headline(choices: Sequence[IntervalChoice]) -> tuple[str, float, str, str]:
    """(name, minutes, unit, note) for `key_figure`: the first choice's cheapest interval, its
    rate named, the others beside it in the note."""
    used, *others = choices
    note = "; ".join([f"Young/Daly sqrt(2CM) = {used.young_daly_s / 60:.1f} min, C = {used.write_s:.1f} s",
                      *(f"at the {o.rate.label} rate, {o.rate.bytes_per_s / 1e6:,.0f} MB/s: "
                        f"{o.cheapest.interval_s / 60:.1f} min" for o in others)])
    return (f"cheapest checkpoint interval (hard kills), writes at the {used.rate.label} rate of "
            f"{used.rate.bytes_per_s / 1e6:,.0f} MB/s", used.cheapest.interval_s / 60, "min", note)


def plot_tradeoff(rows: list[TradeoffRow], path: str | os.PathLike | None = None):
    """Expected Spot cost and on-demand cost against the checkpoint interval."""
    fig, ax = new_figure((7, 4))
    xs = [r.interval_s / 60 for r in rows]
    ax.plot(xs, [r.spot_cost for r in rows], "o-", label="Spot, expected cost")
    ax.plot(xs, [r.on_demand_cost for r in rows], "s--", label="on-demand")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (minutes)")
    ax.set_ylabel("USD per job")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    return finish(fig, path)


@dataclass
class CapacityOption:
    """One way to buy the job's machine time: what an hour costs, what the job costs, and the
    rules that come with it (each with its source)."""

    name: str
    usd_per_hour: tuple[float, float]  # (low, high): one figure when both are equal
    job_usd: tuple[float, float]
    wall_hours: float
    rules: list[str]
    sources: list[str]


def capacity_options(s: SpotScenario, interval_s: float, price_source: str) -> list[CapacityOption]:
    """On-demand, Spot (at the checkpoint interval `interval_s`, preemptions as `s.spot` models
    them) and DWS flex-start for the job of `s`. Flex-start has no sourced rate in labkit's
    catalog: its price is given as the range Google documents, from about half of on-demand
    (`facts.DWS_MAX_DISCOUNT`) to on-demand, for the same wall time as on-demand (it is not
    preempted) after a wait for capacity."""
    spot_row = row(s, interval_s)
    on_demand = s.on_demand_usd_hr
    busy = spot_row.on_demand_cost / on_demand if on_demand else s.work_hours  # work + checkpoint writes
    dws_low = on_demand * (1 - facts.DWS_MAX_DISCOUNT.value)
    return [
        CapacityOption("on-demand", (on_demand, on_demand), (spot_row.on_demand_cost,) * 2, busy,
                       ["starts when capacity is there (a stockout fails the job, retried up to 3 times)",
                        "never preempted"],
                       [price_source, facts.STOCKOUT_RESTARTS.cite()]),
        CapacityOption("Spot", (s.spot_usd_hr, s.spot_usd_hr), (spot_row.spot_cost,) * 2, spot_row.wall_hours,
                       [f"preempted at any time ({s.spot.preemptions_per_hour}/h assumed): the job restarts, "
                        "up to 6 times, from its last checkpoint",
                        f"up to {facts.SPOT_MAX_DISCOUNT.value:.0%} off on-demand"],
                       [price_source, facts.SPOT_JOB_RESTARTS.cite(), facts.SPOT_MAX_DISCOUNT.cite()]),
        CapacityOption("DWS flex-start", (dws_low, on_demand), (dws_low * busy, on_demand * busy), busy,
                       [f"waits for all its GPUs at once, at most maxWaitDuration (default "
                        f"{facts.DWS_MAX_WAIT_DEFAULT_H.value:.0f} h)",
                        "not preempted once running; L4, A100, H100, H200 or B200 only; timeout <= 7 days",
                        "price: up to about half of on-demand (no rate in labkit's catalog)"],
                       list(dict.fromkeys([facts.DWS_MAX_WAIT_DEFAULT_H.cite(), facts.DWS_NOT_PREEMPTIBLE.cite(),
                                           facts.DWS_MAX_DISCOUNT.cite()]))),
    ]


def capacity_rows(options: list[CapacityOption]) -> list[dict[str, Any]]:
    """Table rows of `capacity_options` (a range where the price is one)."""
    def money(pair: tuple[float, float]) -> str:
        return f"${pair[0]:,.2f}" if pair[0] == pair[1] else f"${pair[0]:,.2f}-{pair[1]:,.2f}"

    return [{"capacity": o.name, "USD/h": money(o.usd_per_hour), "job USD": money(o.job_usd),
             "wall h": round(o.wall_hours, 1), "rules": "; ".join(o.rules)} for o in options]


def capacity_text(options: list[CapacityOption], title: str) -> str:
    """The comparison as a table, then each option's sources."""
    from labkit.course.tables import table

    return "\n".join([table(capacity_rows(options), title=title),
                      *(f"{o.name}: " + "; ".join(o.sources) for o in options)])
