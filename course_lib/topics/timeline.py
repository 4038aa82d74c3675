"""Reading a step's timeline: draw every rank's phases, measure the overlap, export a Perfetto trace.

The timeline comes from `course_lib.training.timeline_recorder` (a TimelineRecorder in a hand loop, or
`TrainConfig(timeline_steps=N)` and `history.timeline`).                   (lessons 04, 10)
"""
import json
from pathlib import Path

from ..training.timeline_recorder import Span, Timeline

PHASE_COLORS = {
    "data": "#a0a0a0", "forward": "#4c72b0", "backward": "#dd8452", "wait": "#c44e52",
    "optimizer": "#55a868", "allreduce": "#8172b3", "replica forward": "#64b5cd",
}
OTHER_COLOR = "#ccb974"  # a phase a hand loop named itself
MAX_BUCKET_ROWS = 6      # more buckets share rows (bucket b on row b % 6)
COMM_NOTES = {
    "gloo": "gloo has no communication stream: its worker threads run the all-reduces, drawn under "
            "each rank's backward",
    "nccl": "all-reduces run on NCCL's own CUDA stream (times from CUDA events)",
}
DATA_PARALLEL_NOTES = {  # what DataParallel does with the replicas' gradients (lesson 02)
    "cpu": "replica threads run the forward; one backward computes every replica's gradients into "
           "the same parameters: no all-reduce to overlap",
    "cuda": "replica threads run the forward; Broadcast's backward sums the replicas' gradients on "
            "GPU 0 once autograd has them all: nothing overlaps backward",
}


# -- reading it ----------------------------------------------------------------------------------
def overlap_fraction(timeline: Timeline, rank: int, step: int):
    """The share of this step's all-reduce time hidden under backward's computing; None without one.

    All-reduce time is the union of the bucket all-reduces (from a bucket's hook call to the end of
    its all-reduce); "under backward" is backward minus the wait at its end, when gradients are
    all computed and the rank only waits for the last all-reduces.
    """
    allreduces = merge_intervals([(s.start, s.end) for s in timeline.select(rank, step, "allreduce")])
    if not allreduces or _length(allreduces) == 0:
        return None
    computing = _subtract(merge_intervals([(s.start, s.end) for s in timeline.select(rank, step, "backward")]),
                          merge_intervals([(s.start, s.end) for s in timeline.select(rank, step, "wait")]))
    return _length(_intersect(allreduces, computing)) / _length(allreduces)


def overlap_fractions(timeline: Timeline, rank: int = 0) -> dict:
    """{step: overlap_fraction} for one rank; None for steps with no all-reduce (no_sync, one process)."""
    return {step: overlap_fraction(timeline, rank, step) for step in timeline.steps}


def wait_seconds(timeline: Timeline, step=None) -> dict:
    """{rank: seconds spent waiting at the end of backward}, over every recorded step or one."""
    return {rank: timeline.total("wait", rank, step) for rank in range(timeline.world_size)}


def find_straggler(timeline: Timeline, step=None) -> int:
    """The rank the others wait for: it reaches the all-reduces last, so it waits least."""
    waits = wait_seconds(timeline, step)
    return min(waits, key=waits.get)


