"""The step timeline: real 2-rank gloo runs through launch, then its reading, drawing and export."""
import json
import statistics
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib import launch
from course_lib.topics.timeline import (chrome_trace, draw_timeline, find_straggler, overlap_fraction,
                                        save_chrome_trace, wait_seconds)
from course_lib.training.data import make_dataset
from course_lib.training.models import make_model
from course_lib.training.timeline_recorder import Span, Timeline, TimelineRecorder, clock_offsets
from course_lib.training.trainers import TrainConfig, Trainer

TIMEOUT = 120
DELAY = 0.3  # seconds the slowed rank sleeps in its data phase, every step


# -- what the ranks run ------------------------------------------------------------------------------
def hand_loop_with_buckets(steps=5, record=3, no_sync=False):
    """A hand-written DDP loop with two buckets; returns the timeline, each bucket's parameters and
    each parameter's gradient-ready time per step (post-accumulate-grad hooks, this rank's clock)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    model = DDP(make_model(hidden=1024), bucket_cap_mb=0.01)  # the last layer, then the first
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    X, y = torch.randn(2048, 16), torch.randint(0, 4, (2048,))
    step_now, grad_ready, bucket_params = [0], {}, {}
    for param in model.parameters():
        param.register_post_accumulate_grad_hook(
            lambda p: grad_ready.setdefault(step_now[0], {}).__setitem__(p.data_ptr(), time.perf_counter()))

    def remembering_hook(state, bucket):  # the recorder calls the hook we pass it
        bucket_params[bucket.index()] = [p.data_ptr() for p in bucket.parameters()]
        return allreduce_hook(state, bucket)

    recorder = TimelineRecorder(model, steps=record, skip=steps - record, comm_hook=remembering_hook)
    for step in range(steps):
        step_now[0] = step
        recorder.start()
        Xb, yb = X[step % 2::2], y[step % 2::2]
        recorder.lap("data")
        with model.no_sync() if no_sync else torch.enable_grad():
            loss = F.cross_entropy(model(Xb), yb)
            recorder.lap("forward")
            loss.backward()
        recorder.lap("backward")
        optimizer.step()
        optimizer.zero_grad()
        recorder.lap("optimizer")
    return {"timeline": recorder.finish(), "bucket_params": bucket_params, "grad_ready": grad_ready}


class SlowOnOneRank(torch.utils.data.Dataset):
    """The course's data; on `slow_rank`, every batch of `batch_size` takes `delay` seconds longer."""

    def __init__(self, dataset, slow_rank, delay, batch_size):
        self.dataset, self.slow_rank, self.per_sample = dataset, slow_rank, delay / batch_size

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        if self.per_sample and dist.get_rank() == self.slow_rank:
            time.sleep(self.per_sample)
        return self.dataset[index]


def trainer_timeline(delay=0.0, grad_accum_steps=1, max_steps=5, timeline_steps=3):
    config = TrainConfig(strategy="ddp", batch_size=8, grad_accum_steps=grad_accum_steps, max_steps=max_steps,
                         timeline_steps=timeline_steps, progress=False, shuffle=False)
    dataset = SlowOnOneRank(make_dataset(256), slow_rank=1, delay=delay, batch_size=8)
    return Trainer(make_model(), dataset, config).fit()


def straggler_runs():
    return {"even": trainer_timeline().timeline, "slowed": trainer_timeline(delay=DELAY).timeline}


def accumulation_runs():
    history = trainer_timeline(grad_accum_steps=2, max_steps=4, timeline_steps=2)
    every_step_no_sync = hand_loop_with_buckets(steps=4, record=2, no_sync=True)["timeline"]
    return {"accumulated": history.timeline, "losses": history.losses, "no_sync": every_step_no_sync}


@pytest.fixture(scope="module")
def bucket_runs():
    return launch(hand_loop_with_buckets, nprocs=2, timeout=TIMEOUT, output="none")


