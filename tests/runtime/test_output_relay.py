"""OutputRelay on its own: labelled lines, a progress bar redrawn in place in a terminal, profiler noise."""
import contextlib
import io

import pytest

from course_lib.runtime.shared.output import OutputRelay

# The monotonic clock starts near zero at boot: a machine up for seconds must behave like one up
# for days. Each clock below stands still unless a test moves it.
CLOCK_STARTS = pytest.mark.parametrize("clock_start", [0.0, 1e6], ids=["just-booted", "up-for-days"])


class Clock:
    def __init__(self, start: float):
        self.now = start

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


def _relay_into(stream, **options):
    relay = OutputRelay(live_every=0.0, **options)
    return relay, contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream)


def test_a_bar_is_one_line_redrawn_in_a_terminal_with_other_lines_above_it():
    terminal = Terminal()
    relay, out, err = _relay_into(terminal)
    with out, err:
        relay.feed(0, "stderr", b"\r 10%|#")
        relay.feed(0, "stderr", b"\r 50%|#####")
        relay.feed(1, "stdout", b"hello\n")
        relay.feed(0, "stderr", b"\r100%|##########\n")
        relay.flush()
    screen = _render(terminal.getvalue())
    assert screen == ["[rank1] hello", "[rank0] 100%|##########"], screen
    assert "\r[rank0]  50%|#####" in terminal.getvalue()  # it was shown live on its way
    assert relay.outputs() == {0: ["100%|##########"], 1: ["hello"]}  # an error shows the bar's end once


@CLOCK_STARTS
def test_without_a_terminal_a_bar_becomes_occasional_whole_lines(clock_start):
    captured, clock = io.StringIO(), Clock(clock_start)
    relay, out, err = _relay_into(captured, redraw_every=3600, clock=clock)
    with out, err:
        for percent in (10, 50, 90):
            relay.feed(0, "stderr", f"\r{percent}%".encode())
        clock.now += 3600
        relay.feed(0, "stderr", b"\r95%")
        relay.feed(0, "stderr", b"\r99%")
        relay.flush()
    # the first state at once, then one line per redraw_every, and the last state at the end
    assert captured.getvalue() == "[rank0] 10%\n[rank0] 90%\n[rank0] 99%\n"


@CLOCK_STARTS
def test_a_live_bar_shows_its_first_state_at_once_then_at_most_every_live_every(clock_start):
    terminal, clock = Terminal(), Clock(clock_start)
    relay = OutputRelay(live_every=1.0, clock=clock)
    with contextlib.redirect_stderr(terminal):
        relay.feed(0, "stderr", b"\r10%")
        relay.feed(0, "stderr", b"\r20%")   # within live_every of the first: not drawn yet
        shown_before_a_second = terminal.getvalue()
        clock.now += 1.0
        relay.tick()
    assert "[rank0] 10%" in shown_before_a_second and "20%" not in shown_before_a_second
    assert "[rank0] 20%" in terminal.getvalue()


def test_a_bar_of_a_second_rank_does_not_fight_for_the_live_line():
    terminal = Terminal()
    relay, out, err = _relay_into(terminal, redraw_every=3600)
    with out, err:
        relay.feed(0, "stderr", b"\rrank zero 10%")
        relay.feed(1, "stderr", b"\rrank one 10%\rrank one 20%")
        relay.feed(0, "stderr", b"\rrank zero 20%\n")
        relay.feed(1, "stderr", b"\n")
        relay.flush()
    screen = _render(terminal.getvalue())
    assert screen.count("[rank0] rank zero 20%") == 1 and not any("rank zero 10%" in line for line in screen)
    assert "[rank1] rank one 20%" in screen, screen


def test_library_noise_is_left_out_and_the_learners_own_lines_stay():
    captured = io.StringIO()
    relay, out, err = _relay_into(captured)
    with out, err:
        relay.feed(0, "stderr", b"USDT:2026-11-23 15:52:02 11388:11388 SyncActivityProfilerHandler.cpp:52] "
                                b"profiler_start\nstep 1\nUSDT: my own line\n")
        relay.feed(1, "stdout", b"[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of "
                                b"connected peer ranks is : 1\n[Gloo] my own line\n")
        relay.flush()
    assert captured.getvalue() == "[rank0] step 1\n[rank0] USDT: my own line\n[rank1] [Gloo] my own line\n"


def _render(text: str) -> list:
    """What a terminal shows: "\\r" goes back to the start of the line and overwrites it."""
    screen, line = [], []
    column = 0
    for char in text:
        if char == "\n":
            screen.append("".join(line).rstrip())
            line, column = [], 0
        elif char == "\r":
            column = 0
        else:
            if column < len(line):
                line[column] = char
            else:
                line.append(char)
            column += 1
    if "".join(line).strip():
        screen.append("".join(line).rstrip())
    return screen
