"""What the course Trainer costs over a minimal hand-written DDP loop: same model, data and ranks.

Both loops run in the same launch, alternating rounds so that machine noise hits both alike; the
ratio of their median step times is printed (target: at most 1.05).

    python benchmarks/trainer_overhead.py [--nprocs 2] [--rounds 10] [--hidden 512] [--batch-size 64]
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from course_lib import launch
from course_lib.training.data import make_dataset
from course_lib.training.models import make_model
from course_lib.training.trainers import TrainConfig, Trainer

TARGET = 1.05
HAND, TRAINER = "hand-written DDP loop", "course Trainer"


def hand_written_ddp(dataset, hidden: int, batch_size: int, epochs: int) -> list:
    """The loop a learner would write from the PyTorch DDP tutorial; returns seconds per step."""
    model = DistributedDataParallel(make_model(hidden=hidden))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    step_times, last = [], time.perf_counter()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for X, y in loader:
            loss = F.cross_entropy(model(X), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            now = time.perf_counter()
            step_times.append(now - last)
            last = now
    return step_times


def course_trainer(dataset, hidden: int, batch_size: int, epochs: int) -> list:
    config = TrainConfig(strategy="ddp", batch_size=batch_size, epochs=epochs, lr=0.05,
                         shuffle=True, seed=0, progress=False)
    return Trainer(make_model(hidden=hidden), dataset, config).fit().step_times


def compare(rounds: int, samples: int, hidden: int, batch_size: int, epochs: int, warmup_steps: int = 3):
    """On every rank: alternate the two loops `rounds` times; returns this rank's step times per round."""
    dataset = make_dataset(samples)
    times = {HAND: [], TRAINER: []}
    cpu_seconds_per_step = {HAND: [], TRAINER: []}
    for _ in range(rounds):
        for name, loop in ((HAND, hand_written_ddp), (TRAINER, course_trainer)):
            dist.barrier()
            cpu_started = time.process_time()
            step_times = loop(dataset, hidden, batch_size, epochs)
            cpu_seconds_per_step[name].append((time.process_time() - cpu_started) / len(step_times))
            times[name].append(step_times[warmup_steps:])
    return {"wall": times, "cpu": cpu_seconds_per_step}


def slowest_rank_median(per_rank: list, name: str, round_index=None) -> float:
    # A DDP step ends when the slowest rank's does: take the slowest rank's median.
    def steps(times):
        rounds = times[name] if round_index is None else [times[name][round_index]]
        return [step for one_round in rounds for step in one_round]
    return max(statistics.median(steps(times)) for times in per_rank)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    results = launch(compare, args.rounds, args.samples, args.hidden, args.batch_size, args.epochs,
                      nprocs=args.nprocs, timeout=args.timeout)
    per_rank = [result["wall"] for result in results]
    print(f"{args.nprocs} ranks, MLP hidden={args.hidden}, batch {args.batch_size} per rank, "
          f"{args.rounds} alternating rounds of {args.epochs} epochs each")
    for name in (HAND, TRAINER):
        steps = sum(len(one_round) for one_round in per_rank[0][name])
        print(f"  {name:<22} median step {slowest_rank_median(per_rank, name) * 1e3:8.3f} ms  "
              f"({steps} steps per rank)")
    # Rounds side by side share the machine's load at that moment: the median of their ratios
    # is steadier on a busy machine than the ratio of the overall medians.
    ratios = [slowest_rank_median(per_rank, TRAINER, i) / slowest_rank_median(per_rank, HAND, i)
              for i in range(args.rounds)]
    ratio = statistics.median(ratios)
    verdict = "met" if ratio <= TARGET else "NOT met"
    print(f"  per-round ratios: {' '.join(f'{r:.3f}' for r in ratios)}")
    # CPU time per step (all threads, setup included) is what other processes on the machine
    # cannot inflate: a second view of the overhead when the wall clock is noisy.
    cpu = {name: statistics.median(max(rank["cpu"][name][i] for rank in results) for i in range(args.rounds))
           for name in (HAND, TRAINER)}
    print(f"  CPU time per step: hand-written {cpu[HAND] * 1e3:.3f} ms, Trainer {cpu[TRAINER] * 1e3:.3f} ms, "
          f"ratio {cpu[TRAINER] / cpu[HAND]:.3f}")
    print(f"step-time ratio, Trainer / hand-written (median over rounds): {ratio:.3f}  "
          f"(target <= {TARGET}: {verdict})")


if __name__ == "__main__":
    main()
