"""Why ranks hang: compare the collectives each rank recorded and name the first place they part.

Every rank issues the same collectives in the same order, or some rank waits forever. Each rank
sends the collectives torch recorded (rank.collective_log), numbered per process group; with
what the launcher knows of each rank (returned, failed, killed, or still running and where its
main thread waits), `diagnose` says in one line what went wrong:

    collective #4 differs: rank 0 all_reduce float32[4] (Cell In[3], line 9), rank 1 broadcast float32[10] (...)
    rank 1 returned after 3 collectives; rank 0 waits in its 4th (all_reduce float32[4], Cell In[3], line 9)
    rank 1 is in no collective: it runs your code (busy (hang.py:12)) after 3; rank 0 waits in its 4th (...)
    ranks 0 and 1 both wait in recv: a recv returns only when its peer sends to it, and no rank is sending

and lists the last collectives every rank agreed on, so that one sees where the ranks parted.
"""
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ..shared.tracebacks import place

# What the main thread of a rank in a torch.distributed call waits in (tracebacks.innermost_frame)
POINT_TO_POINT = ("recv", "send", "irecv", "isend", "batch_isend_irecv", "wait")
MATCHED_SHOWN = 3


@dataclass
class RankState:
    """What the launcher knows of one rank when the run stopped."""

    rank: int
    state: str                     # "returned", "failed", "exited" (killed or exit code) or "running"
    gave_up: str = ""               # failed only because it stopped waiting: "gloo lost the connection", "it timed out"
    records: Optional[list] = None  # its recorded collectives (None: it sent none)
    waiting_in: str = ""           # running: its main thread's innermost frame, "all_reduce (distributed_c10d.py:3245)"
    summary: str = ""              # failed or exited: "ValueError: ..." or "killed by SIGABRT"
    last_output: List[str] = field(default_factory=list)
    last_call: str = ""            # the collective it last entered from Python, "all_reduce float32[4]"


def diagnose(ranks: Dict[int, RankState]) -> str:
    """One line (and the matched collectives under it) naming why the ranks did not meet; "" when
    nothing recorded says more than each rank's own detail."""
    if not ranks:
        return ""
    for rule in (_different_collective, _one_ended_early, _crashed_in_a_collective, _one_busy,
                 _point_to_point, _all_in_one):
        found = rule(ranks)
        if found:
            headline, agreed = found
            return headline + _matched_before(ranks, agreed)
    return ""


# -- the rules, in order --------------------------------------------------------------------------
def _different_collective(ranks):
    """The lowest call number at which two ranks issued different collectives (op, shapes, dtypes)."""
    first = None
    for group in _groups(ranks):
        calls = {r: _by_seq(s.records, group) for r, s in ranks.items() if s.records}
        for seq in sorted({seq for by_seq in calls.values() for seq in by_seq}):
            issued = {r: by_seq[seq] for r, by_seq in calls.items() if seq in by_seq}
            if len({_signature(record) for record in issued.values()}) > 1:
                if first is None or seq < first[1]:
                    first = (group, seq, issued)
                break
    if first is None:
        return None
    group, seq, issued = first
    parts = [f"{_ranks_phrase(rs)} {_call(issued[rs[0]])}" for rs in _grouped(issued)]
    return f"collective #{seq}{_in_group(group)} differs: {'; '.join(parts)}", (group, seq - 1)


def _one_ended_early(ranks):
    """A rank that returned, failed or died while others wait in a collective it never issued."""
    waiting = _waiting(ranks)
    ended = [s for s in ranks.values() if s.state != "running" and not s.gave_up]
    if not waiting or not ended:
        return None
    group, record = _earliest_wait(waiting)
    others = [s for s in ended if _count(s, group) < record["seq"]]
    if not others:
        return None
    ended_parts = [_ended_phrase(s, group, record) for s in sorted(others, key=lambda s: s.rank)]
    wait_parts = [_waiter_phrase(ranks[r], rec) for r, rec in sorted(waiting[group].items())]
    return "; ".join(ended_parts + wait_parts), (group, record["seq"] - 1)


