"""Each rank's output, relayed to the caller as whole lines labelled with the rank.

Lines are written through the caller's *current* sys.stdout/sys.stderr, so they show in JupyterLab,
nbclient, nbval and scripts alike. A progress bar (a line redrawn with "\\r") shows live as one
updating line: a display updated in place in a notebook, the line itself in a terminal; elsewhere
(a file, a captured stream) its state becomes an occasional line.
"""
import codecs
import re
import sys
import time
from collections import deque
from typing import Callable

from .live_line import live_line_for

OUTPUT_MODES = ("all", "rank0", "none")
# Lines libraries print that say nothing to a learner, from any rank: what PyTorch's profiler
# (kineto) prints on every start and stop, and gloo's connection report at every
# init_process_group (printed by torch 2.8, not by 2.13).
NOISE = re.compile(r"^USDT:\S+ \S+ \d+:\d+ \w+\.cpp:\d+\] profiler_\w+$"
                   r"|^\[Gloo\] Rank \d+ is connected to \d+ peer ranks\. "
                   r"Expected number of connected peer ranks is : \d+$")


class OutputRelay:
    def __init__(self, mode: str = "all", keep_lines: int = 200, redraw_every: float = 2.0,
                 live_every: float = 0.1, clock: Callable[[], float] = time.monotonic):
        if mode not in OUTPUT_MODES:
            raise ValueError(f"output={mode!r}: choose one of {', '.join(map(repr, OUTPUT_MODES))}")
        self.mode = mode
        self.keep_lines = keep_lines
        self.redraw_every = redraw_every    # a redrawn line not shown live: one line this often
        self.live_every = live_every        # the live line: updated at most this often
        self.clock = clock                  # any start: only differences of its readings count
        self._decoders = {}
        self._pending = {}      # (rank, stream) -> text of the current line not yet ended or redrawn
        self._redrawn = {}      # (rank, stream) -> (its latest state, time last shown as a line or None)
        self._live = None       # the one redrawn line shown in place
        self.lines = {}         # rank -> deque of its last lines, whatever the mode

    def shows(self, rank: int) -> bool:
        return self.mode == "all" or (self.mode == "rank0" and rank == 0)

    def feed(self, rank: int, stream: str, data: bytes) -> None:
        key = (rank, stream)
        decoder = self._decoders.setdefault(key, codecs.getincrementaldecoder("utf-8")("replace"))
        text = self._pending.pop(key, "") + decoder.decode(data)
        while text:
            newline, carriage = text.find("\n"), text.find("\r")
            if newline < 0 and carriage < 0:
                break
            if carriage >= 0 and (newline < 0 or carriage < newline):
                if carriage == len(text) - 1:
                    break  # wait: a "\r\n" may be split across reads
                if text[carriage + 1] == "\n":
                    self._end_line(key, text[:carriage])
                    text = text[carriage + 2:]
                else:
                    self._redraw(key, text[:carriage])
                    text = text[carriage + 1:]
                continue
            self._end_line(key, text[:newline])
            text = text[newline + 1:]
        if text:
            self._pending[key] = text
            if key in self._redrawn and text.strip("\r").strip():
                self._show_live(key, text.rstrip("\r"))  # a bar writes "\r" first: this is its state now

    def _redraw(self, key, text: str) -> None:
        """The line was redrawn ("\\r"): show it live, or its state at most every few seconds."""
        if not text.strip():
            self._redrawn.setdefault(key, ("", None))
            return
        _, last_shown = self._redrawn.get(key, ("", None))
        if self._show_live(key, text):
            self._redrawn[key] = (text, last_shown)
            return
        now = self.clock()
        if last_shown is None or now - last_shown >= self.redraw_every:
            self._emit(*key, [text])
            self._redrawn[key] = ("", now)
        else:
            self._redrawn[key] = (text, last_shown)

    def _show_live(self, key, text: str) -> bool:
        rank, stream = key
        if not self.shows(rank):
            return False
        if self._live is None:
            line = live_line_for(sys.stderr if stream == "stderr" else sys.stdout)
            if line is None:
                return False
            self._live = _Live(key, line, self.clock)
        if self._live.key != key:
            return False  # one live line at a time; other bars show as occasional lines
        self._live.set(f"[rank{rank}] {text}", self.live_every)
        return True

    def tick(self) -> None:
        """Called between reads: show the live line's latest state once it is due."""
        if self._live is not None:
            self._live.set(self._live.latest, self.live_every)

    def _end_line(self, key, text: str) -> None:
        self._redrawn.pop(key, None)
        if self._live is not None and self._live.key == key:
            if not text.strip():  # the bar cleared itself: its last state stays
                text = self._live.latest.split("] ", 1)[-1]
            self._keep(key[0], [text])
            self._live.end(f"[rank{key[0]}] {text}")
            self._live = None
            return
        self._emit(*key, [text])

    def end_live(self) -> None:
        """A cell ends (a session's command): its live line stays as it is; the next starts anew."""
        if self._live is not None:
            self._live.end(self._live.latest)
            self._live = None

    def flush(self) -> None:
        """End of the run: show what is left (unfinished lines, a bar's last state)."""
        for key, (text, _) in list(self._redrawn.items()):
            if text and not self._pending.get(key, "").strip():
                self._end_line(key, text)
        self._redrawn.clear()
        for key, text in list(self._pending.items()):
            self._end_line(key, text.rstrip("\r"))
        self._pending.clear()
        self.end_live()

    def _keep(self, rank: int, lines) -> None:
        self.lines.setdefault(rank, deque(maxlen=self.keep_lines)).extend(lines)

    def _emit(self, rank: int, stream: str, lines) -> None:
        lines = [line for line in lines if NOISE.match(line) is None]
        if not lines:
            return
        self._keep(rank, lines)
        if self.shows(rank):
            target = sys.stderr if stream == "stderr" else sys.stdout
            text = "".join(f"[rank{rank}] {line}\n" for line in lines)
            if self._live is not None:
                self._live.line.write_around(target, text)
            else:
                target.write(text)
                target.flush()

    def outputs(self) -> dict:
        return {rank: list(lines) for rank, lines in sorted(self.lines.items())}


class _Live:
    """The live line's state: whose it is, what it shows, what it should show next."""

    def __init__(self, key, line, clock: Callable[[], float]):
        self.key, self.line, self.clock = key, line, clock
        self.latest = self.shown = ""
        self.shown_at = None  # never shown yet, whatever the clock reads

    def set(self, text: str, every: float) -> None:
        self.latest = text
        now = self.clock()
        if text != self.shown and (self.shown_at is None or now - self.shown_at >= every):
            self.line.show(text)
            self.shown, self.shown_at = text, now

    def end(self, text: str) -> None:
        self.line.end(text)