# -- drawing it ----------------------------------------------------------------------------------
def draw_timeline(timeline: Timeline, steps=None, ax=None, title=None):
    """Draw the timeline with matplotlib: one lane per rank, its all-reduces and replicas beneath.

    Each rank's lane shows data, forward, backward, the wait at backward's end (red, hatched) and
    the optimizer step; under it, one row per DDP bucket shows that bucket's all-reduce, from its
    hook call to its end, so the part that overlaps backward is the part drawn under backward.
    Above each step: its share of all-reduce time hidden under backward (mean over ranks).
    Returns the Axes; its y tick labels name the lanes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    steps = list(timeline.steps if steps is None else steps)
    spans = [span for span in timeline.spans if span.step in steps]
    if not spans:
        raise ValueError(f"the timeline has no spans for steps {steps}; it recorded steps "
                         f"{timeline.steps}")
    rows = _rows(timeline, spans)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 1.2 + 0.42 * len(rows)))
    phases = _draw_bars(ax, rows, spans)
    _label_steps(ax, timeline, steps, top=0.25)
    ax.set_yticks([-index for index in range(len(rows))])
    ax.set_yticklabels([label for _, label, _ in rows], fontsize=8)
    ax.set_ylim(-len(rows) - 0.1, 0.25 + 0.9)
    _set_titles(ax, timeline, spans, title)
    handles = [Patch(facecolor=PHASE_COLORS.get(phase, OTHER_COLOR), hatch="///" if phase == "wait" else None,
                     label=_PHASE_LABELS.get(phase, phase)) for phase in _in_order(phases)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3, zorder=0)
    return ax


def _draw_bars(ax, rows, spans) -> set:
    """One broken_barh per row and phase, row i centred on y = -i; returns the phases drawn."""
    drawn = set()
    for index, (key, _, height) in enumerate(rows):
        on_row = [span for span in spans if _row_key(span) == key]
        for phase in _in_order({span.phase for span in on_row}):
            bars = [(span.start * 1e3, span.seconds * 1e3) for span in on_row if span.phase == phase]
            waiting = phase == "wait"  # drawn over the end of backward, hatched
            ax.broken_barh(bars, (-index - height / 2, height), facecolors=PHASE_COLORS.get(phase, OTHER_COLOR),
                           edgecolor="#7a1f22" if waiting else "white", linewidth=0.5,
                           hatch="///" if waiting else None, zorder=3 if waiting else 2)
            drawn.add(phase)
    return drawn


def _label_steps(ax, timeline: Timeline, steps, top: float) -> None:
    """A dotted line where each step starts; above it, its number and overlap (mean over ranks)."""
    for step in steps:
        start, end = timeline.step_bounds(step)
        ax.axvline(start * 1e3, color="#444444", linewidth=0.6, linestyle=":", zorder=1)
        fractions = [f for f in (overlap_fraction(timeline, rank, step) for rank in range(timeline.world_size))
                     if f is not None]
        label = f"step {step}" + (f"\n{sum(fractions) / len(fractions):.0%} hidden" if fractions else "")
        ax.text((start + end) / 2 * 1e3, top, label, ha="center", va="bottom", fontsize=7)


def _set_titles(ax, timeline: Timeline, spans, title) -> None:
    replicas = len({span.lane for span in spans if span.lane.startswith("replica")})
    if timeline.world_size > 1:
        ax.set_xlabel("milliseconds (every rank on rank 0's clock, "
                      f"aligned to within {timeline.clock_error_bound * 1e6:.0f} µs)")
        heading = f"{timeline.world_size} ranks, {timeline.backend}"
        note = COMM_NOTES.get(timeline.backend, "") if any(s.lane == "comm" for s in spans) else ""
    else:
        ax.set_xlabel("milliseconds")
        heading = f"one process{f', DataParallel over {replicas} replicas' if replicas else ''}"
        note = DATA_PARALLEL_NOTES.get(timeline.device_type, "") if replicas else ""
    ax.set_title((title or heading) + (f"\n{note}" if note else ""), fontsize=9)


_PHASE_LABELS = {"wait": "wait (end of backward)", "allreduce": "bucket all-reduce",
                 "data": "data wait"}
_ORDER = ("data", "forward", "replica forward", "backward", "wait", "allreduce", "optimizer")


def _in_order(phases) -> list:
    return sorted(phases, key=lambda p: (_ORDER.index(p) if p in _ORDER else len(_ORDER), p))


def _row_key(span: Span):
    if span.lane == "comm":
        return (span.rank, "comm", span.bucket % MAX_BUCKET_ROWS)
    return (span.rank, span.lane, None)


def _rows(timeline: Timeline, spans: list) -> list:
    """[(row key, label, bar height)], top to bottom: per rank, compute, then buckets, then replicas."""
    comm = "NCCL stream" if timeline.comm_stream else "all-reduce"
    rows = []
    for rank in range(timeline.world_size):
        mine = [span for span in spans if span.rank == rank]
        rows.append(((rank, "compute", None), f"rank {rank}" if timeline.world_size > 1 else "process", 0.8))
        for row in sorted({span.bucket % MAX_BUCKET_ROWS for span in mine if span.lane == "comm"}):
            buckets = sorted({s.bucket for s in mine if s.lane == "comm" and s.bucket % MAX_BUCKET_ROWS == row})
            rows.append(((rank, "comm", row), f"{comm}, bucket {'/'.join(map(str, buckets))}", 0.55))
        for lane in sorted({span.lane for span in mine if span.lane.startswith("replica")}):
            rows.append(((rank, lane, None), f"{lane} thread", 0.55))
    return rows


# -- exporting it --------------------------------------------------------------------------------
def chrome_trace(timeline: Timeline) -> dict:
    """The timeline in the Trace Event Format that chrome://tracing and ui.perfetto.dev open.

    One process (pid) per rank; threads (tid): 0 the rank's compute, 1 + b bucket b's all-reduce,
    100 + i DataParallel replica i. Each span is a complete event (ph "X") with ts and dur in
    microseconds; "M" events name the processes and threads.
    """
    events, threads = [], {}
    for span in sorted(timeline.spans, key=lambda s: (s.rank, _tid(s), s.start, -s.end)):
        tid = _tid(span)
        threads[(span.rank, tid)] = _thread_name(span, timeline)
        ts, end = round(span.start * 1e6, 3), round(span.end * 1e6, 3)
        args = {"step": span.step}
        if span.bucket is not None:
            args.update(bucket=span.bucket, bytes=span.nbytes)
        events.append({"name": span.phase if span.bucket is None else f"all-reduce bucket {span.bucket}",
                       "cat": span.lane, "ph": "X", "ts": ts, "dur": max(0.0, round(end - ts, 3)),
                       "pid": span.rank, "tid": tid, "args": args})
    names = [{"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}}
             for rank in range(timeline.world_size)]
    names += [{"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": name}}
              for (rank, tid), name in sorted(threads.items())]
    return {"traceEvents": names + events, "displayTimeUnit": "ms",
            "otherData": {"backend": timeline.backend, "world_size": timeline.world_size,
                          "clock_error_bound_us": round(timeline.clock_error_bound * 1e6, 3)}}


def save_chrome_trace(timeline: Timeline, path) -> Path:
    """Write chrome_trace(timeline) as JSON; open the file in https://ui.perfetto.dev."""
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(timeline)))
    return path


