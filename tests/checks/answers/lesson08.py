"""Lesson 08's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from course_lib.checks import lesson08


from . import answer, wrong_answer  # noqa: F401


def mean_loss_with_all_gather_printed_to_stderr(loss):
    everyone = [torch.zeros_like(loss) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, loss.detach())
    mean = torch.stack(everyone).mean()
    if dist.get_rank() == 0:
        print(f"[step] loss averaged over ranks: {mean.item():.6f}", file=sys.stderr)
    return mean


def mean_loss_printing_the_tensor(loss):
    total = loss.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    mean = total / dist.get_world_size()
    if not dist.get_rank():
        print(mean)
    return mean.item()


def wrap_with_static_graph(model):
    return DDP(model, static_graph=True)


def wrap_after_freezing_the_unused_branch(model):
    model.unused_head.requires_grad_(False)  # DDP only waits for parameters that need a gradient
    return DDP(model)


def indices_with_a_new_sampler_each_epoch(dataset, epochs=3, batch_size=4):
    seen = []
    for epoch in range(epochs):
        sampler = DistributedSampler(dataset, shuffle=True, seed=0)
        sampler.set_epoch(epoch)
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
        seen.append([index for (batch,) in loader for index in batch.tolist()])
    return seen


def indices_straight_from_the_sampler(dataset, epochs=3, batch_size=4):
    sampler = DistributedSampler(dataset, num_replicas=dist.get_world_size(),
                                 rank=dist.get_rank(), shuffle=True, seed=0)
    orders = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        orders.append([int(dataset[index][0]) for index in sampler])
    return orders


def save_then_monitored_barrier(model, path):
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)
    dist.monitored_barrier()


def wrap_only_the_body(model):
    return DDP(model.body)  # forward is the body's: DDP gets only what trains


def save_atomically_then_all_reduce(model, path):
    if dist.get_rank() == 0:
        partial = f"{path}.partial"
        torch.save(model.state_dict(), partial)
        os.replace(partial, path)  # the name points at a complete file, or at the old one
    dist.all_reduce(torch.zeros(1))  # every rank: returns once rank 0 has renamed


def save_then_broadcast_a_flag(model, path):
    done = torch.zeros(1)
    if dist.get_rank() == 0:
        torch.save({name: tensor.cpu() for name, tensor in model.state_dict().items()}, path)
        done += 1
    dist.broadcast(done, src=0)  # the others block here until rank 0 has saved


ALTERNATIVES = {
    lesson08.check_log_mean_loss: [
        answer("all_gather, printed to stderr", mean_loss_with_all_gather_printed_to_stderr),
        answer("prints the tensor, returns a float", mean_loss_printing_the_tensor),
    ],
    lesson08.check_wrap_model: [
        answer("static_graph=True", wrap_with_static_graph),
        answer("freezes the unused branch before wrapping", wrap_after_freezing_the_unused_branch),
        answer("wraps only the body", wrap_only_the_body),
    ],
    lesson08.check_indices_per_epoch: [
        answer("a new sampler each epoch, set_epoch", indices_with_a_new_sampler_each_epoch),
        answer("iterates the sampler, no loader", indices_straight_from_the_sampler),
    ],
    lesson08.check_save_checkpoint: [
        answer("monitored_barrier", save_then_monitored_barrier),
        answer("a broadcast as the barrier", save_then_broadcast_a_flag),
        answer("written atomically, an all_reduce as the barrier", save_atomically_then_all_reduce),
    ],
}
