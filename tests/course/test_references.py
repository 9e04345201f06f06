"""Reference figures are read from the repository's benchmark results, never retyped: every figure
the course shows as a reference is a number some file in benchmarks/results holds, and a speed
figure quoted in a notebook's text must be one too."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from labkit.core import precisions
from labkit.course import precision
from labkit.course.input_pipeline import read_rates
from labkit.hardware import results
from labkit.hardware.catalog import find, load_catalog

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9]*.py"))
# A number followed by a throughput or bandwidth unit (or "% MFU"), as a sentence would quote it.
QUOTED = re.compile(r"(\d[\d,]*(?:\.\d+)?)\s*(?:k|K|M)?\s*(images/s|img/s|tokens/s|samples/s|TFLOP/s|GB/s|TB/s|% MFU)")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def all_numbers() -> set[float]:
    """Every number written in any file of `results.results_dir()` (JSON values and numbers in text
    files): what a quoted reference figure must be found among."""
    out: set[float] = set()
    for path in sorted(results.results_dir().glob("*")):
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            _walk(json.loads(text), out)
        else:
            out.update(float(m) for m in _NUMBER.findall(text.replace(",", "")))
    return out


def _walk(value: Any, out: set[float]) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        out.add(float(value))
    elif isinstance(value, dict):
        for v in value.values():
            _walk(v, out)
    elif isinstance(value, list):
        for v in value:
            _walk(v, out)


def _held(value: float, decimals: int, numbers: set[float]) -> bool:
    """Whether some results number, rounded as the quote is, equals the quoted value."""
    return any(round(n, decimals) == value for n in numbers)


def _markdown(path: Path) -> list[str]:
    cells, current, in_markdown = [], [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# %%"):
            if in_markdown:
                cells.append("\n".join(current))
            in_markdown, current = "[markdown]" in line, []
        elif in_markdown:
            current.append(line.removeprefix("# ").removeprefix("#"))
    if in_markdown:
        cells.append("\n".join(current))
    return cells


def quoted_figures(text: str) -> list[tuple[str, float, int]]:
    """(as written, value, decimals) of every number-with-unit in `text`."""
    out = []
    for m in QUOTED.finditer(text):
        raw = m.group(1).replace(",", "")
        decimals = len(raw.split(".")[1]) if "." in raw else 0
        out.append((m.group(0), float(raw), decimals))
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_text_quotes_only_figures_a_results_file_holds(path):
    numbers = all_numbers()
    missing = [written for cell in _markdown(path) for written, value, decimals in quoted_figures(cell)
               if not _held(value, decimals, numbers)]
    assert not missing, f"{path.name} quotes figures no file in benchmarks/results holds: {missing}"


def test_the_check_catches_a_retyped_figure():
    numbers = all_numbers()
    (written, value, decimals), = quoted_figures("the H100 ladder reached **5,534 images/s**")
    assert written.startswith("5,534") and not _held(value, decimals, numbers)
    (_, value, decimals), = quoted_figures("labkit reached 5,536 images/s")
    assert _held(value, decimals, numbers)


def _benchmarks_only(monkeypatch, tmp_path):
    """A results folder with the benchmark files and no course run."""
    import shutil

    for name in (results.RESNET_FILE, results.GPT_FILE):
        shutil.copy(results.results_dir() / name, tmp_path / name)
    monkeypatch.setenv("LABKIT_RESULTS_DIR", str(tmp_path))


def test_reference_ladder_rows_are_the_benchmark_rows_without_a_course_run(monkeypatch, tmp_path):
    _benchmarks_only(monkeypatch, tmp_path)
    rows, provenance = precision.reference_ladder()
    data = json.loads((results.results_dir() / results.RESNET_FILE).read_text())
    rates = {r["variant"]: r["rate"] for r in data["rows"]}
    assert [r["samples_per_s"] for r in rows] == [rates[v] for v in results.RESNET_RUNGS]
    # the benchmark has no fp16 rung, and no rung in a precision that changes nothing in a ResNet (fp8)
    resnet_rungs = [r.key for r in precision.RUNGS["torch"] if r.key != "fp16"
                    and precisions.why_not_trains(r.precision, "torch", "resnet") is None]
    assert [r["key"] for r in rows][:5] == resnet_rungs
    assert {r["range"] for r in rows} == {"one run"}
    assert "NVIDIA H100" in provenance and "2026-11-22" in provenance and "bench_torch.py" in provenance
    numbers = all_numbers()
    assert all(r["samples_per_s"] in numbers for r in rows)


def test_reference_ladder_is_notebook_04s_own_from_the_newest_course_run_on_a_gpu():
    course = results.course_run("04")
    if course is None:
        pytest.skip("no full-size course run on a GPU in benchmarks/results")
    rows, provenance = precision.reference_ladder()
    rungs = {f.label: f.value for f in course.figures("04")}
    assert rows and all(rungs[precision.RUNG_FIGURE.format(rung=r["rung"])] == r["samples_per_s"] for r in rows)
    assert rows[0]["key"] == "fp32" and rows[0]["speedup"] == 1.0
    notes = {f.label: f.note for f in course.figures("04")}  # each rung keeps the range its file holds
    for r in rows:
        note = notes[precision.RUNG_FIGURE.format(rung=r["rung"])]
        assert (f"range {r['range']}" in note) if "range" in note else r["range"] == "-"
    assert course.file.name in provenance and course.device in provenance and "course_gpu.py" in provenance


def test_a_later_course_run_of_other_notebooks_does_not_hide_notebook_04s(monkeypatch, tmp_path):
    _benchmarks_only(monkeypatch, tmp_path)

    def write(name: str, date: str, notebooks: dict) -> None:
        (tmp_path / name).write_text(json.dumps({"date": date, "scale": "full", "machine": {"gpu": ["G"]},
                                                 "notebooks": notebooks}))

    ladder = {"status": "ok", "figures": [{"name": precision.RUNG_FIGURE.format(rung="fp32"), "value": 900.0}]}
    write("2026-01-01-g-course.json", "2026-01-01", {"04_mixed_precision": ladder})
    write("2026-02-01-g-course.json", "2026-02-01", {"00_tour": {"status": "ok", "figures": []},
                                                    "04_mixed_precision": {"status": "timeout"}})
    assert results.course_run().file.name == "2026-02-01-g-course.json"  # the newest of all
    assert results.course_run("04").file.name == "2026-01-01-g-course.json"  # the newest with 04 ok
    assert read_rates.reference_resnet().value == 900.0
    assert precision.reference_ladder()[0][0]["samples_per_s"] == 900.0


def test_gpu_appetite_and_mfu_references_come_from_the_files():
    numbers = all_numbers()
    assert read_rates.reference_resnet().value in numbers
    assert read_rates.REFERENCE_RESNET50_IMAGES_PER_S == read_rates.reference_resnet().value
    datasheet = find(load_catalog(), "H100 80GB").peak_bf16_tflops
    for ref in results.gpt_mfu(datasheet):
        assert ref.tokens_per_s in numbers and ref.of_measured in numbers and ref.measured_tflops in numbers


def test_gpu_feed_estimate_uses_the_results_file(monkeypatch, tmp_path):
    feed = read_rates.feed_estimate(0.9)
    assert feed.images_per_s == pytest.approx(1.5 * read_rates.reference_resnet().value)
    assert feed.workers == read_rates.workers_to_feed(images_per_s=feed.images_per_s, image_bytes=224 * 224 * 3,
                                                      gb_per_s=0.9)
    assert feed.decoding_workers is None  # not measured: not claimed
    # decoding JPEGs counts too: the workers are the more of reading and decoding
    decoding = read_rates.feed_estimate(0.9, decodes_per_s=500.0)
    assert decoding.decoding_workers == math.ceil(decoding.images_per_s / 500.0)
    assert decoding.workers == max(decoding.reading_workers, decoding.decoding_workers) == decoding.decoding_workers
    assert read_rates.jpeg_decodes_per_s(seconds=0.01, repeats=1) > 0
    _benchmarks_only(monkeypatch, tmp_path)  # no course run: the benchmark's fastest rung
    assert read_rates.feed_estimate(0.9).reference.source.name == results.RESNET_FILE
    monkeypatch.setenv("LABKIT_RESULTS_DIR", str(tmp_path / "nothing"))
    missing = read_rates.feed_estimate(0.9)
    assert missing.reference is None and str(tmp_path / "nothing") in missing.why


def test_every_results_file_says_where_it_came_from():
    for name in (results.RESNET_FILE, results.GPT_FILE):
        f = results.load(name)
        assert f.device and f.software and f.date and f.command, name


def test_missing_results_say_where_they_were_looked_for(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_RESULTS_DIR", str(tmp_path))
    with pytest.raises(results.ResultsUnavailable, match=str(tmp_path)):
        results.resnet_ladder()
