"""Lesson 08's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from course_lib.checks import lesson08
from course_lib.topics import pitfalls

from . import answer, wrong_answer


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


# Wrong answers: the broken snippets (course_lib.topics.pitfalls), fixes of the symptom, half-fixes

def sums_and_prints_everywhere(loss):
    dist.all_reduce(loss)
    print(f"mean loss {loss.item() / dist.get_world_size():.4f}")
    return loss


def divides_on_rank0_only(loss):
    dist.all_reduce(loss)
    if dist.get_rank() == 0:
        loss = loss / dist.get_world_size()
        print(f"mean loss {loss.item():.4f}")
    return loss


def reduces_to_rank0(loss):
    dist.reduce(loss, dst=0)
    loss = loss / dist.get_world_size()
    if dist.get_rank() == 0:
        print(f"mean loss {loss.item():.4f}")
    return loss


def prints_its_own_loss(loss):
    mean = loss.clone()
    dist.all_reduce(mean)
    mean /= dist.get_world_size()
    if dist.get_rank() == 0:
        print(f"mean loss {loss.item():.4f}")  # rank 0's own loss, not the mean
    return mean


def drops_the_collective(loss):
    if dist.get_rank() == 0:  # no hang any more, and no mean either
        print(f"mean loss {loss.item():.4f}")
    return loss


def prints_the_sum(loss):
    total = loss.clone()
    dist.all_reduce(total)
    if dist.get_rank() == 0:
        print(f"mean loss {total.item():.4f}")
    return total / dist.get_world_size()


def divides_by_two(loss):
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    mean /= 2  # the broken run had 2 ranks
    if dist.get_rank() == 0:
        print(f"mean loss {mean.item():.4f}")
    return mean


def no_ddp(model):
    return model


def deletes_after_wrapping(model):
    wrapped = DDP(model)
    del model.unused_head  # too late: DDP already expects a gradient for it
    return wrapped


def freezes_after_wrapping(model):
    wrapped = DDP(model)
    model.unused_head.requires_grad_(False)  # too late: DDP already expects a gradient for it
    return wrapped


def sets_epoch_after_the_epoch(dataset, epochs=3, batch_size=4):
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    seen = []
    for epoch in range(epochs):
        seen.append([i for (batch,) in loader for i in batch.tolist()])
        sampler.set_epoch(epoch)
    return seen


def shuffles_without_sharding(dataset, epochs=3, batch_size=4):
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)
    return [[i for (batch,) in loader for i in batch.tolist()] for _ in range(epochs)]


def reshuffles_its_own_share(dataset, epochs=3, batch_size=4):
    share = list(DistributedSampler(dataset, shuffle=True, seed=0))  # the same share every epoch
    generator = torch.Generator().manual_seed(dist.get_rank())
    return [[share[i] for i in torch.randperm(len(share), generator=generator).tolist()]
            for _ in range(epochs)]


def sampler_for_two_ranks(dataset, epochs=3, batch_size=4):
    sampler = DistributedSampler(dataset, num_replicas=2, rank=dist.get_rank() % 2, seed=0)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    seen = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        seen.append([i for (batch,) in loader for i in batch.tolist()])
    return seen


def barrier_before_saving(model, path):
    dist.barrier()
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)


def barrier_on_rank0_only(model, path):
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)
        dist.barrier()


def waits_for_the_file(model, path):
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)
    else:
        while not os.path.exists(path):  # the file (an old one, a torn one) may be there already
            time.sleep(0.01)


def sleeps_then_returns(model, path):
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)
    else:
        time.sleep(1.0)  # "long enough" for one disk


def retries_loading(model, path):
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)
        return
    while True:
        try:
            torch.load(path, map_location="cpu")  # loads whatever complete file is there
            return
        except Exception:  # noqa: BLE001
            time.sleep(0.01)


WRONG_ANSWERS = {
    lesson08.check_log_mean_loss: [
        wrong_answer("the broken snippet: all_reduce on rank 0 only",
                     pitfalls.log_mean_loss_broken),
        wrong_answer("the symptom fixed: no collective, rank 0 logs its own loss",
                     drops_the_collective),
        wrong_answer("all_reduce everywhere, but every rank prints", sums_and_prints_everywhere),
        wrong_answer("divides by world_size on rank 0 only", divides_on_rank0_only),
        wrong_answer("dist.reduce to rank 0: other ranks get no mean", reduces_to_rank0),
        wrong_answer("returns the mean, but rank 0 prints its own loss", prints_its_own_loss),
        wrong_answer("returns the mean, but rank 0 prints the sum", prints_the_sum),
        wrong_answer("divides the sum by 2, the broken run's world size", divides_by_two),
    ],
    lesson08.check_wrap_model: [
        wrong_answer("the broken snippet: plain DDP", pitfalls.wrap_model_broken),
        wrong_answer("the symptom fixed: no DDP at all, each rank trains alone", no_ddp),
        wrong_answer("deletes the branch after wrapping", deletes_after_wrapping),
        wrong_answer("freezes the branch after wrapping", freezes_after_wrapping),
        wrong_answer("the course's fix, pitfalls.wrap_model", pitfalls.wrap_model),
    ],
    lesson08.check_indices_per_epoch: [
        wrong_answer("the broken snippet: no set_epoch", pitfalls.indices_per_epoch_broken),
        wrong_answer("set_epoch after the epoch's loop", sets_epoch_after_the_epoch),
        wrong_answer("the symptom fixed: DataLoader(shuffle=True) without sharding",
                     shuffles_without_sharding),
        wrong_answer("the symptom fixed: each rank reshuffles its own fixed share",
                     reshuffles_its_own_share),
        wrong_answer("a sampler with num_replicas=2 written in", sampler_for_two_ranks),
    ],
    lesson08.check_save_checkpoint: [
        wrong_answer("the broken snippet: rank 0 saves, nobody waits",
                     pitfalls.save_checkpoint_broken),
        wrong_answer("every rank saves", pitfalls.save_checkpoint_everywhere),
        wrong_answer("barrier before saving", barrier_before_saving),
        wrong_answer("barrier inside `if rank == 0`", barrier_on_rank0_only),
        wrong_answer("the symptom fixed: the others wait until the file exists",
                     waits_for_the_file),
        wrong_answer("the symptom fixed: the others sleep a second", sleeps_then_returns),
        wrong_answer("the symptom fixed: the others retry loading until it loads",
                     retries_loading),
    ],
}


# -- replicas that agree, values that are finite (check_replica_health) ---------------------------

def _flat(model):
    return torch.cat([parameter.detach().flatten() for parameter in model.parameters()])


def _not_finite(model, loss):
    return not bool(torch.isfinite(_flat(model)).all() and torch.isfinite(loss.detach()))


def health_by_all_gather_of_hashes(model, loss):
    """The bytes of the parameters hashed, every rank's hash and flag gathered: two collectives."""
    import hashlib

    digest = hashlib.sha256(_flat(model).numpy().tobytes()).digest()[:7]
    mine = torch.tensor([int.from_bytes(digest, "big"), int(_not_finite(model, loss))])
    everyone = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    if any(int(row[1]) for row in everyone):
        return "non-finite"
    return "ok" if len({int(row[0]) for row in everyone}) == 1 else "diverged"


