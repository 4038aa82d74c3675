"""Each rank's output, relayed to the caller as whole lines labelled with the rank.

Lines are written through the caller's *current* sys.stdout/sys.stderr, so they show in JupyterLab,
nbclient, nbval and scripts alike; a progress bar's carriage-return redraws become occasional lines.
"""
import codecs
import sys
import time
from collections import deque

OUTPUT_MODES = ("all", "rank0", "none")


class OutputRelay:
    def __init__(self, mode: str = "all", keep_lines: int = 200, redraw_every: float = 2.0):
        if mode not in OUTPUT_MODES:
            raise ValueError(f"output={mode!r}: choose one of {', '.join(map(repr, OUTPUT_MODES))}")
        self.mode = mode
        self.keep_lines = keep_lines
        self.redraw_every = redraw_every
        self._decoders = {}
        self._pending = {}      # (rank, stream) -> text not yet ended by a newline
        self._redraw = {}       # (rank, stream) -> (latest redraw text, time last shown)
        self.lines = {}         # rank -> deque of its last lines, whatever the mode

    def shows(self, rank: int) -> bool:
        return self.mode == "all" or (self.mode == "rank0" and rank == 0)

    def feed(self, rank: int, stream: str, data: bytes) -> None:
        key = (rank, stream)
        decoder = self._decoders.setdefault(key, codecs.getincrementaldecoder("utf-8")("replace"))
        text = self._pending.pop(key, "") + decoder.decode(data)
        out = []
        while text:
            newline, carriage = text.find("\n"), text.find("\r")
            if newline < 0 and carriage < 0:
                break
            if carriage >= 0 and (newline < 0 or carriage < newline):
                if carriage == len(text) - 1:
                    break  # wait: a "\r\n" may be split across reads
                if text[carriage + 1] == "\n":
                    out.append(text[:carriage])
                    self._redraw.pop(key, None)
                    text = text[carriage + 2:]
                else:
                    self._note_redraw(key, text[:carriage], out)
                    text = text[carriage + 1:]
                continue
            out.append(text[:newline])
            self._redraw.pop(key, None)
            text = text[newline + 1:]
        if text:
            self._pending[key] = text
        self._emit(rank, stream, out)

    def _note_redraw(self, key, text, out) -> None:
        """A progress bar redraws its line with "\\r": show its state at most every few seconds."""
        if not text.strip():
            return
        _, last_shown = self._redraw.get(key, ("", 0.0))
        now = time.monotonic()
        if now - last_shown >= self.redraw_every:
            out.append(text)
            self._redraw[key] = ("", now)
        else:
            self._redraw[key] = (text, last_shown)

    def flush(self) -> None:
        """End of the run: show what is left (unfinished lines, a bar's last state)."""
        for (rank, stream), (text, _) in list(self._redraw.items()):
            if text and not self._pending.get((rank, stream), "").strip():
                self._emit(rank, stream, [text])
        self._redraw.clear()
        for (rank, stream), text in list(self._pending.items()):
            self._emit(rank, stream, [text.rstrip("\r")])
        self._pending.clear()

    def _emit(self, rank: int, stream: str, lines) -> None:
        if not lines:
            return
        kept = self.lines.setdefault(rank, deque(maxlen=self.keep_lines))
        kept.extend(lines)
        if self.shows(rank):
            target = sys.stderr if stream == "stderr" else sys.stdout
            target.write("".join(f"[rank{rank}] {line}\n" for line in lines))
            target.flush()

    def outputs(self) -> dict:
        return {rank: list(lines) for rank, lines in sorted(self.lines.items())}
