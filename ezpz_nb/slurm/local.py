"""A two-node Slurm cluster on this machine, for tests and learners on Linux.

``LocalSlurm.start()`` runs Debian's ``munged``, ``slurmctld`` and two ``slurmd -N n1|n2``
in the foreground of their own sessions, with every file they use (config, key, sockets,
state, logs) in one temporary folder that ``SLURM_CONF`` points at: nothing goes to
``/etc``, and :meth:`LocalSlurm.stop` ends them by PID. ``ezpz-nb slurm up`` leaves a
pointer file behind (:func:`pointer_path`) so that ``ez.submit`` finds the cluster
without any variable set.

Measured on a 2-core machine as root: up and ``idle`` in about 1.2 s.
Why each line of the config is there:

* ``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``: no cgroups (a
  container, no systemd).
* ``AccountingStorageType=accounting_storage/none``: no slurmdbd, so no ``sacct``:
  states are read with ``scontrol show job`` while ``MinJobAge`` keeps ended jobs.
* Two ``NodeName`` lines on one host, each its own ``Port``: two nodes, one machine.
  ``NodeAddr=127.0.0.1`` because the names ``n1``/``n2`` resolve nowhere.
* ``SlurmdParameters=config_overrides``: a node may claim more CPUs than the host
  has, so 2 nodes x 2 ranks fit on 2 cores.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from ezpz_nb.slurm.errors import SlurmError
from ezpz_nb.slurm.pids import alive, parent, processes_of, send

__all__ = [
    "NODES",
    "PACKAGES",
    "LocalSlurm",
    "missing_tools",
    "pointer_path",
    "free_port",
]

#: The node names of the local cluster.
NODES = ("n1", "n2")
#: Debian's packages the local cluster runs on.
PACKAGES = "slurmctld slurmd slurm-client munge"
_TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
#: How long the daemons get to come up (measured ~1.2 s idle on a loaded 2-core machine).
_UP_S = 30.0


def missing_tools() -> str:
    """Why no local cluster can start here ("" when it can): what to install, or run as."""
    missing = [t for t in _TOOLS if shutil.which(t, path=_sbin_path()) is None]
    if missing:
        return (
            f"{', '.join(missing)} not found: install Debian's packages "
            f"(sudo apt-get install -y --no-install-recommends {PACKAGES})"
        )
    if os.geteuid() != 0:
        return "the local Slurm cluster runs slurmd, which needs root (run as root, or use a site's Slurm)"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no user 'munge' (the munge package makes it): reinstall munge"
    return ""


def _sbin_path() -> str:
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def pointer_path() -> Path:
    """Where ``ezpz-nb slurm up`` notes the cluster it started (``EZPZ_NB_SLURM_POINTER``)."""
    env = os.environ.get("EZPZ_NB_SLURM_POINTER")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "ezpz_nb" / "local-slurm.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(folder: Path, ports: dict[str, int], cpus: int) -> str:
    host = socket.gethostname().split(".")[0]
    nodes = "\n".join(
        f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[n]} CPUs={cpus} "
        "State=UNKNOWN"
        for n in NODES
    )
    return f"""\