def health_by_broadcast_and_compare(model, loss):
    """Rank 0's parameters broadcast, each rank compares exactly, then one all-reduce (MAX) of
    [differs, not finite]: every rank gets both verdicts."""
    reference = _flat(model).clone()
    dist.broadcast(reference, src=0)
    flags = torch.tensor([float(not torch.equal(reference, _flat(model))),
                          float(_not_finite(model, loss))])
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    if flags[1] > 0:
        return "non-finite"
    return "diverged" if flags[0] > 0 else "ok"


def _with_fingerprint(fingerprint):
    def check(model, loss):
        mine = fingerprint(_flat(model).double())
        summary = torch.stack([mine, -mine, torch.tensor(float(_not_finite(model, loss)),
                                                         dtype=torch.float64)])
        dist.all_reduce(summary, op=dist.ReduceOp.MAX)
        if summary[2] > 0:
            return "non-finite"
        return "ok" if summary[0] == -summary[1] else "diverged"
    return check


def health_checked_locally(model, loss):
    return "non-finite" if _not_finite(model, loss) else "ok"


def health_on_rank_zero_only(model, loss):
    """Rank 0 gathers every fingerprint and flag and decides; the others are never told."""
    mine = torch.stack([pitfalls.fingerprint(model), torch.tensor(float(_not_finite(model, loss)),
                                                                   dtype=torch.float64)])
    everyone = [torch.zeros_like(mine) for _ in range(dist.get_world_size())] \
        if dist.get_rank() == 0 else None
    dist.gather(mine, everyone, dst=0)
    if dist.get_rank() != 0:
        return "ok"
    if any(row[1] > 0 for row in everyone):
        return "non-finite"
    return "ok" if len({float(row[0]) for row in everyone}) == 1 else "diverged"


def health_flag_summed_then_divided(model, loss):
    """The flag averaged (SUM / N) and compared with 1: true only when every rank saw a NaN."""
    mine = pitfalls.fingerprint(model)
    summary = torch.stack([mine, -mine])
    dist.all_reduce(summary, op=dist.ReduceOp.MAX)
    flag = torch.tensor(float(_not_finite(model, loss)))
    dist.all_reduce(flag)
    if flag / dist.get_world_size() >= 1:
        return "non-finite"
    return "ok" if summary[0] == -summary[1] else "diverged"


ALTERNATIVES[lesson08.check_replica_health] = [
    answer("sha256 of the bytes, all_gather", health_by_all_gather_of_hashes),
    answer("rank 0's weights broadcast, compared exactly", health_by_broadcast_and_compare),
]
WRONG_ANSWERS[lesson08.check_replica_health] = [
    wrong_answer("checks only locally", health_checked_locally),
    wrong_answer("calls the course's own check", pitfalls.replica_health_check),
    wrong_answer("raises on the rank with the NaN, alone", pitfalls.replica_health_check_local),
    wrong_answer("rank 0 decides, the others are never told", health_on_rank_zero_only),
    wrong_answer("a plain sum as the fingerprint", _with_fingerprint(lambda values: values.sum())),
    wrong_answer("a sum of squares as the fingerprint",
                 _with_fingerprint(lambda values: (values ** 2).sum())),
    wrong_answer("the flag averaged: non-finite only when every rank is",
                 health_flag_summed_then_divided),
]
