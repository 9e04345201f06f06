"""Vertex's own notebook executor (`labkit.vertex.notebook_execution`): the NotebookExecutionJob
dict against the real aiplatform types, the checks it shares with labkit's CustomJob path, the
parameters written into the uploaded notebook, the real NotebookServiceClient against the local
fake, and `labkit run --vertex --executor`."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from google.api_core import exceptions
from nbformat.v4 import new_code_cell, new_notebook

from labkit import vertex
from labkit.cli import main
from labkit.core.config import ParameterError
from labkit.vertex import notebook_execution as nbx
from labkit.vertex.fake_service import FakeVertex
from labkit.vertex.specs import first_mismatch
from labkit.vertex.submit import get_job, job_state, notebook_service_client, wait


@pytest.fixture(scope="module", autouse=True)
def _aiplatform():
    """The Vertex AI client, imported when this module's first test runs rather than at collection."""
    global aiplatform_v1, aiplatform_v1beta1
    pytest.importorskip("google.cloud.aiplatform")
    from google.cloud import aiplatform_v1, aiplatform_v1beta1


SA = "runner@p.iam.gserviceaccount.com"
PARENT = "projects/p/locations/us-central1"


@pytest.fixture
def notebook(tmp_path):
    """A notebook that installs what it imports, with a parameters cell (size: int, name: str)."""
    nb = new_notebook(cells=[new_code_cell("%pip install numpy"),
                             new_code_cell("size = 8\nname = 'a'", metadata={"tags": ["parameters"]}),
                             new_code_cell("import numpy as np\nprint(np.ones(size).sum(), name)")])
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    path = tmp_path / "demo.ipynb"
    nbformat.write(nb, path)
    return path


def _job(notebook, **kw):
    options = dict(output_uri="gs://my-bucket/run1", machine_type="g2-standard-8", accelerator_type="NVIDIA_L4",
                   accelerator_count=1, service_account=SA)
    return nbx.notebook_execution_job(str(notebook), kw.pop("parameters", {"size": 16}), **(options | kw))


# ---------------------------------------------------------------- the spec

def test_the_spec_keeps_every_field_in_v1_and_v1beta1(notebook):
    spec = _job(notebook, labels={"team": "ml"}, timeout_s=3600, kms_key_name="projects/p/locations/"
                "us-central1/keyRings/r/cryptoKeys/k", subnetwork="projects/p/regions/us-central1/subnetworks/s")
    for types in (aiplatform_v1.types, aiplatform_v1beta1.types):
        message = types.NotebookExecutionJob(**spec)
        back = types.NotebookExecutionJob.to_dict(message, use_integers_for_enums=False)
        assert first_mismatch(dict(spec), back, "spec") is None
    assert vertex.validate_notebook_execution(spec, "v1beta1").kernel_name == "python3"
    assert spec["gcs_notebook_source"] == {"uri": "gs://my-bucket/run1/inputs/demo.ipynb"}
    assert spec["gcs_output_uri"] == "gs://my-bucket/run1/notebooks"
    assert spec["workbench_runtime"] == {} and spec["execution_timeout"] == "3600s"
    assert spec["custom_environment_spec"]["machine_spec"] == {
        "machine_type": "g2-standard-8", "accelerator_type": "NVIDIA_L4", "accelerator_count": 1}
    assert spec["custom_environment_spec"]["network_spec"]["enable_internet_access"] is True
    assert spec["labels"] == {"labkit-job": "notebook-executor", "team": "ml"}
    assert spec.notebook == str(notebook) and spec.parameters == {"size": 16}


def test_neither_api_version_has_a_parameters_field():
    """The reason labkit writes parameters into the notebook: should a client version add the
    field, this fails and the module should use it."""
    v1 = set(aiplatform_v1.types.NotebookExecutionJob.meta.fields)
    assert v1 == set(aiplatform_v1beta1.types.NotebookExecutionJob.meta.fields)
    assert not {f for f in v1 if "param" in f}
    assert {"workbench_runtime", "kernel_name", "custom_environment_spec", "gcs_output_uri"} <= v1


def test_a_field_the_types_would_drop_is_refused(notebook):
    spec = dict(_job(notebook), execution_user="me@example.com")  # one oneof with service_account
    with pytest.raises(ValueError, match="did not survive"):
        vertex.validate_notebook_execution(spec)
    with pytest.raises(ParameterError, match="notebook_source"):
        nbx.check_notebook_execution(dict(_job(notebook), direct_notebook_source={"content": b"{}"}))