# -- tests that start processes --------------------------------------------------------------------------
def test_each_bucket_all_reduce_starts_when_its_gradients_are_ready_and_overlaps_backward(bucket_runs):
    timeline = bucket_runs[0]["timeline"]
    assert timeline == bucket_runs[1]["timeline"]  # every rank gets every rank's spans
    assert timeline.steps == [2, 3, 4] and timeline.world_size == 2 and timeline.backend == "gloo"
    overlapped = []
    for rank, run in enumerate(bucket_runs):
        to_shared_clock = -timeline.clock_offsets[rank] - timeline.origin
        for step in timeline.steps:
            phases = timeline.select(rank, step, lane="compute")
            compute = [s for s in phases if s.phase != "wait"]
            assert [s.phase for s in compute] == ["data", "forward", "backward", "optimizer"]
            assert all(a.end == b.start for a, b in zip(compute, compute[1:]))  # consecutive laps
            backward = compute[2]
            allreduces = timeline.select(rank, step, "allreduce")
            assert [s.bucket for s in allreduces] == [0, 1]
            for span in allreduces:
                ready = max(run["grad_ready"][step][ptr] for ptr in run["bucket_params"][span.bucket])
                assert ready + to_shared_clock <= span.start  # the hook comes after the gradients
                assert backward.start <= span.start <= span.end <= backward.end  # DDP waits for it
            [wait] = timeline.select(rank, step, "wait")
            assert (wait.start, wait.end) == (allreduces[-1].start, backward.end)
            first_layer_ready = max(run["grad_ready"][step][ptr] for ptr in run["bucket_params"][1])
            overlapped.append(allreduces[0].start < first_layer_ready + to_shared_clock)
            assert 0 < overlap_fraction(timeline, rank, step) <= 1
    # Bucket 0 (the last layer) went out while backward still computed the first layer's gradients.
    assert any(overlapped)


def test_clocks_are_aligned_within_the_stated_bound(bucket_runs):
    timeline = bucket_runs[0]["timeline"]
    # One machine, one monotonic clock: the true offset is 0, so the estimate's error is its value.
    assert abs(timeline.clock_offsets[1]) <= timeline.clock_error_bound < 0.05
    assert timeline.clock_drift < 0.05


def test_no_sync_records_no_all_reduce():
    runs = launch(accumulation_runs, nprocs=2, timeout=TIMEOUT, output="none")
    no_sync = runs[0]["no_sync"]
    assert len(no_sync.select(phase="backward")) == 2 * 2  # 2 ranks x 2 recorded steps
    assert not no_sync.select(phase="allreduce") and not no_sync.select(phase="wait")
    accumulated = runs[0]["accumulated"]
    assert accumulated.steps == [2, 3]
    for rank in range(2):
        for step in accumulated.steps:
            first, last = accumulated.select(rank, step, "backward")  # two micro-batches
            allreduces = accumulated.select(rank, step, "allreduce")
            assert allreduces, "the last micro-batch's backward all-reduces"
            assert all(last.start <= s.start and s.end <= last.end for s in allreduces)
            assert not [s for s in allreduces if s.start < first.end]  # none under no_sync
    assert runs[0]["losses"] == runs[1]["losses"]  # recording changed nothing DDP does


def test_a_slowed_rank_makes_the_other_wait_about_the_delay():
    runs = launch(straggler_runs, nprocs=2, timeout=TIMEOUT, output="none")[0]
    even, slowed = runs["even"], runs["slowed"]

    def median_wait(timeline, rank):
        return statistics.median(timeline.total("wait", rank, step) for step in timeline.steps)

    grown = median_wait(slowed, 0) - median_wait(even, 0)
    assert grown >= DELAY / 2, f"rank 0's wait grew by {grown:.3f} s for a {DELAY} s delay"
    assert median_wait(slowed, 1) < median_wait(slowed, 0) - DELAY / 2
    assert statistics.median(slowed.total("data", 1, step) for step in slowed.steps) >= DELAY
    assert find_straggler(slowed) == 1
    waits = wait_seconds(slowed)
    assert waits[0] > waits[1]


def test_the_perfetto_trace_is_valid_json_in_the_trace_event_format(bucket_runs, tmp_path):
    timeline = bucket_runs[0]["timeline"]
    trace = json.loads(save_chrome_trace(timeline, tmp_path / "trace.json").read_text())
    events = trace["traceEvents"]
    complete = [event for event in events if event["ph"] == "X"]
    assert len(complete) == len(timeline.spans)
    for event in complete:
        assert isinstance(event["name"], str) and isinstance(event["cat"], str)
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
        assert isinstance(event["ts"], (int, float)) and isinstance(event["dur"], (int, float))
        assert event["ts"] >= 0 and event["dur"] >= 0 and isinstance(event["args"], dict)
    tracks = {}
    for event in complete:
        tracks.setdefault((event["pid"], event["tid"]), []).append(event["ts"])
    assert all(ts == sorted(ts) for ts in tracks.values())  # monotonic on every track
    assert {pid for pid, _ in tracks} == {0, 1} and {tid for _, tid in tracks} == {0, 1, 2}
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert named == set(tracks)
    # Nested events on a track must nest: the wait ends with its backward.
    for event in (e for e in complete if e["name"] == "wait"):
        parent = [e for e in complete if e["name"] == "backward" and e["pid"] == event["pid"]
                  and e["ts"] <= event["ts"] and event["ts"] + event["dur"] <= e["ts"] + e["dur"] + 1e-3]
        assert len(parent) == 1


