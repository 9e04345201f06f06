import json
import subprocess

import pytest

from labkit.cli import main
from labkit.core import doctor, gcp


def test_doctor_reports_devices_and_advice():
    report = doctor.collect()
    assert report.devices.cpu_count >= 1
    text = report.text()
    assert "python" in text and "cpu" in text and "gcp" in text
    if not report.devices.has_gpu:
        assert any("No GPU" in line for line in report.advice())


@pytest.mark.slow
def test_doctor_json_from_the_installed_command(python):
    out = subprocess.run([python, "-m", "labkit", "doctor", "--json"], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    data = json.loads(out)
    assert {"python", "packages", "frameworks", "devices", "cloud", "advice"} <= set(data)
    assert data["devices"]["cpu_count"] >= 1


def test_cloud_context_from_env_and_gcloud_files(tmp_path):
    empty = gcp.detect({"HOME": str(tmp_path)})
    assert not empty.ready
    assert [m.split(":")[0] for m in empty.missing()] == ["credentials", "project", "region", "bucket"]
    conf = tmp_path / ".config" / "gcloud"
    (conf / "configurations").mkdir(parents=True)
    (conf / "configurations" / "config_default").write_text(
        "[core]\nproject = my-proj\n[compute]\nregion = europe-west4\n")
    (conf / "application_default_credentials.json").write_text("{}")
    ctx = gcp.detect({"HOME": str(tmp_path), "LABKIT_BUCKET": "my-bucket"})
    assert (ctx.project, ctx.region, ctx.bucket) == ("my-proj", "europe-west4", "gs://my-bucket")
    assert ctx.ready and "application default" in ctx.credentials
    missing_key = gcp.detect({"HOME": str(tmp_path), "GOOGLE_APPLICATION_CREDENTIALS": "/nope.json"})
    assert missing_key.credentials is None and "does not exist" in missing_key.notes[0]
    for text, said in (("not json", "not a JSON credentials file"), ('{"a": 1}', "no 'type'")):
        (tmp_path / "key.json").write_text(text)
        bad_key = gcp.detect({"HOME": str(tmp_path), "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "key.json")})
        assert bad_key.credentials is None and said in bad_key.notes[0]
    (tmp_path / "key.json").write_text('{"type": "service_account", "client_email": "a@p.iam.gserviceaccount.com"}')
    assert gcp.detect({"HOME": str(tmp_path), "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "key.json")}).credentials


def test_cli_without_command_prints_help(capsys):
    assert main([]) == 2
    assert "doctor" in capsys.readouterr().out
