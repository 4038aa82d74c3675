"""Each rank's row of forwards and backwards, as a schedule plays out on paper (pipeline_schedules.
play, labelled a model) or as the ranks ran it (pipeline.Record, measured): a forward in blue, a
backward in orange, each with its micro-batch; what is left white is the bubble."""
COLORS = {"F": "#4c72b0", "B": "#dd8452"}


def draw_schedule(steps, ax=None, title: str = ""):
    """`steps`: a Played (play's result: time units) or one step's Records (seconds, drawn in ms)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.5 + 0.5 * _rows(steps)))
    bars, unit = _bars(steps)
    for rank, kind, i, start, end in bars:
        ax.broken_barh([(start, end - start)], (rank - 0.4, 0.8), color=COLORS[kind], edgecolor="white")
        ax.text((start + end) / 2, rank, f"{kind}{i}", ha="center", va="center", color="white", fontsize=8)
    ax.set_yticks(range(_rows(steps)), [f"rank {r}" for r in range(_rows(steps))])
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_title(title)
    return ax


def _rows(steps) -> int:
    return len(steps.slots) if hasattr(steps, "slots") else 1 + max(r.rank for r in steps)


def _bars(steps):
    if hasattr(steps, "slots"):  # a model: time units
        return [(rank, kind, i, start, end) for rank, slots in enumerate(steps.slots)
                for kind, i, start, end in slots], "time units (a model: a forward 1, a backward 2)"
    origin = min(r.started for r in steps)
    return [(r.rank, r.action, r.microbatch, (r.computing - origin) * 1e3, (r.ended - origin) * 1e3)
            for r in steps], "ms (measured: from when its input was there to when it ended)"