def test_the_figure_renders(bucket_runs, tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = bucket_runs[0]["timeline"]
    ax = draw_timeline(timeline)
    path = tmp_path / "timeline.png"
    ax.figure.savefig(path, dpi=80)
    plt.close(ax.figure)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    labels = [label.get_text() for label in ax.get_yticklabels()]
    assert labels == ["rank 0", "all-reduce, bucket 0", "all-reduce, bucket 1",
                      "rank 1", "all-reduce, bucket 0", "all-reduce, bucket 1"]
    bars = sum(len(collection.get_paths()) for collection in ax.collections)
    assert bars == len(timeline.spans)  # one bar per span


# -- tests without processes ----------------------------------------------------------------------------
def test_clock_offsets_contain_the_true_offset():
    # Rank 1's clock reads 5 s ahead of rank 0's; each round an instant T lies in both intervals.
    rounds = [(10.0, 0.002, 0.003), (11.0, 0.001, 0.0005), (12.0, 0.004, 0.001)]
    rank0 = [(t - a, t + b) for t, a, b in rounds]
    rank1 = [(t + 5 - b, t + 5 + a) for t, a, b in rounds]
    offsets, bounds = clock_offsets([rank0, rank1])
    assert offsets[0] == bounds[0] == 0
    assert abs(offsets[1] - 5) <= bounds[1] <= 0.0015 + 1e-12


def synthetic_timeline():
    spans = [Span(0, 0, "data", 0.0, 1.0), Span(0, 0, "forward", 1.0, 2.0), Span(0, 0, "backward", 2.0, 6.0),
             Span(0, 0, "wait", 5.0, 6.0), Span(0, 0, "optimizer", 6.0, 7.0),
             Span(0, 0, "allreduce", 3.0, 5.5, lane="comm", bucket=0, nbytes=4),
             Span(0, 0, "allreduce", 5.0, 6.0, lane="comm", bucket=1, nbytes=4)]
    return Timeline(spans=spans, world_size=1, steps=[0])


def test_overlap_fraction_counts_all_reduce_time_under_backward_computing():
    # All-reduce time: 3.0 to 6.0 (3 s); under backward's computing (2.0 to 5.0): 2 s.
    assert overlap_fraction(synthetic_timeline(), 0, 0) == pytest.approx(2 / 3)
    no_comm = Timeline(spans=[Span(0, 0, "backward", 0.0, 1.0)], steps=[0])
    assert overlap_fraction(no_comm, 0, 0) is None


def test_chrome_trace_of_a_synthetic_timeline():
    trace = chrome_trace(synthetic_timeline())
    json.dumps(trace)
    wait = next(e for e in trace["traceEvents"] if e.get("name") == "wait")
    assert (wait["ts"], wait["dur"], wait["tid"]) == (5e6, 1e6, 0)


def test_the_trainer_records_its_last_steps_in_one_process():
    config = TrainConfig(strategy="single", batch_size=16, max_steps=5, timeline_steps=2, progress=False)
    history = Trainer(make_model(), make_dataset(256), config).fit()
    timeline = history.timeline
    assert timeline.steps == [3, 4] and timeline.world_size == 1 and timeline.backend == "none"
    assert [s.phase for s in timeline.select(0, 3)] == ["data", "forward", "backward", "optimizer"]
    assert set(history.phase_times) == {"data", "forward", "backward", "optimizer"}  # the timer still runs
    off = Trainer(make_model(), make_dataset(256), TrainConfig(strategy="single", max_steps=2, progress=False))
    assert off.fit().timeline is None
    with pytest.raises(ValueError, match="timeline_steps"):
        TrainConfig(timeline_steps=-1)


def test_data_parallel_replicas_get_their_own_lanes():
    config = TrainConfig(strategy="dp", batch_size=16, max_steps=3, timeline_steps=2, progress=False)
    timeline = Trainer(make_model(), make_dataset(256), config).fit().timeline
    for step in timeline.steps:
        [forward] = timeline.select(0, step, "forward")
        replicas = timeline.select(0, step, "replica forward")
        assert sorted(s.lane for s in replicas) == ["replica 0", "replica 1"]
        assert all(forward.start <= s.start <= s.end <= forward.end for s in replicas)
        assert not timeline.select(0, step, "allreduce")  # DataParallel has none to overlap

