"""The nbval sanitize rules: what may differ between a check cell's stored and fresh output.

Shipped in the package so `check` works from an install; tests/sanitize.cfg is this, rendered.
"""
from pathlib import Path

# (name, regex, replacement): numbers that vary from run to run or machine to machine.
RULES = [
    ("kernel_cell_file", r"[^\s'\"]*/ipykernel_\d+/\d+\.py", "<notebook cell>"),
    ("memory_address", r"0x[0-9a-fA-F]{6,}", "0xADDRESS"),
    ("duration", r"\b\d+(\.\d+)?\s?(ns|us|µs|ms|s|sec|seconds)\b", "DURATION"),
    ("process_id", r"\bpid[ =:]?\d+", "pid PID"),
    ("port", r"\bport[ =:]?\d+", "port PORT"),
]


def render() -> str:
    """The rules in nbval's sanitize file format."""
    blocks = [f"[{name}]\nregex: {regex}\nreplace: {replacement}\n" for name, regex, replacement in RULES]
    return "\n".join(blocks)


def write_sanitize_file(folder: Path) -> Path:
    """Write the rules into `folder` for `--nbval-sanitize-with`; returns the file's path."""
    path = Path(folder) / "sanitize.cfg"
    path.write_text(render(), encoding="utf-8")
    return path
