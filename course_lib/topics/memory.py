"""Memory per rank: an estimator (parameters, gradients, optimizer state, activations) for a
training recipe, its measured counterpart (tensor bytes on CPU, peak allocation on GPU), and a
reader for the CUDA caching allocator's out-of-memory message.

The estimator counts what every rank keeps; the CUDA context, the allocator's rounding and
fragmentation, communication buffers and temporary tensors come on top (leave headroom).
"""
import math
import re
import weakref
from collections import namedtuple
from dataclasses import dataclass, fields
from typing import Optional

import torch

GB = 10**9
GiB = 2**30

PRECISIONS = ("fp32", "bf16-mixed", "bf16")
ESTIMATED_OPTIMIZERS = ("sgd", "sgd-momentum", "adam", "adamw", "adam-8bit")
SHARDING_STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp")

# Values each optimizer keeps per parameter, and their size when the state is not 8-bit.
_STATE_VALUES = {"sgd": 0, "sgd-momentum": 1, "adam": 2, "adamw": 2, "adam-8bit": 2}
# What each strategy shards over world_size; the rest is replicated on every rank.
_SHARDED = {
    "ddp": (),
    "zero1": ("optimizer_state",),
    "zero2": ("optimizer_state", "gradients"),
    "zero3": ("optimizer_state", "gradients", "parameters"),
    "fsdp": ("optimizer_state", "gradients", "parameters"),  # shards as ZeRO-3 (bytes: see below)
}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes one rank holds, by kind. `peak` is a measured peak allocation (GPU only), if any."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int = 0
    peak: Optional[int] = None

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state + self.activations

    def parts(self) -> dict:
        """{"parameters": bytes, "gradients": ..., "optimizer state": ..., "activations": ...}"""
        return {field.name.replace("_", " "): getattr(self, field.name)
                for field in fields(self) if field.name != "peak"}

    def fits(self, gpu_memory_bytes: int) -> bool:
        """Whether the total fits in `gpu_memory_bytes` (give it what is usable, not the label)."""
        return self.total <= gpu_memory_bytes

    def describe(self, unit: int = GiB, unit_name: str = "GiB") -> str:
        """One line per part, then the total, in `unit`."""
        lines = [f"{name:<16}{value / unit:>10.2f} {unit_name}" for name, value in self.parts().items()]
        lines.append(f"{'total':<16}{self.total / unit:>10.2f} {unit_name}")
        if self.peak is not None:
            lines.append(f"{'measured peak':<16}{self.peak / unit:>10.2f} {unit_name}")
        return "\n".join(lines)


