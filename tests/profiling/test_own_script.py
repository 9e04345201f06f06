"""`labkit profile -- python my_train.py`: a script written without labkit, profiled unmodified,
with the verdict naming its own code and DataLoader."""

from __future__ import annotations

import json
import textwrap

import pytest

from labkit.cli import main


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    pytest.importorskip("torch")


SCRIPT = """
import sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class SlowFiles(Dataset):  # each sample "reads a file"
    def __len__(self):
        return 4096
    def __getitem__(self, i):
        time.sleep(0.004)
        return torch.randn(16), i % 2

def train(steps, workers):
    model = torch.nn.Linear(16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(SlowFiles(), batch_size=8, num_workers=workers)
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == steps:
            break
    print("finished", step, flush=True)

if __name__ == "__main__":
    train(int(sys.argv[1]), int(sys.argv[2]))
"""


def write(tmp_path, code: str = SCRIPT):
    path = tmp_path / "my_train.py"
    path.write_text(textwrap.dedent(code))
    return path


@pytest.mark.slow
def test_an_unmodified_script_is_profiled_and_its_own_dataset_named(tmp_path, capsys):
    script = write(tmp_path)
    code = main(["profile", "--out", str(tmp_path / "out"), "--steps", "3", "--warmup", "1", "--",
                 "python", str(script), "1000", "0"])
    out = capsys.readouterr().out
    assert code == 0, out
    line = textwrap.dedent(SCRIPT).splitlines().index("    def __getitem__(self, i):") + 1
    assert "input-bound" in out and f"__getitem__ (my_train.py:{line})" in out, out
    assert "your DataLoader over SlowFiles" in out and "num_workers=0" in out
    assert "finished" not in out  # stopped once the steps were traced, not run for 1000 steps
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["verdict"] == "input-bound" and summary["loaders"][0]["num_workers"] == 0
    assert (tmp_path / "out" / "trace.json").stat().st_size > 0
    assert any((tmp_path / "out" / "tensorboard").glob("*.pt.trace.json"))


@pytest.mark.slow
def test_it_can_let_the_script_finish(tmp_path, capsys):
    script = write(tmp_path)
    code = main(["profile", "--out", str(tmp_path / "out"), "--steps", "2", "--warmup", "0", "--then", "continue",
                 "--", "python", str(script), "6", "0"])
    assert code == 0 and "finished 6" in capsys.readouterr().out


def test_a_script_that_never_trains_is_refused_on_one_line(tmp_path, capsys):
    script = write(tmp_path, "print('just a script')\n")
    code = main(["profile", "--out", str(tmp_path / "out"), "--", "python", str(script)])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("labkit profile: parameter")]
    assert code == 2 and len(lines) == 1 and "optimizer" in lines[0] and "step()" in lines[0]


@pytest.mark.slow
def test_only_one_process_profiles_under_torchrun(tmp_path):
    """Rank 0 is profiled; the other rank runs untouched."""
    from labkit.profiling.command import profile_command

    code = SCRIPT.replace("def train(steps, workers):", "def train(steps, workers):\n"
                          "    import torch.distributed as dist\n    dist.init_process_group('gloo')")
    script = write(tmp_path, code.replace("model = torch.nn.Linear(16, 2)",
                                          "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 2))"))
    result = profile_command(["torchrun", "--standalone", "--nproc-per-node", "2", str(script), "50", "0"],
                             tmp_path / "out", steps=2, warmup=1)
    assert result.verdict.kind in ("input-bound", "communication-bound", "compute-bound")
    assert (tmp_path / "out" / "owner.pid").read_text().isdigit()
