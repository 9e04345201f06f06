"""Notebook 03's conclusions, as sentences over this run's measurements: the input ladders
(`ladder`) and the page-cache reading rates (`read_rates`).
Rungs and readers are found by key, so relabelling one for display changes no sentence's logic."""

from __future__ import annotations

import os

from labkit.core import stats
from labkit.course.input_pipeline.ladder import InputLadder, InputLadderConfig
from labkit.course.input_pipeline.read_rates import ReadRates, best_torch_mechanism


def conclusions(ladders: list[InputLadder], mechanisms: dict[str, stats.Spread] | dict[str, float] | None,
                raw: ReadRates, config: InputLadderConfig) -> str:
    """The notebook's conclusions, one bullet per ladder, mechanism and ceiling."""
    lines = []
    for lad in ladders:
        lines += _ladder_lines(lad, config)
    if mechanisms:
        lines.append(_mechanism_line(mechanisms))
    ceiling = raw.ceiling
    t = raw.gb_per_s.get("torch_batch")
    f = raw.gb_per_s.get("tf_data")
    if t:
        lines.append(f"- From the page cache, with CRCs verified, the torch path read {t:.2f} GB/s: "
                     f"{100 * t / ceiling:.0f}% of the single-core ceiling {ceiling:.2f} GB/s "
                     f"(raw read {raw.gb_per_s['raw']:.2f}, CRC32C {raw.gb_per_s['crc32c']:.2f} GB/s)"
                     + (f", {t / f:.2f}× tf.data's TFRecordDataset ({f:.2f} GB/s)." if f else "."))
    return "\n".join(lines)


def _mechanism_line(mechanisms: dict[str, stats.Spread] | dict[str, float]) -> str:
    median = {k: (v.median if isinstance(v, stats.Spread) else float(v)) for k, v in mechanisms.items()}
    best = best_torch_mechanism(mechanisms)
    worst = min(median, key=median.get)
    ranked = sorted(median, key=median.get, reverse=True)
    line = (f"- torch reading mechanism, from the page cache: {best} delivered the most "
            f"({median[best]:,.0f} samples/s), {median[best] / median[worst]:.1f}× {worst} "
            f"({median[worst]:,.0f} samples/s)")
    a, b = mechanisms[ranked[1]], mechanisms[best]
    if isinstance(a, stats.Spread) and isinstance(b, stats.Spread) and min(len(a.values), len(b.values)) >= stats.MIN_REPEATS:
        c = stats.compare(a.values, b.values)
        if c.winner is None:
            return line + (f"; against the runner-up, {ranked[1]}, it shows {stats.NO_DIFFERENCE} "
                           f"(ranges {b.range_text()} vs {a.range_text()}): either will do on this machine.")
        return line + (f"; it beat the runner-up, {ranked[1]}, in every pass (ranges {b.range_text()} vs "
                       f"{a.range_text()}): that is the mechanism to use on this machine.")
    return line + "; one pass each, so no verdict."


def _step(lad: InputLadder, before: str, after: str) -> str:
    """"2.50× shards (faster)": rung `after` against `before`, ratio of medians and the verdict."""
    ratio = lad.rung(after).samples_per_s / lad.rung(before).samples_per_s
    return f"{ratio:.2f}× {lad.rung(before).label} ({lad.verdict(before, after)})"


def _ladder_lines(lad: InputLadder, config: InputLadderConfig) -> list[str]:
    naive, shards = lad.rung("naive"), lad.rung("shards")
    par = lad.rung("parallel_reads")
    epochs = len(naive.epochs_s) or 1
    lines = [
        f"- {lad.engine}: one file per sample trained at {naive.samples_per_s:,.0f} samples/s (median of "
        f"{epochs} epoch{'s' if epochs > 1 else ''}) with {100 * naive.data_fraction:.0f}% of the time waiting "
        f"for data, each file paying {config.open_latency_ms:g} ms to open. Shards of {config.records_per_shard}: "
        f"{_step(lad, 'naive', 'shards')}; parallel reads {_step(lad, 'shards', 'parallel_reads')}; prefetch "
        f"{_step(lad, 'parallel_reads', 'prefetch')}; cache {_step(lad, 'prefetch', 'cache')}. Highest median: "
        f"{lad.best.label} ({lad.speedup():.1f}× the naive rung, data wait {100 * lad.best.data_fraction:.0f}%)."]
    if lad.engine == "torch" and par.samples_per_s < shards.samples_per_s and \
            lad.verdict("shards", "parallel_reads") != stats.NO_DIFFERENCE:
        steps = -(-config.num_samples // config.batch_size)
        lines.append(f"  The {config.num_workers} loader workers were started afresh for each epoch "
                     f"(persistent_workers=False); over an epoch of {steps} steps that start-up cost "
                     "more than the overlap saved. The prefetch rung keeps them alive.")
    keys = [r.key for r in lad.rungs]
    for a, b in zip(keys, keys[1:], strict=False):
        if lad.verdict(a, b) == "faster" or lad.comparison(a, b) is None:
            continue
        lines.append(f"  {lad.rung(b).label}: not measurably faster than {lad.rung(a).label} here "
                     f"({_why_flat(lad, a, b, config)}).")
    return lines


def _why_flat(lad: InputLadder, before: str, rung: str, config: InputLadderConfig) -> str:
    """The likely reason a rung did not help, from what it adds and what the run measured."""
    waited, waits = lad.rung(before).data_fraction, lad.rung(rung).data_fraction
    change = f"waited for data {100 * waited:.0f}% of the time before it and {100 * waits:.0f}% with it"
    if rung in ("parallel_reads", "prefetch"):
        helpers = (f"{config.num_workers} loader processes" if lad.engine == "torch" and config.num_workers
                   else "its reader threads")
        return (f"{helpers} share {os.cpu_count()} cores with the training step, which {change}; "
                "with more cores and remote storage they pay off")
    if waits < waited - 0.05:
        return f"the step {change}, but the epochs' times vary more than that gain"
    if waited < 0.2:
        return f"the step {change}: there was little to win"
    return f"the step {change}: it did not cut the wait"
