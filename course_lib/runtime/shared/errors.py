"""What went wrong in a distributed run: one failure per rank, gathered into one exception.

`DistributedRunError` names every failed rank, leads with the root cause and keeps each rank's output.
"""
import os
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Dict, List, Optional

import course_lib

# course_lib/, every layer of it: its frames say nothing to a learner (from the package, so a move
# of this module cannot change it)
_LIBRARY = os.path.dirname(os.path.abspath(course_lib.__file__)) + os.sep

# What gloo says when the rank at the other end of a connection has exited or crashed
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
# What gloo and NCCL say when a collective outlived the process group's timeout
BACKEND_TIMEOUT = ("Timed out waiting", "Watchdog caught collective operation timeout")

PHASES = {
    "startup": "while starting the rank (before your code)",
    "unpickling": "while unpickling your function and arguments (before your code)",
    "init_process_group": "in init_process_group (before your code)",
    "running": "in your function",
    "returning": "while sending the return value back",
    "exiting": "after your function returned",
    "interrupted": "",
    "exit": "",
    "timeout": "",
    "hung": "",
}


@dataclass
class RankFailure:
    rank: int
    phase: str                      # a key of PHASES
    summary: str                    # one line: "ValueError: bad shape" or "killed by SIGSEGV"
    traceback: str = ""             # the rank's formatted traceback, when it raised
    when: float = 0.0               # time.time() on the rank when it failed (orders root causes)
    exitcode: Optional[int] = None  # negative: killed by that signal
    stack: str = ""                 # Python stacks of a hung rank (faulthandler)
    waiting_in: str = ""            # innermost function of a hung rank's main thread
    threads: str = ""               # a hung rank's threads as Linux shows them, where Python shows none

    def headline(self) -> str:
        where = PHASES.get(self.phase, self.phase)
        return f"rank {self.rank}{' ' + where if where else ''}: {self.summary}"

    @property
    def gave_up_waiting(self) -> str:
        """Why a rank stopped waiting in a collective without a bug of its own: "" if it did not."""
        if self.lost_a_peer:
            return "gloo lost the connection"
        if any(words in self.summary for words in BACKEND_TIMEOUT):
            return "it timed out"
        return ""

    @property
    def lost_a_peer(self) -> bool:
        """Whether this failure is gloo losing its connection to a rank that ended first: a
        consequence of another rank's failure, not a bug of its own."""
        return bool(self.gloo_said)

    @property
    def gloo_said(self) -> str:
        """gloo's words for a lost peer in this failure ("Connection reset by peer"), or ""."""
        return next((words for words in PEER_GONE if words in self.summary), "")


