"""The sandbox a submission is graded in: bubblewrap (bwrap) around one process tree, with Python and
course_lib read-only, a private folder, no network, an empty environment and resource limits.

Inside, sandbox_entry.py sets the limits and (when bwrap ran as root) drops to a uid of the
sandbox's own before the grading module starts; nothing the tree starts outlives the sandbox.
"""
import functools
import os
import secrets
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

GiB = 2**30
FOLDER = "/learner"              # the private folder: the working directory, HOME and TMPDIR in it
HOME, TMPDIR = f"{FOLDER}/.home", f"{FOLDER}/.tmp"
RECORD = f"{FOLDER}/.record/checks.pt"  # the checks' record (checks/engine/record.py), copied out
GRADING = "/grading"             # read-only: what is copied in (in/), the grader's own files
HOSTNAME = "grading"
PYTHON = os.path.normpath(os.path.abspath(sys.executable))  # no `..` through folders not bound
UIDS = range(3_000_000, 4_000_000)  # as root, each sandbox runs as a uid of its own from these
SYSTEM_FOLDERS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
SYSTEM_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime")
INSTALL = ("install bubblewrap: `sudo apt install bubblewrap` (Debian, Ubuntu), `sudo dnf install "
           "bubblewrap` (Fedora), `sudo zypper install bubblewrap` (openSUSE)")
TOO_OLD = ("this bubblewrap is older than 0.8 (`bwrap --version`): install 0.8 or later, from "
           "your distribution's backports or https://github.com/containers/bubblewrap")
NAMESPACES_OFF = (
    "bwrap could not create namespaces: as a user other than root it needs unprivileged user "
    "namespaces (`sysctl user.max_user_namespaces` above 0; on Ubuntu 23.10 and later "
    "`sysctl kernel.apparmor_restrict_unprivileged_userns=0` or an AppArmor profile for bwrap; in "
    "a container, one started with user namespaces allowed), or run the grading as root")

ONLY_ROOT = ("this user namespace maps no uid but root's, so a submission could not run as another "
             "user: grade as a user other than root, or where more uids are mapped")


def _default_processes() -> int:
    return 256 + 16 * (os.cpu_count() or 1)  # each process counts its threads (torch: a core each)


@dataclass(frozen=True)
class Limits:
    """What one submission may use. Per process: memory (its heap and private mappings, what
    RLIMIT_DATA counts) and CPU seconds; for the whole sandbox: processes and threads together,
    and what each of its writable folders (its own, /tmp, /dev/shm: memory) may hold, and so the
    largest file it writes."""

    memory_bytes: int = 2 * GiB
    cpu_seconds: int = 3600
    processes: int = field(default_factory=_default_processes)
    file_bytes: int = 1 * GiB


@functools.lru_cache(maxsize=1)
def why_unavailable() -> str:
    """'' when a sandbox starts here; else what is missing and what to install, in one message."""
    if not sys.platform.startswith("linux"):
        return f"grading in a sandbox needs Linux and bubblewrap; this is {sys.platform}"
    if shutil.which("bwrap") is None:
        return f"bubblewrap (bwrap) is not installed: {INSTALL}"
    if os.geteuid() == 0 and not _switchable_uids():
        return ONLY_ROOT
    with tempfile.TemporaryDirectory(prefix="course-sandbox-probe-") as inputs, \
            Sandbox(Limits(), Path(inputs)) as box:
        probe = subprocess.run(box.command("platform"), capture_output=True, text=True,
                               pass_fds=box.pass_fds, timeout=60, check=False)
    if probe.returncode == 0:
        return ""
    said = (probe.stderr or probe.stdout).strip()[-600:]
    advice = (TOO_OLD if "nknown option" in said else
              NAMESPACES_OFF if "namespace" in said or "uid map" in said else "")
    return f"bwrap could not start a sandbox ({said})" + (f"; {advice}" if advice else "")


