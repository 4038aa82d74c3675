"""What recording a timeline costs a step on 2 CPU ranks: recording on against off, side by side.

Two views, both taking turns round after round in one launch, so machine noise hits both alike:

- the Trainer with TrainConfig(timeline_steps=<every step>) against the Trainer without it: the
  median over rounds of the ratio of their median step times (wall clock; target: at most 1.03),
  and the ratio of their fastest fifth of steps (noise only adds time, so fast steps show the
  intrinsic cost; on a busy machine the median ratio swings by more than the cost measured);
- a hand-written DDP loop with a TimelineRecorder against the same loop without: this process's
  CPU time per step (time.thread_time), which other processes on the machine hardly inflate,
  as microseconds a step and as a share of the Trainer's step.

"On" records every step: the recorder's marks, and DDP's communication hook (a Python hook in place
of DDP's built-in C++ all-reduce, which is most of the cost).

Where the cost is, per bucket (this thread's CPU, the fastest of the rounds, so the least noise):
the all-reduce alone as DDP's C++ path issues it, torch's own Python `allreduce_hook`, and the
recorder's hook while recording (a bucket, and the last one), each called on one bucket-sized
buffer and waited for. The recorder's hook does what `allreduce_hook` does (divide, all-reduce,
one callback on the all-reduce's future, which gloo's thread runs) plus two clock readings; for
the last bucket it waits itself instead of the callback (see course_lib/training/timeline_recorder.py).

    python benchmarks/timeline_overhead.py [--nprocs 2] [--rounds 20] [--hidden 512] [--batch-size 64]
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from course_lib import launch
from course_lib.training.data import make_dataset
from course_lib.training.models import make_model
from course_lib.training.timeline_recorder import TimelineRecorder
from course_lib.training.trainers import TrainConfig, Trainer

TARGET = 1.03
OFF, ON = "recording off", "recording on"


def trainer_step_times(dataset, hidden: int, batch_size: int, steps: int, record: bool) -> list:
    """Seconds per step of one Trainer run; with `record`, a timeline of every step."""
    config = TrainConfig(strategy="ddp", batch_size=batch_size, max_steps=steps, lr=0.05, shuffle=True,
                         progress=False, timeline_steps=steps if record else 0)
    history = Trainer(make_model(hidden=hidden), dataset, config).fit()
    recorded = history.timeline.steps if record else []
    assert len(recorded) == (steps if record else 0)
    return history.step_times


class HandLoop:
    """The lessons' hand-written DDP loop, with or without a recorder; CPU seconds per step."""

    def __init__(self, hidden: int, batch_size: int, record: bool):
        self.model = DistributedDataParallel(make_model(hidden=hidden))
        self.recorder = TimelineRecorder(self.model, steps=None) if record else None
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.X, self.y = torch.randn(batch_size, 16), torch.randint(0, 4, (batch_size,))

    def cpu_seconds_per_step(self, steps: int) -> float:
        model, recorder, optimizer = self.model, self.recorder, self.optimizer
        seconds = []
        for _ in range(steps):
            started = time.thread_time()
            if recorder:
                recorder.start()
            X, y = self.X.clone(), self.y.clone()
            if recorder:
                recorder.lap("data")
            loss = F.cross_entropy(model(X), y)
            if recorder:
                recorder.lap("forward")
            loss.backward()
            if recorder:
                recorder.lap("backward")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if recorder:
                recorder.lap("optimizer")
            seconds.append(time.thread_time() - started)
        return statistics.median(seconds)


class OneBucket:
    """Stands in for DDP's GradBucket: what the hooks call."""

    def __init__(self, numel: int, last: bool = False):
        self.tensor, self.last = torch.zeros(numel), last

    def buffer(self):
        return self.tensor

    def index(self):
        return 0

    def is_last(self):
        return self.last


