"""Notebook 09's proposal for a GPU job: which levers a Vertex AI job on the target GPU carries,
what decided each one, and what an epoch costs there.

    plan = plan_for_target(result, hardware, "H100 80GB")
    plan.rows            # per lever: measured here, on the stored GPU run, carried, decided by
    plan.config          # what the job runs: `capstone.epoch_job(result, n, config=plan.config)`
    plan.carried_by      # the carried levers, grouped by what decided them
    cost_rows(plan, target_price(plan), samples_per_epoch=1_281_167)

On a GPU machine the levers measured here decide (the climb's verdicts), and the epoch is
priced from this machine's own runs. On a CPU, a verdict on bf16 or channels_last says nothing
about tensor cores, so the levers are split by what they remove:

- waiting for input (`capstone.INPUT_LEVERS`, loader workers): decided here, since the wait is
  the storage's and the loader's, not the device's;
- arithmetic (16-bit formats, memory layout, compiler): decided by the stored GPU course run's
  ladder (notebook 04's, `labkit.course.precision.reference_ladder`), each kept only when every
  run with it beat every run without it there (the lowest, median and highest run of each rung
  as the file records them), and the epoch is priced from that ladder's throughput, median and
  range, at the target's hourly price: never from the CPU's own result.

That ladder is ResNet-50's with torch on one GPU model: for another model or framework it does
not decide (`TargetPlan.ladder_decides`), and for another target GPU the plan holds both GPUs'
datasheet rows (`TargetPlan.gpu_gap`). The notebook writes the sentences from these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from labkit.core import stats
from labkit.core.train_config import TrainConfig
from labkit.course import capstone, ladder, references
from labkit.course.levers import LEVERS
from labkit.course.precision import default_batch
from labkit.hardware.machines import Price

if TYPE_CHECKING:
    from labkit.hardware.gpus import GPUFacts

# The stored ladder's rungs that judge a device lever: (lever key, rung without it, rung with it).
# The climb follows the capstone's order; a lever whose rung "without" is not where the climb
# stands (a lever before it was not kept) is not judged.
LADDER_STEPS = (("bf16", "fp32", "bf16"), ("channels_last", "bf16", "bf16_channels_last"),
                ("compile", "bf16_channels_last", "bf16_channels_last_compile"))
LADDER_MODEL, LADDER_FRAMEWORK = "resnet", "torch"  # what the stored ladder trained
BASE_RUNG = "fp32"
_RANGE = re.compile(r"\s*([\d,.]+)\s*[–-]\s*([\d,.]+)\s*")


@dataclass(frozen=True)
class StoredLadder:
    """A ResNet-50 precision ladder measured on a GPU and stored with the repository: its rows
    (`precision.reference_ladder`'s), where it comes from, and the device and date it ran on."""

    rows: tuple[dict[str, Any], ...]
    provenance: str
    file: str  # benchmarks/results/NAME
    device: str
    date: str

    @classmethod
    def load(cls) -> StoredLadder | None:
        """The stored ladder, or None when labkit is installed without its results."""
        from labkit.course.precision import reference_ladder
        from labkit.hardware import results

        try:
            rows, provenance = reference_ladder()
            source = results.load(provenance.split(":", 1)[0].removeprefix("benchmarks/results/"))
        except results.ResultsUnavailable:
            return None
        return cls(tuple(rows), provenance, references.source(results.results_dir() / source.name),
                   source.device, source.date)

    def row(self, key: str) -> dict[str, Any] | None:
        return next((r for r in self.rows if r["key"] == key), None)

    def spread(self, key: str) -> stats.Spread | None:
        """The rung's lowest, median and highest run as the file records them (None: no such
        rung, or one run with no range)."""
        row = self.row(key)
        found = _RANGE.fullmatch(str(row.get("range") or "")) if row else None
        if found is None:
            return None
        low, high = (float(g.replace(",", "")) for g in found.groups())
        median = float(row["samples_per_s"])  # the range is rounded for display: keep it around the median
        return stats.Spread((min(low, median), median, max(high, median)))

    def origin(self) -> str:
        return f"stored GPU run: {self.file}, {self.device}, {self.date}"

    def climb(self, min_gain: float, target_bf16: bool = True) -> tuple[list[dict[str, Any]], str]:
        """The device levers judged on this ladder, in order, and the rung the kept ones reach.
        Each row: key, lever, ratio, verdict, kept, why (when not judged)."""
        current, out = BASE_RUNG, []
        for key, before, after in LADDER_STEPS:
            row = {"key": key, "lever": LEVERS[LADDER_FRAMEWORK][key].label, "ratio": None, "kept": False,
                   "verdict": "not judged", "why": ""}
            a, b = self.spread(before), self.spread(after)
            if key == "bf16" and not target_bf16:
                row["why"] = "the target GPU has no bf16 tensor cores"
            elif self.row(after) is None:
                row["why"] = "the stored ladder has no rung with it"
            elif before != current:
                row["why"] = f"it is measured on top of the {self.row(before)['rung']} rung, which was not kept there"
            else:
                c = stats.Comparison(a, b, min_effect=min_gain) if a and b else None
                row.update(ratio=self.row(after)["samples_per_s"] / self.row(before)["samples_per_s"],
                           verdict=ladder.verdict(c), kept=bool(c and c.b_is_better), comparison=c,
                           ranges=f"{self.row(before)['range']} → {self.row(after)['range']} samples/s")
                if row["kept"]:
                    current = after
            out.append(row)
        return out, current


@dataclass(frozen=True)
class GpuGap:
    """The stored ladder ran on another GPU than the target: both names and each one's
    datasheet row (`labkit.hardware.gpus`; None where labkit's GPU table has no row for it)."""

    ran_on: str
    target: str
    ran: GPUFacts | None
    wanted: GPUFacts | None


@dataclass(frozen=True)
class TargetPlan:
    """What the job on `target` carries. `rows`: one per lever (lever, here, stored GPU run,
    carried, decided by, why: the reason a lever is not carried); `config`: the TrainConfig the
    job runs; `measured_here`: the levers and the price come from this machine (a GPU);
    `ladder` and `rung`: the stored ladder and the rung its kept levers reach (a CPU run);
    `ladder_decides`: that ladder trained this model with this framework, so it judged the
    device levers; `gpu_gap`: set when it ran on another GPU than the target."""

    result: capstone.CapstoneResult
    target: str
    config: TrainConfig
    rows: tuple[dict[str, Any], ...]
    measured_here: bool
    ladder: StoredLadder | None = None
    rung: str | None = None
    ladder_decides: bool = False
    gpu_gap: GpuGap | None = None

    @property
    def carried(self) -> list[str]:
        """The keys of the levers the job carries, in order."""
        return [r["key"] for r in self.rows if r["carried"]]

    @property
    def carried_labels(self) -> list[str]:
        return [r["lever"] for r in self.rows if r["carried"]]

    @property
    def deciders(self) -> str:
        """What decided the carried levers (this machine, the stored GPU run), in one phrase."""
        return "; ".join(dict.fromkeys(r["decided by"] for r in self.rows if r["carried"])) or "nothing carried"

    @property
    def comparison(self) -> stats.Comparison | None:
        """Baseline (a) against the planned job (b) where the epoch is priced: this machine's
        final comparison, or the stored ladder's fp32 rung against the rung reached."""
        if self.measured_here:
            return self.result.final_comparison
        a, b = (self.ladder.spread(BASE_RUNG), self.ladder.spread(self.rung)) if self.ladder and self.rung else (None, None)
        return stats.Comparison(a, b, min_effect=self.result.min_gain) if a and b else None

    @property
    def priced_on(self) -> str:
        """Whose throughput prices the epoch."""
        if self.measured_here:
            return f"measured here on {self.result.final[1]['device']}"
        return self.ladder.origin() if self.ladder else "nothing: no GPU measurement is stored"

    @property
    def step_time_ms(self) -> float | None:
        """The planned job's step at full scale where it is known: this GPU's measured step, or
        the stored rung's median rate at the job's batch (the ladder's batch at full scale)."""
        if self.measured_here:
            best = self.result.final[1]
            return best["step_time_ms"] if self.result.optimised.scale == "full" else None
        row = self.ladder.row(self.rung) if self.ladder and self.rung else None
        return 1000.0 * default_batch(self.config.model, "full") / row["samples_per_s"] if row else None

    @property
    def carried_by(self) -> dict[str, list[str]]:
        """The carried levers' labels, grouped by what decided them, in order."""
        by: dict[str, list[str]] = {}
        for r in self.rows:
            if r["carried"]:
                by.setdefault(r["decided by"], []).append(r["lever"])
        return by

    @property
    def not_carried(self) -> list[dict[str, Any]]:
        """The rows of the levers the job leaves out; each row's "why" says the reason."""
        return [r for r in self.rows if not r["carried"]]


def _here(trial: dict[str, Any] | None, why_not: str | None = None) -> str:
    """A lever's result on this machine, in a table cell."""
    if trial is not None:
        return f"{trial['gain']:.2f}×, {trial['verdict']}"
    return f"not tried: {why_not}" if why_not else "not tried here"


def plan_for_target(result: capstone.CapstoneResult, hardware: capstone.Hardware, target: str,
                    stored: StoredLadder | None | bool = True) -> TargetPlan:
    """The levers the job on the catalog row `target` carries. `stored`: the stored ladder
    (True: load it; None: none is stored)."""
    here = f"measured here on {result.final[1]['device']}"
    if hardware.device_type == "cuda":
        rows = [{"key": t["key"], "lever": t["lever"], "here": _here(t), "stored GPU run": "-",
                 "carried": t["kept"], "decided by": here, "why": "" if t["kept"] else f"{t['verdict']} here"}
                for t in result.trials]
        return TargetPlan(result, target, result.optimised, tuple(rows), measured_here=True)
    ladder_ = StoredLadder.load() if stored is True else stored
    base = result.baseline
    decides = ladder_ is not None and (base.framework, base.model) == (LADDER_FRAMEWORK, LADDER_MODEL)
    climbed, rung = ladder_.climb(result.min_gain, _target_bf16(target)) if decides else ([], None)
    rows = _cpu_rows(result, climbed, here, ladder_)
    config = _cpu_config(result, [r["key"] for r in rows if r["carried"]])
    return TargetPlan(result, target, config, tuple(rows), False, ladder_, rung, decides,
                      _gpu_gap(ladder_, target) if decides else None)


def _cpu_rows(result: capstone.CapstoneResult, climbed: list[dict[str, Any]], here: str,
              stored: StoredLadder | None) -> list[dict[str, Any]]:
    trials = {t["key"]: t for t in result.trials}
    skipped = {s.key: s.why for s in result.skipped}
    judged = {r["key"]: r for r in climbed}
    rows = []
    for key in dict.fromkeys([*trials, *skipped, *judged]):
        trial, on_gpu = trials.get(key), judged.get(key)
        label = trial["lever"] if trial else (on_gpu["lever"] if on_gpu else _label(result, key))
        row = {"key": key, "lever": label, "here": _here(trial, skipped.get(key)),
               "stored GPU run": "-", "carried": False, "decided by": "", "why": ""}
        if key in capstone.INPUT_LEVERS:
            row.update(carried=bool(trial and trial["kept"]), **{"decided by": here})
            row["why"] = "" if row["carried"] else f"{trial['verdict'] if trial else 'not tried'} here"
        elif on_gpu is not None and on_gpu["ratio"] is not None:
            row.update({"stored GPU run": f"{on_gpu['ratio']:.2f}×, {on_gpu['verdict']} ({on_gpu['ranges']})",
                        "carried": on_gpu["kept"], "decided by": stored.origin()})
            row["why"] = "" if on_gpu["kept"] else f"{on_gpu['verdict']} on the {stored.origin()}"
        else:
            row["why"] = (on_gpu["why"] if on_gpu else "no GPU measurement of it is stored") + \
                "; run this notebook on a GPU to measure it"
            row["decided by"] = "nothing measured on a GPU"
        rows.append(row)
    return rows


def _label(result: capstone.CapstoneResult, key: str) -> str:
    return next((s.label for s in result.skipped if s.key == key), key)


def _cpu_config(result: capstone.CapstoneResult, carried: list[str]) -> TrainConfig:
    """The baseline with the carried levers: an input lever's settings as measured here, a
    device lever's from the registry."""
    fields: dict[str, Any] = {}
    for key in carried:
        changes = LEVERS[result.baseline.framework][key].changes
        if key in capstone.INPUT_LEVERS:
            fields.update({k: getattr(result.optimised, k) for k in changes})
        else:
            fields.update(changes)
    return replace(result.baseline, **fields)


def _facts(name: str) -> GPUFacts | None:
    from labkit.hardware.gpus import lookup

    return lookup(name)


def _target_bf16(target: str) -> bool:
    facts = _facts(target)
    return facts is None or facts.supports("bf16")


def _gpu_gap(stored: StoredLadder, target: str) -> GpuGap | None:
    """Both GPUs' datasheet rows when the ladder's GPU is not the target's (None: the same GPU)."""
    ran, wanted = _facts(stored.device), _facts(target)
    if ran is not None and wanted is not None and ran.key == wanted.key:
        return None
    return GpuGap(stored.device, target, ran, wanted)


def target_price(plan: TargetPlan, price_per_hour: float | None = None,
                 spot_price_per_hour: float | None = None) -> Price | None:
    """The hourly price the epoch is priced at: the reader's, else this machine's (when the
    plan was measured here), else the catalog's for the target GPU."""
    from labkit.hardware.catalog import load_catalog
    from labkit.hardware.machines import catalog_price, price_for_this_machine

    if price_per_hour is not None or plan.measured_here:
        return price_for_this_machine(price_per_hour, spot_price_per_hour)
    return catalog_price(load_catalog(), plan.target)


def cost_rows(plan: TargetPlan, price: Price | None, samples_per_epoch: int,
              spot_overhead: float = 0.0) -> list[dict[str, Any]]:
    """Hours and dollars per epoch of the baseline and the planned job: this machine's runs
    (`capstone.cost_rows`) when measured here; else the stored ladder's fp32 rung and the rung
    the carried levers reach, each with the hours its lowest and highest run give."""
    if plan.measured_here:
        return capstone.cost_rows(plan.result, price, samples_per_epoch, spot_overhead)
    if plan.ladder is None or plan.rung is None:
        return []
    rows = []
    for run, key in (("baseline (fp32)", BASE_RUNG), ("planned job", plan.rung)):
        spread = plan.ladder.spread(key) or stats.Spread((plan.ladder.row(key)["samples_per_s"],))
        hours = [samples_per_epoch / v / 3600.0 for v in (spread.median, spread.high, spread.low)]
        row: dict[str, Any] = {"run": run, "rung": plan.ladder.row(key)["rung"], "samples/s": spread.median,
                               "range": plan.ladder.row(key)["range"], "h/epoch": hours[0],
                               "h/epoch range": f"{hours[1]:.2f}–{hours[2]:.2f}"}
        if price is not None:
            row["$/epoch"] = hours[0] * price.on_demand
            if price.spot is not None:
                row["Spot $/epoch"] = hours[0] * (1.0 + spot_overhead) * price.spot
        rows.append(row)
    return rows
