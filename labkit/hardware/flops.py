"""FLOPs of a training step, computed from the model config or counted on a real model.

Training costs about 3× the forward pass (forward, then backward for activations and weights),
so for a transformer it is ≈ 6·N per token plus attention: 6·N + 12·n_layer·n_embd·block_size
per token (N without position embeddings). GPT-2 small (vocab 50304, block 1024) gives 0.8548
GFLOP per token, the figure the performance targets use. For any torch model,
`count_training_flops` counts forward + backward with torch's FLOP counter instead.
"""

from __future__ import annotations

from labkit.core.models import GPTConfig


def gpt_params(cfg: GPTConfig, include_position: bool = False) -> int:
    """Parameters of the GPT of `cfg` (tied embeddings; biases when cfg.bias)."""
    d, L = cfg.n_embd, cfg.n_layer
    per_layer = 12 * d * d + 2 * d  # attention 4d², MLP 8d², two layer norms
    if cfg.bias:
        per_layer += 3 * d + d + 4 * d + d + 2 * d  # qkv, proj, fc, fc_proj biases, ln biases
    n = cfg.vocab_size * d + L * per_layer + d * (2 if cfg.bias else 1)
    return n + (cfg.block_size * d if include_position else 0)


def gpt_flops_per_token(cfg: GPTConfig) -> float:
    """Training FLOPs per token: 6·N + 12·n_layer·n_embd·block_size."""
    return 6.0 * gpt_params(cfg) + 12.0 * cfg.n_layer * cfg.n_embd * cfg.block_size


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