class Sandbox:
    """One sealed run: a scratch folder for what the sandbox reads, and the bwrap command that
    starts a Python module inside with `limits`; `inputs`' files are copied into its private
    folder; `readable` {path inside: path here} files are bound read-only under GRADING."""

    def __init__(self, limits: Limits, inputs: Path, readable: dict = None, env: dict = None):
        self.limits, self.inputs = limits, Path(inputs)
        self.readable, self.env = dict(readable or {}), dict(env or {})
        self.as_root = os.geteuid() == 0
        uids = _switchable_uids() if self.as_root else [os.getuid()]
        if not uids:
            raise RuntimeError(ONLY_ROOT)
        self.uid = uids[secrets.randbelow(len(uids))]

    def __enter__(self):
        self._scratch = tempfile.TemporaryDirectory(prefix="course-sandbox-")
        self.scratch = Path(self._scratch.name)
        self._result = tempfile.TemporaryFile(dir=self.scratch)
        self._record = tempfile.TemporaryFile(dir=self.scratch)
        self.pass_fds = (self._result.fileno(), self._record.fileno())
        self._write_system_files()
        for folder in (self.inputs, *self.readable.values()):
            _let_all_read(Path(folder))
        return self

    def __exit__(self, *exc):
        self._result.close()
        self._record.close()
        self._scratch.cleanup()

    def result(self) -> bytes:
        """What the module wrote to the path `{result}` stood for in its arguments."""
        self._result.seek(0)
        return self._result.read()

    def record(self) -> bytes:
        """What the kernel left at RECORD (b"" if nothing), copied out as the sandbox ended."""
        self._record.seek(0)
        return self._record.read()

    def command(self, module: str, *arguments) -> list:
        """bwrap, then sandbox_entry, then `python -m module arguments` in the entry's process;
        `{result}` in `arguments` is a file the host reads back with result()."""
        limits = self.limits
        entry = [PYTHON, "-I", "-m", "course_lib.authoring.sandbox_entry",
                 "--uid", str(self.uid), "--memory", str(limits.memory_bytes),
                 "--cpu", str(limits.cpu_seconds), "--processes", str(limits.processes),
                 "--file-bytes", str(limits.file_bytes), "--inputs", f"{GRADING}/in",
                 "--result-fd", str(self.pass_fds[0]),
                 "--record", RECORD, "--record-fd", str(self.pass_fds[1]),
                 *[item for folder in (FOLDER, "/tmp", "/dev/shm") for item in ("--folder", folder)],
                 *[item for folder in (HOME, TMPDIR, os.path.dirname(RECORD))
                   for item in ("--make", folder)]]
        # the fresh folders first: a Python under /tmp is bound into the sandbox's own /tmp
        mounts = [*self._fresh_folders(), *self._system(), *self._python(), *self._grading()]
        return ["bwrap", *self._namespaces(), *_with_parents(mounts), *self._environment(),
                "--chdir", "/", "--", *entry, "--", module, *arguments]

    def _namespaces(self) -> list:
        user = [] if self.as_root else ["--unshare-user", "--disable-userns"]
        return [*user, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                "--hostname", HOSTNAME, "--die-with-parent", "--new-session"]

    def _system(self) -> list:
        mounts = [("--ro-bind", "/usr", "/usr")]
        for name in SYSTEM_FOLDERS:
            path = Path("/", name)
            if path.is_symlink():
                mounts.append(("--symlink", os.readlink(path), str(path)))
            elif path.is_dir():
                mounts.append(("--ro-bind", str(path), str(path)))
        mounts += [("--ro-bind-try", f"/etc/{name}", f"/etc/{name}") for name in SYSTEM_FILES]
        return mounts + [("--ro-bind", str(self.scratch / "etc" / name), f"/etc/{name}")
                         for name in ("passwd", "group", "hosts", "nsswitch.conf")]

    def _python(self) -> list:
        """This Python (its prefixes, site-packages) and course_lib's folder, read-only, at the
        same paths (the folders above them hold nothing else)."""
        import course_lib

        wanted = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                  *site.getsitepackages(), sysconfig.get_paths()["purelib"],
                  sysconfig.get_paths()["platlib"], os.path.dirname(os.path.realpath(sys.executable)),
                  os.path.dirname(os.path.realpath(course_lib.__file__))}
        system = ["/usr", *(f"/{name}" for name in SYSTEM_FOLDERS)]
        kept = []
        for path in sorted(map(os.path.realpath, wanted), key=len):
            if os.path.isdir(path) and not any(_inside(path, top) for top in system + kept):
                kept.append(path)
        return [("--ro-bind", path, path) for path in kept]

    def _fresh_folders(self) -> list:
        size = str(self.limits.file_bytes)
        return [("--proc", "/proc"), ("--dev", "/dev")] + [
            ("--perms", mode, "--size", size, "--tmpfs", path)
            for path, mode in (("/dev/shm", "1777"), ("/tmp", "1777"), (FOLDER, "0700"))]

    def _grading(self) -> list:
        return [("--ro-bind", str(self.inputs), f"{GRADING}/in")] + [
            ("--ro-bind", str(here), f"{GRADING}/{inside}") for inside, here in self.readable.items()]

    def _environment(self) -> list:
        env = {"PATH": f"{os.path.dirname(PYTHON)}:/usr/local/bin:/usr/bin:/bin",
               "HOME": HOME, "TMPDIR": TMPDIR, "LANG": "C.UTF-8", "USER": "learner",
               "JUPYTER_PLATFORM_DIRS": "1", "JUPYTER_CONFIG_DIR": f"{HOME}/.jupyter",
               "JUPYTER_DATA_DIR": f"{HOME}/.local/share/jupyter",
               "JUPYTER_RUNTIME_DIR": f"{HOME}/.local/share/jupyter/runtime",
               "IPYTHONDIR": f"{HOME}/.ipython", "MPLCONFIGDIR": f"{HOME}/.config/matplotlib",
               "MPLBACKEND": "agg", "XDG_CACHE_HOME": f"{HOME}/.cache",
               "XDG_CONFIG_HOME": f"{HOME}/.config", "PYDEVD_DISABLE_FILE_VALIDATION": "1",
               **self.env}
        return ["--clearenv", *[item for name, value in env.items()
                                for item in ("--setenv", name, str(value))]]

    def _write_system_files(self) -> None:
        """/etc's few files a process looks itself up in: one user, loopback only."""
        etc = self.scratch / "etc"
        etc.mkdir()
        uid = self.uid
        (etc / "passwd").write_text(f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
                                    f"learner:x:{uid}:{uid}:learner:{HOME}:/bin/sh\n")
        (etc / "group").write_text(f"root:x:0:\nlearner:x:{uid}:\n")
        (etc / "hosts").write_text(f"127.0.0.1 localhost {HOSTNAME}\n::1 localhost ip6-localhost\n")
        (etc / "nsswitch.conf").write_text("passwd: files\ngroup: files\nhosts: files\n")