def _crashed_in_a_collective(ranks):
    """A rank the backend killed inside a collective (gloo aborts on a size mismatch) while the
    others went on: what it was in, what the backend said, and what the others issued there."""
    crashed = [s for s in ranks.values() if s.state == "exited" and s.records is None
               and _call_in_crash_dump(s.last_output)]
    if not crashed:
        return None
    parts, agreed = [], None
    for state in sorted(crashed, key=lambda s: s.rank):
        crash = _crash_message(state.last_output)
        parts.append(f"rank {state.rank} {state.summary} in {_crashed_call(state)}"
                     + (f" (gloo: {crash})" if crash else ""))
    for state in sorted(ranks.values(), key=lambda s: s.rank):
        if state in crashed or not state.records:
            continue
        last = state.records[-1]
        ended = {"returned": " and it finished", "failed": " and it failed"}.get(state.state, "")
        parts.append(f"rank {state.rank}'s last collective was #{last['seq']} ({_call(last)}){ended}")
        agreed = agreed or (last["group"], last["seq"] - 1)
    return "; ".join(parts), agreed


def _one_busy(ranks):
    """A rank still running but in no collective (busy in Python, sleeping) while others wait."""
    waiting = _waiting(ranks)
    busy = [s for s in ranks.values() if s.state == "running" and not _in_collective(s, waiting)
            and not _in_point_to_point(s)]
    if not waiting or not busy:
        return None
    group, record = _earliest_wait(waiting)
    parts = []
    for state in sorted(busy, key=lambda s: s.rank):
        where = f" in {state.waiting_in}" if state.waiting_in else ""
        parts.append(f"rank {state.rank} is in no collective: it runs your code{where}, after "
                     f"{_count(state, group)} collective{'s' if _count(state, group) != 1 else ''}")
    parts += [_waiter_phrase(ranks[r], rec) for r, rec in sorted(waiting[group].items())]
    return "; ".join(parts), (group, record["seq"] - 1)


def _point_to_point(ranks):
    """Ranks that wait in send/recv with no rank on the other side of them."""
    running = [s for s in ranks.values() if s.state == "running"]
    p2p = [s for s in running if _in_point_to_point(s)]
    if not p2p:
        return None
    kinds = sorted({_function(s.waiting_in) for s in p2p})
    names = _ranks_phrase([s.rank for s in p2p])
    every = "both" if len(p2p) == 2 else "all"
    if len(p2p) == len(ranks) and kinds in (["recv"], ["irecv"], ["wait"]):
        line = (f"{names} {every} wait in {kinds[0]}: a recv returns only when its peer sends to it, "
                f"and no rank is sending (make one side send first, or use isend/irecv)")
    elif len(p2p) == len(ranks) and kinds == ["send"]:
        line = (f"{names} {every} wait in send: a send returns only when its peer receives it, and "
                f"no rank is receiving (make one side receive first, or use isend/irecv)")
    else:
        others = [s for s in ranks.values() if s not in p2p]
        line = f"{names} wait{'s' if len(p2p) == 1 else ''} in " + ", ".join(
            f"{_function(s.waiting_in)} (rank {s.rank})" for s in p2p)
        line += "; " + "; ".join(_elsewhere(s) for s in sorted(others, key=lambda s: s.rank)) if others else ""
        line += ": every send needs a matching recv on its peer, issued in an order both can reach"
    return line, None


def _all_in_one(ranks):
    """Every rank waits in the same collective, and they agree on it: the wait is not a mismatch."""
    waiting = _waiting(ranks)
    for group, records in waiting.items():
        if len(records) == len(ranks) and len({(_signature(r), r["seq"]) for r in records.values()}) == 1:
            record = next(iter(records.values()))
            return (f"every rank waits in collective #{record['seq']}{_in_group(group)} ({_call(record)}) "
                    f"and they agree on it: it has not finished (a slow network, or a rank outside "
                    f"this group that it needs)"), (group, record["seq"] - 1)
    return None


