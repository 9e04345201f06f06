"""The number formats labkit knows and which of them a run trains in: one row per format, the one
place its facts are written.

    PRECISIONS                      # ("fp32", "tf32", "bf16", "fp16", "fp8"): TrainConfig.precision's choices
    FORMAT_NAMES                    # every format a GPU's tensor cores may run (here the same five)
    get("bf16").bytes               # 2: bytes per element of what the format computes in
    get("tf32").tensor_cores_from   # 8.0: the first NVIDIA compute capability with its tensor cores
    rung_label("torch", "fp16")     # "fp16 + GradScaler": the precision ladder's rung label
    why_not_trains("fp8", "tf", "gpt")  # "is not a tf training precision (tf trains in fp32, ...)"

Everything else derives from these rows: TrainConfig's choices and help, the precision rungs of
both frameworks (`labkit.course.levers`), the formats a notebook's plan climbs and the memory a
batch takes (`labkit.course.sizing`), which GPUs run a format on tensor cores
(`labkit.hardware.gpus`) and the peak-rate columns of its table. A new training precision is a
row here (with `rungs`), its policy in `labkit.torch.precision` and `labkit.tf.precision`, and
its recipe.

Tensor-core generations: NVIDIA's CUTLASS documents its warp-level bf16 MMA as "Supported
architectures: sm_80+" (`CUTLASS_WARP_MMA`) and its fp8 one as "(SM89)" (`CUTLASS_WARP_MMA_FP8`),
both read 2026-11-29; fp16 tensor cores came with Volta (7.0) and TF32 with Ampere (8.0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

CUTLASS_WARP_MMA = ("https://docs.nvidia.com/cutlass/4.6.0/media/docs/pythonDSL/cute_dsl_api/"
                    "cute_nvgpu_warp.html")
CUTLASS_WARP_MMA_FP8 = ("https://docs.nvidia.com/cutlass/4.5.3/media/docs/pythonDSL/cute_dsl_api/"
                        "cute_nvgpu_warp.html")


@dataclass(frozen=True)
class Format:
    """One number format. `bytes`: bytes per element of what a run computes in (tf32 keeps
    fp32's storage, 4). `tensor_cores_from`: the NVIDIA compute capability whose tensor cores
    first ran it, with that `architecture` (0.0: fp32, on CUDA cores everywhere). `summary`: what
    training in it means (TrainConfig's help). `rungs`: framework -> the label of its rung on the
    precision ladder; the frameworks that train in it (empty: not a TrainConfig precision).
    `loss_scaling`: gradients underflow without a loss scale (fp16's 5-bit exponent).
    `models`: the models it changes anything in (empty: every model). `needs_tensor_cores`: a run
    on a GPU without its tensor cores is refused, and a plan on a CPU leaves it out (the CPU only
    emulates it: it would time nothing of the format)."""

    name: str
    bytes: int
    tensor_cores_from: float
    architecture: str = ""
    summary: str = ""
    rungs: Mapping[str, str] = field(default_factory=dict)
    loss_scaling: bool = False
    models: tuple[str, ...] = ()
    needs_tensor_cores: bool = False

    @property
    def trains(self) -> bool:
        return bool(self.rungs)


FORMATS: tuple[Format, ...] = (
    Format("fp32", 4, 0.0, summary="fp32", rungs={"torch": "fp32", "tf": "fp32"}),
    Format("tf32", 4, 8.0, "Ampere", "tf32 (fp32 maths on TF32 tensor cores)",
           {"torch": "tf32", "tf": "tf32"}),
    Format("bf16", 2, 8.0, "Ampere", "bf16 autocast",
           {"torch": "bf16 autocast", "tf": "bf16 (mixed_bfloat16)"}),
    Format("fp16", 2, 7.0, "Volta", "fp16 autocast + GradScaler",
           {"torch": "fp16 + GradScaler", "tf": "fp16 + loss scaling"}, loss_scaling=True),
    # Every Linear layer's matmuls in fp8 (labkit.torch.fp8), the rest as bf16; torch only (labkit's
    # TF engine has no fp8 path). Only GPT has Linear layers whose sizes fp8's matmul takes
    # (multiples of 16): the CNN's and ResNet's classifiers are 10 and 1000 wide.
    Format("fp8", 1, 8.9, "Ada or Hopper",
           "fp8 matmuls in the Linear layers, bf16 autocast elsewhere (compute capability 8.9+)",
           {"torch": "fp8 Linear + bf16"}, models=("gpt",), needs_tensor_cores=True),
)
FORMAT_NAMES = tuple(f.name for f in FORMATS)
PRECISIONS = tuple(f.name for f in FORMATS if f.trains)
_BY_NAME = {f.name: f for f in FORMATS}


def get(name: str) -> Format:
    """The row of format `name`; ValueError naming the known ones otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"format {name!r} is not one of {', '.join(FORMAT_NAMES)}") from None


def precisions(framework: str | None = None) -> tuple[Format, ...]:
    """The training precisions, in ladder order; those `framework` trains in when given."""
    return tuple(f for f in FORMATS if f.trains and (framework is None or framework in f.rungs))


def rung_label(framework: str, name: str) -> str:
    """What a reader sees for `framework`'s rung of precision `name`."""
    return get(name).rungs[framework]


def why_not_trains(name: str, framework: str, model: str) -> str | None:
    """None when `framework` trains `model` in precision `name`, else why not (the end of a
    ParameterError about `precision`)."""
    f = get(name)
    if framework not in f.rungs:
        trains = ", ".join(p.name for p in precisions(framework))
        return f"is not a {framework} training precision ({framework} trains in {trains})"
    if f.models and model not in f.models:
        return (f"applies to model {' and '.join(map(repr, f.models))} only (in model {model!r} it "
                f"would change nothing)")
    return None


def help_text() -> str:
    """TrainConfig's help for `precision`: every training precision's summary (a summary may
    hold a comma, hence the semicolons)."""
    return "; ".join(f.summary for f in precisions())
