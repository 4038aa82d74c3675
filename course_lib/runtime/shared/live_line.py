"""A line redrawn in place, where the caller's output goes: a progress bar relayed from a rank.

In a Jupyter kernel, a display updated in place (whatever output follows it); in a terminal, "\\r".
"""
import sys


def live_line_for(stream):
    """How a line can be redrawn in place where `stream` goes, or None where it cannot."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if getattr(shell, "kernel", None) is not None and hasattr(stream, "pub_thread"):
        # the cell's own output in a Jupyter kernel (JupyterLab, Notebook, VS Code, nbclient, nbval)
        return DisplayedLine()
    try:
        return TerminalLine(stream) if stream.isatty() else None
    except (AttributeError, ValueError):
        return None


class DisplayedLine:
    """In a notebook: one text output, updated in place, whatever other output comes after it."""

    def __init__(self):
        self.handle = None

    def show(self, text: str) -> None:
        from IPython.display import display

        data = {"text/plain": text}
        if self.handle is None:
            self.handle = display(data, raw=True, display_id=True)
        else:
            self.handle.update(data, raw=True)

    def end(self, text: str) -> None:
        self.show(text)

    def write_around(self, target, text: str) -> None:
        target.write(text)
        target.flush()


class TerminalLine:
    """In a terminal: the line redrawn with "\\r"; other lines are written above it."""

    def __init__(self, stream):
        self.stream, self.shown = stream, ""

    def show(self, text: str) -> None:
        self.stream.write("\r" + text + " " * max(0, len(self.shown) - len(text)))
        self.stream.flush()
        self.shown = text

    def end(self, text: str) -> None:
        self.show(text)
        self.stream.write("\n")
        self.stream.flush()
        self.shown = ""

    def write_around(self, target, text: str) -> None:
        shown = self.shown
        if shown:
            self.stream.write("\r" + " " * len(shown) + "\r")
            self.stream.flush()
        target.write(text)
        target.flush()
        if shown:
            self.stream.write(shown)
            self.stream.flush()