def bytes_per_parameter(optimizer: str = "adam", precision: str = "fp32",
                        strategy: str = "ddp") -> dict:
    """Bytes per parameter before sharding: {"parameters", "gradients", "optimizer_state"}.

    - "fp32": fp32 weights, gradients and optimizer state. (torch.autocast keeps this layout:
      only the activations are bf16.)
    - "bf16-mixed": bf16 compute, fp32 weights for the optimizer, fp32 optimizer state. Where
      the bytes sit depends on the strategy. DDP and ZeRO-1/2/3 here use the ZeRO paper's layout
      (DeepSpeed): bf16 weights (2) and gradients (2), the fp32 master copy (4) kept with the
      optimizer state. "fsdp" is FSDP2's MixedPrecisionPolicy: the sharded parameter stays fp32
      and is the optimizer's parameter, its gradient is fp32, and bf16 copies exist only while
      a layer is gathered (not counted): 4 + 4 + state, the same total. (Megatron-LM keeps fp32
      gradients next to bf16 weights: 2 more bytes; not modelled here.)
    - "bf16": everything bf16, no master copy (cheapest; small updates can round away).
    - "adam-8bit" keeps its two values in 1 byte each (block scales ignored: ~0.004 B/param).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: use one of {PRECISIONS}")
    if optimizer not in ESTIMATED_OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r}: use one of {ESTIMATED_OPTIMIZERS}")
    if strategy not in SHARDING_STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: use one of {SHARDING_STRATEGIES}")
    weight_bytes = 4 if precision == "fp32" else 2
    state_value_bytes = 1 if optimizer == "adam-8bit" else weight_bytes
    if precision == "bf16-mixed" and optimizer != "adam-8bit":
        state_value_bytes = 4  # the optimizer runs in fp32 on the fp32 weights
    state = _STATE_VALUES[optimizer] * state_value_bytes
    if precision == "bf16-mixed" and strategy == "fsdp":  # the fp32 shard is the optimizer's
        return {"parameters": 4, "gradients": 4, "optimizer_state": state}
    master_copy = 4 if precision == "bf16-mixed" else 0
    return {"parameters": weight_bytes, "gradients": weight_bytes,
            "optimizer_state": master_copy + state}


def estimate_memory(n_parameters: int, optimizer: str = "adam", precision: str = "fp32",
                    strategy: str = "ddp", world_size: int = 1,
                    activation_bytes: int = 0) -> MemoryBreakdown:
    """What one rank holds when training `n_parameters` with this recipe.

    `strategy` says what is split over `world_size` ranks (each rank keeps ceil(n / world_size)
    of a sharded kind). `activation_bytes` is this rank's saved activations for one micro-batch
    (per-sample bytes x batch_size; measure them with SavedActivations, or use
    transformer_activation_bytes): every strategy here keeps them whole on every rank.
    """
    if strategy not in SHARDING_STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: use one of {SHARDING_STRATEGIES}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r}: need a whole number of ranks, at least 1")
    if n_parameters < 0 or activation_bytes < 0:
        raise ValueError("n_parameters and activation_bytes cannot be negative")
    shard = math.ceil(n_parameters / world_size)
    per_parameter = bytes_per_parameter(optimizer, precision, strategy)
    held = {kind: per_parameter[kind] * (shard if kind in _SHARDED[strategy] else n_parameters)
            for kind in per_parameter}
    return MemoryBreakdown(activations=int(activation_bytes), **held)


Recipe = namedtuple("Recipe", "precision optimizer strategy")
# Lesson 11's ways to train a large model: a precision, an optimizer, a ZeRO stage (0 = DDP).
RECIPES = [Recipe(precision, optimizer, strategy)
           for precision in PRECISIONS
           for optimizer in ("adam", "adam-8bit")
           for strategy in ("ddp", "zero1", "zero2", "zero3")]


def fitting_recipes(n_parameters: int, gpu_memory_bytes: int, world_size: int,
                    activation_bytes: int = 0, recipes=RECIPES) -> list:
    """The recipes, in their order, whose estimate for one rank fits in `gpu_memory_bytes`."""
    return [recipe for recipe in recipes
            if estimate_memory(n_parameters, recipe.optimizer, recipe.precision, recipe.strategy,
                               world_size, activation_bytes).fits(gpu_memory_bytes)]


def transformer_activation_bytes(batch_size: int, seq_len: int, hidden: int, n_layers: int,
                                 n_heads: int, checkpointing: bool = False,
                                 flash_attention: bool = True) -> int:
    """A transformer's saved activations with 16-bit values, after Korthikanti et al. (2022,
    arXiv:2205.05198): s*b*h*(34 + 5*a*s/h) bytes per layer. The 5*a*s/h term is the attention
    scores, a*s*s values per sample kept three times (softmax output and dropout output in
    2 bytes, the dropout mask in 1). A fused attention (flash attention, the fused kernels of
    scaled_dot_product_attention) never stores them: the default, flash_attention=True, drops
    the term; flash_attention=False is the published formula.
    With every layer checkpointed, each layer keeps its 16-bit input (2*s*b*h) and one layer at
    a time is recomputed in full during the backward pass."""
    scores = 0 if flash_attention else 5 * n_heads * seq_len / hidden
    per_layer = seq_len * batch_size * hidden * (34 + scores)
    if checkpointing:
        return int(n_layers * 2 * seq_len * batch_size * hidden + per_layer)
    return int(n_layers * per_layer)


# -- measured ---------------------------------------------------------------------------------

def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes this process holds for `tensor`: the local shard of a DTensor (FSDP), else all of it."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def _span(tensor: torch.Tensor) -> tuple:
    """(device, first byte, one past the last byte) of the memory a tensor's view covers."""
    extent = 1 + sum((size - 1) * abs(stride) for size, stride in zip(tensor.shape, tensor.stride()))
    start = tensor.data_ptr()
    return str(tensor.device), start, start + (extent * tensor.element_size() if tensor.numel() else 0)


