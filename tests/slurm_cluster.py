"""A throw-away single-node SLURM cluster (Debian's slurm-wlm + munge) for the `slurm` tests.

    with SlurmCluster(tmp_dir) as cluster:          # munged + slurmctld + slurmd, free ports
        subprocess.run([...], env=cluster.env)       # SLURM_CONF and PATH for the clients

Everything lives under the given dir: munge key/socket, slurm.conf, state, spool, logs.
The daemons are stopped by PID. Without accounting, ``sacct`` only says so, and
submitit would then wait forever for a job that died without a result: a ``sacct`` of
our own, first on PATH, answers submitit's query from ``squeue --states=all`` (finished
jobs stay listed for ``MinJobAge`` seconds).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
SACCT = """#!/usr/bin/env python3
# sacct -o JobID,State,NodeList --parsable2 -j ID[,ID]: answered from squeue (no accounting here).
import subprocess, sys
args = sys.argv[1:]
ids = args[args.index("-j") + 1] if "-j" in args else ""
out = subprocess.run(["squeue", "-h", "-r", "--states=all", "-o", "%i|%T|%N", *(["-j", ids] if ids else [])],
                     capture_output=True, text=True).stdout
print("JobID|State|NodeList")
for line in out.splitlines():
    print(line.strip())
"""


def missing_packages() -> list[str]:
    return [name for name in (*DAEMONS, "sbatch", "squeue", "scontrol") if shutil.which(name) is None]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SlurmCluster:
    def __init__(self, root: Path, partitions: str | None = None, cpus: int = 2):
        self.root = Path(root)
        self.host = socket.gethostname().split(".")[0]
        self.cpus = cpus
        # Two partitions on the one node: a job in "high" preempts (requeues) one in "low",
        # which first gets its --signal and GraceTime seconds to save.
        self.partitions = partitions or "\n".join([
            f"PartitionName=low Nodes={self.host} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=30",
            f"PartitionName=high Nodes={self.host} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF",
        ])  # fmt: skip
        self.procs: dict[str, int] = {}
        self.conf = self.root / "slurm.conf"
        bin_dir = self.root / "bin"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    # --- set-up ---------------------------------------------------------------------------

    def write_files(self) -> None:
        for sub in ("munge", "state", "spool", "log", "bin"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o755)  # clients reach the socket through this dir
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        sacct = self.root / "bin" / "sacct"
        sacct.write_text(SACCT)
        sacct.chmod(sacct.stat().st_mode | stat.S_IEXEC)
        socket_path = self.root / "munge" / "munge.socket"
        log = self.root / "log"
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=attnlab-test",
                    f"SlurmctldHost={self.host}(127.0.0.1)",
                    f"SlurmctldPort={free_port()}",
                    f"SlurmdPort={free_port()}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={socket_path},cred_expire=10",
                    f"StateSaveLocation={self.root / 'state'}",
                    f"SlurmdSpoolDir={self.root / 'spool'}",
                    f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
                    f"SlurmdPidFile={self.root / 'slurmd.pid'}",
                    f"SlurmctldLogFile={log / 'slurmctld.log'}",
                    f"SlurmdLogFile={log / 'slurmd.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "AccountingStorageType=accounting_storage/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "JobCompType=jobcomp/none",
                    "ReturnToService=2",
                    "MinJobAge=3600",  # finished jobs stay visible to squeue (our sacct)
                    "KillWait=30",
                    "SchedulerType=sched/builtin",
                    "SchedulerParameters=sched_interval=1",  # a requeued job starts once its BeginTime passes
                    "PreemptType=preempt/partition_prio",
                    "PreemptMode=REQUEUE",
                    "SlurmctldParameters=preempt_send_user_signal",
                    "MpiDefault=none",
                    f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=4000 State=UNKNOWN",
                    self.partitions,
                    "",
                ]
            )
        )

    def start_daemon(self, name: str, command: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 - stays open while the daemon runs
        proc = subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc.pid
        self._popen = getattr(self, "_popen", {})
        self._popen[name] = proc

    def start(self, timeout: float = 60) -> SlurmCluster:
        self.write_files()
        munge = self.root / "munge"
        self.start_daemon("munged", [
            "munged", "-F", "-S", str(munge / "munge.socket"), f"--key-file={munge / 'munge.key'}",
            f"--pid-file={munge / 'munged.pid'}", f"--log-file={self.root / 'log' / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}", "--force",
        ])  # fmt: skip
        self.wait(lambda: (munge / "munge.socket").exists(), timeout, "munged's socket")
        self.start_daemon("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
        self.start_daemon("slurmd", ["slurmd", "-D", "-f", str(self.conf)])
        self.wait(lambda: self.node_state() in ("idle", "mixed", "allocated"), timeout, "the node to be idle")
        return self

    def node_state(self) -> str:
        result = self.run(["sinfo", "-h", "-o", "%T"], check=False)
        return result.stdout.strip().split("\n")[0] if result.returncode == 0 else ""

    def wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for name, proc in getattr(self, "_popen", {}).items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}; see {self.root / 'log'}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout} s for {what}; see {self.root / 'log'}")
            time.sleep(0.2)

    # --- use ------------------------------------------------------------------------------

    def run(self, command: list[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(command, env=self.env, capture_output=True, text=True, check=check, timeout=timeout)

    def jobs(self) -> dict[str, str]:
        """Job id (array elements as 123_0) → state, finished jobs included."""
        out = self.run(["squeue", "-h", "-r", "--states=all", "-o", "%i|%T"]).stdout
        return dict(line.strip().split("|", 1) for line in out.splitlines() if line.strip())

    # --- tear-down ------------------------------------------------------------------------

    def stop(self, timeout: float = 20) -> None:
        for name in reversed(DAEMONS):
            proc = getattr(self, "_popen", {}).get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout)
        self.kill_job_steps()

    def kill_job_steps(self) -> None:
        """slurmstepd processes of unfinished jobs outlive slurmd: stop those started under our spool."""
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if f"SLURM_CONF={self.conf}" in environ and pid != os.getpid() and "pytest" not in cmdline:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
