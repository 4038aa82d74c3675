"""The machinery behind lesson 13's graders, tested where it can fail: rank 0's slow disk really
shows a half-written file to a rank that looks for it, and a file renamed whole is never seen half
written; the noise probe finds seeds that meet far into a run, and torch's 32-bit seeds; lesson 13
and 14's grader modules stay short. What the ranks return crosses as plain data and is judged in
the grader (engine/boundary.py); the inputs drawn at grading time keep each exercise's traps.
"""
import contextlib
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from answers.lesson13 import (barrier_before_saving, every_rank_writes, polls_for_the_file,
                              polls_then_waits_a_moment, retries_until_it_loads,
                              seeds_that_meet_at_step_500, takes_the_largest_learning_rate,
                              takes_the_smallest_learning_rate)
from course_lib import launch
from course_lib.checks import lesson13
from course_lib.checks.engine import GradingError, boundary
from course_lib.checks.lesson13 import noise_probe
from course_lib.checks.lesson13.epoch_end import (EPOCH_LOSSES, LEARNING_RATES, WIDER_LOSSES, WIDER_RATES,
                                                  epoch_inputs)
from course_lib.checks.lesson13.slow_disk import (WRITE_SECONDS, ReadTooEarly, slow_disk,
                                                  what_was_loaded)
from course_lib.topics import debugging
from course_lib.training.data import make_dataset

CHECKS = Path(__file__).resolve().parents[2] / "course_lib" / "checks"
# Lesson 13's and 14's grader modules, each lesson a module or a package
LESSON_13_AND_14_MODULES = sorted(path.relative_to(CHECKS).as_posix()
                                  for pattern in ("lesson1[34].py", "lesson1[34]/*.py")
                                  for path in CHECKS.glob(pattern))


def _poll_then_load(folder, rename_whole):
    """Rank 0 writes data.pt (whole, by a rename, or in place); rank 1 waits for the name to exist
    and loads it. What rank 1 saw: 'whole', or the early read."""
    path = os.path.join(folder, "data.pt")
    with slow_disk(folder) as disk:
        if dist.get_rank() == 0:
            target = path + ".partial" if rename_whole else path
            torch.save({"x": torch.arange(100_000)}, target)
            if rename_whole:
                os.replace(target, path)
            return "writer", time.monotonic()
        while not os.path.exists(path):
            time.sleep(0.005)
        try:
            loaded = torch.load(path)
        except ReadTooEarly:
            return disk.early_reads, time.monotonic()
        return ("whole" if torch.equal(loaded["x"], torch.arange(100_000)) else "wrong",
                time.monotonic())


@pytest.mark.parametrize("attempt", range(2))
def test_a_rank_that_polls_for_the_name_reads_rank_0s_file_half_written(tmp_path, attempt):
    (_, written), (seen, read) = launch(_poll_then_load, str(tmp_path), False, nprocs=2,
                                        backend="gloo", timeout=60, output="none")
    assert isinstance(seen, list) and len(seen) == 1, seen  # recorded, and only once
    assert read < written  # it read while rank 0 was still writing


@pytest.mark.parametrize("attempt", range(2))
def test_a_file_renamed_whole_is_never_read_half_written(tmp_path, attempt):
    (_, written), (seen, _) = launch(_poll_then_load, str(tmp_path), True, nprocs=2,
                                     backend="gloo", timeout=60, output="none")
    assert seen == "whole"


def test_the_slow_disk_is_slow_only_on_rank_0(tmp_path):
    def save_timed(folder):
        with slow_disk(folder) as disk:
            start = time.monotonic()
            torch.save(torch.zeros(1000), os.path.join(folder, f"{dist.get_rank()}.pt"))
            return time.monotonic() - start, disk.saves

    (rank0, saves0), (rank1, saves1) = launch(save_timed, str(tmp_path), nprocs=2,
                                              backend="gloo", timeout=60, output="none")
    assert rank0 >= 0.9 * WRITE_SECONDS > 10 * rank1 and saves0 == saves1 == 1


def _fingerprints(generator_seed_of):
    """The probe's fingerprints for 2 ranks, from a seed function of (seed, step, rank)."""
    def on_rank(rank):
        def add_noise(X, step, seed=0):
            generator = torch.Generator().manual_seed(generator_seed_of(seed, step, rank))
            return X + 0.1 * torch.randn(X.shape, generator=generator)
        return noise_probe.fingerprints_on_rank(add_noise)
    return [on_rank(0), on_rank(1)]


def test_the_probe_finds_seeds_that_meet_far_into_a_run():
    meet = noise_probe.first_collision(_fingerprints(lambda s, t, r: 1000 * s + 2 * t + r))
    assert meet == ((0, 0, 500), (0, 1, 0))  # the first a run meets: at step 500
    far = noise_probe.first_collision(_fingerprints(lambda s, t, r: 10 ** 6 * s + 2 * t + r))
    assert far is not None and max(far[0][2], far[1][2]) == 500_000
    # 64-bit seeds of their own, of which torch's CPU generator keeps the low 32 bits
    wide = noise_probe.first_collision(_fingerprints(lambda s, t, r: (s * 2**32 + t) * 2**16 + r))
    assert wide is not None


