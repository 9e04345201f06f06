"""The TF engine end to end in real processes: metrics schema (with data time and MFU),
preemption and resume through labkit's checkpoints (identical losses, fallback past a corrupt
step) and through Keras BackupAndRestore, CPU-only device set-up."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.core import checkpoint
from labkit.core.config import ParameterError
from labkit.core.metrics import load_metrics
from labkit.core.train_config import PREEMPTED_EXIT_CODE, Preempted, TrainConfig


@pytest.fixture(scope="module", autouse=True)
def _tensorflow():
    """TensorFlow, imported when this module's first test runs rather than at collection."""
    pytest.importorskip("tensorflow")


REPO = Path(__file__).resolve().parents[2]
SMALL = ["--model", "cnn", "--batch-size", "32", "--num-samples", "256"]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
               TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def _train(*args: str, env=None, timeout=240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "labkit", "train", "--framework", "tf", *SMALL, *args]
    return subprocess.run(cmd, env=env or _env(), capture_output=True, text=True, timeout=timeout)


def _fit_here(tmp_path: Path, **overrides) -> dict:
    """Train in this process (no interpreter start-up) and read the metrics file back."""
    from labkit.tf.engine import fit

    out = tmp_path / "m.json"
    values = dict(framework="tf", model="cnn", batch_size=32, num_samples=256, steps=8,
                  device="cpu", progress=False, metrics_out=str(out))
    fit(TrainConfig(**{**values, **overrides}))
    return load_metrics(out)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """An uninterrupted 8-step run: the curve every resumed run must reproduce."""
    return _fit_here(tmp_path_factory.mktemp("ref"))


@pytest.mark.slow
def test_tensorboard_scalars(tmp_path):
    _fit_here(tmp_path, steps=2, tensorboard_dir=str(tmp_path / "tb"))
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


@pytest.mark.slow
def test_the_smoke_model_learns_on_the_held_out_samples_torch_measures(tmp_path):
    """TensorFlow's twin of the torch engine's test: ten steps at lr 10^-2 take the held-out loss
    (the same 256 unseen samples) well under chance."""
    data = _fit_here(tmp_path, steps=10, batch_size=64, num_samples=None, lr=1e-2)
    heldout = data["run"]["heldout"]
    assert heldout["samples"] == 256 and heldout["loss"] < 0.8 * heldout["chance"], heldout
    assert data["summary"]["heldout_loss"] == heldout["loss"] == data["steps"][-1]["heldout_loss"]


@pytest.mark.slow
def test_metrics_schema(reference):
    steps = reference["steps"]
    assert [s["step"] for s in steps] == list(range(8))
    for key in ("loss", "step_time_s", "data_time_s", "samples_per_s", "mfu", "lr",
                "peak_memory_bytes"):
        assert all(key in s for s in steps), key
    run = reference["run"]
    assert (run["framework"], run["strategy"], run["world_size"]) == ("tf", "default", 1)
    assert run["parameters"] == 20042
    assert run["mfu_peak"].startswith("measured: 512x512x512 float32 matmul on cpu")
    s = steps[-1]
    assert s["mfu"] == pytest.approx(s["samples_per_s"] * run["flops_per_sample"] / run["peak_flops"])
    assert reference["summary"]["num_steps"] == 8


@pytest.mark.slow
def test_preempted_run_resumes_with_the_uninterrupted_losses(tmp_path, reference):
    """The drill (SIGTERM to itself during step 4), then the same run again: it continues with
    step 5 and the per-step losses are the uninterrupted run's, exactly."""
    ckpt = str(tmp_path / "ck")
    with pytest.raises(Preempted) as info:
        _fit_here(tmp_path, checkpoint_dir=ckpt, checkpoint_every=3, preempt_at=4)
    assert info.value.step == 4
    assert checkpoint.committed_steps(ckpt) == [2, 4]
    meta = checkpoint.load(ckpt).meta
    assert (meta["world_size"], meta["framework"], meta["fingerprint"]["batch_size"]) == (1, "tf", 32)
    resumed = _fit_here(tmp_path, checkpoint_dir=ckpt, checkpoint_every=3)
    # The metrics file holds every step once: 0-4 from the first attempt, 5-7 resumed.
    assert [s["step"] for s in resumed["steps"]] == list(range(8))
    assert resumed["run"]["resumed_from_step"] == 4
    assert [s["loss"] for s in resumed["steps"]] == [s["loss"] for s in reference["steps"]]
    assert resumed["run"]["final_weights"] == reference["run"]["final_weights"]


@pytest.mark.slow
def test_a_corrupt_checkpoint_falls_back_to_the_previous_committed_step(tmp_path, reference):
    ckpt = tmp_path / "ck"
    _fit_here(tmp_path, steps=5, checkpoint_every=2, checkpoint_dir=str(ckpt))
    blob = ckpt / "step-00000004" / "optimizer.npz"
    blob.write_bytes(blob.read_bytes()[:100])
    with pytest.warns(checkpoint.CheckpointWarning, match=r"step 4.*optimizer\.npz.*truncated"):
        resumed = _fit_here(tmp_path, checkpoint_dir=str(ckpt))
    # Resumed from step 3: the first attempt's step 4 is trained again, not listed twice.
    assert [s["step"] for s in resumed["steps"]] == list(range(8))
    assert [s["loss"] for s in resumed["steps"]] == [s["loss"] for s in reference["steps"]]


