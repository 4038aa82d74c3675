"""Paths the runtime derives from the package: the library frames a learner's traceback leaves out,
and the folder a spawned rank imports course_lib from.
"""
import shutil
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path

import pytest

import course_lib
from course_lib.runtime.shared.errors import _without_library_frames

PACKAGE = Path(course_lib.__file__).resolve().parent


def _raise_from(path: Path):
    """An error raised in a function whose code says it lives at `path` (as a module there would)."""
    namespace = {}
    exec(compile("def library_function():\n    raise ValueError('inside')\n", str(path), "exec"), namespace)
    try:
        namespace["library_function"]()
    except ValueError as error:
        return error


@pytest.mark.parametrize("layer", ["runtime", "training", "topics", "checks", "authoring"])
def test_a_learners_traceback_leaves_out_every_layer_of_course_lib(layer):
    error = _raise_from(PACKAGE / layer / "probe.py")
    kept = [frame.filename for frame in traceback.extract_tb(_without_library_frames(error.__traceback__))]
    assert kept == [__file__], f"frames of course_lib/{layer}/ shown to the learner: {kept}"


def test_a_file_beside_course_lib_is_the_learners_and_stays():
    error = _raise_from(PACKAGE.parent / "course_lib_notes.py")  # not inside course_lib/
    kept = [frame.filename for frame in traceback.extract_tb(_without_library_frames(error.__traceback__))]
    assert kept == [__file__, str(PACKAGE.parent / "course_lib_notes.py")]


RANK_SEES = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])  # this checkout's course_lib, not the installed one
    import course_lib
    from course_lib import launch

    def where_course_lib_is():
        import course_lib
        return course_lib.__file__

    print(course_lib.__file__)
    print(launch(where_course_lib_is, nprocs=1, start_method="spawn", init_process_group=False,
                 timeout=120, output="none")[0])
""")


@pytest.mark.timeout(240)
def test_a_spawned_rank_imports_the_course_lib_that_launched_it(tmp_path):
    # A second copy of the package, as in a learner's clone beside an installed course_lib: the
    # rank must find the launcher's copy on its PYTHONPATH, not whatever is installed.
    checkout = tmp_path / "checkout"
    shutil.copytree(PACKAGE, checkout / "course_lib", ignore=shutil.ignore_patterns("__pycache__"))
    script = tmp_path / "run.py"
    script.write_text(RANK_SEES)
    done = subprocess.run([sys.executable, str(script), str(checkout)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    parent, rank = done.stdout.split()[-2:]
    assert parent == str(checkout / "course_lib" / "__init__.py")
    assert rank == parent, f"the spawned rank imported {rank}, its launcher {parent}"
