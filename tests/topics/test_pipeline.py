"""Pipeline parallelism from send and recv (topics/from_scratch/pipeline.py, pipeline_schedules.py):
the schedules on paper, and the stages on gloo ranks against one process and torch's schedules."""
import pytest
import torch

from course_lib import launch
from course_lib.checks.lesson18.ranks import blocks, gradients_on_rank, one_process
from course_lib.topics.from_scratch.pipeline import measure_steps
from course_lib.topics.from_scratch.pipeline_schedules import (ScheduleError, bubble_fraction, gpipe,
                                                               one_f_one_b, play)

pytestmark = [pytest.mark.timeout(300), pytest.mark.filterwarnings("ignore:3 ranks on 2 CPU cores")]


@pytest.mark.parametrize("stages, microbatches", [(1, 3), (2, 1), (2, 4), (3, 2), (4, 8), (5, 3)])
def test_gpipe_and_1f1b_take_m_plus_p_minus_1_slots_and_1f1b_holds_p_minus_s(stages, microbatches):
    for schedule, held in ((gpipe, [microbatches] * stages),
                           (one_f_one_b, [min(stages - s, microbatches) for s in range(stages)])):
        played = play([schedule(s, stages, microbatches) for s in range(stages)])
        assert played.makespan == (microbatches + stages - 1) * 3, schedule.__name__
        assert played.most_held == held, schedule.__name__
        busy = sum(end - start for _, _, start, end in played.slots[0])
        assert 1 - busy / played.makespan == pytest.approx(bubble_fraction(stages, microbatches))


def test_play_names_a_hang_a_mix_up_and_a_missing_action():
    wrong_end = [one_f_one_b(1 - s, 2, 4) for s in range(2)]
    with pytest.raises(ScheduleError, match="would hang: rank 0 waits in recv for micro-batch 0's input gradient"):
        play(wrong_end)
    mixed = [gpipe(0, 2, 2), [("F", 0), ("F", 1), ("B", 1), ("B", 0)]]
    with pytest.raises(ScheduleError, match="send number 1 to it is micro-batch 1's"):
        play(mixed)
    with pytest.raises(ScheduleError, match=r"missing \[\('B', 1\)\]"):
        play([gpipe(0, 2, 2)[:-1], gpipe(1, 2, 2)], microbatches=2)


@pytest.mark.parametrize("stages", [2, 3])
def test_stages_on_ranks_give_one_process_gradients_as_torch_schedule_1f1b(stages):
    microbatches, seed = 5, 3
    for schedule in (gpipe, one_f_one_b):
        orders = [[list(action) for action in schedule(s, stages, microbatches)] for s in range(stages)]
        results = launch(gradients_on_rank, orders, microbatches, seed, nprocs=stages, backend="gloo",
                         timeout=120, output="none")
        expected = one_process(stages, microbatches, seed)
        for rank, result in enumerate(results):
            for name in ("ours", "torch"):
                for got, want in zip(result[name], expected[rank]):
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=f"{schedule.__name__} {name}")
    assert len(blocks(stages, seed)) == stages


def test_measure_steps_records_every_action_of_every_rank_per_step():
    measured = measure_steps(gpipe, microbatch_counts=(1, 3), repeats=2, rows=4, width=8, layers=1)
    assert sorted(measured) == [1, 3]
    for m, steps in measured.items():
        assert len(steps) == 2
        for records in steps:
            assert sorted((r.rank, r.action, r.microbatch) for r in records) == sorted(
                (rank, kind, i) for rank in range(2) for kind in "FB" for i in range(m))
            assert all(r.started <= r.computing <= r.ended for r in records)
            first_forward = {r.rank: r for r in records if r.action == "F" and r.microbatch == 0}
            assert first_forward[1].computing > first_forward[0].computing  # rank 1 waited for rank 0's output