@pytest.mark.slow
def test_a_batch_size_change_is_refused_unless_allowed_then_continues_by_samples(tmp_path):
    ckpt = str(tmp_path / "ck")
    _fit_here(tmp_path, steps=3, batch_size=16, num_samples=64, checkpoint_dir=ckpt)
    with pytest.raises(ParameterError, match=r"batch_size 16 -> 32; .*--allow-resume-change batch_size"):
        _fit_here(tmp_path, steps=5, batch_size=32, num_samples=64, checkpoint_dir=ckpt)
    resumed = _fit_here(tmp_path, steps=4, batch_size=32, num_samples=64, checkpoint_dir=ckpt,
                        allow_resume_change="batch_size")
    assert [s["step"] for s in resumed["steps"]] == [0, 1, 2, 3] and resumed["run"]["resume_changes"] == {
        "batch_size": [16, 32]}
    # 3 x 16 samples, then one step of 32 would pass the epoch's 64: the next step starts epoch 1
    saved = json.loads(checkpoint.load(ckpt).files["train.json"])["data_position"]
    assert saved == {"step": 4, "epoch": 1, "sample": 32}


def test_a_torch_checkpoint_is_refused_naming_the_folder(tmp_path):
    checkpoint.save(str(tmp_path), 3, {"model.pt": b"torch bytes"}, {"framework": "torch"})
    with pytest.raises(ParameterError, match="checkpoint_dir.*torch engine"):
        _fit_here(tmp_path, steps=2, checkpoint_dir=str(tmp_path))


