"""Pipeline schedules, and what one does before it runs: each rank's order of forwards ("F", i) and
backwards ("B", i) of the micro-batches, played out on paper with a forward taking `forward` time
units and a backward `backward` on every stage (a model: real stages differ, and sending takes time).

    gpipe(stage, stages, m)        all forwards, then all backwards (GPipe)
    one_f_one_b(stage, stages, m)  stage s: p - s - 1 forwards, then a forward and a backward in turn,
                                   then the backwards left (as torch's Schedule1F1B: its p - s warm-up
                                   forwards count the first of the steady phase)
    play(orders)                   when each action runs on each stage, or why the ranks would hang

The rules `play` follows are pipeline.py's: a stage's forward of i waits for the stage before to
have sent i's output; its backward of i waits for the stage after to have sent i's input gradient,
and for its own forward of i; sends never wait; between two ranks the k-th recv gets the k-th send.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

Action = Tuple[str, int]  # ("F", micro-batch) or ("B", micro-batch)


def gpipe(stage: int, stages: int, microbatches: int) -> List[Action]:
    """All forwards, then all backwards, in the order the micro-batches came."""
    return [("F", i) for i in range(microbatches)] + [("B", i) for i in range(microbatches)]


def one_f_one_b(stage: int, stages: int, microbatches: int) -> List[Action]:
    """Warm-up forwards, then one forward and one backward in turn, then the backwards left."""
    warmup = min(stages - stage - 1, microbatches)
    order = [("F", i) for i in range(warmup)]
    for i in range(microbatches - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(microbatches - warmup, microbatches)]


def bubble_fraction(stages: int, microbatches: int) -> float:
    """The idle share of each rank's step when every stage takes the same time (a model)."""
    return (stages - 1) / (microbatches + stages - 1)


class ScheduleError(ValueError):
    """The orders cannot run: an action is missing or repeated, or the ranks would hang or mix up
    micro-batches. The message says which rank, which action, and what it waits for."""


@dataclass
class Played:
    """Each stage's actions with their start and end (time units), and the most micro-batches a
    stage held at once (forwarded, not yet backwarded: their activations are kept)."""

    slots: List[List[Tuple[str, int, float, float]]]
    most_held: List[int]

    @property
    def makespan(self) -> float:
        return max(end for stage in self.slots for *_, end in stage)

    def idle_shares(self) -> List[float]:
        """Each stage's share of the step it does not compute."""
        return [1 - sum(end - start for *_, start, end in stage) / self.makespan for stage in self.slots]


def play(orders: Sequence[Sequence[Action]], forward=1.0, backward=2.0, microbatches: int = None) -> Played:
    """Play the ranks' orders out (orders[s] is stage s's; `microbatches`: as many as rank 0 runs
    forwards, unless given); ScheduleError if they cannot run. `forward` and `backward` are the
    time of one on every stage, or a list: one time a stage."""
    stages = len(orders)
    _check_each_once(orders, microbatches)
    # channel (from, to) -> [(micro-batch, time it was sent)], in the order sent
    sent: Dict[Tuple[int, int], List[Tuple[int, float]]] = {}
    received = {}  # (from, to) -> how many recvs were matched so far
    position, clock = [0] * stages, [0.0] * stages
    done = [set() for _ in range(stages)]
    slots, held, most_held = [[] for _ in range(stages)], [0] * stages, [0] * stages
    while any(position[s] < len(orders[s]) for s in range(stages)):
        moved = False
        for s in range(stages):
            while position[s] < len(orders[s]):
                kind, i = orders[s][position[s]]
                peer = s - 1 if kind == "F" else s + 1
                if kind == "B" and ("F", i) not in done[s]:
                    raise ScheduleError(f"rank {s} runs the backward of micro-batch {i} before its "
                                        f"forward: a backward needs what its forward saved")
                ready = clock[s]
                if 0 <= peer < stages:
                    channel = (peer, s)
                    k = received.get(channel, 0)
                    if k >= len(sent.get(channel, [])):
                        break  # waits in recv for its peer to send
                    got, at = sent[channel][k]
                    if got != i:
                        what = "output" if kind == "F" else "input gradient"
                        raise ScheduleError(
                            f"rank {s}'s recv number {k + 1} from rank {peer} is for micro-batch {i}'s "
                            f"{what}, but rank {peer}'s send number {k + 1} to it is micro-batch {got}'s: "
                            f"between two ranks sends and recvs match in order, so it would compute "
                            f"with another micro-batch's tensor")
                    received[channel] = k + 1
                    ready = max(ready, at)
                cost = forward if kind == "F" else backward
                end = ready + (cost[s] if isinstance(cost, (list, tuple)) else cost)
                slots[s].append((kind, i, ready, end))
                clock[s], position[s] = end, position[s] + 1
                done[s].add((kind, i))
                held[s] += 1 if kind == "F" else -1
                most_held[s] = max(most_held[s], held[s])
                to = s + 1 if kind == "F" else s - 1
                if 0 <= to < stages:
                    sent.setdefault((s, to), []).append((i, end))
                moved = True
        if not moved:
            raise ScheduleError(_hang(orders, position, stages))
    return Played(slots, most_held)


def _check_each_once(orders, microbatches) -> None:
    if microbatches is None:
        microbatches = sum(1 for kind, _ in orders[0] if kind == "F") if orders else 0
    expected = {(kind, i) for kind in "FB" for i in range(microbatches)}
    for s, order in enumerate(orders):
        seen = list(order)
        if len(seen) != len(set(seen)) or set(seen) != expected:
            missing = sorted(expected - set(seen))
            repeated = sorted({a for a in seen if seen.count(a) > 1})
            extra = sorted(set(seen) - expected)
            raise ScheduleError(
                f"rank {s} must run each of F 0..{microbatches - 1} and B 0..{microbatches - 1} once"
                + (f"; missing {missing}" if missing else "")
                + (f"; repeated {repeated}" if repeated else "") + (f"; unknown {extra}" if extra else ""))


def _hang(orders, position, stages) -> str:
    waits = []
    for s in range(stages):
        if position[s] < len(orders[s]):
            kind, i = orders[s][position[s]]
            peer = s - 1 if kind == "F" else s + 1
            what = "output" if kind == "F" else "input gradient"
            waits.append(f"rank {s} waits in recv for micro-batch {i}'s {what} from rank {peer}")
    return ("the ranks would hang: " + "; ".join(waits)
            + " (each waits for a send its peer makes only later in its order)")
