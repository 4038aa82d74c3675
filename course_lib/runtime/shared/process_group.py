"""Signal a process and everything it started: its process group, where it leads one."""
import os
import signal


def signal_group(pid: int, sig: int = signal.SIGKILL) -> bool:
    """Send `sig` to the process group `pid` leads, or to `pid` alone where it leads none (or on a
    system without process groups). False when the process is gone already."""
    for kill in ((os.killpg, os.kill) if hasattr(os, "killpg") else (os.kill,)):
        try:
            kill(pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            continue
    return False