def distinct_bytes(tensors) -> int:
    """Bytes covered by the tensors, memory shared between them counted once (tied weights,
    views of one buffer). A view counts what it covers, not its whole storage, so a batch
    sliced from a dataset counts as the batch."""
    spans = sorted(_span(tensor.to_local() if hasattr(tensor, "to_local") else tensor)
                   for tensor in tensors)
    total, current = 0, None
    for device, start, end in spans:
        if current is not None and current[0] == device and start <= current[2]:
            current = (device, current[1], max(current[2], end))  # overlaps: extend
            continue
        if current is not None:
            total += current[2] - current[1]
        current = (device, start, end)
    return total + (current[2] - current[1] if current is not None else 0)


def optimizer_state_tensors(optimizer) -> list:
    """Every tensor in the optimizer's state (ZeroRedundancyOptimizer: this rank's part)."""
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer wraps a local one
    return [value for state in inner.state.values() for value in state.values()
            if isinstance(value, torch.Tensor)]


def measure_model_state(model: torch.nn.Module, optimizer=None, activation_bytes: int = 0,
                        peak: Optional[int] = None) -> MemoryBreakdown:
    """Count the bytes of the model's parameters, their gradients and the optimizer's state, as
    held by this process now (after a step, so the state exists)."""
    parameters = list(model.parameters())
    gradients = [parameter.grad for parameter in parameters if parameter.grad is not None]
    state = optimizer_state_tensors(optimizer) if optimizer is not None else []
    return MemoryBreakdown(distinct_bytes(parameters), distinct_bytes(gradients),
                           distinct_bytes(state), activation_bytes, peak)


class _Packed:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


class SavedActivations(torch.autograd.graph.saved_tensors_hooks):
    """Count the bytes autograd keeps for the backward pass (the activations), parameters excluded.

        with SavedActivations(model) as saved:
            loss = loss_fn(model(X), y)
        saved.bytes   # read it before backward(), which frees them

    Works on CPU and GPU, and with torch.utils.checkpoint (non-reentrant): what checkpointing
    drops is not kept, so it is not counted. Memory shared by several saved tensors counts once.
    Under FSDP the gathered full parameters are not the registered ones: they count here.
    """

    def __init__(self, model: Optional[torch.nn.Module] = None):
        self._parameters = {parameter.untyped_storage().data_ptr()
                            for parameter in (model.parameters() if model is not None else ())}
        self._packed = []
        super().__init__(self._pack, self._unpack)

    def __enter__(self):
        super().__enter__()
        return self

    def _pack(self, tensor):
        packed = _Packed(tensor)
        self._packed.append(weakref.ref(packed))  # alive as long as autograd keeps it
        return packed

    @staticmethod
    def _unpack(packed):
        return packed.tensor

    def tensors(self) -> list:
        """The tensors autograd still keeps for backward (each once), parameters excluded."""
        kept = {}
        for reference in self._packed:
            packed = reference()
            if packed is None:
                continue
            tensor = packed.tensor
            if tensor.untyped_storage().data_ptr() not in self._parameters:
                kept.setdefault(_span(tensor), tensor)
        return list(kept.values())

    @property
    def bytes(self) -> int:
        """Bytes autograd still keeps for backward; memory shared by saved tensors counts once."""
        return distinct_bytes(self.tensors())


