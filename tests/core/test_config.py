import pytest

from labkit.core import config
from labkit.core.config import ParameterError


def test_parameter_error_names_the_parameter_and_value():
    with pytest.raises(ParameterError, match=r"parameter 'scale' must be one of .* \(got 'huge'\)") as e:
        config.check_choice("scale", "huge", config.SCALES)
    assert e.value.name == "scale"
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("value", [True, "8", 2.5, None])
def test_check_int_rejects_non_integers(value):
    with pytest.raises(ParameterError, match="'steps' must be an integer"):
        config.check_int("steps", value)


def test_check_int_bounds_and_none():
    assert config.check_int("steps", 4.0, minimum=1) == 4
    assert config.check_int("steps", None, allow_none=True) is None
    with pytest.raises(ParameterError, match="'steps' must be >= 1"):
        config.check_int("steps", 0, minimum=1)
    with pytest.raises(ParameterError, match="must be <= 10"):
        config.check_int("steps", 11, maximum=10)


def test_check_float_rejects_nan_and_bools():
    with pytest.raises(ParameterError, match="finite number"):
        config.check_float("lr", float("nan"))
    with pytest.raises(ParameterError, match="finite number"):
        config.check_float("lr", True)
    assert config.check_float("lr", 1, minimum=0) == 1.0


def test_resolve_scale_auto_follows_the_hardware(monkeypatch):
    from labkit.core import devices

    cpu = devices.DeviceInfo(cpu_count=2, cpu_model="x", memory_bytes=None)
    gpu = devices.DeviceInfo(2, "x", None, gpus=(devices.GPU(0, "H100", 80 * 2**30, "9.0"),))
    monkeypatch.setattr(devices, "detect", lambda: cpu)
    assert config.resolve_scale("auto") == "smoke"
    monkeypatch.setattr(devices, "detect", lambda: gpu)
    assert config.resolve_scale("auto") == "full"
    assert config.resolve_scale("smoke") == "smoke"
    with pytest.raises(ParameterError, match="'scale'"):
        config.resolve_scale("medium")


def test_by_scale():
    assert config.by_scale("smoke", smoke=1, full=2) == 1
    assert config.by_scale("full", smoke=1, full=2) == 2


@pytest.mark.parametrize(("value", "file", "problem"), [
    ("", False, "must be a path"), ("  ", True, "must be a path"), (3, False, "must be a path"),
    ("out/", True, "ends with a separator"), (None, True, None), ("out/", False, None), ("m.json", True, None)])
def test_check_path_refuses_empty_paths_and_folder_names_for_files(value, file, problem):
    if problem is None:
        assert config.check_path("metrics_out", value, file=file) == value
    else:
        with pytest.raises(config.ParameterError, match=f"'metrics_out' {problem}"):
            config.check_path("metrics_out", value, file=file)
