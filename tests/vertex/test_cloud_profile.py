"""Looking inside a running job: the interactive shell (enable_web_access) and the Vertex AI
TensorBoard Profiler, in the specs labkit builds, `labkit job`, and the wrapper that starts the
profiler inside the training process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from labkit import vertex
from labkit.cli import main
from labkit.core.config import ParameterError
from labkit.vertex import cloud_profile, userjob

OUT = "gs://my-bucket/runs/r1"
TB = dict(tensorboard="projects/p/locations/us-central1/tensorboards/1",
          service_account="trainer@p.iam.gserviceaccount.com")


def test_web_access_reaches_every_kind_of_job_and_the_rest_form():
    pytest.importorskip("google.cloud.aiplatform_v1")
    specs = [vertex.training_job({}, output_uri=OUT, enable_web_access=True),
             vertex.notebook_job("gs://bkt/nb.ipynb", {}, output_uri=OUT, enable_web_access=True),
             userjob.user_job(["python", "t.py"], output_uri=OUT, code=OUT + "/inputs/c.tar.gz",
                              enable_web_access=True)]
    for spec in specs:
        assert spec["enable_web_access"] is True
        vertex.validate(spec)
        assert json.loads(vertex.to_rest_json(spec))["enableWebAccess"] is True
    assert "enable_web_access" not in vertex.training_job({}, output_uri=OUT)
    study = vertex.tuning_job({}, output_uri=OUT, metric="loss", goal="minimize",
                              parameters={"lr": ("log", 1e-4, 1e-1)}, max_trial_count=2,
                              parallel_trial_count=1, enable_web_access=True)
    assert study["trial_job_spec"]["enable_web_access"] is True
    with pytest.raises(ParameterError, match="enable_web_access"):
        vertex.training_job({}, output_uri=OUT, enable_web_access="yes")


def test_the_profiler_job_installs_the_sdk_plugin_and_starts_training_under_it():
    spec = vertex.training_job({"framework": "tf"}, output_uri=OUT, tensorboard_profiler=True, **TB)
    container = spec["worker_pool_specs"][0]["container_spec"]
    assert container["args"][:5] == ["python", "-m", "labkit.vertex.with_profiler", "--", "python"]
    assert container["args"][5:8] == ["-m", "labkit", "train"]
    assert "pip install --quiet 'google-cloud-aiplatform[cloud_profiler]'" in container["command"][2]
    assert spec["tensorboard"] == TB["tensorboard"]


@pytest.mark.parametrize("framework, extra, words", [
    ("torch", TB, ["TensorFlow only", "labkit profile"]),
    ("tf", {}, ["needs tensorboard=projects/P/locations/L/tensorboards/ID"]),
])
def test_a_profiler_the_service_cannot_give_is_refused(framework, extra, words):
    with pytest.raises(ParameterError) as err:
        vertex.training_job({"framework": framework}, output_uri=OUT, tensorboard_profiler=True, **extra)
    assert err.value.name == "tensorboard_profiler"
    for w in words:
        assert w in str(err.value)


def test_only_a_python_command_can_run_under_the_profiler():
    assert cloud_profile.profiled(["python3", "train.py", "--x"])[-3:] == ["python3", "train.py", "--x"]
    for bad in (["bash", "run.sh"], ["python"], ["python", "-m"]):
        with pytest.raises(ParameterError, match="starts inside the training process"):
            cloud_profile.profiled(bad)
    with pytest.raises(ParameterError, match="call cloud_profiler.init"):
        userjob.user_job(["--epochs", "1"], output_uri=OUT, image_uri="gcr.io/p/own:1", args_only=True,
                         framework="tf", tensorboard_profiler=True, **TB)


def test_labkit_job_dry_run_shows_both_and_refuses_a_torch_profiler(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("GOOGLE_CLOUD_PROJECT", "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "train.py").write_text("print('hi')\n")
    flags = ["--code", str(tmp_path), "--output", "gs://my-bucket/tf", "--enable-web-access",
             "--tensorboard-profiler", "--tensorboard", TB["tensorboard"], "--service-account",
             TB["service_account"]]
    assert main(["job", "--dry-run", "--framework", "tf", *flags, "--", "python", "train.py"]) == 0
    out = capsys.readouterr().out
    rest = json.loads(out[:out.index("\n}\n") + 2])
    assert rest["enableWebAccess"] is True
    container = rest["workerPoolSpecs"][0]["containerSpec"]
    assert container["args"] == ["python", "-m", "labkit.vertex.with_profiler", "--", "python", "train.py"]
    assert "cloud_profiler" in container["command"][2] and "enableWebAccess: true" in out  # the gcloud config
    assert main(["job", "--dry-run", *flags, "--", "python", "train.py"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tensorboard_profiler" in err[0] and "TensorFlow only" in err[0]


def _wrapped(tmp_path, env):
    script = tmp_path / "train.py"
    script.write_text("import sys\nprint('trained', sys.argv[1:])\nsys.exit(3)\n")
    clean = {k: v for k, v in env.items() if not k.startswith("AIP_")}
    return subprocess.run([sys.executable, "-m", "labkit.vertex.with_profiler", "--", "python", str(script), "--x", "1"],
                          capture_output=True, text=True, env=clean, timeout=120)


def test_on_vertex_a_missing_profiler_stops_the_job_at_once(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if k != cloud_profile.EMULATED_ENV}
    done = _wrapped(tmp_path, env)
    assert done.returncode == 2 and "trained" not in done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "AIP_TF_PROFILER_PORT" in lines[0] and "tensorboard-profiler" in lines[0]


def test_in_the_emulator_the_script_trains_without_the_profiler_and_keeps_its_exit_status(tmp_path):
    import os

    done = _wrapped(tmp_path, {**os.environ, cloud_profile.EMULATED_ENV: "1"})
    assert done.returncode == 3 and "trained ['--x', '1']" in done.stdout
    assert "not in the emulator" in done.stderr


@pytest.mark.slow
def test_the_emulated_profiler_job_trains_and_says_the_profiler_is_not_here(tmp_path, capsys):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import sys\nprint('trained with', sys.argv[1:])\n")
    assert main(["emulate", "--code", str(code), "--framework", "tf", "--enable-web-access",
                 "--tensorboard-profiler", "--tensorboard", TB["tensorboard"], "--service-account",
                 TB["service_account"], "--output", "gs://my-bucket/tf", "--workdir", str(tmp_path / "w"),
                 "--", "python", "train.py", "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert "trained with ['--epochs', '1']" in out and "interactive shell is not emulated" in out
    assert "TensorBoard Profiler: not in the emulator" in out
