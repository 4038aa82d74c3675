"""Keeping machine paths out of committed notebooks: outputs name no /root/, /home/, /tmp/...

Executed outputs (tracebacks, warnings, printed paths) are rewritten before a notebook is stored;
a traceback's terminal colours are taken out before its text is reported.
"""
import re
import site
import sys
import sysconfig
import tempfile
from pathlib import Path

# A notebook cell's code, as the kernel names it when it compiles the cell to a file.
KERNEL_CELL_FILE = re.compile(r"[^\s'\"]*/ipykernel_\d+/\d+\.py")
# Where machine paths hide in absolute form; reported by the tests when a notebook still has one.
MACHINE_PATH = re.compile(r"(/root/|/home/|/Users/|/tmp/|/work/|/private/var/|[A-Z]:\\Users\\)")
# A terminal colour code, as IPython colours a traceback (junit XML writes the escape as "#x1B")
ANSI_COLOR = re.compile(r"(?:\x1b|#x1B)\[[0-9;]*m")


def machine_paths(root: Path) -> list:
    """(path, replacement) pairs, longest path first so the most specific one wins."""
    pairs = {str(Path(root).resolve()): ".", str(Path.home()): "~"}
    for folder in {*site.getsitepackages(), site.getusersitepackages(),
                   sysconfig.get_paths()["purelib"], sysconfig.get_paths()["stdlib"]}:
        pairs[folder] = "<python>"
    pairs[sys.prefix] = pairs[sys.base_prefix] = "<python>"
    pairs[tempfile.gettempdir()] = "<tmp>"
    return sorted(pairs.items(), key=lambda pair: -len(pair[0]))


def scrub_text(text: str, root: Path) -> str:
    text = KERNEL_CELL_FILE.sub("<notebook cell>", text)
    for path, replacement in machine_paths(root):
        text = text.replace(path, replacement)
    return text


def uncolored(text: str) -> str:
    """`text` without its terminal colour codes."""
    return ANSI_COLOR.sub("", text)


def scrub_outputs(nb, root: Path):
    """Rewrite machine paths in every text output of `nb`, in place; images are left alone."""
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            _scrub_mapping(output, root)
    return nb


def _scrub_mapping(mapping, root: Path) -> None:
    for key, value in mapping.items():
        if key.startswith("image/"):
            continue
        if isinstance(value, str):
            mapping[key] = scrub_text(value, root)
        elif isinstance(value, list):
            mapping[key] = [scrub_text(item, root) if isinstance(item, str) else item
                            for item in value]
        elif isinstance(value, dict):
            _scrub_mapping(value, root)


def paths_left(nb) -> list:
    """The machine paths still in `nb`'s outputs, as 'cell N: path' lines; [] when clean."""
    found = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            for match in MACHINE_PATH.finditer(_text_of(output)):
                found.append(f"cell {index}: {match.group(0)}")
    return found


def _text_of(output) -> str:
    data = {kind: value for kind, value in output.get("data", {}).items()
            if not kind.startswith("image/")}
    return str({**output, "data": data})
