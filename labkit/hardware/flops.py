"""FLOPs of a training step, computed from the model config or counted on a real model.

Training costs about 3× the forward pass (forward, then backward for activations and weights),
so for a transformer it is ≈ 6·N per token plus attention: 6·N + 12·n_layer·n_embd·block_size
per token (N without position embeddings). GPT-2 small (vocab 50304, block 1024) gives 0.8548
GFLOP per token, the figure the performance targets use. For any torch model,
`count_training_flops` counts forward + backward with torch's FLOP counter instead.
"""

from __future__ import annotations

from labkit.core.models import gpt_flops_per_token  # the one formula, also used for MFU

__all__ = ["count_training_flops", "gpt_flops_per_token", "mlp_training_flops",
           "model_flops_per_sample"]


def mlp_training_flops(width: int, depth: int, batch_size: int, out_features: int = 10) -> float:
    """Forward + backward FLOPs of the profiling workload's MLP: 6 × weights × batch (matmuls only)."""
    weights = depth * width * width + width * out_features
    return 6.0 * weights * batch_size


def count_training_flops(model, example_input) -> float:
    """Count forward + backward FLOPs of one step of a torch model with torch's FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        model(example_input).float().sum().backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def model_flops_per_sample(model: str) -> float:
    """Training FLOPs per sample of a course model at full size ('gpt': GPT-2 small, one
    sequence of block_size tokens). Other models: pass `flops_per_sample` measured with
    `count_training_flops`."""
    from labkit.core.config import ParameterError, check_choice
    from labkit.core.models import build_config

    check_choice("model", model, ("gpt", "cnn", "resnet"))
    if model != "gpt":
        raise ParameterError("flops_per_sample", 0.0,
                             f"must be set for model {model!r} (count it with count_training_flops)")
    cfg = build_config("gpt", "full")
    return gpt_flops_per_token(cfg) * cfg.block_size  # type: ignore[arg-type]
