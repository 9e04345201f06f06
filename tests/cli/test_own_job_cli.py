"""`labkit emulate` and `labkit job` on user-style trainers (examples/, which import nothing from
labkit): 2-node jobs that find each other, leave their model, checkpoints and TensorBoard files
in the emulated bucket, survive a preemption, and the same job for the service."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from labkit.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_torch_ddp_trainer_from_its_dockerfile_survives_a_spot_preemption(tmp_path, capsys):
    pytest.importorskip("torch")
    code = main(["emulate", "--dockerfile", str(EXAMPLES / "ddp_trainer" / "Dockerfile"), "--workers", "1",
                 "--spot", "--preempt-at-step", "1", "--step-pattern", r"Epoch (\d+)/", "--output",
                 "gs://my-bucket/ddp", "--workdir", str(tmp_path), "--", "--epochs", "3"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "sent SIGTERM to workerpool0[0]" in out and "1 job restart(s)" in out, out[-4000:]
    assert "resumed from /gcs/my-bucket/ddp/checkpoints/checkpoint.pt" in out  # the second attempt
    assert "[workerpool1[0]] Epoch 3/3" in out  # both nodes trained, as one DDP job
    bucket = tmp_path / "gcs" / "my-bucket" / "ddp"
    written = files_under(bucket)
    assert "model/model.pt" in written and "checkpoints/checkpoint.pt" in written
    assert any(f.startswith("logs/events.out.tfevents") for f in written)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_tensorflow_multiworker_trainer_writes_through_tensorflows_own_gs(tmp_path, capsys, monkeypatch):
    pytest.importorskip("tensorflow")
    monkeypatch.chdir(EXAMPLES / "tf_trainer")  # the folder an image would be built from
    code = main(["emulate", "--workers", "1", "--output", "gs://my-bucket/tf", "--workdir", str(tmp_path),
                 "--quiet", "--", "python", "train.py", "--epochs", "2"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    written = files_under(tmp_path / "gcs" / "my-bucket" / "tf")
    assert "model/saved_model/saved_model.pb" in written and "checkpoints/checkpoint" in written
    assert any(f.startswith("logs/events.out.tfevents") for f in written)
    logs = sorted((tmp_path / "jobs").glob("*/logs/attempt0/*.log"))
    assert all("Epoch 2/2" in log.read_text() for log in logs) and len(logs) == 2


def test_input_refused_before_any_replica_starts_is_one_line_and_exit_2(tmp_path, capsys):
    spec = tmp_path / "job.yaml"
    spec.write_text("workerPoolSpecs:\n- machineSpec: {machineType: n1-standard-4}\n  replicaCount: 1\n"
                    "  containerSpec: {imageUri: gcr.io/p/i, comand: [python]}\n")
    cases = [
        (["--spec", str(spec)], "comand"),
        (["--", "python", "x.py"], "--output"),
        (["--output", "gs://bkt/r", "--image", "gcr.io/p/i", "--", "--epochs", "2"], "--entrypoint"),
        (["--output", "gs://bkt/r", "--preempt-after", "3s", "--preempt-at-step", "2", "--", "python", "x.py"],
         "--preempt-at-step"),
        (["--output", "gs://bkt/r", "--preempt-at-step", "2", "--step-pattern", "Epoch", "--", "python", "x.py"],
         "--step-pattern"),
    ]
    for flags, named in cases:
        code = main(["emulate", "--workdir", str(tmp_path / "w"), "--code", str(tmp_path), *flags])
        err = capsys.readouterr().err.strip()
        assert code == 2 and named in err and len(err.splitlines()) == 1, (flags, err)
    assert not list((tmp_path / "w").glob("jobs/*/logs"))  # no replica ever started


@pytest.mark.slow  # an emulated job's replica processes
def test_a_failing_job_exits_1_naming_the_replica_and_its_last_words(tmp_path, capsys):
    code = main(["emulate", "--workers", "1", "--output", "gs://bkt/r", "--workdir", str(tmp_path / "w"),
                 "--code", str(tmp_path), "--quiet", "--", "python", "-c",
                 "import os, sys; sys.exit('bad input on ' + os.environ['RANK']) if os.environ['RANK'] == '1' "
                 "else __import__('time').sleep(30)"])
    out = capsys.readouterr().out
    assert code == 1 and "workerpool1[0] exited 1" in out and "bad input on 1" in out


def test_a_spec_file_runs_as_gcloud_would_submit_it(tmp_path, capsys):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "task.py").write_text(
        "import os, sys, pathlib\nout = pathlib.Path(os.environ['AIP_MODEL_DIR'].replace('gs://', '/gcs/'))\n"
        "out.mkdir(parents=True, exist_ok=True)\n(out / f\"{os.environ['CLOUD_ML_JOB_ID'] != ''}.txt\")"
        ".write_text(' '.join(sys.argv[1:]))\n")
    spec = tmp_path / "job.yaml"
    spec.write_text("workerPoolSpecs:\n- machineSpec: {machineType: n1-standard-4}\n  replicaCount: 1\n"
                    "  containerSpec:\n    imageUri: gcr.io/p/trainer\n    args: [--epochs, '3']\n"
                    "baseOutputDirectory: {outputUriPrefix: gs://spec-bucket/run}\n")
    code = main(["emulate", "--spec", str(spec), "--entrypoint", "python task.py", "--container-workdir",
                 str(tmp_path / "code"), "--workdir", str(tmp_path / "w"), "--quiet"])
    assert code == 0, capsys.readouterr().out[-2000:]
    assert (tmp_path / "w/gcs/spec-bucket/run/model/True.txt").read_text() == "--epochs 3"


def test_the_job_for_the_service_is_printed_without_credentials(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("GOOGLE_CLOUD_PROJECT", "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    code = main(["job", "--dry-run", "--code", str(EXAMPLES / "ddp_trainer"), "--workers", "1",
                 "--machine-type", "g2-standard-8", "--accelerator-type", "NVIDIA_L4", "--accelerator-count",
                 "1", "--spot", "--output", "gs://my-bucket/ddp", "--", "python", "train.py", "--epochs", "5"])
    out = capsys.readouterr().out
    assert code == 0, out
    rest = json.loads(out[:out.index("\n}\n") + 2])
    assert rest["scheduling"]["strategy"] == "SPOT" and rest["scheduling"]["restartJobOnWorkerRestart"]
    container = rest["workerPoolSpecs"][1]["containerSpec"]
    assert container["args"] == ["python", "train.py", "--epochs", "5"]
    assert "tar -xzf /gcs/my-bucket/ddp/inputs/code-" in container["command"][2]
    assert "torch.cuda.is_available()" in container["command"][2]  # a GPU job stops without a GPU
    assert "gcloud ai custom-jobs create --region=" in out and "--config=labkit-job.yaml" in out
    assert "would upload gs://my-bucket/ddp/inputs/code-" in out and "nothing submitted" in out


@pytest.mark.slow
def test_the_job_is_created_through_the_real_client_with_its_code_uploaded(tmp_path, capsys, monkeypatch):
    pytest.importorskip("google.cloud.aiplatform")
    from labkit.vertex.fake_service import FakeVertex
    from labkit.vertex.storage import LocalStorage

    monkeypatch.setenv("HOME", str(tmp_path))
    with FakeVertex() as fake, LocalStorage(tmp_path / "gcs", tmp_path / "state") as storage:
        (tmp_path / "gcs" / "my-bucket").mkdir()
        for key, value in storage.client_env().items():
            monkeypatch.setenv(key, value)
        code = main(["job", "--endpoint", fake.endpoint, "--project", "p", "--region", "us-central1",
                     "--code", str(EXAMPLES / "ddp_trainer"), "--workers", "1", "--output",
                     "gs://my-bucket/ddp", "--label", "team=ml", "--", "python", "train.py"])
        out = capsys.readouterr().out
        assert code == 0 and "submitted projects/p/locations/us-central1/customJobs/" in out, out
        created = fake.created()[0]
    assert created["labels"] == {"labkit-job": "user", "team": "ml"}
    command = created["job_spec"]["worker_pool_specs"][0]["container_spec"]["command"][2]
    archive = command.split("tar -xzf /gcs/")[1].split()[0]
    assert (tmp_path / "gcs" / archive).stat().st_size > 1000  # uploaded through gcsfs, before the job


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_tuning_study_of_your_own_script_runs_here(tmp_path, capsys, monkeypatch):
    pytest.importorskip("hypertune")
    monkeypatch.chdir(tmp_path)
    code = main(["emulate", "--tune-metric", "accuracy", "--goal", "maximize", "--param", "lr=log:0.01:0.2",
                 "--param", "momentum=0.0,0.9", "--trials", "2", "--parallel-trials", "2", "--output",
                 "gs://study/s1", "--workdir", str(tmp_path / "w"), "--", "python", "-m",
                 "labkit.recipes.hypertune_report", "--epochs", "2"])
    out = capsys.readouterr().out
    assert code == 0 and out.count("SUCCEEDED accuracy=0.") == 2 and "best trial" in out, out


def test_the_emulator_never_copies_its_own_outputs_as_code(tmp_path):
    """A job folder inside the code folder (the default runs/emulate/...) is no part of the image."""
    from labkit.vertex.programs import JOB_MARKER, copy_image_files

    (tmp_path / "code" / "runs" / "emulate" / "1").mkdir(parents=True)
    (tmp_path / "code" / "runs" / "emulate" / "1" / JOB_MARKER).write_text("{}")
    (tmp_path / "code" / "train.py").write_text("")
    copy_image_files(tmp_path / "code", tmp_path / "copy")
    assert sorted(os.listdir(tmp_path / "copy")) == ["runs", "train.py"]
    assert not (tmp_path / "copy" / "runs" / "emulate" / "1").exists()
    shutil.rmtree(tmp_path / "copy")
