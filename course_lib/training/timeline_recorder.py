"""A timeline of a few training steps on every rank: each phase's start and end on one shared clock.

Data wait, forward, backward, each DDP bucket's all-reduce, the wait at the end of backward and the
optimizer step; `course_lib.topics.timeline` draws it and writes it as a Chrome / Perfetto trace.

    recorder = TimelineRecorder(ddp_model, steps=3)   # a collective: every rank, at the same point
    batches = iter(loader)
    for step in range(5):
        recorder.start()                              # a step begins
        X, y = next(batches);      recorder.lap("data")
        loss = loss_fn(ddp_model(X), y); recorder.lap("forward")
        loss.backward();           recorder.lap("backward")
        optimizer.step(); optimizer.zero_grad(); recorder.lap("optimizer")
    timeline = recorder.finish()                      # a collective: every rank gets every rank's spans

`start()` and `lap()` are `measure.PhaseTimer`'s calls, so the Trainer swaps a recorder in for its
timer when `TrainConfig(timeline_steps=N)` asks for one (`history.timeline`).

How each phase is known:

- Compute phases are the laps: from the previous mark to this one. On the CPU the marks are
  `time.perf_counter()`; on CUDA they are CUDA events on the current stream, read back in
  `finish()` (the NCCL path is written but untested here: no GPU in this project's CI).
- A bucket's all-reduce comes from DDP's communication hook. `DistributedDataParallel.register_comm_hook`
  says the hook "is called once the bucket is ready" and that the Reducer then "use[s] the tensors
  returned by the Future and copy grads to individual parameters"; the Reducer's header
  (torch/include/.../c10d/reducer.hpp) keeps the hook's Future per bucket (`future_work`), reads
  its result in `finalize_backward`, and reduces buckets in their order (`get_grad_buckets`). The
  recorder's hook notes the time it is called (this bucket is ready, and the ones before it were
  launched), starts the all-reduce, and returns `future.then(callback)`. The callback notes when
  the all-reduce's future completed; `then`'s Future is "marked as completed when the given
  callback finishes" (torch.futures), so the callback has run before `backward()` returns. The
  all-reduce is `default_hooks.allreduce_hook`'s (divide the bucket by world_size, then an async
  sum), called on the process group directly: one Python callback per bucket instead of two. A
  hook passed as `comm_hook` runs instead. On CUDA the callback records an event on the current
  stream, which, says `torch.futures.Future.then`, torch synchronises with the kernels that
  produce the future's value: the event completes when NCCL's all-reduce has.
- The cost: DDP runs this Python hook instead of its built-in C++ all-reduce for the whole run
  (DDP takes a hook once, before the first backward): a Python call, a division of the bucket (the
  C++ path divides while copying gradients in) and a Python callback on the all-reduce's future,
  which gloo's thread runs. The callback cannot go: a Python hook's Future must hold a Python
  object (python_comm_hook.cpp asserts `result.isPyObject()`; an all-reduce's own future holds a
  tensor list), so `then` is what turns it into one. Except for the last bucket on a CPU
  (`bucket.is_last()`, "the last bucket to allreduce in an iteration" says comm.hpp; reducer.hpp
  reduces buckets "in a predetermined order", and reads every Future in finalize_backward when
  backward ends): the hook waits for it itself, notes its end, and returns a finished Future, so
  no callback on gloo's thread sits between the last all-reduce and the end of backward.
  benchmarks/timeline_overhead.py measures the hook per bucket against the bare all-reduce, and
  the whole recording per step.
- The wait at the end of backward: from the last bucket's hook call (every gradient is computed by
  then) to the end of the backward lap, when DDP has waited for every bucket's future.
- Under `no_sync()` DDP's forward skips `reducer.prepare_for_backward` (distributed.py,
  `_post_forward`), which reducer.hpp says is how gradients are accumulated without being
  reduced: no bucket is all-reduced, the hook is not called, and no all-reduce or wait is recorded.
- With the course's `dp.DataParallel` (or `nn.DataParallel`), each replica's forward is recorded
  from forward hooks on the wrapped module (replicas share its hooks), one lane per replica thread.
- A wrapper that keeps its own `events` (course_lib.topics.from_scratch: each collective's launch
  and completion on the perf_counter clock, reset when its forward starts): each lap takes the
  completed ones as spans on the "comm" lane: an all-reduce as "allreduce" (its bucket, else its
  place among the step's collectives, as the bucket), other collectives under their own names.
  `record_comm(phase, start, end)` adds such a span by hand (a learner's own hooks).

The clocks: each rank's readings around a few tiny all-reduces bound the offset between its clock
and rank 0's (see `clock_offsets`); every time is then on rank 0's clock, with a stated error bound.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import torch
import torch.distributed as dist
from torch import nn

ALIGN_ROUNDS = 16


@dataclass(frozen=True)
class Span:
    """One interval on one rank. Times are seconds on the shared clock (see Timeline.origin)."""

    rank: int
    step: int                     # the step's index, counted from the recorder's first start()
    phase: str                    # "data", "forward", "backward", "wait", "optimizer", "allreduce", ...
    start: float
    end: float
    lane: str = "compute"         # "compute", "comm" (bucket all-reduces) or "replica N" (DataParallel)
    bucket: Optional[int] = None  # for an all-reduce: DDP's bucket index
    nbytes: Optional[int] = None  # for an all-reduce: the bucket's size in bytes

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Timeline:
    """Every rank's spans for the recorded steps, on one clock. Equal on every rank after finish()."""

    spans: List[Span] = field(default_factory=list)
    world_size: int = 1
    backend: str = "none"          # "gloo", "nccl", or "none" (one process)
    device_type: str = "cpu"
    comm_stream: bool = False      # NCCL runs collectives on a CUDA stream of its own; gloo on threads
    steps: List[int] = field(default_factory=list)
    clock_offsets: List[float] = field(default_factory=list)  # rank r's clock minus rank 0's, seconds
    clock_error_bound: float = 0.0  # any two ranks' times agree to within this many seconds
    clock_drift: Optional[float] = None  # how far the offsets moved between start and finish
    origin: float = 0.0            # rank 0's perf_counter() at time 0 (the first recorded step's start)

    def select(self, rank=None, step=None, phase=None, lane=None) -> List[Span]:
        """The spans that match every argument given, in start order."""
        found = [span for span in self.spans
                 if (rank is None or span.rank == rank) and (step is None or span.step == step)
                 and (phase is None or span.phase == phase) and (lane is None or span.lane == lane)]
        return sorted(found, key=lambda span: span.start)

    def total(self, phase: str, rank=None, step=None) -> float:
        """Seconds spent in `phase` (summed over spans)."""
        return sum(span.seconds for span in self.select(rank, step, phase))

    def step_bounds(self, step: int, rank=None) -> tuple:
        """(start, end) of a step: its first and last span, over every rank or one."""
        spans = self.select(rank, step)
        return min(s.start for s in spans), max(s.end for s in spans)


