"""recipes/common.py runs without labkit, so it writes out what labkit decides elsewhere: the flag
defaults, the model sizes, the checks, the device rule, the data settings and the metrics file's
layout. Each is held equal to labkit's own here; and the networks and samples a recipe trains
are labkit's very classes, not copies of them."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, fields

import pytest

from labkit.core.config import SCALES, ParameterError
from labkit.core.metrics import MetricsLog, StepMetrics, load_metrics, summarize
from labkit.core.models import MODEL_NAMES, build_config
from labkit.core.placement import DEVICES, place
from labkit.core.train_config import TrainConfig
from labkit.recipes import common


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    global torch
    torch = pytest.importorskip("torch")


def args_of(*argv: str, **extra) -> argparse.Namespace:
    p = common.parser("test")
    for flag, kind in (("--grad-accum", int), ("--checkpoint-every", int), ("--preempt-at", int),
                       ("--checkpoint-dir", str)):
        p.add_argument(flag, type=kind, default=None if flag in ("--preempt-at", "--checkpoint-dir")
                       else getattr(TrainConfig, flag[2:].replace("-", "_")))
    return p.parse_args(list(argv))


def test_the_flags_and_their_defaults_are_labkit_train_s():
    args = common.parser("test").parse_args([])
    for name in ("model", "scale", "steps", "batch_size", "lr", "warmup_steps", "grad_clip", "seed",
                 "device"):
        assert getattr(args, name) == getattr(TrainConfig, name), name
    assert args.num_samples is None and args.metrics_out is None
    assert common.MODELS == MODEL_NAMES and common.SCALES == SCALES
    assert tuple(common.parser("t")._option_string_actions["--device"].choices) == DEVICES


def test_the_model_sizes_are_labkit_s():
    for model in MODEL_NAMES:
        for scale in ("smoke", "full"):
            cfg = common.model_config(argparse.Namespace(model=model, scale=scale))
            assert vars(cfg) == asdict(build_config(model, scale)), (model, scale)


def test_the_networks_and_samples_are_the_engine_s_own_classes():
    """One definition of each: labkit's engine builds labkit.torch.plain's networks and
    labkit.data.samples' generator, which is what a recipe (and its copy) imports."""
    from labkit.data import samples, synthetic
    from labkit.torch import data, models, plain

    for name in ("CNN", "ResNet", "GPT", "Block", "CausalSelfAttention"):
        assert getattr(models, name) is getattr(plain, name)
    assert data.SampleDataset is plain.SampleDataset and data.to_float_images is plain.to_float_images
    assert synthetic.SyntheticImages is samples.SyntheticImages
    assert synthetic.SyntheticTokens is samples.SyntheticTokens
    assert issubclass(synthetic.ImageDatasetConfig, samples.ImageDatasetConfig)
    for model in MODEL_NAMES:
        args = common.parse(common.parser("t"), ["--model", model])
        built = models.build_model(build_config(model))
        assert type(common.torch_model(args)) is type(built)
    # the recipe's model starts from the engine's weights: same seed, same construction order
    args = common.parse(common.parser("t"), ["--model", "gpt", "--seed", "3"])
    torch.manual_seed(3)
    engine = models.build_model(build_config("gpt"))
    assert all(torch.equal(a, b) for a, b in zip(common.torch_model(args).state_dict().values(),
                                                  engine.state_dict().values(), strict=True))


@pytest.mark.parametrize("model", ["cnn", "gpt"])
def test_the_samples_are_the_engine_s(model):
    """Same generator settings as `labkit train` (label noise, sizes, count), so the same bytes:
    common.torch_dataset, batched, against the engine's batch-at-a-time dataset."""
    from labkit.data.synthetic import TRAINING_LABEL_NOISE, for_model
    from labkit.torch.data import make_dataset

    assert common.LABEL_NOISE == TRAINING_LABEL_NOISE
    args = common.parse(common.parser("t"), ["--model", model, "--batch-size", "8", "--seed", "5"])
    config = common.engine_config(args)
    assert common.num_samples(args) == config.num_samples_or_default() == 4096
    args.num_samples = 300
    ours = common.torch_dataset(args)
    theirs = for_model(build_config(model), 300, 5)
    assert asdict(ours.source.config) == asdict(theirs.config)
    engine = make_dataset(build_config(model), 300, 5)
    indices = [0, 7, 299, 150]
    x, y = torch.utils.data.default_collate([ours[i] for i in indices])
    ex, ey = engine[indices]
    assert x.dtype == ex.dtype and torch.equal(x, ex) and torch.equal(y, ey)


