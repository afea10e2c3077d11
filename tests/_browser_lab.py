"""Start a throwaway ``ezpz-nb lab`` for the browser and CLI tests, and always take it down."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psutil

# Settings that keep the page quiet and every cell in the DOM, so the test
# sees what a learner sees without popups or virtualised cells.
_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {
        "windowingMode": "none",
        "autoStartDefaultKernel": True,
    },
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """A running JupyterLab: its URL parts and its process."""

    def __init__(self, root: Path, port: int, token: str, proc: subprocess.Popen) -> None:
        self.root, self.port, self.token, self.proc = root, port, token, proc

    def url(self, path: str) -> str:
        """``http://127.0.0.1:PORT/PATH?token=TOKEN``."""
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}?token={self.token}"

    def api(self, path: str, method: str = "GET") -> Any:
        """Call the server's REST API; JSON answer or ``None``."""
        req = urllib.request.Request(self.url(f"api/{path}"), method=method)
        with urllib.request.urlopen(req, timeout=5) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def wait_kernel_idle(self, timeout: float) -> None:
        """Wait until a notebook session has a started kernel that is idle."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sessions = self.api("sessions") or []
            if any((s.get("kernel") or {}).get("execution_state") == "idle" for s in sessions):
                return
            time.sleep(0.3)
        raise TimeoutError(f"no idle kernel within {timeout:.0f} s; see {self.root / 'lab.log'}")


def wait_up(lab: Lab, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lab.proc.poll() is not None:
            raise RuntimeError(
                f"JupyterLab exited with code {lab.proc.returncode}; see {lab.root / 'lab.log'}"
            )
        try:
            lab.api("status")
            return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(
        f"JupyterLab did not answer within {timeout:.0f} s; see {lab.root / 'lab.log'}"
    )


def _stop(lab: Lab) -> None:
    """Shut kernels down, then kill the server and everything it started."""
    try:
        for k in lab.api("kernels") or []:
            lab.api(f"kernels/{k['id']}", method="DELETE")
    except OSError:
        pass
    try:
        # Kernels, forkservers and ranks (each rank leads its own process
        # group, so killing the server's group alone would miss them).
        family = psutil.Process(lab.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    with suppress(ProcessLookupError):
        os.killpg(lab.proc.pid, signal.SIGTERM)
    try:
        lab.proc.wait(10)
    except subprocess.TimeoutExpired:
        lab.proc.kill()
        lab.proc.wait(5)
    for p in family:
        with suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(family, timeout=5)


def lab_env(root: Path) -> dict[str, str]:
    """This environment, with JupyterLab's config, runtime and settings inside ``root``."""
    for rel, value in _SETTINGS.items():
        path = root / ".lab-settings" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "JUPYTER"))}
    env.update(
        JUPYTERLAB_SETTINGS_DIR=str(root / ".lab-settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(root / ".lab-workspaces"),
        JUPYTER_RUNTIME_DIR=str(root / ".jupyter-runtime"),
        JUPYTER_CONFIG_DIR=str(root / ".jupyter-config"),
        IPYTHONDIR=str(root / ".ipython"),
    )
    return env


def lab_command(root: Path, port: int, token: str) -> list[str]:
    """The README's ``ezpz-nb lab DIR`` (as ``python -m ezpz_nb``), quiet and on a known port.

    It copies the notebooks of whichever ezpz_nb is imported into ``root``, so a
    test run against an installed wheel serves that wheel's notebooks.
    """
    return [
        sys.executable,
        "-m",
        "ezpz_nb",
        "lab",
        str(root),
        "--no-browser",
        "--port",
        str(port),
        f"--IdentityProvider.token={token}",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--ServerApp.terminals_enabled=False",
    ]


@contextmanager
def jupyterlab(root: Path, timeout: float = 90.0) -> Iterator[Lab]:
    """Run ``ezpz-nb lab`` on 127.0.0.1 (free port, random token) serving ``root``.

    Its config, runtime and settings stay inside ``root``; on exit its kernels
    are shut down and every process it started is killed, whatever happened.
    """
    port, token = free_port(), secrets.token_hex(16)
    log = (root / "lab.log").open("w")
    proc = subprocess.Popen(
        lab_command(root, port, token),
        cwd=root,
        env=lab_env(root),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    lab = Lab(root, port, token, proc)
    try:
        wait_up(lab, timeout)
        yield lab
    finally:
        _stop(lab)
        log.close()
