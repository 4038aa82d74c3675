"""Pipeline parallelism from send and recv: a model cut into stages, one a rank; micro-batches go
forward through the stages and their gradients come back; a schedule is each rank's order of
forwards ("F", i) and backwards ("B", i).

    stage = Stage(my_layers, torch.Size([16, 64]))        # what passes between stages: one micro-batch
    records = stage.run(gpipe(stage.index, stage.stages, 4), inputs, targets, loss_fn)
    # every stage's parameters now hold the gradient of the whole batch's mean loss

A forward receives its input from the stage before (the first stage takes the micro-batch), runs
the stage's layers, and sends the output on (the last stage computes the loss instead, divided by
the number of micro-batches, so the gradients add up to the whole batch's). A backward receives
the gradient of that output from the stage after (the last stage starts from its loss), runs
autograd through the stage, and sends the gradient of its input back. Sends are asynchronous
(`isend`): a rank blocks only in a `recv`, until its peer has sent. Between two ranks sends and
recvs match in the order they are posted (NCCL has no tags), so a stage must receive micro-batches
in the order its neighbour sends them. Same code on gloo and NCCL (where `device` is the rank's GPU).

Schedules (pipeline_schedules.py, for p stages and m micro-batches): gpipe runs every forward,
then every backward, so each stage holds all m micro-batches' activations; one_f_one_b holds at most
p - s on stage s. Both take m + p - 1 slots of a forward and a backward when the stages take equal
time: a share (p - 1) / (m + p - 1) of every rank's time is idle, the bubble.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, List, Sequence

import torch
import torch.distributed as dist
from torch import nn

from .pipeline_schedules import Action, bubble_fraction, gpipe, one_f_one_b  # noqa: F401 (re-exported)


@dataclass
class Record:
    """One action on one rank: when it started, when its input was there (its recv returned: the
    time before is waiting), and when it ended (perf_counter seconds: one clock for every process
    of a machine)."""

    rank: int
    action: str
    microbatch: int
    started: float
    computing: float
    ended: float


class Stage:
    """This rank's part of the model, and the sends and recvs that join it to its neighbours."""

    def __init__(self, module: nn.Module, shape: torch.Size, device="cpu", dtype=torch.float32):
        self.module, self.shape, self.device, self.dtype = module, torch.Size(shape), device, dtype
        self.index, self.stages = dist.get_rank(), dist.get_world_size()
        self.is_first, self.is_last = self.index == 0, self.index == self.stages - 1
        self.saved = {}      # micro-batch -> (input, output or loss): what its backward needs
        self.sending = []    # isend handles, waited for at the end of the step

    def forward(self, i: int, inputs=None, target=None, loss_fn=None, microbatches: int = 1) -> None:
        if self.is_first:
            x = inputs
        else:
            x = self._receive(self.index - 1).requires_grad_()
        output = self.module(x)
        if self.is_last:
            output = loss_fn(output, target) / microbatches
        else:
            self.sending.append(dist.isend(output.detach().contiguous(), self.index + 1))
        self.saved[i] = (x, output)

    def backward(self, i: int) -> None:
        x, output = self.saved.pop(i)
        if self.is_last:
            output.backward()
        else:
            output.backward(self._receive(self.index + 1))
        if not self.is_first:
            self.sending.append(dist.isend(x.grad.contiguous(), self.index - 1))

    def run(self, order: Sequence[Action], inputs: Sequence[torch.Tensor], targets: Sequence[torch.Tensor],
            loss_fn: Callable) -> List[Record]:
        """One step: the actions of `order` on this rank's stage; what each did, and when."""
        records, microbatches = [], len(inputs)
        for action, i in order:
            started = self._computing = time.perf_counter()  # a recv moves _computing on
            if action == "F":
                self.forward(i, inputs[i] if self.is_first else None,
                             targets[i] if self.is_last else None, loss_fn, microbatches)
            elif action == "B":
                self.backward(i)
            else:
                raise ValueError(f"an action is ('F', i) or ('B', i), not {(action, i)!r}")
            records.append(Record(self.index, action, i, started, self._computing, time.perf_counter()))
        for handle in self.sending:
            handle.wait()
        self.sending = []
        return records

    def _receive(self, peer: int) -> torch.Tensor:
        buffer = torch.empty(self.shape, device=self.device, dtype=self.dtype)
        dist.recv(buffer, peer)
        self._computing = time.perf_counter()
        return buffer


def idle_shares(records) -> dict:
    """{rank: share of the step it did not compute}: the step from the first start to the last end
    over every rank; a rank computes from when its input is there to when the action ends."""
    step = max(r.ended for r in records) - min(r.started for r in records)
    busy = {}
    for r in records:
        busy[r.rank] = busy.get(r.rank, 0.0) + (r.ended - r.computing)
    return {rank: 1 - seconds / step for rank, seconds in sorted(busy.items())}


def blocks(stages: int, width: int, layers: int = 1, seed: int = 0) -> List[nn.Module]:
    """A model cut into `stages` blocks, each `layers` Linear+Tanh of `width`, seeded."""
    torch.manual_seed(seed)
    return [nn.Sequential(*[module for _ in range(layers) for module in (nn.Linear(width, width), nn.Tanh())])
            for _ in range(stages)]


def mean_squared_error(output, target):
    return ((output - target) ** 2).mean()


def _steps_on_rank(schedule, microbatch_counts, repeats, rows, width, layers):
    rank, stages = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)  # one core a rank: the stages' speeds must not depend on the other
    block = blocks(stages, width, layers)[rank]
    generator = torch.Generator().manual_seed(1)
    measured = {}
    for _ in range(repeats + 1):  # the first round warms up, and is left out
        for m in microbatch_counts:  # interleaved: a burst of load touches every m alike
            inputs = [torch.randn(rows, width, generator=generator) for _ in range(m)]
            targets = [torch.randn(rows, width, generator=generator) for _ in range(m)]
            dist.barrier()
            stage = Stage(block, torch.Size([rows, width]))
            records = stage.run(schedule(rank, stages, m), inputs, targets, mean_squared_error)
            block.zero_grad()
            measured.setdefault(m, []).append(records)
    return {m: steps[1:] for m, steps in measured.items()}


def measure_steps(schedule, microbatch_counts=(1, 2, 4, 8), repeats: int = 5, stages: int = 2,
                  rows: int = 64, width: int = 512, layers: int = 4):
    """{m: [one step's Records of every rank, for each repeat]}: `schedule` run on `stages` gloo
    ranks, each stage `layers` Linear+Tanh of `width`, micro-batches of `rows` samples."""
    from ...runtime.launcher.launch import launch

    per_rank = launch(_steps_on_rank, schedule, tuple(microbatch_counts), repeats, rows, width, layers,
                      nprocs=stages, backend="gloo", timeout=120, output="none")
    return {m: [[record for rank in per_rank for record in rank[m][k]] for k in range(repeats)]
            for m in microbatch_counts}
