"""What one training step of any PyTorch model holds and computes, counted without memory:
the model is built and run on fake tensors (shapes and dtypes, no storage, no arithmetic), so a
70B model is counted in seconds on a laptop.

    fp = measure(load_factory("mypkg.models:build"), input_shape=(3, 224, 224), batch_size=32)
    fp.parameters, fp.param_bytes, fp.activation_bytes, fp.flops_per_step, fp.kind

Counted from the tensors themselves, not from a formula: the parameters (each storage once, so
tied weights count once), one gradient per trainable parameter, AdamW's state after a step,
and what autograd saves for backward during the forward of `batch_size` examples (under
autocast for "bf16" / "fp16"). FLOPs of forward + backward come from torch's FlopCounterMode;
the loss is cross-entropy over the output's last dimension (class or token logits; see
`_loss`). The share of FLOPs in convolutions says which measured run stands for the model's utilisation
(`kind`: "convolutional" or "matmul"). Left out, and said so: the CUDA context, the
allocator's cache and fragmentation, and temporaries freed within the step.

The input is `input_shape` per example: one number is a sequence of token ids (int64), more
are a float tensor (e.g. C, H, W). A forward that fails names the innermost layer it was in
(`ModelError`); a factory that does not give an `nn.Module` is refused the same way.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import logging
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from labkit.core.config import ParameterError, check_choice, check_int

PRECISIONS = ("fp32", "bf16", "fp16")
MODES = ("ddp", "zero1", "zero2", "zero3", "fsdp")
CONV_OPS = ("convolution", "convolution_backward", "cudnn_convolution", "_convolution")


class ModelError(ValueError):
    """The model cannot be counted: `.where` is the factory or the layer at fault."""

    def __init__(self, where: str, cause: str):
        self.where = where
        super().__init__(f"{where}: {cause}")


def load_factory(spec: str, search_path: str | os.PathLike | None = None) -> Callable:
    """`package.module:function` (the module importable from `search_path`, default the
    current folder, or installed) as a callable; `package.module:Class(4, width=64)` calls it
    with those literal arguments."""
    if not isinstance(spec, str) or ":" not in spec or not all(spec.split(":", 1)):
        raise ParameterError("MODEL", spec, "must be package.module:function (a factory that returns an nn.Module)")
    module_name, attr = spec.split(":", 1)
    attr, args, kwargs = _call_of(spec, attr)
    folder = os.fspath(search_path or os.getcwd())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise ModelError(spec, f"cannot import {module_name} ({e}); run from the folder that holds it") from None
    except Exception as e:  # the user's module failed while importing
        raise ModelError(spec, f"importing {module_name} failed: {type(e).__name__}: {e}") from None
    factory = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            raise ModelError(spec, f"{module_name} has no attribute {attr!r}")
        factory = getattr(factory, part)
    if not callable(factory):
        raise ModelError(spec, f"{attr} is not callable")
    return functools.partial(factory, *args, **kwargs) if args or kwargs else factory


def _call_of(spec: str, attr: str) -> tuple[str, tuple, dict]:
    """`name` or `name(literal, key=literal, ...)`: the name and the arguments to call it with."""
    if "(" not in attr:
        return attr, (), {}
    try:
        call = ast.parse(attr, mode="eval").body
        if not isinstance(call, ast.Call):
            raise ValueError
        name = ast.unparse(call.func)
        return (name, tuple(ast.literal_eval(a) for a in call.args),
                {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg})
    except (SyntaxError, ValueError):
        raise ParameterError("MODEL", spec, "must be package.module:function or package.module:function(ARGS) "
                             "with literal arguments, e.g. mymodels:ResNet(depth=18)") from None


@dataclass(frozen=True)
class Footprint:
    """One training step of a model, counted. Bytes are for one replica at `batch_size`."""

    model: str
    parameters: int
    trainable: int
    input_shape: tuple[int, ...]
    batch_size: int
    precision: str
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    flops_per_step: float
    conv_flop_share: float

    @property
    def kind(self) -> str:
        """"convolutional" when most FLOPs are convolutions, else "matmul" (transformers, MLPs)."""
        return "convolutional" if self.conv_flop_share >= 0.5 else "matmul"

    @property
    def flops_per_sample(self) -> float:
        return self.flops_per_step / self.batch_size

    @property
    def state_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    def per_gpu(self, mode: str = "ddp", gpus: int = 1) -> dict[str, int]:
        """Bytes on each of `gpus` data-parallel GPUs, each at this batch size: DDP keeps
        everything; ZeRO-1 shards the optimizer state, ZeRO-2 the gradients too, ZeRO-3 / FSDP
        the parameters too. Activations are never sharded by data parallelism."""
        check_choice("mode", mode, MODES)
        check_int("gpus", gpus, minimum=1)
        shard = {"ddp": (), "zero1": ("optimizer",), "zero2": ("optimizer", "grads"),
                 "zero3": ("optimizer", "grads", "params"), "fsdp": ("optimizer", "grads", "params")}[mode]
        parts = {"params": self.param_bytes, "grads": self.grad_bytes, "optimizer": self.optimizer_bytes}
        out = {k: -(-v // gpus) if k in shard else v for k, v in parts.items()}
        out["activations"] = self.activation_bytes
        out["total"] = sum(out.values())
        return out

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(kind=self.kind, flops_per_sample=self.flops_per_sample, state_bytes=self.state_bytes)
        return d


def measure(factory: Callable, input_shape: Sequence[int], batch_size: int = 1, precision: str = "fp32",
            *, name: str = "", vocab_limit: int = 2) -> Footprint:
    """Count one training step of `factory()` on fake tensors; see the module docstring.
    Token inputs are ids below `vocab_limit` (any id an embedding accepts)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    check_choice("precision", precision, PRECISIONS)
    check_int("batch_size", batch_size, minimum=1)
    shape = tuple(int(s) for s in input_shape)
    if not shape or any(s < 1 for s in shape):
        raise ParameterError("input_shape", input_shape, "must be positive sizes: C,H,W or a sequence length T")
    where = name or getattr(factory, "__name__", "the factory")
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with _quiet():
        model = _build(factory, where, fake, lambda: _example(shape, batch_size, vocab_limit))
    with fake, _quiet():
        params = list(model.parameters())
        unique = {id(p): p for p in params}.values()
        param_bytes = sum(p.numel() * p.element_size() for p in unique)
        trainable = [p for p in unique if p.requires_grad]
        x = _example(shape, batch_size, vocab_limit)
        keep = {_storage_key(p) for p in unique} | {_storage_key(x)}
        saved: dict[int, object] = {}

        def pack(t):
            key = _storage_key(t)
            if key not in keep:
                saved[key] = t.untyped_storage()  # held, so its address is not reused
            return t

        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        autocast = torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None)
        with FlopCounterMode(display=False) as flops:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
                loss = _loss(_forward(model, x, where), where)
            activation_bytes = sum(s.nbytes() for s in saved.values())
            if not loss.requires_grad:
                raise ModelError(where, "its output does not depend on any trainable parameter")
            loss.backward()
        grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in trainable if p.grad is not None)
        optimizer = torch.optim.AdamW(trainable, lr=1e-3)
        optimizer.step()
        optimizer_bytes = sum(t.numel() * t.element_size() for s in optimizer.state.values()
                              for t in s.values() if torch.is_tensor(t))  # the step counts too
        counts = flops.get_flop_counts().get("Global", {})
        total = float(sum(counts.values()))
        conv = float(sum(v for op, v in counts.items() if str(op).removeprefix("aten.").split(".")[0] in CONV_OPS))
    return Footprint(where, sum(p.numel() for p in unique), sum(p.numel() for p in trainable), shape, batch_size,
                     precision, param_bytes, grad_bytes, optimizer_bytes, activation_bytes, total,
                     conv / total if total else 0.0)


