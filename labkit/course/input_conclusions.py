"""Notebook 03's conclusions, as sentences over this run's measurements: the input ladders
(`labkit.course.input_ladder`) and the page-cache reading rates (`labkit.course.read_rates`).
Rungs and readers are found by key, so relabelling one for display changes no sentence's logic."""

from __future__ import annotations

import os

from labkit.course.input_ladder import InputLadder, InputLadderConfig
from labkit.course.read_rates import ReadRates, best_torch_mechanism


def conclusions(ladders: list[InputLadder], mechanisms: dict[str, float] | None, raw: ReadRates,
                config: InputLadderConfig) -> str:
    """The notebook's conclusions, one bullet per ladder, mechanism and ceiling."""
    lines = []
    for lad in ladders:
        lines += _ladder_lines(lad, config)
    if mechanisms:
        best = best_torch_mechanism(mechanisms)
        worst = min(mechanisms, key=mechanisms.get)
        lines.append(f"- torch reading mechanism, from the page cache: {best} delivered the most "
                     f"({mechanisms[best]:,.0f} samples/s), {mechanisms[best] / mechanisms[worst]:.1f}× "
                     f"{worst} ({mechanisms[worst]:,.0f} samples/s); that is the mechanism to use on this machine.")
    ceiling = raw.ceiling
    t = raw.gb_per_s.get("torch_batch")
    f = raw.gb_per_s.get("tf_data")
    if t:
        lines.append(f"- From the page cache, with CRCs verified, the torch path read {t:.2f} GB/s: "
                     f"{100 * t / ceiling:.0f}% of the single-core ceiling {ceiling:.2f} GB/s "
                     f"(raw read {raw.gb_per_s['raw']:.2f}, CRC32C {raw.gb_per_s['crc32c']:.2f} GB/s)"
                     + (f", {t / f:.2f}× tf.data's TFRecordDataset ({f:.2f} GB/s)." if f else "."))
    return "\n".join(lines)


def _ladder_lines(lad: InputLadder, config: InputLadderConfig) -> list[str]:
    naive, shards = lad.rung("naive"), lad.rung("shards")
    par, pre, cache = lad.rung("parallel_reads"), lad.rung("prefetch"), lad.rung("cache")
    lines = [
        f"- {lad.engine}: one file per sample trained at {naive.samples_per_s:,.0f} samples/s with "
        f"{100 * naive.data_fraction:.0f}% of the time waiting for data, each file paying "
        f"{config.open_latency_ms:g} ms to open. Shards of {config.records_per_shard} made it "
        f"{shards.samples_per_s / naive.samples_per_s:.1f}× faster; parallel reads "
        f"{par.samples_per_s / shards.samples_per_s:.2f}× on top, prefetch "
        f"{pre.samples_per_s / par.samples_per_s:.2f}×, cache {cache.samples_per_s / pre.samples_per_s:.2f}×. "
        f"Best rung: {lad.best.label} ({lad.speedup():.1f}× the naive rung, data wait "
        f"{100 * lad.best.data_fraction:.0f}%)."]
    if lad.engine == "torch" and par.samples_per_s < shards.samples_per_s:
        steps = -(-config.num_samples // config.batch_size)
        lines.append(f"  The {config.num_workers} loader workers were started afresh for each epoch "
                     f"(persistent_workers=False); over an epoch of {steps} steps that start-up cost "
                     "more than the overlap saved. The prefetch rung keeps them alive.")
    gains = [(r.label, r.samples_per_s / p.samples_per_s) for p, r in zip(lad.rungs, lad.rungs[1:], strict=False)]
    flat = [label for label, g in gains if g < 1.05]
    if flat:
        lines.append(f"  Rungs that gained less than 5% here: {', '.join(flat)} (on {os.cpu_count()} "
                     "cores, extra processes compete with the training step; with more cores and "
                     "real storage they pay off).")
    return lines
