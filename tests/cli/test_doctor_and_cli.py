import json
import shutil
import subprocess

import pytest

from labkit.cli import main
from labkit.core import devices, doctor, gcp


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


# ---------------------------------------------------------------- inside a training container

CU128 = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")


def test_doctor_checks_cuda_and_nccls_plugin_and_a_cpu_machine_reports_no_gpu():
    report = doctor.collect()
    assert report.cuda is not None and report.nccl is not None
    text = report.text()
    assert "nccl net" in text and report.nccl.line() in text
    assert report.nccl.status in ("loads", "none", "fails", "disabled")
    data = json.loads(json.dumps(report.to_dict()))  # plain JSON, as `labkit doctor --json` prints
    assert data["nccl_net_plugin"]["line"] == report.nccl.line()
    if not report.devices.has_gpu:
        assert not report.cuda.has_gpu and report.cuda.kernels == () and report.cuda.problems() == []
        assert "no GPU" in text


def test_the_cuda_verdicts_name_the_gpu_the_build_and_the_driver():
    v100 = devices.GPU(0, "Tesla V100-SXM2-16GB", 16 * 2**30, "7.0")
    h200 = devices.GPU(1, "NVIDIA H200", 141 * 2**30, "9.0")
    check = doctor.judge("2.7.1+cu128", "12.8", "550.90.07", CU128, (v100, h200))
    assert [ok for _, _, ok in check.kernels] == [False, True]
    assert check.driver_ok is True and "minor version compatibility" in check.driver_text
    (problem,) = check.problems()
    assert "Tesla V100" in problem and "7.0" in problem and "sm_75-sm_120" in problem
    assert any("NO kernels" in line for line in check.lines())
    old = doctor.judge("2.7.1+cu128", "12.8", "470.256.02", CU128, (h200,))
    assert old.driver_ok is False and "too old" in old.problems()[0]
    unknown = doctor.judge("2.7.1+cu128", "12.8", None, (), (h200,))  # no arch list: no verdict
    assert unknown.kernels[0][2] is None and unknown.problems() == []
    assert doctor.judge("2.13.0+cpu", None, None, (), ()).lines()[0].startswith("cuda        no GPU")


def test_the_plugin_search_follows_nccl_and_reports_cleanly_without_one():
    assert doctor.plugin_candidates("gIB") == ["gIB", "libnccl-net-gIB.so"]
    assert doctor.plugin_candidates("libnccl-net.so") == ["libnccl-net.so"]
    assert doctor.plugin_candidates("/opt/x/libp.so") == ["/opt/x/libp.so"]
    missing = doctor.nccl_net_plugin({"NCCL_NET_PLUGIN": "labkitnosuch,other"})
    assert missing.status == "none" and missing.tried == (
        "labkitnosuch", "libnccl-net-labkitnosuch.so", "other", "libnccl-net-other.so")
    assert "built-in IB and socket" in missing.line()
    assert doctor.nccl_net_plugin({"NCCL_NET_PLUGIN": "none"}).status == "disabled"


def _cc(tmp_path, name: str, source: str, *link: str):
    (tmp_path / f"{name}.c").write_text(source)
    subprocess.run([shutil.which("cc"), "-shared", "-fPIC", "-o", str(tmp_path / f"{name}.so"),
                    str(tmp_path / f"{name}.c"), *link], check=True, capture_output=True)
    return tmp_path / f"{name}.so"


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build a stand-in plugin")
def test_a_plugin_that_loads_and_one_whose_library_is_missing(tmp_path):
    plugin = _cc(tmp_path, "libnccl-net-test", "int ncclNetPlugin_v8 = 0;\n")
    found = doctor.nccl_net_plugin({"NCCL_NET_PLUGIN": str(plugin)})
    assert found.status == "loads" and found.api == 8 and found.path == str(plugin.resolve())
    assert "API v8" in found.line()
    # A plugin whose dependency is not on the loader path, as gIB's is without libibverbs.
    dep = _cc(tmp_path, "liblabkitdep", "int labkit_dep(void) { return 1; }\n")
    broken = _cc(tmp_path, "libnccl-net-broken", "int labkit_dep(void);\nint ncclNetPlugin_v9(void) "
                 "{ return labkit_dep(); }\n", f"-L{tmp_path}", "-llabkitdep")
    dep.unlink()
    failed = doctor.nccl_net_plugin({"NCCL_NET_PLUGIN": str(broken)})
    assert failed.status == "fails" and "liblabkitdep.so" in failed.error and failed.path is None
    assert "does not load" in failed.line()
    not_elf = tmp_path / "libnccl-net-text.so"
    not_elf.write_text("not a library")
    assert doctor.nccl_net_plugin({"NCCL_NET_PLUGIN": str(not_elf)}).status == "fails"
