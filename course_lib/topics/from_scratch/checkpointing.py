"""Activation checkpointing by hand: keep a block's input, not its activations, and run its forward
again in backward, with the random state it had, so that dropout draws the same mask (lesson 19).

    x = Checkpoint.apply(block, x)      # in place of x = block(x)

- forward: note the random state (torch.get_rng_state(); and torch.cuda.get_rng_state(device) of
  each GPU the inputs are on), keep the inputs (save_for_backward), run the block: a Function's
  forward runs without grad (Function.apply), so autograd records nothing inside it and nothing
  inside is saved; the explicit no_grad says so, as torch's CheckpointFunction does.
- backward: inside torch.random.fork_rng (which puts the surrounding random states back when it
  ends), set the noted states, run the block again with grad enabled on detached copies of the
  inputs, backprop the output's gradient through it (the parameters' .grad fill in), and return
  the inputs' gradients.

torch.utils.checkpoint(use_reentrant=True) is this Function (CheckpointFunction in
torch/utils/checkpoint.py, which notes the GPUs' states with get_device_states once CUDA is
initialised): GPU dropout draws from the GPU's own generator, not the CPU's.
"""
from __future__ import annotations

import time
from typing import Callable, List, Optional

import torch
from torch import nn


class Checkpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, function: Callable, *inputs):
        ctx.function = function
        ctx.random_state = torch.get_rng_state()
        ctx.devices = sorted({x.device.index for x in inputs if torch.is_tensor(x) and x.is_cuda})
        ctx.device_states = [torch.cuda.get_rng_state(device) for device in ctx.devices]  # GPU dropout's
        ctx.save_for_backward(*inputs)
        with torch.no_grad():
            return function(*inputs)

    @staticmethod
    def backward(ctx, *output_gradients):
        with torch.random.fork_rng(devices=ctx.devices):  # these states are back as they were at its end
            torch.set_rng_state(ctx.random_state)
            for device, state in zip(ctx.devices, ctx.device_states):
                torch.cuda.set_rng_state(state, device)
            inputs = [x.detach().requires_grad_(x.requires_grad) for x in ctx.saved_tensors]
            with torch.enable_grad():
                outputs = ctx.function(*inputs)
        if torch.is_tensor(outputs):
            outputs = (outputs,)
        torch.autograd.backward(outputs, output_gradients)
        return (None, *(x.grad for x in inputs))


def checkpoint(function: Callable, *inputs):
    """function(*inputs), its activations recomputed in backward instead of kept."""
    return Checkpoint.apply(function, *inputs)


def blocks(count: int, width: int, dropout: float = 0.1, seed: int = 0) -> nn.ModuleList:
    """`count` MLP blocks (Linear, GELU, Dropout, Linear), the lesson's model."""
    torch.manual_seed(seed)
    return nn.ModuleList(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Dropout(dropout),
                                       nn.Linear(4 * width, width)) for _ in range(count))


def run_blocks(model: nn.ModuleList, x: torch.Tensor, checkpoint: Optional[Callable] = None):
    """The blocks one after the other, each through `checkpoint(block, x)` if one is given."""
    for block in model:
        x = block(x) if checkpoint is None else checkpoint(block, x)
    return x


def time_steps(variants: dict, rounds: int, warmup: int = 2) -> dict:
    """{name: [CPU seconds of its step in each round]}: each variant's step() called once a round,
    the variants in turns (A B A B ...), so that whatever else the machine does falls on all of them
    alike; the `warmup` rounds are left out. The clock is this thread's CPU time
    (time.thread_time): a step's share of the core, not the time other programs held it, so run the
    steps on one thread (torch.set_num_threads(1))."""
    seconds: dict = {name: [] for name in variants}
    for index in range(warmup + rounds):
        for name, step in variants.items():
            started = time.thread_time()
            step()
            if index >= warmup:
                seconds[name].append(time.thread_time() - started)
    return seconds


def ratios(numerators: List[float], denominators: List[float]) -> List[float]:
    """Each round's ratio: the rounds were taken in turns, so round k of both saw the same machine."""
    return [a / b for a, b in zip(numerators, denominators)]