def test_torch_keeps_32_bits_of_a_seed_and_numpy_all_of_them():
    def draw(seed):
        return torch.randn(4, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(draw(5), draw(5 + 2**32))  # why the lesson seeds with NumPy
    assert not np.array_equal(np.random.default_rng([0, 5]).random(4),
                              np.random.default_rng([0, 5 + 2**32]).random(4))


def test_the_probe_reaches_far_steps_and_stays_quick():
    steps = noise_probe.probe_steps()
    assert set(range(noise_probe.DENSE_STEPS)) <= set(steps) and max(steps) == noise_probe.FAR_STEP
    assert {500_000, 5_000_000, 2**20, 2**25} <= set(steps) and len(steps) < 2200


@pytest.mark.parametrize("name", LESSON_13_AND_14_MODULES)
def test_lesson_13_and_14_grader_modules_are_short(name):
    assert len((CHECKS / name).read_text().splitlines()) <= 400


@pytest.mark.parametrize("wrong", [polls_for_the_file, polls_then_waits_a_moment,
                                   retries_until_it_loads, barrier_before_saving],
                         ids=lambda fn: fn.__name__)
def test_a_read_of_a_half_written_file_is_the_verdict_not_a_crash(wrong):
    with pytest.raises(GradingError, match="read the file before it was complete"):
        lesson13.check_load_data(wrong)


def test_every_rank_writing_is_seen_when_rank_0_starts_late():
    # rank 1 finds no file, and writes: [1, 1] when rank 0 looked first, [0, 1] when it came late
    with pytest.raises(GradingError, match=r"got:      \[[01], 1\]"):
        lesson13.check_load_data(every_rank_writes)


@pytest.mark.parametrize("wrong", [takes_the_smallest_learning_rate, takes_the_largest_learning_rate],
                         ids=lambda fn: fn.__name__)
def test_ranks_made_to_agree_on_another_rate_than_rank_0s_are_rejected(wrong):
    with pytest.raises(GradingError, match="the ranks agree, but on another rank's value"):
        lesson13.check_end_of_epoch(wrong)


def test_seeds_that_meet_at_step_500_are_named_with_the_step():
    with pytest.raises(GradingError, match=r"same numbers as rank 0 at seed 0, step 500[\s\S]*"
                                           r"meet at step 500"):
        lesson13.check_add_noise(seeds_that_meet_at_step_500)


# -- what crosses, and the inputs drawn at grading time ------------------------------------------

@contextlib.contextmanager
def seed_offset(offset):
    token = boundary._seed_offset.set(offset)
    try:
        yield
    finally:
        boundary._seed_offset.reset(token)


def test_the_epoch_inputs_are_the_notebooks_at_offset_0_and_keep_their_traps_at_others():
    with seed_offset(0):
        assert epoch_inputs() == (EPOCH_LOSSES, LEARNING_RATES)
        assert epoch_inputs(3) == (WIDER_LOSSES, WIDER_RATES)
    drawn = set()
    for offset in range(1, 41):
        with seed_offset(offset):
            losses, rates = epoch_inputs()
            wider_losses, wider_rates = epoch_inputs(3)
        drawn.add(repr((losses, rates)))
        assert all(abs(first - second) > 0.05 for first, second in losses)  # own loss != mean
        assert rates[0][1] == 0.0 < rates[0][0]  # rank 1 knows none: rank 0's is the largest
        assert rates[1][0] < rates[1][1]  # rank 1's is stale: rank 0's is the smallest
        assert abs(sum(rates[1]) - rates[1][0]) > 1e-3  # adding the rates up is seen
        assert all(abs(loss - sum(each) / 3) > 0.05 for each in wider_losses for loss in each)
        assert wider_rates[0][1:] == [0.0, 0.0] < wider_rates[0][:1]
        assert all(wider_rates[1][0] < rate for rate in wider_rates[1][1:])
    assert len(drawn) == 40


def test_the_noise_fingerprints_cross_as_rows_and_come_back_the_same():
    fingerprints = _fingerprints(lambda s, t, r: 1000 * s + 2 * t + r)[0]
    rows = noise_probe.fingerprint_rows(fingerprints)
    assert boundary.plain(rows) is rows and rows.dtype == torch.float64
    assert noise_probe.fingerprints_from_rows(rows) == fingerprints
    ragged = {key: numbers[:1 + key[1] % 2] for key, numbers in fingerprints.items()}
    assert noise_probe.fingerprints_from_rows(noise_probe.fingerprint_rows(ragged)) == ragged


def test_what_load_data_returned_is_judged_in_the_grader():
    X, y = make_dataset(n_samples=debugging.DATA_SAMPLES).tensors
    observed = {"saves": 0, "early_reads": [], "type": "list", "tensors": [X, y]}
    assert boundary.plain(observed) is observed
    assert what_was_loaded(observed) == "the dataset"
    assert what_was_loaded(dict(observed, tensors=[X, y + 1])) == "something else: list"
    assert what_was_loaded(dict(observed, type="NoneType", tensors=None)) == \
        "something else: NoneType"
    early = dict(observed, early_reads=["EOFError: Ran out of input"])
    assert what_was_loaded(early) == "read the file before it was complete (EOFError: Ran out of input)"