@pytest.mark.parametrize("machine, accelerator, count, field", [
    ("n1-standard-8", "NVIDIA_L4", 1, "accelerator_type"),      # L4 runs on G2 only
    ("g2-standard-8", "NVIDIA_L4", 2, "accelerator_count"),     # g2-standard-8 has exactly one
    ("g2-standard-8", "NVIDIA_L4", 0, "accelerator_count"),
    ("n1-standard-8", None, 1, "accelerator_type"),
    ("n1-standard-2", None, 0, "machine_type"),                 # not offered
    ("ct5lp-hightpu-4t", None, 0, "machine_type"),              # a TPU VM
    ("g2-standard-8", "NVIDIA_NOPE", 1, "accelerator_type"),
])
def test_invalid_machines_and_accelerators_are_refused(notebook, machine, accelerator, count, field):
    with pytest.raises(ParameterError) as e:
        _job(notebook, machine_type=machine, accelerator_type=accelerator, accelerator_count=count)
    assert e.value.name == field


def test_disks_labels_and_outputs_are_checked(notebook):
    for kw, field in [({"disk_type": "pd-fast"}, "disk_type"), ({"disk_size_gb": 5}, "disk_size_gb"),
                      ({"labels": {"Team": "x"}}, "labels['Team']"), ({"output_uri": "/tmp/out"}, "output_uri"),
                      ({"output_uri": "gs://Bad_Bucket/x"}, "output_uri"),
                      ({"service_account": "runner"}, "service_account")]:
        with pytest.raises(ParameterError) as e:
            _job(notebook, **kw)
        assert e.value.name == field, kw


def test_parameters_are_checked_against_the_parameters_cell(notebook):
    with pytest.raises(ParameterError, match="is not a parameter of demo.ipynb") as e:
        _job(notebook, parameters={"nope": 1})
    assert e.value.name == "nope"
    with pytest.raises(ParameterError) as e:
        _job(notebook, parameters={"size": "big"})
    assert e.value.name == "size"
    with pytest.raises(ParameterError, match="no parameters field") as e:
        nbx.notebook_execution_job("gs://bkt/n.ipynb", {"size": 1}, output_uri="gs://bkt/o")
    gs = nbx.notebook_execution_job("gs://bkt/n.ipynb", output_uri="gs://bkt/o", generation="7")
    assert gs["gcs_notebook_source"] == {"uri": "gs://bkt/n.ipynb", "generation": "7"} and gs.notebook is None


def test_the_uploaded_notebook_has_the_parameters_written_in(notebook):
    assert nbx.notebook_content(notebook) == notebook.read_bytes()
    nb = nbformat.reads(nbx.notebook_content(notebook, {"size": 16}).decode(), as_version=4)
    tags = [c.metadata.get("tags", []) for c in nb.cells]
    assert tags.index(["injected-parameters"]) == tags.index(["parameters"]) + 1
    assert "size = 16" in nb.cells[2].source and "import numpy" in nb.cells[3].source
    assert not nbx.imports_without_install(notebook)


def test_the_gcloud_command_says_what_the_job_says(notebook):
    spec = _job(notebook, labels={"team": "ml"})
    command = nbx.gcloud_command(spec, "us-central1")
    assert command.startswith("gcloud workbench executions create")
    for flag in ("--region=us-central1", "--gcs-notebook-uri=gs://my-bucket/run1/inputs/demo.ipynb",
                 f"--service-account={SA}", "--kernel-name=python3", "--machine-type=g2-standard-8",
                 "--accelerator-type=NVIDIA_L4", "--accelerator-count=1", "--disk-type=PD_STANDARD",
                 "--execution-timeout=86400s"):
        assert flag in command
    assert "--no-enable-internet-access" not in command
    assert nbx.gcloud_gaps(spec) == ["labels (the command has no --labels flag)"]
    h100 = _job(notebook, machine_type="a3-highgpu-1g", accelerator_type="NVIDIA_H100_80GB")
    assert any("NVIDIA_H100_80GB" in gap for gap in nbx.gcloud_gaps(h100))


# ---------------------------------------------------------------- through the fake service