def _example(shape: tuple[int, ...], batch_size: int, vocab_limit: int):
    """A batch of input: token ids for one size, floats for more."""
    import torch

    if len(shape) == 1:
        return torch.zeros((batch_size, *shape), dtype=torch.long).random_(0, vocab_limit)
    return torch.zeros((batch_size, *shape))


def _build(factory: Callable, where: str, fake, example: Callable):
    """`factory()` on fake tensors; a model that cannot be built that way (lazy layers, whose
    shapes come from a first batch) is built on the meta device, given one batch there, and
    then moved to fake tensors."""
    import torch

    try:
        with fake:
            model = factory()
    except Exception as first:
        try:
            with torch.device("meta"):
                model = factory()
                if isinstance(model, torch.nn.Module) and any(
                        isinstance(m, torch.nn.modules.lazy.LazyModuleMixin) for m in model.modules()):
                    model(example())
            with fake:
                model = model.to_empty(device="cpu") if isinstance(model, torch.nn.Module) else model
        except Exception:
            raise ModelError(where, f"building the model failed: {type(first).__name__}: {_first_line(first)}") from None
    if not isinstance(model, torch.nn.Module):
        raise ModelError(where, f"returned {type(model).__name__}, not a torch.nn.Module")
    return model


def _storage_key(t) -> int:
    """The storage a tensor's bytes live in. A view is known by its base: under fake tensors a
    view of a weight (its transpose, saved by a matmul) has a storage object of its own."""
    while t._base is not None:
        t = t._base
    return t.untyped_storage()._cdata


@contextlib.contextmanager
def _quiet():
    """Fake tensors log a traceback for every op that fails, and warn about data pointers
    that do not exist: the error this module raises says what matters."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        logger.setLevel(level)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def _forward(model, x, where: str):
    """model(x), naming the innermost layer whose forward raised."""
    import torch

    names = {id(m): n for n, m in model.named_modules()}
    stack: list = []

    def enter(module, _args):
        stack.append(module)

    def leave(module, _args, _out):
        if stack and stack[-1] is module:
            stack.pop()

    hooks = [torch.nn.modules.module.register_module_forward_pre_hook(enter),
             torch.nn.modules.module.register_module_forward_hook(leave)]
    try:
        return model(x)
    except Exception as e:
        layer = stack[-1] if stack else model
        label = names.get(id(layer)) or "the model's own forward"
        raise ModelError(where, f"forward fails in layer {label!r} ({type(layer).__name__}) on an input of "
                                f"shape {tuple(x.shape)}: {type(e).__name__}: {_first_line(e)}") from None
    finally:
        for h in hooks:
            h.remove()


def _loss(out, where: str):
    """The loss a training step would take of the output (its first tensor when a tuple, a dict
    or a ModelOutput): cross-entropy over the last dimension for float outputs of two or more
    dimensions (class logits, or per-token logits), whose saved log-probabilities are often the
    largest activation of a language model; else the sum."""
    import torch
    import torch.nn.functional as F

    t = out
    if isinstance(out, dict) or hasattr(out, "values") and not torch.is_tensor(out):
        t = next((v for v in out.values() if torch.is_tensor(v)), None)
    elif isinstance(out, (tuple, list)):
        t = next((v for v in out if torch.is_tensor(v)), None)
    if not torch.is_tensor(t):
        raise ModelError(where, f"its forward returned {type(out).__name__} with no tensor to train on")
    if t.is_floating_point() and t.dim() >= 2:
        logits = t.flatten(0, -2).float()
        return F.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long))
    return t.float().sum()