@dataclass(eq=False)  # exceptions must stay hashable
class DistributedRunError(RuntimeError):
    """A distributed run failed or timed out; nothing of it is left running."""

    failures: Dict[int, RankFailure]
    outputs: Dict[int, List[str]] = field(default_factory=dict)
    world_size: int = 0
    timed_out: bool = False
    note: str = ""                  # what the launcher knows beyond each rank (e.g. the rendezvous)
    results: Dict[int, Any] = field(default_factory=dict)  # {rank: result} of the ranks whose result arrived
    diagnosis: str = ""             # why the ranks did not meet, from the collectives they recorded

    def __post_init__(self):
        RuntimeError.__init__(self, self.describe())

    @property
    def failed_ranks(self) -> List[int]:
        return sorted(self.failures)

    @property
    def root_cause(self) -> RankFailure:
        """The earliest failure that raised; other ranks usually fail because that one did. A rank
        that only lost its connection to a peer is a consequence: a peer that died comes first."""
        own = [f for f in self.failures.values() if not f.lost_a_peer] or list(self.failures.values())
        raised = [f for f in own if f.traceback] or own
        return min(raised, key=lambda f: (f.when or float("inf"), f.rank))

    def __str__(self):
        return self.describe()

    def _render_traceback_(self):
        """IPython's traceback of this error, from the learner's cell to the message: the launcher's
        frames say nothing to them (the ranks' tracebacks are in the message)."""
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None:
            raise RuntimeError("not in IPython")  # IPython falls back to its usual traceback
        return shell.InteractiveTB.structured_traceback(type(self), self, _without_library_frames(self.__traceback__))

    def __reduce__(self):
        return (_rebuild, (self.failures, self.outputs, self.world_size, self.timed_out, self.note,
                           self.results, self.diagnosis))

    def describe(self, output_lines: int = 10) -> str:
        stuck = [f for f in self.failures.values() if f.phase == "exiting"]
        only_stuck = bool(stuck) and len(stuck) == len(self.failures)
        interrupted = any(f.phase == "interrupted" for f in self.failures.values())
        if interrupted:
            head = f"interrupted: the {self.world_size} ranks were stopped; where each one was:"
        elif self.timed_out:
            hung = [f for f in self.failures.values() if f.phase in ("timeout", "exiting")]
            head = f"timed out: {len(hung)} of {self.world_size} ranks still running (ranks {_ranks(hung)})"
        elif only_stuck:
            head = (f"{len(stuck)} of {self.world_size} ranks did not exit after your function returned "
                    f"(ranks {_ranks(stuck)})")
        else:
            head = f"{len(self.failures)} of {self.world_size} ranks failed (ranks {_ranks(self.failures.values())})"
        lines = [head] + ([f"Diagnosis: {self.diagnosis}"] if self.diagnosis else []) + [""]
        lines += [self.note, ""] if self.note else []
        if stuck and len(self.results) == self.world_size:
            lines += ["Your function returned on every rank: the results are in this error's .results "
                      "(results[rank]).", ""]
        if self.timed_out or only_stuck or interrupted:
            for failure in sorted(self.failures.values(), key=lambda f: f.rank):
                lines.append(f"rank {failure.rank}: {failure.summary}")
                if failure.stack:
                    lines += ["  " + line for line in failure.stack.rstrip().splitlines()]
                if failure.threads:
                    lines += ["  " + line for line in failure.threads.rstrip().splitlines()]
                lines.append("")
        else:
            root = self.root_cause
            lines.append(f"Root cause: {root.headline() if not root.lost_a_peer else _peer_ended(root)}")
            if root.traceback:
                lines += ["", root.traceback.rstrip()]
            others = [f for f in self.failures.values() if f is not root]
            if others:
                lines += ["", "Other ranks:"]
                for failure in sorted(others, key=lambda f: f.rank):
                    lines.append(f"  {_consequence(failure, root) if failure.lost_a_peer else failure.headline()}")
                    lines += ["    " + line for line in failure.stack.rstrip().splitlines()]
                    lines += ["    " + line for line in failure.threads.rstrip().splitlines()]
            lines.append("")
        shown = {rank: out[-output_lines:] for rank, out in sorted(self.outputs.items()) if out}
        if shown:
            lines.append(f"Last output of each rank (up to {output_lines} lines; all of it in .outputs):")
            for rank, out in shown.items():
                lines += [f"  [rank{rank}] {line}" for line in out]
        return "\n".join(lines).rstrip()


def _peer_ended(failure: RankFailure) -> str:
    """The only failure is a lost connection: a peer ended (returned or was stopped) first."""
    return (f"rank {failure.rank} {PHASES.get(failure.phase, '')}: lost its connection to a rank that "
            f"had ended, while it still waited in a collective that rank never joined (gloo said "
            f"\"{failure.gloo_said}\"; the diagnosis "
            f"above says which)").replace("  ", " ")


def _consequence(failure: RankFailure, root: RankFailure) -> str:
    """A peer-lost failure, named as what followed the root cause (gloo's own words kept short)."""
    said = failure.gloo_said
    return (f"rank {failure.rank} {PHASES.get(failure.phase, '')}: lost its connection to rank "
            f"{root.rank}, which had failed (a consequence of rank {root.rank}'s failure, not a "
            f"second bug; gloo said \"{said}\")").replace("  ", " ")


def _without_library_frames(tb: Optional[TracebackType]) -> Optional[TracebackType]:
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_LIBRARY):
            kept.append(tb)
        tb = tb.tb_next
    rebuilt = None
    for entry in reversed(kept):
        rebuilt = TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


def _ranks(failures) -> str:
    return ", ".join(str(f.rank) for f in sorted(failures, key=lambda f: f.rank))


def _rebuild(failures, outputs, world_size, timed_out, note="", results=None, diagnosis=""):
    return DistributedRunError(failures, outputs, world_size, timed_out, note, results or {}, diagnosis)
