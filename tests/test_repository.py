"""What a fresh clone downloads: small files only, and nothing built."""
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LARGEST_FILE = 1024 * 1024  # notebooks with stored outputs included: keep them small
BUILT = (".whl", ".tar.gz", ".so", ".egg", ".pyc")


def tracked_files():
    try:
        listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in listing.stdout.decode().split("\0") if name]


def test_no_tracked_file_is_over_1_mib():
    large = {str(path.relative_to(ROOT)): path.stat().st_size
             for path in tracked_files() if path.exists() and path.stat().st_size > LARGEST_FILE}
    assert not large, f"tracked files over 1 MiB (a fresh clone downloads each): {large}"


def test_no_build_artefact_is_tracked():
    built = [str(path.relative_to(ROOT)) for path in tracked_files() if path.name.endswith(BUILT)]
    assert not built, f"build artefacts are tracked (install them from the registry instead): {built}"


def test_binder_asks_for_the_torch_that_pyproject_declares():
    import tomllib

    declared = [dep for dep in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
                if dep.replace(" ", "").startswith("torch>")]
    binder = [line.strip() for line in (ROOT / "binder" / "requirements.txt").read_text().splitlines()
              if line.strip().startswith("torch")]
    assert len(declared) == 1 and binder == declared, f"binder {binder} vs pyproject {declared}"


def test_installing_the_course_turns_off_jupyterlabs_news_prompt():
    """`pip install .` puts the course's settings where JupyterLab reads defaults from."""
    import json
    import tomllib

    data_files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    settings = data_files["share/jupyter/lab/settings/overrides.d"]
    assert settings == ["jupyter/course-lib-settings.json"]
    notification = json.loads((ROOT / settings[0]).read_text())["@jupyterlab/apputils-extension:notification"]
    assert notification == {"fetchNews": "false", "checkForUpdates": False}
