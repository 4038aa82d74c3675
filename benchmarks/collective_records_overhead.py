"""What recording each rank's collectives (the hang diagnosis) costs, on 2 CPU ranks: on against off.

torch reads TORCH_FR_BUFFER_SIZE once per process, so each round runs two launches, one with
`record_collectives=True` (64 entries) and one with False (0), in turns (neither always first),
and each measures in its ranks:

- one small all_reduce (4 floats), 400 times: the calling thread's CPU time per call
  (time.thread_time: torch records on the thread that issues the collective, and other processes
  on the machine hardly inflate it) and its wall time;
- a DDP training step of the course's MLP: wall time (the slowest rank's median) and CPU time.

Targets (issue 24): at most 20 us more per collective, and a DDP step at most 2% slower.

    python benchmarks/collective_records_overhead.py [--rounds 10] [--hidden 512] [--batch-size 64]
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from course_lib import launch
from course_lib.training.models import make_model

PER_CALL_TARGET_US, STEP_TARGET = 20.0, 1.02
OFF, ON = "off", "on"


def measure(calls: int, steps: int, hidden: int, batch_size: int) -> dict:
    """In each rank: CPU and wall seconds per all_reduce, and per DDP step (medians)."""
    tensor = torch.ones(4)
    for _ in range(50):
        dist.all_reduce(tensor)
    cpu, wall = [], []
    for _ in range(calls):
        started, started_cpu = time.perf_counter(), time.thread_time()
        dist.all_reduce(tensor)
        cpu.append(time.thread_time() - started_cpu)
        wall.append(time.perf_counter() - started)
    model = DistributedDataParallel(make_model(hidden=hidden))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    X, y = torch.randn(batch_size, 16), torch.randint(0, 4, (batch_size,))
    step_wall, step_cpu = [], []
    for step in range(steps + 5):
        dist.barrier()
        started, started_cpu = time.perf_counter(), time.thread_time()
        F.cross_entropy(model(X), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= 5:  # the first steps build DDP's buckets
            step_cpu.append(time.thread_time() - started_cpu)
            step_wall.append(time.perf_counter() - started)
    return {"call_cpu": statistics.median(cpu), "call_wall": statistics.median(wall),
            "step_cpu": statistics.median(step_cpu), "step_wall": statistics.median(step_wall)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    rounds = {OFF: [], ON: []}
    for index in range(args.rounds):
        for name in ((OFF, ON) if index % 2 == 0 else (ON, OFF)):
            ranks = launch(measure, args.calls, args.steps, args.hidden, args.batch_size, nprocs=2,
                           timeout=600, output="none", record_collectives=name == ON)
            # each figure is its slowest rank's: a collective or a step ends when every rank is done
            rounds[name].append({key: max(rank[key] for rank in ranks) for key in ranks[0]})

    def median(name, key):
        return statistics.median(r[key] for r in rounds[name])

    extra_cpu = statistics.median(on["call_cpu"] - off["call_cpu"] for on, off in zip(rounds[ON], rounds[OFF]))
    step_ratios = [on["step_wall"] / off["step_wall"] for on, off in zip(rounds[ON], rounds[OFF])]
    step_ratio = statistics.median(step_ratios)
    step_cpu_extra = median(ON, "step_cpu") - median(OFF, "step_cpu")
    print(f"2 gloo ranks, {args.rounds} rounds of two launches taking turns; all_reduce of 4 floats "
          f"x {args.calls}; DDP step of the MLP (hidden {args.hidden}, batch {args.batch_size})")
    print(f"  all_reduce, CPU of the calling thread: off {median(OFF, 'call_cpu') * 1e6:.1f} us, "
          f"on {median(ON, 'call_cpu') * 1e6:.1f} us; recording adds {extra_cpu * 1e6:.1f} us "
          f"(median of per-round differences; target <= {PER_CALL_TARGET_US:g} us: "
          f"{'met' if extra_cpu * 1e6 <= PER_CALL_TARGET_US else 'NOT met'})")
    print(f"  all_reduce, wall: off {median(OFF, 'call_wall') * 1e6:.1f} us, on {median(ON, 'call_wall') * 1e6:.1f} us")
    print(f"  DDP step, wall: off {median(OFF, 'step_wall') * 1e3:.3f} ms, on {median(ON, 'step_wall') * 1e3:.3f} ms; "
          f"ratio on/off, median over rounds {step_ratio:.3f} (target <= {STEP_TARGET}: "
          f"{'met' if step_ratio <= STEP_TARGET else 'NOT met'}); quartiles "
          f"{' / '.join(f'{q:.3f}' for q in statistics.quantiles(step_ratios, n=4))}")
    print(f"  DDP step, CPU of the training thread: off {median(OFF, 'step_cpu') * 1e6:.0f} us, "
          f"on {median(ON, 'step_cpu') * 1e6:.0f} us ({step_cpu_extra / median(OFF, 'step_cpu'):+.1%})")


if __name__ == "__main__":
    main()
