"""Graders for lesson 01 (single-device baseline): throughput from step times, the global batch.

- throughput: samples per second, batch_size over the median step time once the first
  warmup_steps times are left out (any median that agrees with statistics.median).
- global batch size: the samples one optimizer step sees, batch_size x grad_accum_steps x
  world_size."""
import statistics

import torch

from . import expect_close, expect_equal, grader, wrong_answer

# Fake step times (seconds) with slow warm-up steps first, chosen so that each mistake below
# gives a different number, whichever median (statistics' or torch's lower one) is used.
FAKE_RUNS = [
    # (step_seconds, batch_size, warmup_steps)
    ([0.90, 0.10, 0.12, 0.10, 0.30, 0.11], 32, 1),
    ([2.00, 0.05, 0.20, 0.20, 0.25, 0.30, 0.30], 64, 2),
    ([0.40, 0.25, 0.20, 0.20, 0.60], 16, 0),
    ([1.50, 0.80, 0.50, 0.04, 0.05, 0.05, 0.20, 0.06], 128, 3),
]


def reference_throughput(step_seconds, batch_size, warmup_steps):
    return batch_size / statistics.median(step_seconds[warmup_steps:])


@grader("throughput")
def check_throughput(throughput):
    for step_seconds, batch_size, warmup_steps in FAKE_RUNS:
        expect_close(throughput(list(step_seconds), batch_size, warmup_steps),
                     reference_throughput(step_seconds, batch_size, warmup_steps),
                     f"throughput({step_seconds}, batch_size={batch_size}, "
                     f"warmup_steps={warmup_steps})",
                     hint="leave out the first warmup_steps times, take the median of the rest, "
                          "and return samples per second: batch_size / median",
                     rtol=1e-6)


@grader("global batch size")
def check_global_batch_size(global_batch_size):
    for batch_size, grad_accum_steps, world_size in [(32, 1, 1), (8, 4, 2), (16, 2, 8), (4, 1, 2),
                                                     (8, 3, 1)]:
        expect_equal(global_batch_size(batch_size, grad_accum_steps, world_size),
                     batch_size * grad_accum_steps * world_size,
                     f"global_batch_size({batch_size}, {grad_accum_steps}, {world_size})",
                     hint="one optimizer step sees batch_size samples per micro-batch, "
                          "grad_accum_steps micro-batches, on each of world_size ranks")


# Plausible mistakes.

def throughput_mean(step_seconds, batch_size, warmup_steps):
    kept = step_seconds[warmup_steps:]
    return batch_size / (sum(kept) / len(kept))


def throughput_keeps_warmup(step_seconds, batch_size, warmup_steps):
    return batch_size / statistics.median(step_seconds)


def throughput_torch_median_keeps_warmup(step_seconds, batch_size, warmup_steps):
    return batch_size / torch.tensor(step_seconds).median().item()


def throughput_drops_one_step(step_seconds, batch_size, warmup_steps):
    return batch_size / statistics.median(step_seconds[1:])


def throughput_steps_per_second(step_seconds, batch_size, warmup_steps):
    return 1 / statistics.median(step_seconds[warmup_steps:])


def throughput_seconds_per_sample(step_seconds, batch_size, warmup_steps):
    return statistics.median(step_seconds[warmup_steps:]) / batch_size


def global_batch_forgets_world_size(batch_size, grad_accum_steps, world_size):
    return batch_size * grad_accum_steps


def global_batch_forgets_accumulation(batch_size, grad_accum_steps, world_size):
    return batch_size * world_size


def global_batch_divides_by_accumulation(batch_size, grad_accum_steps, world_size):
    return batch_size * world_size // grad_accum_steps


def global_batch_adds(batch_size, grad_accum_steps, world_size):
    return batch_size + grad_accum_steps + world_size


WRONG_ANSWERS = {
    check_throughput: [
        wrong_answer("averages with the mean (slow outliers count)", throughput_mean),
        wrong_answer("keeps the warm-up steps", throughput_keeps_warmup),
        wrong_answer("keeps the warm-up steps, torch's median", throughput_torch_median_keeps_warmup),
        wrong_answer("always drops exactly one step", throughput_drops_one_step),
        wrong_answer("returns steps per second, not samples", throughput_steps_per_second),
        wrong_answer("returns seconds per sample", throughput_seconds_per_sample),
    ],
    check_global_batch_size: [
        wrong_answer("forgets world_size", global_batch_forgets_world_size),
        wrong_answer("forgets grad_accum_steps", global_batch_forgets_accumulation),
        wrong_answer("divides by grad_accum_steps", global_batch_divides_by_accumulation),
        wrong_answer("adds the factors", global_batch_adds),
    ],
}
