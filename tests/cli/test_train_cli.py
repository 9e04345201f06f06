"""`labkit train` end to end in subprocesses: metrics file, the preemption drill (exit 143, resume
finishes the remaining steps with identical losses), a real SIGTERM, and local DDP replicas."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from labkit.core.fingerprint import CHANGEABLE
from labkit.core.train_config import TrainConfig, to_argv
from tests.conftest import REPO


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    pytest.importorskip("torch")


# No held-out evaluation: no test here is about it, and each run would pay for it.
COMMON = ["--framework", "torch", "--model", "cnn", "--batch-size", "8", "--num-samples", "40",
          "--eval-samples", "0", "--no-progress"]


def train(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit", "train", *COMMON, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def steps_of(path) -> list[tuple[int, float]]:
    return [(s["step"], s["loss"]) for s in json.loads(path.read_text())["steps"]]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_preemption_drill_resumes_with_identical_losses(tmp_path):
    full = train("--steps", "9", "--metrics-out", str(tmp_path / "full.json"))
    assert full.returncode == 0, full.stderr
    ck = str(tmp_path / "ck")
    first = train("--steps", "9", "--checkpoint-dir", ck, "--checkpoint-every", "2",
                  "--metrics-out", str(tmp_path / "a.json"), "--preempt-at", "4")
    assert first.returncode == 143, first.stdout + first.stderr
    assert "resume" in first.stdout
    second = train("--steps", "9", "--checkpoint-dir", ck, "--checkpoint-every", "2",
                   "--metrics-out", str(tmp_path / "b.json"))
    assert second.returncode == 0, second.stderr
    a, b = steps_of(tmp_path / "a.json"), steps_of(tmp_path / "b.json")
    assert [s for s, _ in a] == [0, 1, 2, 3, 4] and [s for s, _ in b] == [5, 6, 7, 8]
    assert a + b == steps_of(tmp_path / "full.json")  # bitwise: floats compared exactly


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_external_sigterm_checkpoints_and_exits_143(tmp_path):
    ck = tmp_path / "ck"
    cmd = [sys.executable, "-m", "labkit", "train", *COMMON, "--steps", "10000", "--checkpoint-dir", str(ck),
           "--checkpoint-every", "1", "--input-latency-ms", "20", "--metrics-out", str(tmp_path / "m.json")]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(ck.glob("step-*/COMMITTED")) and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, out + err
    last = steps_of(tmp_path / "m.json")[-1][0]
    assert (ck / f"step-{last:08d}" / "COMMITTED").exists()  # the step in flight was finished and saved


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_nproc_per_node_runs_ddp_replicas(tmp_path):
    r = train("--steps", "3", "--nproc-per-node", "2", "--metrics-out", str(tmp_path / "m.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["run"]["world_size"] == 2 and len(data["steps"]) == 3


def test_bad_flag_values_are_refused():
    r = train("--precision", "fp4", "--steps", "1")
    assert r.returncode != 0 and "invalid choice" in r.stderr
    r = train("--precision", "fp8", "--model", "cnn", "--steps", "1")  # a choice, not for this model
    assert r.returncode == 2 and "parameter 'precision' applies to model 'gpt' only" in r.stdout
    r = train("--steps", "0")
    assert r.returncode == 2 and "parameter 'steps' must be >= 1" in r.stdout


def _configs():
    """Every TrainConfig field drawn from its own domain (None included where allowed), kept to
    combinations TrainConfig accepts."""
    import typing
    from dataclasses import fields

    from hypothesis import strategies as st

    hints = typing.get_type_hints(TrainConfig)
    draws = {}
    for f in fields(TrainConfig):
        hint = hints[f.name]
        kinds = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        optional = type(None) in typing.get_args(hint)
        choices = f.metadata["choices"]
        if choices:
            s = st.sampled_from(choices)
        elif kinds[0] is bool:
            s = st.booleans()
        elif kinds[0] is int:
            s = st.integers(min_value=1, max_value=10**6)
        elif kinds[0] is float:
            s = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_subnormal=True)
        else:
            s = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1,
                        max_size=12).filter(lambda v: not v.startswith("-") and v.strip()
                                            and not v.endswith(("/", "\\")))  # paths a user can mean
        draws[f.name] = st.one_of(st.none(), s) if optional else s
    draws["allow_resume_change"] = st.one_of(st.none(), st.lists(
        st.sampled_from(tuple(CHANGEABLE)), min_size=1, unique=True).map(",".join))
    draws["wandb_project"] = st.one_of(st.none(), st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,39}", fullmatch=True))

    def build(values):
        _keep_parallel_settings_valid(values)
        from labkit.core.precisions import why_not_trains

        if why_not_trains(values["precision"], values["framework"], values["model"]):
            values["precision"] = "bf16"  # fp8: torch's GPT only
        values.update(fp8_head=values["fp8_head"] and values["model"] == "gpt" and values["precision"] == "bf16",
                      cuda_graph_step=values["cuda_graph_step"] and values["precision"] != "fp16")
        if values["preempt_at"] is not None and values["preempt_at"] >= values["steps"]:
            values["preempt_at"] = None
        if (values["framework"], values["parallel"] in ("ddp", "zero3"), values["sharding_backend"],
                values["cuda_graph_step"]) != ("torch", True, "torch", False):
            values["checkpoint_format"] = "auto"  # dcp saves the torch engine's ddp or zero3 state
        return TrainConfig(**values)

    return st.fixed_dictionaries(draws).map(build)


def _keep_parallel_settings_valid(values: dict) -> None:
    """Bend drawn parallelism settings into a combination `TrainConfig` accepts."""
    if values["framework"] != "torch":
        values.update(parallel="ddp", grad_compression="none")
    mode = values["parallel"]
    if mode in ("tp", "pp"):
        values["model"] = "gpt"
    if mode not in ("zero1", "zero2", "zero3"):
        values["sharding_backend"] = "torch"
    if mode != "tp":
        values["tp_degree"] = None
    if mode != "pp":
        values["pp_degree"] = None
    else:
        values["grad_accum"] = 1
    if mode != "ddp":
        values["grad_compression"] = "none"
    if mode not in ("ddp", "zero1") or values["sharding_backend"] == "deepspeed":
        values.update(compile=False, fp8_head=False, precision="bf16" if values["precision"] == "fp16"
                      else values["precision"])
    if values["sharding_backend"] == "deepspeed":
        values["grad_accum"] = 1


def test_to_argv_round_trips_every_field_including_none():
    from hypothesis import given, settings

    from labkit.core.train_config import from_argv

    @settings(max_examples=100, deadline=None)  # hypothesis's default: each example sets every field
    @given(_configs())
    def round_trip(cfg):
        assert from_argv(to_argv(cfg)) == cfg
        assert from_argv(to_argv(cfg, changed_only=True)) == cfg

    round_trip()


def test_a_job_spec_carries_no_clipping_as_none():
    """`--grad-clip None` once made a Vertex job die on start; the spec now says `none`."""
    from labkit.core.train_config import from_argv
    from labkit.vertex.specs import train_args

    args = train_args(TrainConfig(grad_clip=None, checkpoint_dir="gs://bkt/run"))
    assert args[args.index("--grad-clip") + 1] == "none"
    assert from_argv(args).grad_clip is None


def test_the_cli_parses_what_to_argv_writes():
    from dataclasses import fields

    from labkit.cli import build_parser

    cfg = TrainConfig(model="gpt", steps=7, lr=3e-4, grad_clip=None, compile=True, preempt_at=3,
                      input_latency_ms=2.5, checkpoint_dir="gs://bucket/run", compile_mode="tuned")
    args = build_parser().parse_args(["train", *to_argv(cfg)])
    assert {f.name: getattr(args, f.name) for f in fields(TrainConfig)} == {
        f.name: getattr(cfg, f.name) for f in fields(TrainConfig)}


def test_every_field_has_help_and_every_choice_list_is_a_flag_choice():
    from dataclasses import fields

    from labkit.cli import build_parser

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    actions = {a.dest: a for a in train._actions}
    for f in fields(TrainConfig):
        assert f.metadata["help"], f.name
        assert actions[f.name].help.startswith(f.metadata["help"])
        if f.metadata["choices"]:
            assert tuple(actions[f.name].choices) == tuple(f.metadata["choices"]), f.name


@pytest.mark.slow
def test_a_setting_the_machine_cannot_run_is_named_without_a_traceback():
    r = train("--steps", "1", "--cuda-graph-step", "--device", "cpu")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "parameter 'cuda_graph_step' needs a CUDA GPU" in r.stdout and "Traceback" not in r.stderr
    r = train("--steps", "1", "--cuda-graph-step", "--nproc-per-node", "2")  # refused before any replica starts
    assert r.returncode == 2 and "parameter 'cuda_graph_step' needs a single process" in r.stdout


def test_a_local_run_without_a_metrics_file_gets_one_that_is_gone_afterwards(tmp_path, monkeypatch):
    import tempfile
    from pathlib import Path

    from labkit.core.train_config import metrics_file

    named = TrainConfig(metrics_out=str(tmp_path / "mine.json"))
    with metrics_file(named, "labkit-ddp-") as config:
        assert config is named  # the caller's file is left alone
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with metrics_file(TrainConfig(), "labkit-ddp-") as config:
        folder = Path(config.metrics_out).parent
        assert folder.parent == tmp_path and folder.name.startswith("labkit-ddp-") and folder.is_dir()
    assert not folder.exists()
