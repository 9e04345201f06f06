"""The number formats and training precisions are written once (`labkit.core.precisions`): the
config, both precision policies and the GPU table derive from the registry, and no module
carries its own list of the precision names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from labkit.core import precisions
from labkit.core.precisions import FORMAT_NAMES, PRECISIONS

REPO = Path(__file__).resolve().parents[2]
# Literals of three or more format names that are not a copy of the registry's list: what one
# tool supports, or not a list of formats at all.
NOT_COPIES = {
    ("labkit/torch/footprint.py", ("fp32", "bf16", "fp16")),  # the autocast modes it measures (tf32 stores as fp32)
    ("labkit/hardware/cost.py", ("bf16", "fp16", "fp32")),  # precisions with a measured utilisation
    ("labkit/course/capstone_target.py", ("bf16", "fp32", "bf16")),  # a ladder step: lever, from, to
}


def test_the_registry_orders_formats_and_training_precisions():
    assert PRECISIONS == FORMAT_NAMES == ("fp32", "tf32", "bf16", "fp16", "fp8")
    assert [p.name for p in precisions.precisions("torch")] == list(PRECISIONS)
    assert [p.name for p in precisions.precisions("tf")] == ["fp32", "tf32", "bf16", "fp16"]  # fp8: torch only
    assert [precisions.get(n).bytes for n in FORMAT_NAMES] == [4, 4, 2, 2, 1]
    assert [n for n in FORMAT_NAMES if precisions.get(n).loss_scaling] == ["fp16"]
    assert [n for n in FORMAT_NAMES if precisions.get(n).needs_tensor_cores] == ["fp8"]
    with pytest.raises(ValueError, match="'fp4' is not one of fp32, tf32, bf16, fp16, fp8"):
        precisions.get("fp4")


def _format_lists(path: Path) -> list[tuple[int, tuple[str, ...]]]:
    """(line, names) of every tuple, list or set literal of three or more format names."""
    return [(node.lineno, tuple(e.value for e in node.elts)) for node in ast.walk(ast.parse(path.read_text("utf-8")))
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 3
            and all(isinstance(e, ast.Constant) and e.value in FORMAT_NAMES for e in node.elts)]


def test_no_module_keeps_its_own_list_of_precision_names():
    """Lists of format names live only in the registry (recipes are copyable plain code with
    their own constants): sizing's formats, the rungs, the config's choices all derive from it."""
    found = [f"{p.relative_to(REPO)}:{line} {names}" for p in (REPO / "labkit").rglob("*.py")
             if "recipes" not in p.parts and p.name != "precisions.py"
             for line, names in _format_lists(p) if (str(p.relative_to(REPO)), names) not in NOT_COPIES]
    assert found == [], "derive these from labkit.core.precisions"


def test_the_config_takes_the_registry():
    from labkit.core import train_config

    field = train_config.TrainConfig.__dataclass_fields__["precision"]
    assert train_config.PRECISIONS is PRECISIONS and field.metadata["choices"] is PRECISIONS
    assert field.metadata["help"] == precisions.help_text()
    assert all(precisions.get(p).summary in field.metadata["help"] for p in PRECISIONS)
    assert "fp8 matmuls in the Linear layers, bf16 autocast elsewhere (compute capability 8.9+)" \
        in field.metadata["help"]


def test_the_config_refuses_a_precision_the_framework_or_model_does_not_train_in():
    """From the registry's rows: fp8 has a torch rung only, and changes only the GPT."""
    from labkit.core.config import ParameterError
    from labkit.core.train_config import TrainConfig

    assert TrainConfig(model="gpt", precision="fp8").precision == "fp8"
    with pytest.raises(ParameterError, match=r"^parameter 'precision' is not a tf training precision "
                                             r"\(tf trains in fp32, tf32, bf16, fp16\) \(got 'fp8'\)$") as e:
        TrainConfig(framework="tf", model="gpt", precision="fp8")
    assert e.value.name == "precision"
    with pytest.raises(ParameterError, match="applies to model 'gpt' only .in model 'resnet' it would change nothing"):
        TrainConfig(model="resnet", precision="fp8")
    for framework in ("torch", "tf"):
        for p in precisions.precisions(framework):
            assert precisions.why_not_trains(p.name, framework, "gpt") is None


def test_both_policies_cover_their_frameworks_precisions_and_scale_the_loss_where_the_registry_says():
    from labkit.core.config import ParameterError
    from labkit.tf.precision import TFPrecision

    for p in precisions.precisions("tf"):
        assert TFPrecision.for_mode(p.name).loss_scaling == p.loss_scaling
    with pytest.raises(ParameterError, match="^parameter 'precision' must be one of 'fp32', 'tf32', 'bf16', "
                                             "'fp16' .got 'fp8'.$"):
        TFPrecision.for_mode("fp8")
    pytest.importorskip("torch")
    from labkit.torch.precision import PrecisionPolicy

    assert [p.name for p in precisions.precisions("torch")] == list(PRECISIONS)
    for name in PRECISIONS:
        policy = PrecisionPolicy.for_mode(name, "cpu")
        assert policy.grad_scaler == precisions.get(name).loss_scaling
        assert (policy.autocast_dtype is None) == (precisions.get(name).bytes == 4)
