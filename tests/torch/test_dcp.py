"""Sharded checkpoints through torch.distributed.checkpoint (`--checkpoint-format dcp`): the commit
marker lists DCP's files with their sizes and CRC-32C, a corrupt shard is caught and the previous
step taken, a one-process run resumes bit for bit, a 2-rank ZeRO-3 run resumes exactly on 2 ranks
and correctly on 1 process (model and AdamW state equal to the saved ones, the losses those of the
uninterrupted run), and the same through gs:// on the local Cloud Storage server."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from dataclasses import asdict, replace
from types import SimpleNamespace

import pytest

from labkit.core import checkpoint
from labkit.core.config import ParameterError
from labkit.core.fingerprint import ResumeMismatch
from labkit.core.train_config import Preempted, TrainConfig, from_argv, to_argv

crc32c = pytest.importorskip("crc32c")


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    global torch, dcp, engine, trainer, state, DataPosition, DistInfo
    torch = pytest.importorskip("torch")
    from labkit.torch import dcp, engine, state, trainer
    from labkit.torch.data import DataPosition
    from labkit.torch.distributed import DistInfo

BASE = TrainConfig(model="gpt", steps=4, batch_size=8, num_samples=64, device="cpu", progress=False,
                   eval_samples=0)  # 64 samples: the default 4096 are generated for each run
DCP = replace(BASE, checkpoint_format="dcp")


def _marker(directory, step: int) -> dict:
    return json.loads((directory / checkpoint.step_dir_name(step) / checkpoint.MARKER).read_text())


def _flip_a_byte(path, offset: int = 200) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF  # same size: only the checksum can tell
    path.write_bytes(bytes(data))


def test_the_format_is_a_flag_and_is_refused_where_it_cannot_save():
    c = replace(DCP, parallel="zero3")
    assert from_argv(to_argv(c)) == c
    flags = to_argv(c, changed_only=True)
    assert flags[flags.index("--checkpoint-format") + 1] == "dcp"
    for bad in (dict(parallel="zero2"), dict(parallel="tp"), dict(parallel="zero3", sharding_backend="deepspeed"),
                dict(framework="tf", model="cnn"), dict(cuda_graph_step=True)):
        with pytest.raises(ParameterError, match="checkpoint_format") as e:
            replace(DCP, **bad)
        assert "ddp or zero3" in str(e.value) and "\n" not in str(e.value)
    assert state.saver_class("dcp", True) is state.DcpSaver is state.saver_class("dcp", False)
    assert (state.saver_class("auto", True), state.saver_class("auto", False)) == (state.ShardedSaver, state.Saver)


def test_save_lists_each_file_it_wrote_with_its_size_and_crc32c_and_loads_back_exactly(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    moments = [opt.state[p]["exp_avg"].clone() for p in model.parameters()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # DCP's no-process-group notice is expected, and silenced
        files = dcp.save(str(tmp_path), model, opt)
    on_disk = {p.name for p in tmp_path.iterdir()}
    assert set(files) == on_disk == {".metadata", "__0_0.distcp"}
    for name, entry in files.items():
        data = (tmp_path / name).read_bytes()
        assert entry == {"size": len(data), "crc32c": f"{crc32c.crc32c(data):08x}"}
    assert dcp.verify_share(str(tmp_path), files, 0, 1) is None
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    opt.state.clear()
    dcp.load(str(tmp_path), model, opt)
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(m, opt.state[p]["exp_avg"]) for m, p in zip(moments, model.parameters(), strict=True))
    # each rank checks its share; a flipped byte and a missing file are named
    assert dcp.verify_share(str(tmp_path), files, 1, 2) is None  # rank 1 of 2 checks __0_0 only
    _flip_a_byte(tmp_path / "__0_0.distcp")
    assert "__0_0.distcp: contents do not match" in dcp.verify_share(str(tmp_path), files, 0, 1)
    (tmp_path / ".metadata").unlink()
    assert ".metadata: missing" in dcp.verify_share(str(tmp_path), files, 0, 2)
    (tmp_path / "a_file").write_text("")
    with pytest.raises(checkpoint.CheckpointWriteError, match=r"a_file/step: rank 0: Not a directory"):
        dcp.save(str(tmp_path / "a_file" / "step"), model, opt)


def test_a_dcp_checkpoint_resumes_bit_for_bit_and_its_marker_lists_every_file(tmp_path):
    reference = trainer.fit(BASE).losses
    with pytest.raises(Preempted):
        trainer.fit(replace(DCP, checkpoint_dir=str(tmp_path), preempt_at=2))
    marker = _marker(tmp_path, 2)
    folder = tmp_path / checkpoint.step_dir_name(2)
    assert set(marker["files"]) == {".metadata", "__0_0.distcp", "train.pt", "rng-rank0.pt"}
    assert set(marker["files"]) | {checkpoint.MARKER} == {p.name for p in folder.iterdir()}
    assert all(entry["size"] == (folder / name).stat().st_size for name, entry in marker["files"].items())
    assert marker["meta"]["format"] == "dcp" and marker["meta"]["fingerprint"]["world_size"] == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rest = trainer.fit(replace(DCP, checkpoint_dir=str(tmp_path)))
    assert rest.run["resumed_from_step"] == 2 and rest.losses == reference[3:]


def test_a_corrupt_shard_is_named_and_the_previous_step_taken(tmp_path):
    reference = trainer.fit(replace(BASE, steps=6)).losses
    trainer.fit(replace(DCP, checkpoint_every=2, checkpoint_dir=str(tmp_path)))  # steps 1 and 3
    _flip_a_byte(tmp_path / "step-00000003" / "__0_0.distcp")
    with pytest.warns(checkpoint.CheckpointWarning,
                      match=r"step 3 .*__0_0\.distcp: contents do not match.*previous committed step, 1"):
        log = trainer.fit(replace(DCP, steps=6, checkpoint_dir=str(tmp_path)))
    assert [s["step"] for s in log.steps] == [2, 3, 4, 5] and log.losses == reference[2:]


def test_a_run_that_cannot_load_dcp_state_is_refused_naming_the_layout(tmp_path):
    info = DistInfo()
    c = engine.build(DCP, info, torch.device("cpu"))
    state.DcpSaver(str(tmp_path), info).save(c, 0, DataPosition())
    zero2 = SimpleNamespace(model=c.model, optimizer=c.optimizer, scheduler=c.scheduler,
                            strategy=SimpleNamespace(name="zero2"))
    with pytest.raises(state.LayoutMismatch, match=r"layout .*, which --parallel zero2 cannot load"):
        state.restore_sharded(str(tmp_path), zero2, info)


# ---------------------------------------------------------------- several processes


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_zero3_resumes_exactly_on_two_ranks_and_correctly_on_one(tmp_path):
    """2 → 2: the losses of the uninterrupted run, exactly. 2 → 1 (DDP, one process): refused
    until the world-size change is allowed; then the model and AdamW state loaded are the saved
    ones (compared with DCP's own conversion of the checkpoint to one file), and the losses
    continue those of the uninterrupted run to within float rounding (one process sums the
    gradients in another order than two)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from labkit.train import run_replicas, run_training

    uninterrupted = run_training(BASE).losses
    config = replace(DCP, parallel="zero3", checkpoint_dir=str(tmp_path / "a"), preempt_at=2,
                     metrics_out=str(tmp_path / "m.json"))
    two_ranks = run_replicas(replace(config, checkpoint_dir=None, preempt_at=None,
                                     metrics_out=str(tmp_path / "u.json")), 2).losses
    with pytest.raises(Preempted):
        run_replicas(config, 2)
    assert set(_marker(tmp_path / "a", 2)["files"]) == {
        ".metadata", "__0_0.distcp", "__1_0.distcp", "train.pt", "rng-rank0.pt", "rng-rank1.pt"}
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    log = run_replicas(replace(config, preempt_at=None), 2)
    assert log.run["resumed_from_step"] == 2 and log.losses == two_ranks  # exact

    one = replace(config, parallel="ddp", preempt_at=None, checkpoint_dir=str(tmp_path / "b"),
                  metrics_out=str(tmp_path / "one.json"))
    with pytest.raises(ResumeMismatch, match="world_size 2 -> 1"):
        run_training(one)
    c = engine.build(one, DistInfo(), torch.device("cpu"))
    assert state.restore(str(tmp_path / "b"), c, DistInfo()) == (3, DataPosition(0, 24))
    dcp_to_torch_save(str(tmp_path / "b" / "step-00000002"), str(tmp_path / "saved.pt"))
    saved = torch.load(tmp_path / "saved.pt", weights_only=False)
    assert all(torch.equal(saved["model"][k], v) for k, v in c.model.state_dict().items())
    names = {id(p): n for n, p in c.model.named_parameters()}
    for p, moments in c.optimizer.state.items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(saved["optim"]["state"][names[id(p)]][key], moments[key]), (names[id(p)], key)
    rest = run_training(replace(one, allow_resume_change="world_size"))
    assert rest.run["resumed_from_step"] == 2 and rest.run["resume_changes"] == {"world_size": [2, 1]}
    assert rest.losses == pytest.approx(uninterrupted[3:], rel=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_dcp_checkpoint_goes_to_gs_and_resumes_from_it(tmp_path):
    """Through gcsfs to the local Cloud Storage server, as to a real bucket."""
    from labkit.core.launcher import child_env
    from labkit.vertex.storage import LocalStorage

    (tmp_path / "buckets" / "bkt").mkdir(parents=True)
    code = (
        "import json, warnings\nfrom dataclasses import replace\n"
        "from labkit.core.train_config import Preempted, TrainConfig\nfrom labkit.torch import trainer\n"
        f"c = TrainConfig(**json.loads({json.dumps(json.dumps(asdict(DCP)))}))\n"
        "c = replace(c, checkpoint_dir='gs://bkt/run/ckpt', preempt_at=2)\n"
        "try:\n    trainer.fit(c)\nexcept Preempted:\n    pass\n"
        "warnings.simplefilter('error', UserWarning)  # a fallback would be a CheckpointWarning\n"
        "log = trainer.fit(replace(c, preempt_at=None))\n"
        "print(json.dumps([log.run['resumed_from_step'], log.losses]))\n")
    with LocalStorage(tmp_path / "buckets", tmp_path / "state") as server:
        out = subprocess.run([sys.executable, "-c", code], env=child_env(server.client_env()),
                             capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    resumed, losses = json.loads(out.stdout.strip().splitlines()[-1])
    assert resumed == 2 and losses == trainer.fit(BASE).losses[3:]
    folder = tmp_path / "buckets" / "bkt" / "run" / "ckpt" / "step-00000002"
    marker = json.loads((folder / checkpoint.MARKER).read_text())
    assert {".metadata", "__0_0.distcp"} <= set(marker["files"])
    assert all(entry["size"] == (folder / name).stat().st_size for name, entry in marker["files"].items())