@pytest.mark.parametrize("argv", [
    ["--steps", "0"], ["--batch-size", "0"], ["--grad-accum", "0"], ["--lr", "-1"], ["--lr", "nan"],
    ["--warmup-steps", "-1"], ["--grad-clip", "-0.5"], ["--grad-clip", "inf"], ["--seed", "-1"],
    ["--num-samples", "0"], ["--checkpoint-every", "-1"], ["--checkpoint-dir", " "],
    ["--metrics-out", ""], ["--metrics-out", "runs/"], ["--preempt-at", "-1"],
    ["--steps", "5", "--preempt-at", "5"],
])
def test_a_bad_flag_is_refused_in_labkit_train_s_words(argv):
    args = args_of(*argv)
    with pytest.raises(ParameterError) as labkit:
        common.engine_config(args)
    assert common.first_problem(args) == str(labkit.value)


def test_good_flags_pass_both_checks():
    for argv in ([], ["--grad-clip", "0", "--preempt-at", "19", "--checkpoint-dir", "ck"],
                 ["--num-samples", "32", "--lr", "0"]):
        args = args_of(*argv)
        common.engine_config(args)
        assert common.first_problem(args) is None
    assert "must hold at least one global batch of 32 (got 16)" in common.first_problem(
        args_of("--num-samples", "16"))


def test_the_device_rule_is_labkit_s():
    for processes in (1, 2, 3):
        for gpus in (0, 1, 2):
            for choice in DEVICES:
                try:
                    wanted = place(processes, gpus, device=choice).device
                except ParameterError as e:
                    with pytest.raises(ValueError) as ours:
                        common.placement(processes, gpus, choice)
                    assert str(ours.value) == str(e)
                else:
                    assert common.placement(processes, gpus, choice) == wanted, (processes, gpus, choice)


def test_the_metrics_file_has_labkit_s_layout(tmp_path):
    """Rows as StepMetrics writes them (its fields in order, then the extras), the summary as
    labkit computes it, read back by labkit; a resumed run keeps the earlier steps below it."""
    args = common.parse(common.parser("t"), ["--metrics-out", str(tmp_path / "sub" / "m.json")])
    log = common.StepLog("demo", args, world_size=2)
    for step, loss in enumerate((2.5, 2.0, 1.5)):
        log.log(step, loss, lr=1e-3 * step or None, skipped=step == 1, note="x")
    log.write()
    data = load_metrics(tmp_path / "sub" / "m.json")
    assert data["run"] == json.loads(json.dumps({**log.metrics.run}))
    assert data["run"]["recipe"] == "demo" and data["run"]["world_size"] == 2
    names = [f.name for f in fields(StepMetrics) if f.name != "extra"]
    for row in data["steps"]:
        known = {k: v for k, v in row.items() if k in names}
        expected = StepMetrics(**known, extra={k: v for k, v in row.items() if k not in names}).to_dict()
        assert list(row.items()) == list(expected.items())
    assert data["summary"] == summarize(data["steps"])
    assert MetricsLog.read(tmp_path / "sub" / "m.json").losses == [2.5, 2.0, 1.5]

    resumed = common.StepLog("demo", args)
    assert resumed.metrics.continue_from(args.metrics_out, 2) == 2
    resumed.log(2, 1.4)
    assert resumed.losses == [2.5, 2.0, 1.4]
    assert common.StepLog("demo", args).metrics.continue_from(str(tmp_path / "none.json"), 2) == 0
