"""Resuming a checkpoint cannot silently change the run (`labkit.core.fingerprint`): the commit
marker's fingerprint names what defines the run, a resume under another one is refused naming
each field unless allowed, an allowed change is what runs (and what the metrics say), and the
data position is kept in samples so a batch-size change loses and repeats nothing (torch's
`ResumableLoader`, TF's `DataOrigin`)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from labkit.core import checkpoint
from labkit.core.config import ParameterError
from labkit.core.fingerprint import (
    ADAMW,
    Resume,
    ResumeMismatch,
    differences,
    parse_allowed,
    run_fingerprint,
)
from labkit.core.train_config import TrainConfig
from labkit.tf.data import BatchLayout, DataOrigin, replica_indices, step_position

CONFIG = TrainConfig(model="cnn", steps=3, batch_size=8, num_samples=64, eval_samples=0, device="cpu",
                     progress=False)  # no held-out evaluation: these tests are about resuming


def test_the_fingerprint_holds_what_defines_the_run():
    fp = run_fingerprint(replace(CONFIG, grad_clip=0.0, scale="auto", num_samples=None), world_size=2,
                         data="synthetic")
    assert fp["model"] == {"name": "cnn", "image_size": 32, "channels": 3, "num_classes": 10,
                           "width": 32, "depth": 2}  # "auto" recorded as the sizes it picked
    assert (fp["batch_size"], fp["world_size"], fp["grad_accum"], fp["seed"]) == (8, 2, 1, 0)
    assert (fp["lr"], fp["warmup_steps"], fp["grad_clip"], fp["precision"]) == (1e-3, 0, None, "fp32")
    assert fp["optimizer"] == ADAMW and fp["framework"] == "torch"
    assert (fp["data"], fp["num_samples"]) == ("synthetic", 4096)  # the default, resolved
    assert json.loads(json.dumps(fp)) == fp  # a marker gives back what was written


def test_differences_are_named_down_to_the_model_field():
    a = run_fingerprint(CONFIG, world_size=1, data="synthetic")
    b = run_fingerprint(replace(CONFIG, model="gpt", lr=2e-3), world_size=1, data="synthetic")
    diffs = differences(a, b)
    assert diffs["lr"] == (1e-3, 2e-3) and diffs["model.name"] == ("cnn", "gpt")
    assert diffs["model.width"] == (32, None) and diffs["model.n_layer"] == (None, 2)


def test_a_resume_under_other_settings_is_refused_naming_each_field_and_the_flag():
    saved = {"fingerprint": run_fingerprint(CONFIG, world_size=1, data="synthetic")}
    now = Resume.of(replace(CONFIG, batch_size=16, seed=3), world_size=1, data="synthetic")
    with pytest.raises(ResumeMismatch) as info:
        now.check(saved, "runs/ck")
    message = str(info.value)
    for fact in ("checkpoint_dir", "runs/ck", "batch_size 8 -> 16", "seed 0 -> 3",
                 "--allow-resume-change batch_size,seed", "--checkpoint-dir"):
        assert fact in message, fact
    assert "\n" not in message and isinstance(info.value, ValueError)
    assert set(info.value.differences) == {"batch_size", "seed"}


def test_allowed_changes_pass_and_are_recorded_other_changes_still_refused():
    saved = {"fingerprint": run_fingerprint(CONFIG, world_size=1, data="synthetic")}
    allowed = replace(CONFIG, batch_size=16, lr=2e-3, allow_resume_change="batch_size,lr")
    resume = Resume.of(allowed, world_size=1, data="synthetic")
    assert resume.check(saved, "ck") == {"batch_size": (8, 16), "lr": (1e-3, 2e-3)}
    assert resume.record() == {"batch_size": [8, 16], "lr": [1e-3, 2e-3]}
    with pytest.raises(ResumeMismatch, match=r"world_size 1 -> 2; .*--allow-resume-change world_size"):
        Resume.of(allowed, world_size=2, data="synthetic").check(saved, "ck")


def test_the_model_framework_and_optimizer_can_never_change():
    saved = {"fingerprint": run_fingerprint(CONFIG, world_size=1, data="synthetic")}
    with pytest.raises(ResumeMismatch) as err:
        Resume.of(replace(CONFIG, model="gpt"), world_size=1, data="synthetic").check(saved, "ck")
    assert "model.name 'cnn' -> 'gpt'" in str(err.value) and "--checkpoint-dir" in str(err.value)
    assert "--allow-resume-change" not in str(err.value)  # the model cannot change on resume
    with pytest.raises(ParameterError, match="'allow_resume_change' cannot include 'model'"):
        parse_allowed("lr,model")
    with pytest.raises(ParameterError, match="names 'colour', which is not a setting a resume can change"):
        replace(CONFIG, allow_resume_change="colour")
    assert parse_allowed(" batch-size , lr") == {"batch_size", "lr"}


def test_a_checkpoint_without_a_fingerprint_is_refused_naming_the_folder():
    with pytest.raises(ResumeMismatch, match="ck.*no run fingerprint"):
        Resume.of(CONFIG, world_size=1, data="synthetic").check({"world_size": 1, "framework": "torch"},
                                                                "ck")


def test_the_engines_optimizer_is_the_fingerprints():
    import torch

    from labkit.torch.distributed import DistInfo
    from labkit.torch.engine import build

    opt = build(CONFIG, DistInfo(), torch.device("cpu")).optimizer
    assert list(opt.defaults["betas"]) == ADAMW["betas"] and opt.defaults["eps"] == ADAMW["eps"]
    assert {g["weight_decay"] for g in opt.param_groups} == {ADAMW["weight_decay"], 0.0}


# ---------------------------------------------------------------- the data position in samples

def _rounds(loaders, rounds: int) -> list[set[int]]:
    """The samples of each of `rounds` steps, over every replica's loader (one micro-batch each)."""
    out = []
    for _ in range(rounds):
        step: set[int] = set()
        for loader in loaders:
            x, y = next(loader)
            step |= {int(i) for i in y}  # the dataset below labels each sample with its index
        out.append(step)
    return out