def clock_readings(rounds: int = ALIGN_ROUNDS, device=None) -> list:
    """A collective: `rounds` tiny all-reduces, each bracketed by this rank's clock.

    Returns [(before, after), ...] in time.perf_counter() seconds. No rank's all-reduce can return
    before every rank has entered it, so in each round some instant lies within every rank's
    (before, after): that is what `clock_offsets` uses.
    """
    device = torch.device(device or "cpu")
    tensor = torch.zeros(1, device=device)
    readings = []
    for _ in range(rounds):
        before = time.perf_counter()
        dist.all_reduce(tensor)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # NCCL's call returns when queued: wait for the result
        readings.append((before, time.perf_counter()))
    return readings


def clock_offsets(readings_per_rank: list) -> tuple:
    """([offset of rank r's clock from rank 0's], [error bound of each]) from `clock_readings`.

    In round k an instant T lies in every rank's [before, after]; rank r's clock reads
    T + offset_r, so offset_r lies in [before_r - after_0, after_r - before_0]. The offset lies in
    every round's interval (clocks that do not drift during the alignment): the estimate is the
    middle of their intersection, the bound its half-width. Rank 0's offset is 0, exactly.
    """
    reference = readings_per_rank[0]
    offsets, bounds = [], []
    for readings in readings_per_rank:
        low = max(before - ref_after for (before, _), (_, ref_after) in zip(readings, reference))
        high = min(after - ref_before for (_, after), (ref_before, _) in zip(readings, reference))
        if low > high:  # the intervals do not meet: the clocks drifted; trust the tightest round
            width, middle = min(((after - before) + (ref_after - ref_before),
                                 (before + after - ref_before - ref_after) / 2)
                                for (before, after), (ref_before, ref_after) in zip(readings, reference))
            low, high = middle - width / 2, middle + width / 2
        offsets.append((low + high) / 2)
        bounds.append((high - low) / 2)
    offsets[0], bounds[0] = 0.0, 0.0
    return offsets, bounds