# -- pieces ------------------------------------------------------------------------------------
def _groups(ranks) -> List[str]:
    names = {record["group"] for s in ranks.values() for record in s.records or []}
    return sorted(names, key=lambda name: (name != "default_pg", name))


def _by_seq(records, group) -> Dict[int, dict]:
    return {record["seq"]: record for record in records if record["group"] == group}


def _signature(record) -> tuple:
    """What every rank must agree on at one call number."""
    return record["op"], repr(record["shapes"]), repr(record["dtypes"])


def _earliest_wait(waiting) -> tuple:
    """(group, record) of the lowest call number any rank waits in."""
    return min(((group, record) for group, records in waiting.items() for record in records.values()),
               key=lambda item: item[1]["seq"])


def _waiter_phrase(state, record) -> str:
    if state.gave_up:  # it waited there until gloo saw the other end close, or the timeout came
        return f"rank {state.rank} waited in its {_ordinal(record['seq'])} ({_call(record)}) until {state.gave_up}"
    return f"rank {state.rank} waits in its {_ordinal(record['seq'])} ({_call(record)})"


def _waiting(ranks) -> Dict[str, Dict[int, dict]]:
    """{group: {rank: its unfinished collective}} of the running ranks (their last one per group),
    and of the ranks that failed only because a peer went away (the collective they were in)."""
    waiting = {}
    for state in ranks.values():
        if not state.records or not (state.state == "running" or state.gave_up):
            continue
        # In a collective: its main thread says so (the record may already read "done": a collective
        # that timed out in the backend has ended, with an error on its way), or a record is unfinished
        # (an async op's, DDP's all-reduce under backward)
        in_call = bool(state.gave_up) or ("distributed_c10d" in state.waiting_in
                                        and _function(state.waiting_in) not in POINT_TO_POINT)
        pending = state.records[-1:] if in_call else [r for r in state.records if _unfinished(r, ranks)]
        if pending:
            last = max(pending, key=lambda r: r["seq"])
            waiting.setdefault(last["group"], {})[state.rank] = last
    return waiting


def _unfinished(record, ranks) -> bool:
    """Whether the rank still waits in this collective: its record is not done, or it reads done
    though a rank of its group never issued it. Such a collective cannot have completed: the
    backend gave up on it (gloo ends one that outlives the group's timeout, which launch sets to
    its own, and torch retires its record). DDP's all-reduce, issued from backward(), is known by
    its record alone: the rank's main thread waits in autograd, not in a torch.distributed call."""
    if any(0 < _count(state, record["group"]) < record["seq"] for state in ranks.values()):
        return True
    return not record["done"] and not _done_elsewhere(record, ranks)


def _done_elsewhere(record, ranks) -> bool:
    """Another rank finished this very collective: torch marks a gloo record done a few ms after
    the call returns, so a rank asked in that window may show as still in a call it has left."""
    return any(other["done"] and other["group"] == record["group"] and other["seq"] == record["seq"]
               and _signature(other) == _signature(record)
               for state in ranks.values() for other in state.records or [])


def _in_collective(state, waiting) -> bool:
    return any(state.rank in records for records in waiting.values())


def _function(waiting_in: str) -> str:
    return waiting_in.split(" (", 1)[0]


def _in_point_to_point(state) -> bool:
    return state.state == "running" and "distributed_c10d" in state.waiting_in and \
        _function(state.waiting_in) in POINT_TO_POINT


def _count(state, group) -> int:
    return max((r["seq"] for r in state.records or [] if r["group"] == group), default=0)