@pytest.fixture
def fake():
    with FakeVertex() as f:
        yield f


def _submit(spec, fake, tmp_path, **kw):
    (tmp_path / "gcs").mkdir(exist_ok=True)
    return vertex.submit_notebook_execution(spec, project="p", region="us-central1", bucket="gs://my-bucket",
                                            endpoint=fake.endpoint,
                                            filesystem=DirFileSystem(str(tmp_path / "gcs"), LocalFileSystem()), **kw)


def test_the_real_client_creates_the_job_and_gets_it_back(notebook, fake, tmp_path):
    job = _submit(_job(notebook), fake, tmp_path, job_id="demo-1")
    assert job.name == f"{PARENT}/notebookExecutionJobs/demo-1"
    assert job.job_state.name == "JOB_STATE_PENDING" and job.create_time
    client = notebook_service_client(endpoint=fake.endpoint)
    again = client.get_notebook_execution_job(name=job.name)
    assert again.custom_environment_spec.machine_spec.accelerator_type.name == "NVIDIA_L4"
    assert again.kernel_name == "python3" and again.service_account == SA
    assert job_state(job.name, endpoint=fake.endpoint) == "JOB_STATE_SUCCEEDED"
    assert wait(job.name, poll_s=0, endpoint=fake.endpoint).job_state.name == "JOB_STATE_SUCCEEDED"
    assert [j.name for j in client.list_notebook_execution_jobs(parent=PARENT)] == [job.name]
    created = fake.created("notebookExecutionJobs")[0]
    assert created["labels"]["labkit-job"] == "notebook-executor"
    uploaded = nbformat.read(tmp_path / "gcs/my-bucket/run1/inputs/demo.ipynb", as_version=4)
    assert "size = 16" in uploaded.cells[2].source
    with pytest.raises(exceptions.Conflict, match="already exists"):
        _submit(_job(notebook), fake, tmp_path, job_id="demo-1")


def test_a_failed_execution_carries_its_status(notebook, tmp_path):
    with FakeVertex(final_state="JOB_STATE_FAILED") as f:
        job = _submit(_job(notebook), f, tmp_path)
        states = [get_job(job.name, endpoint=f.endpoint) for _ in range(2)]
    assert [s.job_state.name for s in states] == ["JOB_STATE_RUNNING", "JOB_STATE_FAILED"]
    assert states[-1].status.code == 13


def test_the_fake_refuses_what_vertex_refuses(fake):
    client = notebook_service_client(endpoint=fake.endpoint)
    bad = aiplatform_v1.NotebookExecutionJob(
        display_name="x", gcs_notebook_source={"uri": "gs://b/n.ipynb"}, gcs_output_uri="gs://b/o",
        custom_environment_spec={"machine_spec": {"machine_type": "g2-standard-8", "accelerator_type": "NVIDIA_L4",
                                                  "accelerator_count": 4}})
    with pytest.raises(exceptions.BadRequest, match="accelerator_count"):
        client.create_notebook_execution_job(parent=PARENT, notebook_execution_job=bad)
    with pytest.raises(exceptions.BadRequest, match="gcs_output_uri"):
        client.create_notebook_execution_job(parent=PARENT, notebook_execution_job=aiplatform_v1.NotebookExecutionJob(
            display_name="x", gcs_notebook_source={"uri": "gs://b/n.ipynb"}, notebook_runtime_template_resource_name="t"))
    assert fake.created("notebookExecutionJobs") == []


def test_a_placeholder_bucket_or_no_service_account_is_refused_at_submit(notebook, fake, tmp_path):
    placeholder = _job(notebook, output_uri="gs://YOUR_BUCKET/run1")
    with pytest.raises(ParameterError, match="placeholder YOUR_BUCKET") as e:
        _submit(placeholder, fake, tmp_path)
    assert e.value.name == "output_uri"
    with pytest.raises(ParameterError) as e:
        _submit(_job(notebook, service_account=None), fake, tmp_path)
    assert e.value.name == "service_account"
    assert fake.requests == [] and not (tmp_path / "gcs" / "my-bucket").exists()


# ---------------------------------------------------------------- labkit run --vertex --executor