def _pair_bound(bounds: list) -> float:
    # Two ranks r and s are each within bounds[r], bounds[s] of rank 0's clock.
    worst = sorted(bounds, reverse=True)
    return worst[0] + (worst[1] if len(worst) > 1 else 0.0)


class TimelineRecorder:
    """Records this rank's phases for `steps` steps after `skip` (None: every step until finish()).

    Creating it and `finish()` are collectives when a process group is up: call both on every rank.
    model: the model the loop trains (a DDP model gets the recording comm hook, a DataParallel one
    replica hooks; any other just its laps). comm_hook/comm_state: the hook DDP should really run
    (default: default_hooks.allreduce_hook's work); DDP takes one hook, so pass yours here.
    timer: a PhaseTimer to forward start()/lap()/flush() to (the Trainer keeps its phase totals).
    """

    def __init__(self, model: Optional[nn.Module] = None, steps: Optional[int] = 3, skip: int = 0,
                 comm_hook: Optional[Callable] = None, comm_state=None, timer=None, device=None):
        if steps is not None and steps < 1 or skip < 0:
            raise ValueError(f"steps={steps} must be at least 1 (or None) and skip={skip} at least 0")
        self.first, self.last = skip, None if steps is None else skip + steps
        self.timer = timer
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.backend = str(dist.get_backend()) if self.distributed else "none"
        self.device = torch.device(device) if device else _device_of(model)
        self.on_cuda = self.device.type == "cuda"
        if self.on_cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._mark = self._cuda_mark if self.on_cuda else time.perf_counter
        self._raw = []        # (step, phase, lane, start mark, end mark, bucket, nbytes)
        self._buckets = []    # [bucket, ready mark, end mark, nbytes] of the lap in progress
        self._replicas = []   # (host start, start mark, end mark) of replica forwards in this lap
        self._replica_starts = {}
        self._event_source, self._events_seen, self._events_taken = None, None, 0
        self._step, self._recording, self._last = -1, False, None
        self._readings = clock_readings(device=self.device) if self.world_size > 1 else []
        self.timeline: Optional[Timeline] = None
        replica_devices = self._install(model, comm_hook, comm_state)
        self._anchors = {}  # CUDA device index -> (event, host clock when it completed)
        if self.on_cuda:
            for cuda_device in {self.device, *(d for d in replica_devices if d.type == "cuda")}:
                self._anchors[cuda_device.index] = self._cuda_anchor(cuda_device)

    # -- the loop's calls -------------------------------------------------------------------------
    def start(self) -> None:
        """A step begins now (the Trainer calls it before fetching the step's first batch)."""
        self._step += 1
        self._recording = self.first <= self._step and (self.last is None or self._step < self.last)
        self._last = self._mark() if self._recording else None
        if self.timer is not None:
            self.timer.start()

    def lap(self, phase: str) -> None:
        """`phase` ran from the previous mark (start() or lap()) until now."""
        if self._recording:
            now = self._mark()
            self._raw.append((self._step, phase, "compute", self._last, now, None, None))
            if self._buckets:
                self._close_buckets(now)
            if self._replicas:
                self._close_replicas()
            if self._event_source is not None:
                self._take_events()
            self._last = now
        if self.timer is not None:
            self.timer.lap(phase)

    def record_comm(self, phase: str, start: float, end: float, bucket: Optional[int] = None,
                    nbytes: Optional[int] = None) -> None:
        """A collective of the step in progress, from `start` to `end` (time.perf_counter() seconds,
        this rank's clock), drawn on the "comm" lane (e.g. from a hand-written DDP's own hooks)."""
        if self._recording:
            self._raw.append((self._step, phase, "comm", start, end, bucket, nbytes))

    def flush(self) -> dict:
        """The wrapped PhaseTimer's totals (the Trainer's history.phase_times), else {}."""
        return self.timer.flush() if self.timer is not None else {}

    def finish(self) -> Timeline:
        """A collective: gather every rank's spans onto the shared clock; returns the Timeline."""
        self._recording, self.last = False, self._step + 1  # record no more
        end_readings = clock_readings(device=self.device) if self.world_size > 1 else []
        mine = {"spans": self._local_spans(), "start": self._readings, "end": end_readings}
        if self.world_size > 1:
            gathered = [None] * self.world_size
            dist.all_gather_object(gathered, mine)
        else:
            gathered = [mine]
        self.timeline = _build_timeline(gathered, self.backend, self.device.type)
        return self.timeline

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:  # after an error, another rank may never reach the collective
            self.finish()

    # -- DDP's comm hook and DataParallel's replicas ------------------------------------------------
    def _install(self, model, comm_hook, comm_state) -> list:
        """Hook into DDP or DataParallel; returns the devices DataParallel's replicas run on."""
        if isinstance(model, nn.parallel.DistributedDataParallel):
            if getattr(model, "_comm_hooks", None):
                raise ValueError(
                    "this DDP model already has a communication hook, and DDP takes only one, "
                    "which the timeline needs. In a hand loop, pass yours as TimelineRecorder(model, "
                    "comm_hook=your_hook, comm_state=...) instead of registering it, and the "
                    "recorder will call it; with TrainConfig(timeline_steps=N), register none")
            self._comm_hook = comm_hook
            model.register_comm_hook(comm_state, self._recording_hook)
        elif isinstance(getattr(model, "events", None), list):  # course_lib.topics.from_scratch's
            self._event_source = model
        elif hasattr(model, "module") and _is_data_parallel(model):
            model.module.register_forward_pre_hook(self._replica_started)
            model.module.register_forward_hook(self._replica_ended)
            devices = getattr(model, "devices", None) or getattr(model, "device_ids", [])
            return [torch.device("cuda", d) if isinstance(d, int) else torch.device(d) for d in devices]
        return []

    def _recording_hook(self, state, bucket):  # DDP checks that the argument is named `bucket`
        # Runs once per bucket per step, as does its callback: kept to a few calls (each call into
        # torch from Python costs about a microsecond; benchmarks/timeline_overhead.py).
        if self._comm_hook is not None:
            return self._custom_hook(state, bucket)
        buffer = bucket.buffer()
        record = [bucket.index(), self._mark(), None, buffer.nbytes] if self._recording else None
        future = _average(state, buffer)
        if record is not None:
            self._buckets.append(record)
        if bucket.is_last() and not self.on_cuda:
            # DDP waits for the last bucket as soon as this hook returns: wait here instead, on this
            # thread, and hand DDP a finished Future; no callback on gloo's thread then delays the
            # end of backward (one GIL hand-over less). NCCL keeps the callback (its CUDA events).
            future.wait()
            if record is not None:
                record[2] = time.perf_counter()
            done = torch.futures.Future()
            done.set_result(buffer)
            return done
        if record is None:
            return future.then(lambda _: buffer)  # the all-reduce is in place: its result is `buffer`
        mark = self._mark

        def ended(_):
            record[2] = mark()
            return buffer

        return future.then(ended)

    def _custom_hook(self, state, bucket):
        if not self._recording:
            return self._comm_hook(state, bucket)
        record = [bucket.index(), self._mark(), None, bucket.buffer().nbytes]
        self._buckets.append(record)

        def ended(future):
            record[2] = self._mark()
            return future.value()

        return self._comm_hook(state, bucket).then(ended)

    def _close_buckets(self, lap_end) -> None:
        last_ready = None
        for bucket, ready, ended, nbytes in self._buckets:
            self._raw.append((self._step, "allreduce", "comm", ready, ended, bucket, nbytes))
            last_ready = ready  # the hooks are called in bucket order, so the last one is the latest
        self._raw.append((self._step, "wait", "compute", last_ready, lap_end, None, None))
        self._buckets = []

    def _replica_started(self, module, args):
        if self._recording:
            # On CUDA the mark goes on the replica thread's device and stream (parallel_apply's).
            mark = self._cuda_mark(torch.cuda.current_device()) if self.on_cuda else time.perf_counter()
            self._replica_starts[threading.get_ident()] = (time.perf_counter(), mark)

    def _replica_ended(self, module, args, output):
        if self._recording:
            started = self._replica_starts.pop(threading.get_ident(), None)
            if started is not None:
                ended = self._cuda_mark(torch.cuda.current_device()) if self.on_cuda else time.perf_counter()
                self._replicas.append((*started, ended))

    def _take_events(self) -> None:
        """The wrapper's completed collectives since the last lap, in launch order."""
        events = self._event_source.events
        if events is not self._events_seen:  # its forward started a new list
            self._events_seen, self._events_taken = events, 0
        for event in events[self._events_taken:]:
            if event.op != "free":
                if event.completed is None:
                    break  # still running: the next lap takes it
                bucket = event.bucket if event.bucket is not None else self._events_taken
                self.record_comm("allreduce" if event.op == "all_reduce" else event.op, event.started,
                                 event.completed, bucket, event.nbytes)
            self._events_taken += 1

    def _close_replicas(self) -> None:
        # Replica threads are not numbered by torch: lanes follow the order the replicas started.
        replicas = sorted(self._replicas, key=lambda replica: replica[0])
        for index, (_, started, ended) in enumerate(replicas):
            self._raw.append((self._step, "replica forward", f"replica {index}", started, ended, None, None))
        self._replicas = []

    # -- clocks -------------------------------------------------------------------------------------
    def _cuda_mark(self, device=None):
        """A CUDA event on `device`'s current stream (the compute stream; in a future's callback,
        the stream torch synchronised with the collective's kernels)."""
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device if device is None else device))
        return event

    def _cuda_anchor(self, device):
        """A CUDA event on `device` and the host clock when it completed (within a sync's latency)."""
        torch.cuda.synchronize(device)
        before = time.perf_counter()
        event = self._cuda_mark(device)
        event.synchronize()
        return event, (before + time.perf_counter()) / 2

    def _seconds(self, mark) -> float:
        """A mark as this rank's perf_counter() seconds."""
        if not self.on_cuda or isinstance(mark, float):  # a host time (record_comm)
            return mark
        event, host = self._anchors[mark.device.index]
        return host + event.elapsed_time(mark) / 1000.0

    def _local_spans(self) -> list:
        if self.on_cuda and self._raw:
            torch.cuda.synchronize(self.device)
        return [(step, phase, lane, self._seconds(start), self._seconds(end), bucket, nbytes)
                for step, phase, lane, start, end, bucket, nbytes in self._raw]


