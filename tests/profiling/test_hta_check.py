"""labkit's reading of a trace beside Holistic Trace Analysis's (`labkit.profiling.hta_check`):
a real torch.profiler trace of a CPU run, a trace with GPU kernels written out here, and HTA missing."""

from __future__ import annotations

import json
import sys

import pytest

from labkit.profiling import hta_check


@pytest.fixture(scope="module", autouse=True)
def _hta():
    """HTA (and pandas under it), imported when this module's first test runs rather than at
    collection."""
    pytest.importorskip("hta.trace_analysis")


def test_a_real_cpu_trace_agrees_on_steps(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=3),
                 on_trace_ready=tensorboard_trace_handler(str(tmp_path))) as prof:
        for _ in range(4):
            loss = model(torch.randn(32, 64)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    both = hta_check.side_by_side(tmp_path)
    compared = [row for row in both.rows if row[2] is not None]
    assert compared and both.agrees()
    assert any("no GPU kernels" in n for n in both.notes)


def write_gpu_trace(folder, kernels):
    """Three 1 ms steps, kernels on stream 7 launched from the CPU: the shape of a CUDA trace."""
    events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1,
               "ts": 1000.0 * i, "dur": 1000.0, "args": {}} for i in (1, 2, 3)]
    for c, (start, dur, name) in enumerate(kernels, start=1):
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": start - 50.0, "dur": 10.0, "args": {"correlation": c, "External id": c}})
        events.append({"ph": "X", "cat": "gpu_memcpy" if name.startswith("Memcpy") else "kernel", "name": name,
                       "pid": 0, "tid": 7, "ts": float(start), "dur": float(dur),
                       "args": {"device": 0, "stream": 7, "correlation": c, "External id": c}})
    trace = {"schemaVersion": 1, "distributedInfo": {"rank": 0}, "deviceProperties": [{"id": 0}], "traceEvents": events}
    (folder / "host.pt.trace.json").write_text(json.dumps(trace))


def test_gpu_busy_agrees_with_htas_temporal_breakdown(tmp_path):
    write_gpu_trace(tmp_path, [(1100, 300, "ampere_sgemm_128x64_nn"), (1500, 200, "ampere_sgemm_128x64_nn"),
                               (2100, 400, "vectorized_elementwise_kernel"), (2600, 100, "Memcpy HtoD"),
                               (3100, 500, "ampere_sgemm_128x64_nn")])
    both = hta_check.side_by_side(tmp_path)
    busy = {what: (ours, theirs) for what, ours, theirs in both.rows}
    # HTA keeps steps 1-2: kernels 1100..2700, 1,000 us of them in a 1,600 us span
    assert busy["GPU busy, first to last kernel (%)"] == (pytest.approx(62.5), pytest.approx(62.5))
    assert busy["GPU busy inside the steps (%), labkit's report"][0] == pytest.approx(50.0)  # 1,500 of 3,000 us
    assert both.agrees()


def test_without_hta_the_install_command_is_named(tmp_path, monkeypatch):
    write_gpu_trace(tmp_path, [(1100, 300, "k")])
    monkeypatch.setitem(sys.modules, "hta.trace_analysis", None)
    with pytest.raises(ImportError, match="pip install HolisticTraceAnalysis"):
        hta_check.side_by_side(tmp_path)


def test_a_folder_without_one_trace_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="expected one"):
        hta_check.side_by_side(tmp_path)