@pytest.fixture
def no_cloud(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("GOOGLE_CLOUD_PROJECT", "GOOGLE_CLOUD_REGION", "GOOGLE_APPLICATION_CREDENTIALS",
                 "CLOUDSDK_CONFIG", "CLOUDSDK_CORE_PROJECT", "CLOUDSDK_COMPUTE_REGION", "LABKIT_BUCKET"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("flags", [["--replica-count", "2"], ["--replicas", "2"], ["--spot"],
                                   ["--reduction-servers", "1"], ["--image", "us-docker.pkg.dev/p/r/i:1"]])
def test_options_the_executor_cannot_honour_are_refused_in_one_line(notebook, no_cloud, capsys, flags):
    code = main(["run", str(notebook), "--vertex", "--executor", *flags])
    out = capsys.readouterr().out
    assert code == 2 and len(out.strip().splitlines()) == 1, out
    assert flags[0].split("-")[-1] in out and "--executor" in out


def test_a_dry_run_prints_the_rest_json_the_gcloud_command_and_what_is_missing(notebook, no_cloud, capsys):
    code = main(["run", str(notebook), "--vertex", "--executor", "-p", "size", "32", "--machine-type",
                 "g2-standard-8", "--accelerator-type", "NVIDIA_L4", "--accelerator-count", "1", "--label", "team=ml"])
    out = capsys.readouterr().out
    assert code == 0, out
    rest = json.loads(out[:out.index("\n}\n") + 2])
    assert rest["workbenchRuntime"] == {} and rest["kernelName"] == "python3"
    assert rest["customEnvironmentSpec"]["machineSpec"]["acceleratorType"] == "NVIDIA_L4"
    assert rest["gcsNotebookSource"]["uri"].startswith("gs://YOUR_BUCKET/") and rest["labels"]["team"] == "ml"
    assert "gcloud workbench executions create" in out and "parameters written into" in out
    for missing in ("credentials", "project", "region", "bucket", "service account", "nothing submitted"):
        assert missing in out


def test_an_unknown_parameter_is_refused_by_the_cli(notebook, no_cloud, capsys):
    assert main(["run", str(notebook), "--executor", "-p", "nope", "1"]) == 2
    assert "'nope'" in capsys.readouterr().out


def test_the_cli_creates_the_job_through_the_real_client(notebook, no_cloud, tmp_path, capsys, monkeypatch):
    from labkit.vertex.storage import LocalStorage

    with FakeVertex() as fake, LocalStorage(tmp_path / "gcs", tmp_path / "state") as storage:
        (tmp_path / "gcs" / "my-bucket").mkdir()
        for key, value in storage.client_env().items():
            monkeypatch.setenv(key, value)
        code = main(["run", str(notebook), "--executor", "-p", "size", "4", "--endpoint", fake.endpoint,
                     "--project", "p", "--region", "us-central1", "--bucket", "gs://my-bucket",
                     "--service-account", SA])
        out = capsys.readouterr().out
        assert code == 0 and f"submitted {PARENT}/notebookExecutionJobs/" in out, out
        created = fake.created("notebookExecutionJobs")[0]
    source = created["gcs_notebook_source"]["uri"]
    uploaded = nbformat.read(tmp_path / "gcs" / source[len("gs://"):], as_version=4)
    assert "size = 4" in uploaded.cells[2].source


def test_the_custom_job_path_takes_the_same_endpoint(no_cloud, tmp_path, capsys, monkeypatch):
    """--endpoint is shared: without --executor the notebook goes to the JobService as a CustomJob."""
    from labkit.vertex.storage import LocalStorage

    monkeypatch.setenv("LABKIT_IMAGE_REGISTRY", "us-central1-docker.pkg.dev/p/labkit")
    hello = Path(vertex.__file__).resolve().parents[1] / "assets" / "hello.ipynb"
    with FakeVertex() as fake, LocalStorage(tmp_path / "gcs", tmp_path / "state") as storage:
        (tmp_path / "gcs" / "my-bucket").mkdir()
        for key, value in storage.client_env().items():
            monkeypatch.setenv(key, value)
        code = main(["run", str(hello), "--vertex", "-p", "size", "16", "--endpoint", fake.endpoint,
                     "--project", "p", "--region", "us-central1", "--bucket", "gs://my-bucket"])
        out = capsys.readouterr().out
        assert code == 0 and f"submitted {PARENT}/customJobs/" in out, out
        assert len(fake.created()) == 1 and fake.created("notebookExecutionJobs") == []