_SUM = dist.AllreduceOptions() if dist.is_available() else None  # reduceOp: SUM by default


def _average(process_group, buffer):
    """default_hooks.allreduce_hook's work: divide by the group's size, then start a sum all-reduce.

    `allreduce(tensors, options)` is the first of ProcessGroup.allreduce's overloads: pybind takes
    it without first trying (and failing) another, about 5 µs less than `allreduce(tensors, op)`."""
    group = process_group if process_group is not None else dist.group.WORLD
    buffer.div_(group.size())
    return group.allreduce([buffer], _SUM).get_future()  # in place: its value is [buffer]


def _build_timeline(gathered: list, backend: str, device_type: str) -> Timeline:
    world_size = len(gathered)
    if world_size > 1:
        offsets, bounds = clock_offsets([rank["start"] for rank in gathered])
        end_offsets, _ = clock_offsets([rank["end"] for rank in gathered])
        drift = max(abs(a - b) for a, b in zip(offsets, end_offsets))
    else:
        offsets, bounds, drift = [0.0], [0.0], None
    on_rank0 = [[(step, phase, lane, start - offsets[rank], end - offsets[rank], bucket, nbytes)
                 for step, phase, lane, start, end, bucket, nbytes in data["spans"]]
                for rank, data in enumerate(gathered)]
    origin = min((raw[3] for spans in on_rank0 for raw in spans), default=0.0)
    spans = [Span(rank, step, phase, start - origin, end - origin, lane, bucket, nbytes)
             for rank, rank_spans in enumerate(on_rank0)
             for step, phase, lane, start, end, bucket, nbytes in rank_spans]
    spans.sort(key=lambda span: (span.rank, span.start))
    return Timeline(spans=spans, world_size=world_size, backend=backend, device_type=device_type,
                    comm_stream=backend == "nccl", steps=sorted({span.step for span in spans}),
                    clock_offsets=offsets, clock_error_bound=_pair_bound(bounds), clock_drift=drift,
                    origin=origin)


def _device_of(model) -> torch.device:
    parameter = next(model.parameters(), None) if model is not None else None
    return parameter.device if parameter is not None else torch.device("cpu")


def _is_data_parallel(model) -> bool:
    from .dp import DataParallel  # the course's, which also runs on CPU

    return isinstance(model, (DataParallel, nn.DataParallel))
