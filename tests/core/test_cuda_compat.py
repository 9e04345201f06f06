"""NVIDIA's two compatibility rules: which GPUs a build's kernels run on, and which drivers run a
CUDA version (fully, or under minor version compatibility)."""

from __future__ import annotations

import pytest

from labkit.core import cuda_compat

CU128 = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")  # torch 2.7's CUDA 12.8 wheels
TF = ("sm_60", "sm_70", "sm_80", "sm_89", "compute_90")  # TensorFlow's official builds


@pytest.mark.parametrize("archs,cc,runs", [
    (CU128, "7.0", False),  # V100: no Volta code
    (CU128, "6.1", False),  # P4
    (CU128, "7.5", True), (CU128, "8.9", True),  # L4 runs sm_86 code (same major, higher minor)
    (CU128, "10.0", True), (CU128, "12.0", True),
    (CU128, "13.0", False),  # no PTX: nothing for a future major version
    (TF, "6.1", True), (TF, "7.5", True),  # sm_60 code on a P4, sm_70 on a T4
    (TF, "9.0", True), (TF, "10.0", True), (TF, "12.0", True),  # PTX compute_90 is compiled by the driver
    (TF, "5.2", False),
    (("sm_90a",), "9.0", True), (("sm_90a",), "9.1", False),  # architecture-specific: that one only
    (("compute_120",), "10.0", False), ((), "8.0", False), (("bogus",), "8.0", False),
])
def test_kernels_run_on_the_same_major_version_and_ptx_on_any_newer(archs, cc, runs):
    assert cuda_compat.runs_on(archs, cc) is runs


def test_arch_names_parse_and_describe():
    assert cuda_compat.parse_arch("sm_120") == ("sm", (12, 0), "")
    assert cuda_compat.parse_arch("compute_90") == ("compute", (9, 0), "")
    assert cuda_compat.parse_arch("sm_90a") == ("sm", (9, 0), "a") and cuda_compat.parse_arch("x") is None
    assert cuda_compat.describe_archs(CU128 + ("compute_120",)) == "sm_75-sm_120 (+PTX compute_120)"
    assert cuda_compat.capability("8.9") == (8, 9) == cuda_compat.capability((8, 9))


@pytest.mark.parametrize("cuda,driver,ok,words", [
    ("12.8", "570.172.08", True, "needs >= 570.26"),
    ("12.8", "550.90.07", True, "minor version compatibility"),  # 12.x runs on >= 525, limited
    ("12.8", "470.256.02", False, "too old"),
    ("12.6", "560.35.05", True, "needs >= 560.28.03"),
    ("13.0", "575.57.08", False, ">= 580"),  # CUDA 13 needs a 580 driver even under compatibility
    ("11.8", "450.80.02", True, "minor version compatibility"),
    ("99.0", "999.1", None, "no driver table entry"),
])
def test_a_driver_runs_a_cuda_version_fully_under_compatibility_or_not(cuda, driver, ok, words):
    verdict, text = cuda_compat.driver_verdict(cuda, driver)
    assert verdict is ok and words in text and "\n" not in text
    if ok is False:
        assert cuda_compat.CUDA_RELEASE_NOTES in text
