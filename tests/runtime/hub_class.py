"""A real JupyterHub on loopback for tests/runtime/test_jupyterhub.py: learners as Unix users the
test makes, the hub started from jupyter/jupyterhub_config.py by process id, and a learner's kernel
driven through the Jupyter server's REST and websocket API, as JupyterLab drives it."""
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from shlex import quote
from typing import Callable, Dict, List, Optional

import requests
import websocket

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "jupyter" / "jupyterhub_config.py"
TEST_CONFIG = """
load_subconfig({recipe!r})
c.JupyterHub.port = {port}
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.JupyterHub.db_url = "sqlite:///{folder}/hub.sqlite"
c.JupyterHub.cookie_secret_file = "{folder}/cookie_secret"
c.JupyterHub.pid_file = "{folder}/hub.pid"
c.ConfigurableHTTPProxy.pid_file = "{folder}/proxy.pid"
c.JupyterHub.authenticator_class = "dummy"  # the test's learners have no passwords
c.Authenticator.allow_all = False
c.Authenticator.allowed_users = {users!r}
c.JupyterHub.services = [{{"name": "course-test", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [{{"name": "course-test", "services": ["course-test"],
                            "scopes": ["admin:servers", "access:servers", "list:users", "read:users"]}}]
"""


CANNOT_REACH = 77


class CannotReach(RuntimeError):
    """Other users cannot reach this Python or the course (a folder closed to them)."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def closed_to_others(path: Path) -> Optional[Path]:
    """The highest folder on the way to `path` that other users cannot pass through (/root, 0700)."""
    for folder in [*reversed(path.parents), path]:
        if not os.stat(folder).st_mode & 0o001:
            return folder
    return None


def mounts_opening(paths: List[Path], stash: Path) -> List[str]:
    """Shell lines, for a private mount namespace, that let other users reach `paths` (the Python,
    the course) through a folder closed to them: a tmpfs of mode 0755 over that folder, with the
    folders on the way bound back in. The machine's own folders keep their modes."""
    lines, stashes = [], {}
    for path in paths:
        closed = closed_to_others(path)
        if closed is None or closed == path:
            continue
        if closed not in stashes:
            stashes[closed] = stash / str(len(stashes))
            lines += [f"mkdir -p {quote(str(stashes[closed]))}",
                      f"mount --bind {quote(str(closed))} {quote(str(stashes[closed]))}",
                      f"mount -t tmpfs -o mode=0755 course-test {quote(str(closed))}"]
        child = closed / path.relative_to(closed).parts[0]
        lines += [f"mkdir -p {quote(str(child))}",
                  f"mountpoint -q {quote(str(child))} || mount --bind {quote(str(stashes[closed] / child.name))} "
                  f"{quote(str(child))}"]
    return lines