@pytest.mark.slow
def test_sigterm_then_resume_continues_with_the_next_step(tmp_path, reference):
    ckpt, out = tmp_path / "ckpt", tmp_path / "m.json"
    cmd = [sys.executable, "-m", "labkit", "train", "--framework", "tf", *SMALL, "--steps", "8",
           "--checkpoint-dir", str(ckpt), "--metrics-out", str(out), "--input-latency-ms", "200"]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines = []
    for line in proc.stdout:  # SIGTERM from outside, as Vertex sends it, once training runs
        lines.append(line)
        done = re.search(r"(\d+)/8 \[", line)  # the progress bar (the emulator watches it too)
        if done and int(done.group(1)) >= 2:
            proc.send_signal(signal.SIGTERM)
            break
    rest, _ = proc.communicate(timeout=240)
    assert proc.returncode == PREEMPTED_EXIT_CODE, "".join(lines) + rest
    first = load_metrics(out)["steps"]
    stopped = first[-1]["step"]
    assert 1 <= stopped < 7

    r = _train("--steps", "8", "--checkpoint-dir", str(ckpt), "--metrics-out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    resumed = load_metrics(out)
    assert [s["step"] for s in resumed["steps"]] == list(range(8))  # the earlier steps kept
    assert resumed["run"]["resumed_from_step"] == stopped
    expected = [s["loss"] for s in reference["steps"][stopped + 1:]]
    assert [s["loss"] for s in resumed["steps"][stopped + 1:]] == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
def test_keras_backup_and_restore_finishes_the_planned_epochs(tmp_path, reference):
    """Keras path: SIGTERM mid-epoch, exit 143; the rerun restores the last finished epoch
    from BackupAndRestore and runs the remaining epochs (4 epochs of 2 steps)."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "m.json"
    env = _env(LABKIT_TF_LOOP="keras")
    args = ["--steps", "8", "--checkpoint-every", "2", "--checkpoint-dir", str(ckpt),
            "--metrics-out", str(out)]
    r = _train(*args, "--preempt-at", "5", env=env)  # SIGTERM to itself during step 5 (epoch 2)
    assert r.returncode == PREEMPTED_EXIT_CODE, r.stdout + r.stderr
    assert json.loads((ckpt / "backup" / "training_metadata.json").read_text())["epoch"] == 2

    r = _train(*args, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    resumed = load_metrics(out)
    assert resumed["run"]["resumed_from_epoch"] == 2
    # Epochs 0 and 1 from the first attempt (its step 5 is trained again), then epochs 2 and 3.
    assert [s["step"] for s in resumed["steps"]] == list(range(8))
    # Same model, data and optimizer as the custom loop: the same per-step losses.
    assert [s["loss"] for s in resumed["steps"][4:]] == \
        pytest.approx([s["loss"] for s in reference["steps"][4:]], rel=1e-4)
    assert not (ckpt / "backup").exists()  # BackupAndRestore removes it after a finished fit


def test_batch_must_split_over_replicas_and_accumulation():
    from labkit.tf.engine import fit

    with pytest.raises(ParameterError, match="batch_size"):
        fit(TrainConfig(framework="tf", batch_size=30, grad_accum=4, steps=1, device="cpu",
                        progress=False))


@pytest.mark.slow
def test_grad_accumulation_keeps_the_global_batch_maths(tmp_path, reference):
    losses = [s["loss"] for s in _fit_here(tmp_path, steps=3, grad_accum=4)["steps"]]
    # 4 micro-batches of 8 = one batch of 32: same step, up to summation order.
    assert losses == pytest.approx([s["loss"] for s in reference["steps"][:3]], rel=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_runs_train(tmp_path, precision):
    steps = _fit_here(tmp_path, steps=3, precision=precision)["steps"]
    assert len(steps) == 3 and all(s["loss"] == s["loss"] for s in steps)  # no NaN
    assert steps[-1]["loss"] < 2.6


@pytest.mark.slow
def test_cpu_device_hides_gpus_from_tensorflow():
    code = ("from labkit.tf import runtime; import tensorflow as tf; "
            "print(runtime.configure('cpu'), len(tf.config.get_visible_devices('GPU')))")
    env = _env()
    env.pop("CUDA_VISIBLE_DEVICES")  # the set-up itself must hide them
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-2:] == ["cpu", "0"]


@pytest.mark.gpu
def test_tf_leaves_gpu_memory_to_torch():
    """torch allocates first; TF, configured after, grows its memory instead of mapping it all."""
    code = (
        "import torch; x = torch.ones(1024, 1024, device='cuda');"
        "from labkit.tf import runtime; runtime.configure('auto'); import tensorflow as tf;"
        "y = tf.ones((1024, 1024)); free, total = torch.cuda.mem_get_info();"
        "print(free / total)"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert float(r.stdout.split()[-1]) > 0.5



@pytest.mark.slow
def test_tfrecord_source_gives_the_same_samples_and_run(tmp_path, reference):
    """Samples read back from labkit's TFRecord shards are the generator's bytes, so a run fed
    through the TFRecord layer trains exactly like the in-memory one."""
    import numpy as np

    from labkit.core.models import GPTConfig, build_config
    from labkit.tf.data import arrays_from_shards, load_arrays
    from labkit.tf.engine import fit

    for cfg in (build_config("cnn"), GPTConfig(block_size=16, vocab_size=64)):
        from_shards = arrays_from_shards(cfg, 96, 0, tmp_path / "data")
        for a, b in zip(from_shards, load_arrays(cfg, 96, 0), strict=True):
            assert a.dtype == b.dtype and np.array_equal(a, b)
    assert sorted(p.name for p in (tmp_path / "data").iterdir())[0].startswith("images-n96")
    log = fit(TrainConfig(framework="tf", model="cnn", batch_size=32, num_samples=256, steps=3,
                          device="cpu", progress=False), data_dir=str(tmp_path / "data"))
    assert log.losses == pytest.approx([s["loss"] for s in reference["steps"][:3]], rel=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_gpu_mixed_precision_run_reports_gpu_memory(precision):
    """On a GPU: mixed precision trains, TF reports its peak GPU memory, in a fresh process."""
    code = ("from labkit.tf.engine import fit; from labkit.core.train_config import TrainConfig;"
            f"log = fit(TrainConfig(framework='tf', model='resnet', steps=4, batch_size=64,"
            f" precision='{precision}', device='cuda', progress=False));"
            "print(log.run['device'], log.steps[-1]['peak_memory_bytes'], log.losses[-1])")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    device, peak, loss = r.stdout.split()[-3:]
    assert device == "gpu" and int(peak) > 0 and float(loss) == float(loss)



SUMMED_CLIP = """
import json, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from labkit.tf.keras_fit import summed_clip_adamw
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    ours = summed_clip_adamw()(learning_rate=1.0, global_clipnorm=1.0)
    plain = keras.optimizers.AdamW(learning_rate=1.0, global_clipnorm=1.0)

def clipped(opt):
    first = tf.equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 0)
    share = tf.where(first, tf.constant([3.0, 0.0]), tf.constant([0.0, 4.0]))  # summed: (3, 4), norm 5
    return opt._clip_gradients([share])[0]

print(json.dumps({name: [t.numpy().tolist() for t in strategy.experimental_local_results(
    strategy.run(tf.function(lambda: clipped(opt))))] for name, opt in (("ours", ours), ("plain", plain))}))
"""


@pytest.mark.slow
def test_keras_loop_clips_the_gradient_summed_over_replicas():
    """Under MirroredStrategy the Keras loop's optimizer scales every replica's share by what the
    summed gradient needs (norm 5 clipped to 1: each share × 0.2), as one device would; Keras'
    own AdamW clips each share by its own norm (3 and 4), which this test shows it still does."""
    out = subprocess.run([sys.executable, "-c", SUMMED_CLIP], env=_env(), capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    shares = json.loads(out.stdout.strip().splitlines()[-1])
    assert shares["ours"] == [pytest.approx([0.6, 0.0]), pytest.approx([0.0, 0.8])]
    assert shares["plain"] == [pytest.approx([1.0, 0.0]), pytest.approx([0.0, 1.0])]