class _Indexed:
    """A batch dataset whose targets are the sample indices."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, indices):
        import torch

        idx = torch.tensor(list(indices))
        return idx, idx


def test_a_position_in_samples_continues_the_order_under_any_layout():
    from labkit.torch.data import DataPosition, ResumableLoader

    data = _Indexed(64)
    order = ResumableLoader(data, 64, seed=5)
    uninterrupted = [int(i) for i in next(order)[1]]  # the whole epoch's order, in one batch
    before = ResumableLoader(data, 8, seed=5)  # 3 steps of 8, one replica
    seen = _rounds([before], 3)
    assert before.position == DataPosition(0, 24)
    after = [ResumableLoader(data, 8, world_size=2, rank=r, seed=5, position=before.position)
             for r in range(2)]  # 2 steps of 16 over two replicas
    seen += _rounds(after, 2)
    assert seen == [set(uninterrupted[a:b]) for a, b in [(0, 8), (8, 16), (16, 24), (24, 40), (40, 56)]]
    # the 8 samples left cannot give both replicas a micro-batch: the next step starts epoch 1
    assert all(loader.position == DataPosition(1, 0) for loader in after)


def test_a_position_in_the_dropped_tail_starts_the_next_epoch():
    from labkit.torch.data import DataPosition, ResumableLoader

    loader = ResumableLoader(_Indexed(40), 16, seed=1, position=DataPosition(0, 32))  # 8 left < 16
    first = {int(i) for i in next(loader)[1]}
    fresh = ResumableLoader(_Indexed(40), 16, seed=1, position=DataPosition(1, 0))
    assert first == {int(i) for i in next(fresh)[1]} and loader.position == DataPosition(1, 16)


def test_a_data_position_not_counted_in_samples_is_refused_naming_the_checkpoint():
    from labkit.torch.data import DataPosition
    from labkit.torch.state import saved_position

    assert saved_position({"epoch": 1, "sample": 40}, "ck/step-00000003") == DataPosition(1, 40)
    with pytest.raises(checkpoint.CheckpointError, match=r"ck/step-00000003: .*counts no samples"):
        saved_position({"epoch": 1, "batch": 3}, "ck/step-00000003")


def test_tf_steps_continue_the_order_from_where_a_resumed_run_began():
    n, seed = 64, 2
    # three steps of 8, then the checkpoint's position (epoch 0, 24 samples) with batches of 16
    origin = DataOrigin.resumed(3, {"step": 3, "epoch": 0, "sample": 24})
    assert [step_position(s, 16, n, origin) for s in range(3, 7)] == [(0, 24), (0, 40), (1, 0), (1, 16)]
    order = np.random.default_rng([seed, 0]).permutation(n)
    layout = BatchLayout(16, 2, 2)
    step3 = np.concatenate([replica_indices(3, r, layout, n, seed, origin).ravel() for r in range(2)])
    assert sorted(step3) == sorted(order[24:40])
    # a fresh origin is the step-based order: 8 steps an epoch, so step 9 is epoch 1's second
    assert step_position(9, 8, 64, DataOrigin()) == (1, 8)


# ---------------------------------------------------------------- the torch engine

def test_an_allowed_lr_and_warmup_change_is_what_runs_and_what_the_metrics_say(tmp_path):
    from labkit.torch.trainer import fit

    ck = str(tmp_path / "ck")
    fit(replace(CONFIG, checkpoint_dir=ck))
    changed = replace(CONFIG, steps=5, checkpoint_dir=ck, lr=2e-3, warmup_steps=10,
                      allow_resume_change="lr,warmup_steps")
    log = fit(changed)
    assert [s["lr"] for s in log.steps] == pytest.approx([2e-3 * 4 / 10, 2e-3 * 5 / 10])
    assert log.run["config"]["lr"] == 2e-3
    assert log.run["resume_changes"] == {"lr": [1e-3, 2e-3], "warmup_steps": [0, 10]}
    marker = checkpoint.read_marker(ck, 4)["meta"]["fingerprint"]
    assert (marker["lr"], marker["warmup_steps"]) == (2e-3, 10)  # the next resume matches as is
    assert fit(replace(changed, steps=6, allow_resume_change=None)).run["resume_changes"] is None


def test_a_checkpoint_of_the_other_engine_is_refused_not_skipped(tmp_path):
    from labkit.torch.trainer import fit

    ck = str(tmp_path / "ck")
    checkpoint.save(ck, 2, {"model.npz": b"weights"},
                    {"framework": "tf", "world_size": 1,
                     "fingerprint": run_fingerprint(replace(CONFIG, framework="tf"), world_size=1, data="synthetic")})
    with pytest.raises(ParameterError, match=r"holds a checkpoint of the tf engine"):
        fit(replace(CONFIG, checkpoint_dir=ck))
    assert checkpoint.committed_steps(ck) == [2]  # nothing written over it