def hook_cpu_per_bucket(numel: int, calls: int = 200) -> dict:
    """This thread's CPU seconds per call of each way to reduce one bucket (each waited for)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    bucket, last, group, options = OneBucket(numel), OneBucket(numel, True), dist.group.WORLD, dist.AllreduceOptions()
    recorder = TimelineRecorder(None, steps=None)
    recorder._comm_hook = None  # as _install leaves it for a DDP model without a hook of its own
    recorder.start()
    ways = {"all-reduce alone (DDP's C++ path)": lambda: group.allreduce([bucket.tensor], options).get_future(),
            "torch's allreduce_hook (Python)": lambda: allreduce_hook(None, bucket),
            "the recorder's hook, a bucket": lambda: recorder._recording_hook(None, bucket),
            "the recorder's hook, the last bucket": lambda: recorder._recording_hook(None, last)}
    seconds = {}
    for name, way in ways.items():
        dist.barrier()
        started = time.thread_time()
        for _ in range(calls):
            way().wait()
        seconds[name] = (time.thread_time() - started) / calls
        recorder._buckets.clear()
    return seconds


def compare(rounds: int, samples: int, hidden: int, batch_size: int, steps: int, warmup_steps: int = 3):
    """On every rank: take turns `rounds` times; returns step times and CPU seconds per step."""
    dataset = make_dataset(samples)
    loops = {OFF: HandLoop(hidden, batch_size, False), ON: HandLoop(hidden, batch_size, True)}
    wall, cpu, hooks = {OFF: [], ON: []}, {OFF: [], ON: []}, []
    bucket_numel = sum(p.numel() for p in loops[OFF].model.parameters())  # one bucket: the whole model
    for round_index in range(rounds):
        order = (OFF, ON) if round_index % 2 == 0 else (ON, OFF)  # neither always goes first
        for name in order:
            dist.barrier()
            wall[name].append(trainer_step_times(dataset, hidden, batch_size, steps, record=name == ON)
                              [warmup_steps:])
            dist.barrier()
            cpu[name].append(loops[name].cpu_seconds_per_step(steps))
        hooks.append(hook_cpu_per_bucket(bucket_numel))
    return {"wall": wall, "cpu": cpu, "hooks": hooks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    results = launch(compare, args.rounds, args.samples, args.hidden, args.batch_size, args.steps,
                     nprocs=args.nprocs, timeout=args.timeout, output="none")
    rounds = range(args.rounds)
    # A DDP step ends when the slowest rank's does: take the slowest rank's median in each round.
    wall = {name: [max(statistics.median(r["wall"][name][i]) for r in results) for i in rounds]
            for name in (OFF, ON)}
    ratios = [on / off for on, off in zip(wall[ON], wall[OFF])]
    ratio = statistics.median(ratios)
    low, _, high = statistics.quantiles(ratios, n=4)
    print(f"{args.nprocs} ranks, MLP hidden={args.hidden}, batch {args.batch_size} per rank, "
          f"{args.rounds} rounds taking turns, {args.steps} steps per run")
    print(f"  Trainer step (wall): off {statistics.median(wall[OFF]) * 1e3:.3f} ms, "
          f"on {statistics.median(wall[ON]) * 1e3:.3f} ms; per-round ratios: quartiles "
          f"{low:.3f} / {ratio:.3f} / {high:.3f}")
    cpu_extra = statistics.median(max(r["cpu"][ON][i] - r["cpu"][OFF][i] for r in results) for i in rounds)
    cpu_off = statistics.median(max(r["cpu"][OFF][i] for r in results) for i in rounds)
    print(f"  hand loop CPU time per step: off {cpu_off * 1e6:.0f} µs, recording adds "
          f"{cpu_extra * 1e6:.0f} µs = {cpu_extra / statistics.median(wall[OFF]):.1%} of a Trainer step "
          f"({cpu_extra / cpu_off:.1%} of the step's own CPU time)")
    # Noise only ever adds time: the fast steps show the intrinsic cost best. Pool every round's
    # steps (each step's time is its slowest rank's) and compare a low quantile too.
    pooled = {name: [max(times) for i in rounds for times in zip(*(r["wall"][name][i] for r in results))]
              for name in (OFF, ON)}
    fast = {name: statistics.quantiles(pooled[name], n=5)[0] for name in (OFF, ON)}
    print(f"  fastest fifth of steps: off {fast[OFF] * 1e3:.3f} ms, on {fast[ON] * 1e3:.3f} ms, "
          f"ratio {fast[ON] / fast[OFF]:.3f}")
    print("  per bucket, this thread's CPU (fastest round, slowest rank):")
    for name in results[0]["hooks"][0]:
        fastest = max(min(r["hooks"][i][name] for i in rounds) for r in results)
        print(f"    {name:38s} {fastest * 1e6:6.1f} µs")
    verdict = "met" if ratio <= TARGET else "NOT met"
    print(f"step-time ratio, on / off (median over rounds): {ratio:.3f}  (target <= {TARGET}: {verdict})")


if __name__ == "__main__":
    main()
