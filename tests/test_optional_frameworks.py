"""labkit must import and work on images that lack TensorFlow or PyTorch."""

import subprocess

import pytest

CHECK = (
    "import labkit, labkit.cli, labkit.core.doctor, labkit.core.config, labkit.data, labkit.core.models;"
    "from labkit.core.frameworks import Frameworks; print(Frameworks.detect())"
)


@pytest.mark.parametrize("hidden", ["tensorflow", "torch"])
def test_labkit_imports_without_a_framework(hide_frameworks, python, hidden):
    env = hide_frameworks(hidden)
    out = subprocess.run([python, "-c", CHECK], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    flag = "tensorflow" if hidden == "tensorflow" else "torch"
    assert f"{flag}=False" in out


def test_missing_reason_names_the_install_command():
    from labkit.core.frameworks import FrameworkMissing, missing_reason, require

    assert "pip install 'labkit[tf]'" in missing_reason("tensorflow")
    with pytest.raises(FrameworkMissing, match="not-a-module"):
        require("not-a-module")
