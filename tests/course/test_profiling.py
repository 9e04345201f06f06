"""Notebook 05's readings as numbers and verdicts: where adding decode workers stopped paying off
(fed fixed measurements: unit tests time nothing), labkit's and HTA's readings of one trace, and
the loader fix of the learner's own script as the lines it changes."""

from __future__ import annotations

import statistics

import pytest

from labkit.core.config import ParameterError
from labkit.core.stats import NO_DIFFERENCE
from labkit.course import profiling
from labkit.profiling.hta_check import SideBySide


def _row(workers, runs, vs):
    return {"workers": workers, "samples_per_s": statistics.median(runs), "runs": runs, "vs previous": vs,
            "speedup": statistics.median(runs) / 100.0, "range": f"{min(runs)}–{max(runs)}"}


def test_decode_findings_say_where_workers_stopped_paying_off():
    rows = [_row(0, [100, 101, 99], "reference"), _row(1, [130, 131, 129], "faster"),
            _row(2, [170, 171, 169], "faster"), _row(4, [168, 175, 165], NO_DIFFERENCE)]
    found = profiling.decode_findings(rows, cores=2)
    assert found.paid_up_to == 2 and found.beyond == ((4, NO_DIFFERENCE),)
    assert (found.best_workers, found.best_samples_per_s, found.best_range) == (2, 170, "169–171")
    assert found.best_speedup == pytest.approx(1.7) and found.first_workers == 0 and found.cores == 2


def test_decode_findings_when_no_count_paid_off():
    rows = [_row(0, [100, 101, 99], "reference"), _row(1, [100, 103, 101], NO_DIFFERENCE),
            _row(2, [90, 91, 89], "slower")]
    found = profiling.decode_findings(rows, cores=4)
    assert found.paid_up_to is None
    assert found.beyond == ((1, NO_DIFFERENCE), (2, "slower"))  # every count after the first
    assert found.best_workers == 1  # the highest median, though not measurably faster
    with pytest.raises(ParameterError, match="rows"):
        profiling.decode_findings([], cores=2)


def test_hta_agreement_is_a_verdict_on_the_figures_both_compute():
    same = SideBySide("t", [("ProfilerStep#1 (ms)", 10.0, 10.05), ("labkit only", 3.0, None)])
    assert profiling.HtaCheck(same).agreement == profiling.HTA_AGREE
    apart = SideBySide("t", [("ProfilerStep#1 (ms)", 10.0, 10.5)])
    assert profiling.HtaCheck(apart).agreement == profiling.HTA_DIFFER
    missing = profiling.HtaCheck(None, "pip install HolisticTraceAnalysis")
    assert missing.agreement is None and "pip install" in missing.missing


def test_hta_side_by_side_reads_the_folder_labkit_profile_writes(tmp_path):
    pytest.importorskip("hta.trace_analysis")
    from tests.profiling.test_hta_check import write_gpu_trace

    (tmp_path / "tensorboard").mkdir()
    write_gpu_trace(tmp_path / "tensorboard", [(1100, 300, "ampere_sgemm_128x64_nn"),
                                               (2100, 400, "vectorized_elementwise_kernel"),
                                               (3100, 500, "ampere_sgemm_128x64_nn")])
    check = profiling.hta_side_by_side(tmp_path)
    assert check.table is not None and check.missing == ""
    assert check.agreement == profiling.HTA_AGREE


def test_the_loader_fix_is_shown_as_the_lines_the_profiled_script_changes():
    change = profiling.own_script_change()
    removed = [ln for r, _ in change.hunks for ln in r]
    added = [ln for _, a in change.hunks for ln in a]
    assert "loader = DataLoader(train, batch_size=args.batch_size, shuffle=True)" in removed
    assert "loader = DataLoader(train, batch_size=args.batch_size, shuffle=True, **workers)" in added
    assert any("num_workers" in ln for ln in added) and not any("num_workers" in ln for ln in removed)
    assert not any('"""' in ln for ln in removed + added)  # the module docstrings are left out
    text = change.text()
    assert text.count("\n...\n") == len(change.hunks) - 1 and "- loader = DataLoader(" in text
    # the profile after the fix runs the very file whose lines are shown
    command = profiling.own_script_command("images", num_workers=2)
    assert command[1].endswith(change.after) and command[command.index("--num-workers") + 1] == "2"
    assert profiling.own_script_command("images")[1].endswith(change.before)
