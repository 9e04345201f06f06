import nbformat

from labkit.notebooks.figures import (
    FIGURE_MIME,
    KeyFigure,
    figures_in_notebook,
    format_value,
    key_figure,
)


def test_format_value():
    assert format_value(345107.3) == "345,107"
    assert format_value(2.3456) == "2.35"
    assert format_value(42.25) == "42.2"
    assert format_value(3) == "3"
    assert format_value("n/a") == "n/a"


def test_a_compared_figure_says_what_its_verdict_says(capsys):
    from labkit.core import stats
    from labkit.notebooks.figures import key_comparison

    key_comparison("b vs a", stats.compare([1.0, 1.1, 1.05], [2.0, 2.1, 2.05]), "a", "b", "images/s")
    won = capsys.readouterr().out
    assert won.startswith("b vs a: 1.95×") and won.rstrip().endswith("faster)")
    key_comparison("b vs a", stats.compare([1.0, 1.1, 1.05], [1.02, 1.12, 1.0]), "a", "b", "images/s")
    tied = capsys.readouterr().out
    assert tied.startswith(f"b vs a: {stats.NO_DIFFERENCE} (b: 0.97× a") and tied.count(stats.NO_DIFFERENCE) == 1


def test_a_ratio_says_what_its_verdict_says(capsys):
    from labkit.core import stats
    from labkit.notebooks.figures import key_ratio

    key_ratio("bf16 over fp32", 1.65, stats.NO_DIFFERENCE, f"cpu, median of 3 runs; {stats.NO_DIFFERENCE}")
    assert capsys.readouterr().out.strip() == (f"bf16 over fp32: {stats.NO_DIFFERENCE} (1.65×; cpu, median of 3 runs)")
    key_ratio("bf16 over fp32", 1.65, "faster", "cpu")
    assert capsys.readouterr().out.strip() == "bf16 over fp32: 1.65× (cpu)"


def test_key_figure_text_and_notebook_roundtrip(capsys):
    key_figure("bf16 speed-up over fp32", 2.4, "×", note="CPU smoke sizes")
    out = capsys.readouterr().out.strip()
    assert "\n" not in out and all(part in out for part in ("bf16 speed-up over fp32", "2.4×", "CPU smoke sizes"))
    assert "3 GB/s" in KeyFigure("x", 3.0, "GB/s").text()
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("...")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        "text/plain": "t", FIGURE_MIME: {"name": "a", "value": 1.5, "unit": "s", "note": ""}})]
    nb.cells = [cell, nbformat.v4.new_markdown_cell("x")]
    assert figures_in_notebook(nb) == [KeyFigure("a", 1.5, "s", "")]


def test_a_ratio_headline_against_its_own_verdict_is_found():
    from labkit.core import stats
    from labkit.notebooks.figures import KeyFigure, against_verdict

    honest = [KeyFigure("bf16 over fp32", stats.NO_DIFFERENCE, "", "1.65×; cpu"),
              KeyFigure("shards vs files", 4.77, "×", "faster in every run")]
    lying = KeyFigure("DDP x2 scaling", 1.6, "×", f"cpu; {stats.NO_DIFFERENCE}")
    assert against_verdict(honest) == [] and against_verdict([*honest, lying]) == [lying]