def measure_training_step(model: torch.nn.Module, optimizer, X: torch.Tensor, y: torch.Tensor,
                          loss_fn=torch.nn.functional.cross_entropy) -> MemoryBreakdown:
    """Run one training step and measure it: activations saved by the forward pass, then the
    parameters, gradients and optimizer state after the step. On a GPU `peak` is
    torch.cuda.max_memory_allocated over the step (everything, temporaries included)."""
    device = next(model.parameters()).device
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    optimizer.zero_grad(set_to_none=True)
    with SavedActivations(model) as saved:
        loss = loss_fn(model(X), y)
    activation_bytes = saved.bytes
    loss.backward()
    optimizer.step()
    peak = None
    if on_gpu:
        torch.cuda.synchronize(device)
        peak = int(torch.cuda.max_memory_allocated(device))
    return measure_model_state(model, optimizer, activation_bytes, peak)


# -- the CUDA caching allocator's out-of-memory message ------------------------------------------

_SIZE = r"([\d.]+) (bytes|KiB|MiB|GiB)"  # as the allocator's format_size writes sizes
_UNITS = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
_OOM_PARTS = {  # the sentences of DeviceCachingAllocator::malloc's message
    "requested": rf"Tried to allocate {_SIZE}",
    "total": rf"has a total capacity of {_SIZE}",
    "free": rf"of which {_SIZE} is free",
    "allocated": rf"Of the allocated memory {_SIZE} is allocated by PyTorch",
    "reserved_unallocated": rf"and {_SIZE} is reserved by PyTorch but unallocated",
}
_THIS_PROCESS = rf"Including non-PyTorch memory, this process has {_SIZE} memory in use"  # NVML
_OTHER_PROCESS = rf"Process \d+ has {_SIZE} memory in use"


@dataclass(frozen=True)
class OutOfMemoryReport:
    """The numbers of a torch.OutOfMemoryError from CUDA, in bytes, and what they point to."""

    requested: int  # the segment the allocator asked CUDA for (a 3 MiB tensor asks for 20 MiB)
    total: int
    free: int
    allocated: int  # in live tensors of this process
    reserved_unallocated: int  # cached by this process's allocator, in no tensor
    this_process: Optional[int] = None  # all this process holds, CUDA context included (NVML)
    other_processes: int = 0  # what the other processes on this GPU hold (NVML)

    @property
    def diagnosis(self) -> str:
        if self.requested > self.total:
            return "one allocation larger than the whole GPU: make the tensor smaller"
        if self.reserved_unallocated >= self.requested:
            return ("fragmentation: the cache holds more than the request, but in pieces; "
                    "try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
        if self.other_processes >= self.requested:
            unnamed = "" if self.this_process is not None else (
                " (no sentence names this process: where NVML reports host PIDs, as in a "
                "container, one of them may be this process)")
            return (f"other processes hold {self.other_processes / GiB:.2f} GiB of this GPU"
                    f"{unnamed}: another job, or a rank of yours on the wrong device")
        return ("the tensors fill the GPU: smaller micro-batch, activation checkpointing, "
                "bf16, or shard with ZeRO/FSDP")


def read_oom_message(message: str) -> OutOfMemoryReport:
    """Read the sizes out of a CUDA out-of-memory message (str(error) of torch.OutOfMemoryError)."""
    message = " ".join(message.split())  # whatever the line breaks

    def size(found):
        return round(float(found[0]) * _UNITS[found[1]])

    sizes = {}
    for name, pattern in _OOM_PARTS.items():
        found = re.search(pattern, message)
        if not found:
            raise ValueError(f"not a CUDA out-of-memory message: no {name!r} in it")
        sizes[name] = size(found.groups())
    this_process = re.search(_THIS_PROCESS, message)  # absent where NVML is
    return OutOfMemoryReport(**sizes, this_process=size(this_process.groups()) if this_process else None,
                             other_processes=sum(map(size, re.findall(_OTHER_PROCESS, message))))
