"""Mixed precision for the trainer: autocast, the fp16 GradScaler, the choice by device, and the
errors that guard them.

bf16 needs no scaler; fp16 needs CUDA and a GradScaler (unscale before clipping, overflowed steps
skipped). amp="auto" picks by the device's capability: bf16 on the CPU and on CUDA GPUs that run it
natively (compute capability 8.0+: A100, H100, H200), fp16 with a GradScaler on older CUDA GPUs.
"""
from contextlib import nullcontext

import torch

AMP_MODES = (None, "auto", "fp16", "bf16")


def has_native_bf16(device: torch.device) -> bool:
    """Whether bf16 is the 16-bit format to use on `device`: the CPU (autocast's CPU dtype; fast only
    with AVX512-BF16 or AMX, correct everywhere), a ROCm GPU, or a CUDA GPU of compute capability 8.0
    or newer (Ampere), which runs bf16 in hardware. The test is
    torch.cuda.is_bf16_supported(including_emulation=False), for this device rather than the current
    one; without `including_emulation=False` it answers True on older GPUs too, which emulate bf16 slowly."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type == "cpu"
    if torch.version.hip:
        return True
    return tuple(torch.cuda.get_device_capability(device)) >= (8, 0)


def choose_amp(device: torch.device) -> str:
    """The amp mode for `device`: "bf16" (no scaler) on CPUs (autocast's CPU dtype, native only
    with AVX512-BF16 or AMX) and on GPUs that run it natively (Ampere on), "fp16" (with a
    GradScaler) on CUDA GPUs before Ampere, whose tensor cores (Volta, Turing) take fp16 only."""
    device = torch.device(device)
    if device.type == "cuda" and not has_native_bf16(device):
        return "fp16"
    return "bf16"


class Precision:
    """What the loop calls around forward, backward and the optimizer step for one `amp` mode."""

    def __init__(self, amp, device: torch.device, model: torch.nn.Module):
        if amp not in AMP_MODES:
            raise ValueError(f"amp={amp!r} is not one of {AMP_MODES}")
        self.amp = choose_amp(device) if amp == "auto" else amp  # "fp16", "bf16" or None from here
        self.device_type = device.type
        self.skipped_steps = 0
        self.scaler = None
        if self.amp == "fp16":
            _check_fp16(device, model)
            self.scaler = torch.amp.GradScaler("cuda")

    def autocast(self):
        if self.amp is None:
            return nullcontext()
        dtype = torch.float16 if self.amp == "fp16" else torch.bfloat16
        return torch.autocast(device_type=self.device_type, dtype=dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(self, optimizer, parameters, grad_clip_norm) -> bool:
        """Clip (on true, unscaled gradients) and step; False when fp16 overflowed and the step was skipped."""
        if self.scaler is None:
            if grad_clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(parameters, grad_clip_norm)
            optimizer.step()
            return True
        if grad_clip_norm is not None:
            self.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(parameters, grad_clip_norm)
        scale_before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        # The scaler lowers its scale exactly when it found inf/NaN gradients and skipped the step.
        stepped = self.scaler.get_scale() >= scale_before
        self.skipped_steps += 0 if stepped else 1
        return stepped

    def state_dict(self) -> dict:
        scaler = self.scaler.state_dict() if self.scaler else None
        return {"scaler": scaler, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.skipped_steps = state.get("skipped_steps", 0)


def _check_fp16(device: torch.device, model: torch.nn.Module) -> None:
    if device.type != "cuda":
        raise ValueError(
            f"amp='fp16' needs a CUDA device (the course's fp16 recipe: autocast with a GradScaler, "
            f"for CUDA GPUs without native bf16), but the model is on {device}; use amp='bf16', "
            f"which needs no scaler, amp='auto', or amp=None")
    half = sorted({str(p.dtype) for p in model.parameters() if p.dtype in (torch.float16, torch.bfloat16)})
    if half:
        raise ValueError(
            f"amp='fp16' uses a GradScaler, which cannot unscale {', '.join(half)} gradients "
            f"(it refuses float16 ones, and fails inside unscale_ on CUDA for bfloat16 ones); "
            f"keep the parameters in float32 (model.float()) "
            f"and let autocast lower the precision, or use amp='bf16' which needs no scaler")
