"""The from-scratch DDP's step time against torch's DDP: same model, data and ranks, taking turns.

Four loops, each round in a new order so machine noise hits all alike: torch's
DistributedDataParallel, DDPFromScratch with one all-reduce per parameter (with and without its
event records), and DDPFromScratch with buckets (torch's default cap, 25 MiB). Printed: the median over rounds of each one's step time
(its slowest rank's median) divided by torch's, and this process's CPU time per step
(time.thread_time, which other processes on the machine hardly inflate).

Where the from-scratch DDP is slower, the cost is Python: a hook call per parameter in backward
(autograd takes the GIL for each), an Event recorded per all-reduce with a completion callback
that gloo's thread runs (the GIL again), and with buckets a copy of each gradient into the flat
buffer and back; torch's Reducer does all of this in C++, copying each gradient into its bucket
while dividing it (one pass instead of two).

    python benchmarks/from_scratch_ddp.py [--nprocs 2] [--rounds 20] [--hidden 512] [--layers 4]
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from course_lib import launch
from course_lib.topics.from_scratch import DDPFromScratch
from course_lib.training.models import make_model

TORCH, PER_PARAMETER, BUCKETS = "torch DDP", "from scratch, per parameter", "from scratch, 25 MiB buckets"
UNRECORDED = "from scratch, per parameter, record_events=False"


class Loop:
    """One training loop; step() returns (wall seconds, CPU seconds) of one step."""

    def __init__(self, name: str, hidden: int, layers: int, batch_size: int):
        model = make_model(hidden=hidden, hidden_layers=layers)
        if name == TORCH:
            self.wrapped, self.finish = DistributedDataParallel(model), None
        else:
            self.wrapped = DDPFromScratch(model, bucket_cap_mb=25 if name == BUCKETS else None,
                                          record_events=name != UNRECORDED)
            self.finish = self.wrapped.finish_gradient_sync
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        self.X, self.y = torch.randn(batch_size, 16), torch.randint(0, 4, (batch_size,))

    def step(self):
        started, cpu_started = time.perf_counter(), time.thread_time()
        F.cross_entropy(self.wrapped(self.X), self.y).backward()
        if self.finish is not None:
            self.finish()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - started, time.thread_time() - cpu_started


def compare(rounds: int, hidden: int, layers: int, batch_size: int, steps: int, warmup_steps: int = 3):
    """On every rank: `rounds` rounds, each loop `steps` steps; per loop, per round, the medians."""
    names = [TORCH, PER_PARAMETER, UNRECORDED, BUCKETS]
    loops = {name: Loop(name, hidden, layers, batch_size) for name in names}
    wall, cpu = {name: [] for name in names}, {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:  # each goes first in turn
            dist.barrier()
            times = [loops[name].step() for _ in range(steps)][warmup_steps:]
            wall[name].append(statistics.median(t for t, _ in times))
            cpu[name].append(statistics.median(c for _, c in times))
    return {"wall": wall, "cpu": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    results = launch(compare, args.rounds, args.hidden, args.layers, args.batch_size, args.steps,
                     nprocs=args.nprocs, timeout=args.timeout, output="none")
    rounds = range(args.rounds)
    # A DDP step ends when the slowest rank's does: take the slowest rank's median in each round.
    wall = {name: [max(r["wall"][name][i] for r in results) for i in rounds] for name in results[0]["wall"]}
    cpu = {name: [max(r["cpu"][name][i] for r in results) for i in rounds] for name in results[0]["cpu"]}
    parameters = 2 * (args.layers + 1)
    print(f"{args.nprocs} ranks (gloo), MLP hidden={args.hidden} with {args.layers} hidden layers "
          f"({parameters} parameter tensors), batch {args.batch_size} per rank, {args.rounds} rounds "
          f"taking turns, {args.steps} steps per loop per round")
    for name in wall:
        ratios = [ours / theirs for ours, theirs in zip(wall[name], wall[TORCH])]
        low, middle, high = statistics.quantiles(ratios, n=4)
        cpu_ratio = statistics.median(ours / theirs for ours, theirs in zip(cpu[name], cpu[TORCH]))
        print(f"  {name:48s} step {statistics.median(wall[name]) * 1e3:6.3f} ms, "
              f"/ torch's: {statistics.median(ratios):.2f} (quartiles {low:.2f}-{high:.2f}); "
              f"CPU {statistics.median(cpu[name]) * 1e6:5.0f} µs a step, / torch's: {cpu_ratio:.2f}")


if __name__ == "__main__":
    main()