# Written by ezpz_nb (ezpz-nb slurm up): a two-node cluster on one machine.
ClusterName=ezpz
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ports["ctld"]}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/munge/munge.socket
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
# Ended jobs stay readable by scontrol (no sacct here) for 5 minutes.
MinJobAge=300
# A cancelled or timed-out job's processes get 2 s after SIGTERM, not 30.
KillWait=2
SlurmctldTimeout=10
SlurmdTimeout=30
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class LocalSlurm:
    """A running local cluster: its folder, config and daemons' PIDs.

    Attributes:
        folder: The temporary folder holding everything (removed by :meth:`stop`).
        pids: ``{"munged": pid, "slurmctld": pid, "slurmd-n1": pid, ...}``.
    """

    folder: Path
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        """The ``slurm.conf`` that ``SLURM_CONF`` must name."""
        return self.folder / "slurm.conf"

    def env(self) -> dict[str, str]:
        """Variables that point Slurm's commands at this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def start(cls, parent: str | Path | None = None) -> LocalSlurm:
        """Start munged, slurmctld and two slurmd; return once both nodes are idle.

        Args:
            parent: Where to make the cluster's temporary folder (default: the system's).

        Raises:
            SlurmError: The packages are missing, not root, or a daemon did not come up
                (the message quotes its log); whatever started is stopped first.
        """
        why = missing_tools()
        if why:
            raise SlurmError(f"cannot start a local Slurm cluster: {why}")
        folder = Path(tempfile.mkdtemp(prefix="ezpz-nb-slurm-", dir=parent))
        folder.chmod(0o755)  # munged (user munge) must reach its own subfolder
        cluster = cls(folder)
        try:
            cluster._launch()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _launch(self) -> None:
        f = self.folder
        for sub in ("state", "log", "jobs", *(f"spool/{n}" for n in NODES)):
            (f / sub).mkdir(parents=True, exist_ok=True)
        munge = pwd.getpwnam("munge")
        mdir = f / "munge"
        mdir.mkdir(mode=0o700)
        key = mdir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        for p in (mdir, key):
            os.chown(p, munge.pw_uid, munge.pw_gid)
        ports = {"ctld": free_port(), **{n: free_port() for n in NODES}}
        self.conf.write_text(_config(f, ports, max(4, os.cpu_count() or 1)))
        env = {**os.environ, "SLURM_CONF": str(self.conf)}
        log = (f / "log" / "daemons.log").open("ab")
        munged = [
            "munged", "-F", "-f", f"--socket={mdir}/munge.socket", f"--key-file={key}",
            f"--pid-file={mdir}/munged.pid", f"--log-file={mdir}/munged.log",
            f"--seed-file={mdir}/munged.seed",
        ]  # fmt: skip
        self._spawn("munged", munged, env, log, user="munge")
        self._wait_for(lambda: (mdir / "munge.socket").exists(), "munged", mdir / "munged.log")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"], env, log)
        for n in NODES:
            self._spawn(f"slurmd-{n}", ["slurmd", "-D", "-N", n], env, log)
        self._wait_for(self._all_idle, "slurmctld and slurmd", f / "log" / "slurmctld.log")

    def _spawn(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        log: IO[bytes],
        user: str | None = None,
    ) -> None:
        exe = shutil.which(argv[0], path=_sbin_path())
        assert exe is not None  # missing_tools() checked
        proc = subprocess.Popen(
            [exe, *argv[1:]],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the notebook's Ctrl-C must not reach the daemons
            user=user,
        )
        self.pids[name] = proc.pid

    def _wait_for(self, ready: Callable[[], bool], what: str, log: Path) -> None:
        deadline = time.monotonic() + _UP_S
        while time.monotonic() < deadline:
            if ready():
                return
            dead = [n for n, pid in self.pids.items() if not alive(pid)]
            if dead:
                break
            time.sleep(0.1)
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else "(no log)"
        raise SlurmError(f"{what} did not come up within {_UP_S:g} s; its log ends:\n{tail}")

    def _all_idle(self) -> bool:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"],
            env={**os.environ, **self.env()},
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        states = dict(zip(out[::2], out[1::2], strict=False))
        return all(states.get(n) == "idle" for n in NODES)

    def stop(self) -> None:
        """Cancel every job, end the daemons and their job steps by PID, remove the folder."""
        if self.pids.get("slurmctld") and alive(self.pids["slurmctld"]):
            subprocess.run(
                ["scancel", "--user", pwd.getpwuid(os.getuid()).pw_name],
                env={**os.environ, **self.env()},
                capture_output=True,
                check=False,
                timeout=30,
            )
        # Job steps (slurmstepd, torchrun, ranks) carry this cluster's SLURM_CONF.
        pids = [*processes_of(self.conf), *self.pids.values()]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                send(pid, sig)
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and any(alive(p) for p in pids):
                time.sleep(0.05)
            pids = [p for p in pids if alive(p)]
            if not pids:
                break
        shutil.rmtree(self.folder, ignore_errors=True)
        self.pids = {}
        try:  # the pointer to this cluster, if :meth:`save_pointer` left one
            if json.loads(pointer_path().read_text()).get("folder") == str(self.folder):
                pointer_path().unlink()
        except (OSError, ValueError, AttributeError):
            pass

    def job_processes(self) -> list[int]:
        """Processes of this cluster's jobs still alive (job steps, torchrun, ranks)."""
        ctld = self.pids.get("slurmctld")
        return [
            p
            for p in processes_of(self.conf)
            if p not in self.pids.values() and parent(p) != ctld  # slurmctld's slurmscriptd
        ]

    @property
    def alive(self) -> bool:
        """True while every daemon runs."""
        return bool(self.pids) and all(alive(p) for p in self.pids.values())

    def status(self) -> str:
        """``sinfo``'s view of the nodes, or why the cluster is not up."""
        if not self.alive:
            down = [n for n, p in self.pids.items() if not alive(p)]
            return f"not running ({', '.join(down) or 'no daemons'} gone)"
        out = subprocess.run(
            ["sinfo", "-N", "-o", "%N %P %t %c"],
            env={**os.environ, **self.env()},
            capture_output=True,
            text=True,
            check=False,
        )
        return (out.stdout + out.stderr).strip()

    # ------------------------------------------------------------ the pointer file
    def save_pointer(self) -> Path:
        """Note this cluster where :meth:`from_pointer` (and ``ez.submit``) will find it."""
        path = pointer_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**asdict(self), "folder": str(self.folder)}))
        return path

    @classmethod
    def from_pointer(cls) -> LocalSlurm | None:
        """The cluster ``ezpz-nb slurm up`` started, if it still runs."""
        try:
            data = json.loads(pointer_path().read_text())
            found = cls(Path(data["folder"]), {k: int(v) for k, v in data["pids"].items()})
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return found if found.alive and found.conf.exists() else None
