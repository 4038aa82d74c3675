"""What the launcher and a rank say to each other: the rank's spec and pipes, the message kinds
on its messages pipe, and the one shape of an error record.

A rank sends (kind, payload) tuples, each a channel frame:

    OK          payload: what the job returned (a session's rank: "ready" first, then each reply)
    ERROR       payload: an error record (below); the rank's job failed in that phase
    RENDEZVOUS  payload: where the user's own init_process_group meets (a note on the way)
    EXITING     payload: {"step": ..., "when": ...}, what the rank does after its reply
    COLLECTIVES payload: the collectives the rank recorded (rank.collective_log.records()), a note
                sent before each result or error and whenever the launcher asks (SIGUSR2)
"""
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

OK, ERROR, RENDEZVOUS, EXITING, COLLECTIVES = "ok", "error", "rendezvous", "exiting", "collectives"

# torch's flight recorder keeps this many collectives per rank when the variable is set (0: none)
RECORDER_ENV, RECORDER_ENTRIES = "TORCH_FR_BUFFER_SIZE", 64


@dataclass
class RankSpec:
    """Everything a rank needs to know, fixed by the launcher before it starts."""

    rank: int
    world_size: int
    backend: str
    init_process_group: bool
    threads: int
    parent_pid: int
    env: Dict[str, str] = field(default_factory=dict)
    sys_path: list = field(default_factory=list)
    job: Any = None                # a callable job(spec, pipes); None: sent later on the control pipe
    pg_timeout_s: Optional[float] = None
    record_collectives: bool = True  # send the collectives torch records (the hang diagnosis)
    last_call_path: str = ""         # where the rank writes the collective it is in (rank.last_call)


@dataclass
class RankPipes:
    """The rank's ends of its pipes (file descriptor numbers)."""

    stdout: int
    stderr: int
    messages: int    # rank -> launcher: results and errors
    control: int     # launcher -> rank: the job (spawn) and session commands
    stacks: int      # rank -> launcher: faulthandler's stack dumps on SIGUSR1


def error_record(phase: str, summary: str, traceback: str = "") -> dict:
    """An error as plain data (the launcher may not be able to unpickle the exception itself)."""
    return {"phase": phase, "summary": summary, "traceback": traceback, "when": time.time()}


def unpicklable_result(rank: int, value: Any, exc: BaseException) -> str:
    """What to say when a rank's return value cannot travel back to the launcher."""
    return (f"TypeError: rank {rank} returned a {type(value).__name__} that cannot be pickled "
            f"({type(exc).__name__}: {exc}); return tensors, numbers, strings or containers of them")