def _with_parents(mounts) -> list:
    """The mounts (each a tuple ending with its mount point), each after the folders above its
    point: bwrap would make those itself, readable by root alone, and a uid other than root must
    reach a Python under /root."""
    made, points, options = set(), {mount[-1] for mount in mounts}, []
    for mount in mounts:
        for parent in reversed(Path(mount[-1]).parents):
            if str(parent) not in made | points | {"/"}:
                options += ["--perms", "0755", "--dir", str(parent)]
                made.add(str(parent))
        options += mount
    return options


def _let_all_read(folder: Path) -> None:
    """The sandbox's uid reads what is bound in through the files' own modes."""
    for path in (folder, *folder.rglob("*")):
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o444 | (0o111 if path.is_dir() else 0))


def _switchable_uids() -> range:
    """UIDS where this user namespace maps them (the machine's own does); in one that maps fewer
    (a rootless container's), the top of its range below 65534 (nobody)."""
    with open("/proc/self/uid_map") as uid_map:
        spans = [tuple(map(int, line.split())) for line in uid_map if line.strip()]
    if any(first <= UIDS.start and UIDS.stop <= first + count for first, _, count in spans):
        return UIDS
    top = min(65534, max(first + count for first, _, count in spans))
    return range(max(1000, top - 10000), top)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")
