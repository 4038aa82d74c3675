"""A real one-node SLURM for the tests: Debian's slurm-wlm and munge (`.ci/run` installs them),
configured in a temporary folder, its three daemons started as root and stopped by process id.

`slurm_cluster` (a fixture; import it in a test module) starts it once per session, the first time
a test asks, and skips with the reason where it cannot run: not root, or a package missing.
Partitions: `cpu` (the default; its jobs can be pre-empted and requeued) and `urgent` (a higher
priority tier, whose jobs pre-empt `cpu`'s). The clients find it through SLURM_CONF.
"""
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from course_lib.authoring.slurm_run import job_info
from course_lib.topics.cluster import free_port

PROGRAMS = ["munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "scancel", "sinfo"]
SLURM_CONF = """\
ClusterName=course
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it starts again (120 s by default; 5 is the least)
AuthInfo=socket={folder}/munge/munge.socket,cred_expire=5
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd.log
FirstJobId={first_job_id}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=10
MinJobAge=600
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
{node_line}
PartitionName=cpu Nodes={node} Default=YES MaxTime=10 State=UP PriorityTier=1
PartitionName=urgent Nodes={node} MaxTime=10 State=UP PriorityTier=2 PreemptMode=OFF
"""
_cluster = None


class LocalSlurm:
    """munged, slurmctld and slurmd for one node (this machine), in a folder of their own."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="course-slurm-"))
        self.folder.chmod(0o755)  # munged wants its socket's folders open to all
        self.node = resolvable_hostname()  # what `scontrol show hostnames` gives jobs
        self.conf = self.folder / "slurm.conf"
        self.daemons = []

    def start(self, timeout_s: float = 60) -> None:
        for name in ("state", "spool", "log", "munge", "key"):
            (self.folder / name).mkdir(mode=0o755)
        key = self.folder / "key" / "munge.key"
        (self.folder / "key").chmod(0o700)
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._start("munged", "-F", f"--key-file={key}", f"--socket={self.folder}/munge/munge.socket",
                    f"--pid-file={self.folder}/munge/munged.pid", f"--log-file={self.folder}/log/munged.log",
                    f"--seed-file={self.folder}/key/munged.seed")
        self._wait_for(lambda: (self.folder / "munge" / "munge.socket").exists(), "munged's socket", 20)
        self.conf.write_text(SLURM_CONF.format(
            folder=self.folder, ctld_port=free_port(), slurmd_port=free_port(), node=self.node,
            first_job_id=random.randrange(1000, 900000),  # MASTER_PORT=29500+id%1000 varies by session
            node_line=self._node_line()))
        os.environ["SLURM_CONF"] = str(self.conf)
        self._start("slurmctld", "-D", "-f", str(self.conf))
        self._start("slurmd", "-D", "-N", self.node, "-f", str(self.conf))
        self._wait_for(self._node_idle, "the node to be idle in sinfo", timeout_s)

    def _node_line(self) -> str:
        """This machine as `slurmd -C` sees it, with a memory SLURM can always grant."""
        found = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30).stdout
        fields = dict(part.split("=", 1) for part in found.split() if "=" in part)
        memory = min(int(fields.get("RealMemory", 2048)) // 2, 8192)
        keep = ["CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore"]
        hardware = " ".join(f"{name}={fields[name]}" for name in keep if name in fields)
        return (f"NodeName={self.node} NodeHostname={self.node} NodeAddr=127.0.0.1 {hardware} "
                f"RealMemory={memory} State=UNKNOWN")

    def _start(self, program, *arguments):
        log = open(self.folder / "log" / f"{program}.out", "w")
        self.daemons.append(subprocess.Popen([program, *arguments], stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True))
        log.close()

    def _node_idle(self) -> bool:
        for daemon in self.daemons:
            if daemon.poll() is not None:
                raise RuntimeError(f"{daemon.args[0]} exited with {daemon.returncode}:\n{self.logs()}")
        shown = subprocess.run(["sinfo", "--noheader", "--format=%t"], capture_output=True, text=True,
                               timeout=30)
        return shown.returncode == 0 and "idle" in shown.stdout

    def _wait_for(self, condition, what, timeout_s):
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(f"waited {timeout_s} s for {what}:\n{self.logs()}")
            time.sleep(0.2)

    def logs(self) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
                         for path in sorted((self.folder / "log").iterdir()))

    def wait(self, job_id: str, timeout_s: float, until=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                                         "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")) -> dict:
        """Poll the job until its state is in `until`; past timeout_s, cancel it and fail the test."""
        deadline = time.monotonic() + timeout_s
        while (info := job_info(job_id)).get("JobState") not in until:
            if time.monotonic() > deadline:
                subprocess.run(["scancel", job_id], timeout=30)
                pytest.fail(f"job {job_id} still {info.get('JobState')} after {timeout_s} s; cancelled it")
            time.sleep(0.25)
        return info

    def stop(self) -> None:
        """Cancel every job, then stop the daemons by process id (SIGTERM, then SIGKILL)."""
        if self.daemons and self.daemons[0].poll() is None and len(self.daemons) == 3:
            subprocess.run(["scancel", "--full", "--user=root"], capture_output=True, timeout=30)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and subprocess.run(
                    ["squeue", "--noheader"], capture_output=True, text=True, timeout=30).stdout.strip():
                time.sleep(0.25)
        for daemon in reversed(self.daemons):
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
                try:
                    daemon.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()
        if os.environ.get("SLURM_CONF") == str(self.conf):
            del os.environ["SLURM_CONF"]
        shutil.rmtree(self.folder, ignore_errors=True)


def resolvable_hostname() -> str:
    """This machine's name, which jobs use as the rendezvous host; 'localhost' where it does not
    resolve (a container without its name in /etc/hosts)."""
    name = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(name)
        return name
    except OSError:
        return "localhost"


def missing() -> str:
    """Why this machine cannot run the local SLURM, or ''."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return "the one-node SLURM's daemons run as root on Linux (`.ci/run` runs as root)"
    absent = [program for program in PROGRAMS if not shutil.which(program)]
    if absent:
        return (f"no {', '.join(absent)} on PATH: install Debian's slurm-wlm and munge "
                f"(`apt-get install slurm-wlm munge`, as `.ci/run` does)")
    return ""


@pytest.fixture(scope="session")
def slurm_cluster(request):
    """The session's LocalSlurm, started at the first test that asks for it."""
    global _cluster
    reason = missing()
    if reason:
        pytest.skip(f"no local SLURM: {reason}")
    if _cluster is None:
        cluster = LocalSlurm()
        request.config.add_cleanup(cluster.stop)  # also when start fails half-way
        cluster.start()
        _cluster = cluster
    return _cluster