def _tid(span: Span) -> int:
    if span.lane == "comm":
        return 1 + span.bucket
    if span.lane.startswith("replica"):
        return 100 + int(span.lane.split()[-1])
    return 0


def _thread_name(span: Span, timeline: Timeline) -> str:
    if span.lane == "comm":
        where = "NCCL stream" if timeline.comm_stream else "gloo thread"
        return f"bucket {span.bucket} all-reduce ({where})"
    return span.lane if span.lane != "compute" else "compute"


# -- intervals -----------------------------------------------------------------------------------
def merge_intervals(intervals) -> list:
    """[(start, end), ...] sorted, overlapping ones merged: the time they cover together."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [tuple(pair) for pair in merged]


def _intersect(a, b) -> list:
    return [(max(s1, s2), min(e1, e2)) for s1, e1 in a for s2, e2 in b if max(s1, s2) < min(e1, e2)]


def _subtract(a, b) -> list:
    result = []
    for start, end in a:
        pieces = [(start, end)]
        for cut_start, cut_end in b:
            pieces = [piece for s, e in pieces
                      for piece in ((s, min(e, cut_start)), (max(s, cut_end), e)) if piece[0] < piece[1]]
        result.extend(pieces)
    return result


def _length(intervals) -> float:
    return sum(end - start for start, end in intervals)