def _ended_phrase(state, group, awaited) -> str:
    done = _count(state, group)
    after = f"after {done} collective{'s' if done != 1 else ''}"
    if state.state == "returned":
        return f"rank {state.rank} finished {after}"
    if state.state == "failed":
        return f"rank {state.rank} failed {after} ({state.summary})"
    crash = _crash_message(state.last_output)
    killed = f"rank {state.rank} {state.summary or 'exited'}"
    if state.records is None:  # died without a word: its stack dump and torch's message say where and why
        call = _crashed_call(state)
        line = killed + (f" in {call}" if call else "") + (f" during collective #{awaited['seq']}" if crash else "")
        return line + (f" (gloo: {crash})" if crash else "")
    return f"{killed} {after}" + (f" ({crash})" if crash else "")


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')


def _call_in_crash_dump(lines: List[str]) -> str:
    """'all_reduce at h.py, line 31' from the stack faulthandler printed as the rank crashed."""
    frames = [m for m in map(_FRAME.search, lines) if m]
    for i, frame in enumerate(frames):
        if frame["file"].endswith("distributed_c10d.py"):
            caller = next((f for f in frames[i + 1:] if "/torch/" not in f["file"]
                           and "/course_lib/" not in f["file"]), None)
            where = f" at {place(caller['file'], caller['line'])}" if caller else ""
            return f"{frame['function']}{where}"
    return ""


def _crashed_call(state) -> str:
    """The collective a rank died in, from its stack dump, with its tensors when the rank wrote
    them before entering it: 'all_reduce float32[4] at h.py, line 31'."""
    call = _call_in_crash_dump(state.last_output)
    op, _, where = call.partition(" at ")
    entered = state.last_call.split(" ", 1)
    if op and entered[0] == op and len(entered) == 2:
        return f"{op} {entered[1]}" + (f" at {where}" if where else "")
    return call


def _crash_message(lines: List[str]) -> str:
    """gloo's or torch's own last words before an abort, e.g. a size mismatch gloo enforces."""
    for line in reversed(lines):
        text = line.strip()
        if text.startswith("what():") or "collective mismatch" in text:
            text = text.removeprefix("what():").strip()
            return text.split("] ", 1)[-1] if text.startswith("[enforce fail") else text
    return ""


def _elsewhere(state) -> str:
    if state.state == "running":
        return f"rank {state.rank} runs {state.waiting_in or 'your code'}"
    return f"rank {state.rank} {state.state}" + (f" ({state.summary})" if state.summary else "")


def _matched_before(ranks, agreed) -> str:
    """The last collectives every rank issued the same way, up to the call number `agreed`."""
    if agreed is None:
        return ""
    group, last = agreed
    calls = [_by_seq(s.records, group) for s in ranks.values() if s.records]
    if not calls or last < 1:
        return ""
    matched = [seq for seq in range(last, 0, -1)
               if all(seq in c for c in calls) and len({_signature(c[seq]) for c in calls}) == 1]
    if not matched:
        return ""
    shown = sorted(matched[:MATCHED_SHOWN])
    lines = [f"  before that, every rank issued the same collective{'s' if len(shown) > 1 else ''}:"]
    lines += [f"    #{seq} {_call(calls[0][seq])}" for seq in shown]
    return "\n" + "\n".join(lines)


def _call(record) -> str:
    tensors = ", ".join(f"{dtype}[{', '.join(map(str, shape))}]"
                        for dtype, shape in zip(record["dtypes"], record["shapes"]))
    where = f" at {record['where']}" if record.get("where") else ""
    backward = " in backward()" if record.get("in_backward") else ""  # DDP's gradient all-reduce, say
    return f"{record['op']}{' ' + tensors if tensors else ''}{backward}{where}"


def _grouped(issued: Dict[int, dict]) -> List[List[int]]:
    by_signature = {}
    for rank, record in sorted(issued.items()):
        by_signature.setdefault(_signature(record), []).append(rank)
    return list(by_signature.values())


def _in_group(group: str) -> str:
    return "" if group == "default_pg" else f" of group {group}"


def _ranks_phrase(ranks) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
