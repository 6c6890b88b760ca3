"""A real one-node Slurm cluster on this machine, for the cluster tests: munged, slurmctld and slurmd.

Everything lives under one directory: a generated munge key and munged socket (no system munged is needed
or touched), ``slurm.conf`` and ``gres.conf``, state, spool and log files; the daemons listen on free ports
on 127.0.0.1. The node is this machine with its real CPU count and memory (``slurmd -C``) and four GPUs
declared as generic resources whose device files are stand-ins (like /dev/null), so jobs asking for ``--gpus-per-node=1`` are scheduled
on a machine without a GPU. There is no accounting storage, so ``sacct`` fails; ``squeue`` and
``scontrol`` work. Commands reach the cluster through ``SLURM_CONF`` (:attr:`OneNodeSlurm.env`).

Starting needs root (slurmd runs jobs as their users), the Debian packages ``slurm-wlm`` and ``munge``.
:func:`why_slurm_cannot_start` says in one line why it cannot; :meth:`OneNodeSlurm.start` raises
:class:`SlurmUnavailable` with the daemon's last log line when a daemon does not come up.
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

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "scancel")
NUM_GPUS = 4
START_TIMEOUT_S = 60.0


class SlurmUnavailable(RuntimeError):
    """A daemon of the cluster did not start; the message is one line."""


def why_slurm_cannot_start() -> str | None:
    """One line saying why a one-node cluster cannot start here (None when it can be tried)."""
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} not found): apt-get install slurm-wlm munge"
    if os.geteuid() != 0:
        return "starting slurmd needs root"
    return None


def _free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 just now (held open together while they are picked)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _node_line() -> str:
    """``slurmd -C``'s description of this machine (CPUs, sockets, cores, threads, RealMemory)."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True, timeout=30).stdout
    return next(line for line in out.splitlines() if line.startswith("NodeName="))


def _last_line(path: Path) -> str:
    with contextlib.suppress(OSError):
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        if lines:
            return lines[-1].strip()
    return "(no log)"


class OneNodeSlurm:
    """A one-node cluster under ``root``; :meth:`start`, then :meth:`stop` (always: it kills the daemons)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "etc" / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.logs = self.root / "log"
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def env(self) -> dict:
        """The environment of a command that uses this cluster (``SLURM_CONF`` set; jobs inherit it)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write_config(self) -> None:
        for sub in ("etc", "munge", "log", "state", "spool"):
            (self.root / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
        key = self.root / "munge" / "munge.key"
        if not key.exists():
            subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True, timeout=30)
        described = _node_line().split()
        node = " ".join([f"NodeName={self.node}", *described[1:]])
        ctld_port, slurmd_port = _free_ports(2)
        self.conf.write_text("\n".join([
            "ClusterName=specexp-test",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.logs / 'slurmctld.log'}",
            f"SlurmdLogFile={self.logs / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "GresTypes=gpu",
            "MpiDefault=none",
            "ReturnToService=2",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SchedulerType=sched/backfill",
            "MinJobAge=600",
            "InactiveLimit=0",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            f"{node} NodeAddr=127.0.0.1 Gres=gpu:{NUM_GPUS} State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))
        (self.conf.parent / "gres.conf").write_text(
            f"NodeName={self.node} Name=gpu File={self._gpu_files()}/nvidia[0-{NUM_GPUS - 1}]\n")

    def _gpu_files(self) -> Path:
        """Device files for the declared GPUs (slurmd drops a GPU without one): character devices like
        /dev/null where mknod is allowed, else plain files (slurmd logs an error per file and keeps them)."""
        dev = self.root / "dev"
        dev.mkdir(exist_ok=True)
        for i in range(NUM_GPUS):
            path = dev / f"nvidia{i}"
            if not path.exists():
                try:
                    os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
                except OSError:
                    path.touch()
        return dev

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.logs / f"{name}.stderr", "ab")  # noqa: SIM115 - the daemon owns it until it exits
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                            env=self.env, start_new_session=True)

    def _wait_for(self, what: str, ready, log: Path, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            dead = [name for name, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise SlurmUnavailable(f"{dead[0]} exited while waiting for {what}: {_last_line(log)}")
            time.sleep(0.2)
        raise SlurmUnavailable(f"{what} not ready after {timeout_s:.0f} s: {_last_line(log)}")

    def _node_state(self) -> str:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, env=self.env,
                             timeout=10, check=False)
        return out.stdout.strip() if out.returncode == 0 else ""

    def start(self) -> None:
        """Write the configuration, start munged, slurmctld and slurmd, and wait until the node is idle."""
        self._write_config()
        self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={self.root / 'munge' / 'munge.key'}",
                               f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                               f"--seed-file={self.root / 'munge' / 'munged.seed'}",
                               f"--log-file={self.logs / 'munged.log'}"])
        self._wait_for("munged", self.munge_socket.exists, self.logs / "munged.log")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", ["slurmd", "-D", "-N", self.node, "-f", str(self.conf)])
        self._wait_for("the Slurm node", lambda: self._node_state() == "idle", self.logs / "slurmctld.log")

    def stop(self) -> None:
        """Cancel every job, then stop the daemons (SIGTERM, SIGKILL after 10 s)."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "--user=root"], env=self.env, capture_output=True, timeout=10,
                           check=False)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)

    def scancel(self, job_id: str) -> None:
        """Cancel ``job_id`` (``123`` or an array task ``123_4``) as a user would."""
        subprocess.run(["scancel", job_id], env=self.env, capture_output=True, timeout=10, check=True)

    def squeue(self, job_ids: str | None = None) -> list[str]:
        """``JOBID STATE`` lines of the jobs Slurm has pending or running (of ``job_ids`` when given)."""
        argv = ["squeue", "-h", "-o", "%i %T"] + (["-j", job_ids] if job_ids else [])
        out = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=10, check=False)
        return [line.strip() for line in out.stdout.splitlines() if line.strip()]