class Learners:
    """Unix users made for the test (private homes, as the README's recipe says), removed after."""

    def __init__(self, count: int):
        self.names = [f"crs{os.getpid() % 100000}{letter}" for letter in "abcdefgh"[:count]]
        first = 2_100_000 + secrets.randbelow(100_000) * 10  # uids whose files are only this test's:
        self.uids, self.before = {}, set()
        try:
            for index, name in enumerate(self.names):
                subprocess.run(["useradd", "--create-home", "--key", "HOME_MODE=0700", "--shell", "/bin/sh",
                                "--uid", str(first + index), "--user-group", name], check=True, capture_output=True)
                self.uids[name] = pwd.getpwnam(name).pw_uid
            self.before = {path for paths in self.files().values() for path in paths} - {  # ... and so
                path for name in self.names for path in self.files(("/home",))[name]}  # that it checks
        except BaseException:
            self.remove()
            raise

    def processes(self) -> Dict[int, str]:
        """{pid: command line} of every process that runs as one of the learners."""
        found = {}
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid in self.uids.values():
                    found[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
        return found

    def files(self, folders=("/tmp", "/dev/shm", "/var/tmp", "/home")) -> Dict[str, List[str]]:
        """{learner: [paths]} of what each made in the shared folders (an entry it owns there, and
        all below it) and in its home."""
        owners = {uid: name for name, uid in self.uids.items()}
        found = {name: [] for name in self.names}
        for folder in folders:
            for entry in os.scandir(folder):
                try:
                    owner = owners.get(entry.stat(follow_symlinks=False).st_uid)
                except OSError:
                    continue
                if owner is None:
                    continue
                found[owner].append(entry.path)
                if entry.is_dir(follow_symlinks=False):
                    for here, dirs, names in os.walk(entry.path):
                        found[owner] += [os.path.join(here, name) for name in dirs + names]
        return {name: [path for path in paths if path not in self.before] for name, paths in found.items()}

    def remove(self) -> None:
        for pid in self.processes():  # none should be left: the test says so before this
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for paths in self.files(("/tmp", "/var/tmp", "/dev/shm")).values():  # torch's cache, say
            for path in sorted(paths, key=len):
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                elif os.path.lexists(path):
                    os.unlink(path)
        for name in self.names:  # userdel removes the homes
            subprocess.run(["userdel", "--remove", "--force", name], capture_output=True)


class Hub:
    """jupyterhub -f the recipe, in a mount namespace of its own, on free loopback ports."""

    def __init__(self, learners: Learners):
        self.folder = Path(tempfile.mkdtemp(prefix="course-hub-"))  # root's alone (0700)
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api = requests.Session()
        self.api.headers["Authorization"] = f"token {self.token}"
        self.process = self.log = None
        try:
            self._start(learners)
            self._wait(lambda: self.api.get(f"{self.url}/hub/api/", timeout=5).ok, 240, "the hub to answer")
        except BaseException:
            self.stop()
            raise

    def _start(self, learners: Learners) -> None:
        config = self.folder / "test_config.py"
        config.write_text(TEST_CONFIG.format(
            recipe=str(RECIPE), port=self.port, hub_port=free_port(), proxy_api_port=free_port(),
            folder=self.folder, users=set(learners.names), token=self.token))
        needed = [ROOT, Path(sys.prefix), Path(os.path.realpath(sys.executable)).parent]
        learner = learners.uids[learners.names[0]]
        can_learners_import = (f"setpriv --reuid={learner} --regid={learner} --clear-groups "
                               f"{sys.executable} -c 'import course_lib, jupyterhub' || exit {CANNOT_REACH}")
        level = os.environ.get("COURSE_HUB_LOG_LEVEL", "WARN")  # DEBUG shows each step and its time
        command = "; ".join(["set -e", *mounts_opening(needed, self.folder / "stash"), can_learners_import,
                             f"cd {self.folder}", f"exec {sys.executable} -m jupyterhub -f {config} --log-level={level}"])
        self.log = open(self.folder / "hub.log", "wb")
        self.process = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", command],
                                        stdout=self.log, stderr=subprocess.STDOUT)

    def _wait(self, ready: Callable[[], bool], seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() == CANNOT_REACH:
                raise CannotReach(f"a learner's user cannot import course_lib from {sys.executable}: "
                                  f"{self.said()}")
            if self.process.poll() is not None:
                raise RuntimeError(f"the hub exited ({self.process.returncode}): {self.said()}")
            try:
                if ready():
                    return
            except requests.RequestException:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"waited {seconds} s for {what}: {self.said()}")

    def said(self) -> str:
        self.log.flush()
        return (self.folder / "hub.log").read_text(errors="replace")[-3000:]

    def start_server(self, name: str) -> None:
        self.api.post(f"{self.url}/hub/api/users/{name}/server", timeout=30)

        def ready():
            server = self.api.get(f"{self.url}/hub/api/users/{name}", timeout=10).json()["servers"].get("", {})
            return server.get("ready", False)
        self._wait(ready, 150, f"{name}'s server")

    def kernel(self, name: str) -> "Kernel":
        return Kernel(self, name)

    def _stop_proxy_left(self) -> None:
        """The proxy, by the process id in its pid file, where the hub could not stop it."""
        try:
            pid = int((self.folder / "proxy.pid").read_text())
            if b"configurable-http-proxy" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            pass

    def stop(self) -> None:
        """Stop the hub by its process id: it stops the servers it started and its proxy."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._stop_proxy_left()
        if self.log is not None:
            self.log.close()
        if os.environ.get("COURSE_KEEP_HUB_LOG") and (self.folder / "hub.log").exists():
            print(f"the hub said:\n{(self.folder / 'hub.log').read_text(errors='replace')}")
        shutil.rmtree(self.folder, ignore_errors=True)


class Kernel:
    """A kernel in a learner's server, driven as JupyterLab does: REST for start, interrupt and
    restart; the websocket for execute requests and their output."""

    def __init__(self, hub: Hub, user: str):
        self.hub, self.user = hub, user
        self.base = f"{hub.url}/user/{user}/api/kernels"
        reply = hub.api.post(self.base, json={"name": "python3"}, timeout=60)
        reply.raise_for_status()
        self.id = reply.json()["id"]
        self.socket = None
        self._connect()

    def _connect(self) -> None:
        if self.socket is not None:
            self.socket.close()
        url = self.base.replace("http://", "ws://") + f"/{self.id}/channels?session_id={uuid.uuid4().hex}"
        self.socket = websocket.create_connection(url, header=[f"Authorization: token {self.hub.token}"],
                                                  timeout=120)

    def run(self, code: str, timeout: float = 120, when_printed: Optional[tuple] = None) -> dict:
        """Execute `code`; returns {"stdout", "stderr", "error" (the exception's name or None)}.
        when_printed=(text, action): call action() once `text` has been printed."""
        msg_id = uuid.uuid4().hex
        self.socket.send(json.dumps({
            "header": {"msg_id": msg_id, "username": self.user, "session": uuid.uuid4().hex,
                       "msg_type": "execute_request", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True}}))
        out = {"stdout": "", "stderr": "", "error": None, "traceback": ""}
        deadline = time.monotonic() + timeout
        while True:
            self.socket.settimeout(max(0.1, deadline - time.monotonic()))
            message = json.loads(self.socket.recv())
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                out[content["name"]] += content["text"]
                if when_printed and when_printed[0] in out["stdout"] + out["stderr"]:
                    when_printed[1]()
                    when_printed = None
            elif kind == "error":
                out["error"] = content["ename"]
                out["traceback"] = "\n".join(content["traceback"])
            elif kind == "status" and content["execution_state"] == "idle":
                return out

    def interrupt(self) -> None:
        self.hub.api.post(f"{self.base}/{self.id}/interrupt", timeout=30).raise_for_status()

    def restart(self) -> None:
        self.hub.api.post(f"{self.base}/{self.id}/restart", timeout=120).raise_for_status()
        self._connect()

    def shutdown(self) -> None:
        self.socket.close()
        self.hub.api.delete(f"{self.base}/{self.id}", timeout=60)
