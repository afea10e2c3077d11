"""The ``ezpz-nb`` commands, run as a user types them, in real processes.

Guards against a doctor that passes a broken machine or fails without saying
what to do, a ``notebooks`` command that overwrites a learner's edits, and a
``lab`` that listens beyond 127.0.0.1, serves nothing, or leaves a kernel or
its ranks running after it is stopped.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import suppress
from pathlib import Path

import psutil
import pytest
from _browser_lab import Lab, free_port, lab_command, lab_env, wait_up

import ezpz_nb.cli.resources as resources
from ezpz_nb.cli.lab import WORKDIR, jupyter_args, lab_folder
from ezpz_nb.cli.notebooks import shipped_files
from ezpz_nb.cli.probes import NOTEBOOK_RANKS, check_memory
from ezpz_nb.cli.report import Check, Report

ROOT = Path(__file__).resolve().parent.parent
EZPZ_NB = Path(sys.executable).with_name("ezpz-nb")  # the script pip installs
# Tests never depend on wall-clock time: the doctor gets a budget that a machine busy
# with other tests still meets (benchmarks/doctor.py measures the default one).
BUDGET = ("--budget", "120")
CHECKS = [
    "python",
    "ezpz_nb",
    "torch",
    "ipywidgets",
    "notebook extra",
    "cores",
    "start method",
    "threads",  # a warning on fewer than 4 cores
    "gloo on loopback",
    "4-rank launch",
    "jupyter kernel",
    "widget frontend",
    "memory",
    "shared",  # "shared memory": /dev/shm against notebook 19's loader
]


def _ezpz_nb(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(EZPZ_NB), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def _in_process(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess:
    """``ezpz-nb ARGS`` run in this process (the console script is ``ezpz_nb.cli:main``):
    what a subprocess gives, without its torch import (seconds each on a busy machine).
    The doctor tests and the wheel tests run the installed script itself."""
    from ezpz_nb.cli import main

    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out, err)


def _left_behind(marker: str) -> list[str]:
    """Processes whose command line names ``marker`` (a private folder of the test)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if marker in " ".join(p.info["cmdline"] or []):
            found.append(f"{p.info['pid']}: {' '.join(p.info['cmdline'])}")
    return found


# ---------------------------------------------------------------- doctor


@pytest.mark.system  # the installed ezpz-nb doctor, as a participant runs it: `make system`
def test_doctor_passes_here_with_one_verdict_line(tmp_path, short_tmp):
    done = _ezpz_nb("doctor", *BUDGET, cwd=tmp_path, env={**os.environ, "TMPDIR": short_tmp})
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert re.fullmatch(r"ezpz-nb doctor: READY: 14 checks passed.* \(\d+\.\d s\)", lines[-1])
    assert [ln.split()[1] for ln in lines[1:-1] if ln.startswith(("  ok", "  warn"))] == [
        c.split()[0] for c in CHECKS
    ]
    assert "4 ranks, all_reduce correct" in done.stdout
    # The ranks, the forkserver and their folders went with the command.
    assert os.listdir(short_tmp) == []
    assert _left_behind(short_tmp) == []


@pytest.mark.system  # the installed ezpz-nb doctor, as a participant runs it: `make system`
def test_doctor_fails_on_a_broken_gloo_and_says_what_to_do(tmp_path, short_tmp):
    env = {**os.environ, "TMPDIR": short_tmp, "GLOO_SOCKET_IFNAME": "ezpz-no-such-device"}
    done = _ezpz_nb("doctor", *BUDGET, cwd=tmp_path, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert re.search(r"FAIL  gloo on loopback .*ezpz-no-such-device", out)
    assert "what to do: GLOO_SOCKET_IFNAME is set to 'ezpz-no-such-device': unset it" in out
    assert "4-rank launch" not in out  # no second launch once gloo is known broken
    last = out.strip().splitlines()[-1]
    assert last.startswith("ezpz-nb doctor: NOT READY: 1 of 13 checks failed (gloo on loopback)")
    assert os.listdir(short_tmp) == []
    assert _left_behind(short_tmp) == []


@pytest.mark.system  # a venv made, and the doctor run from it: `make system`
def test_doctor_without_torch_says_to_install_it(tmp_path):
    """Guards the first thing a participant may get wrong: a Python without torch. The
    doctor (which imports ezpz_nb first) still runs and says what to install, and the
    library's names raise an ImportError that says the same, not a traceback from inside."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    py = bare / "bin" / "python"
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "ezpz_nb_checkout.pth").write_text(f"{ROOT}\n")  # ezpz_nb, and nothing else
    done = subprocess.run(
        [py, "-m", "ezpz_nb", "doctor", *BUDGET],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert re.search(r"FAIL  torch .*not installed", done.stdout), done.stdout
    assert "what to do: python -m pip install 'torch>=2.13'" in done.stdout
    assert "NOT READY" in done.stdout.strip().splitlines()[-1]
    used = subprocess.run(
        [py, "-c", "import ezpz_nb as ez; ez.launch(print, world_size=2)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert used.returncode == 1
    assert "ImportError: ezpz_nb.launch needs PyTorch" in used.stderr
    assert "pip install torch" in used.stderr


@pytest.mark.system  # the installed ezpz-nb doctor, as a participant runs it: `make system`
def test_doctor_finds_a_python3_kernel_of_another_python(tmp_path):
    # A python3 kernel spec found before ours, running a Python without ezpz_nb: the
    # notebooks would fail on `import ezpz_nb`, so the doctor must say so.
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    other = sys.base_prefix + "/bin/python3"  # the interpreter the venv was made from
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [other, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3",
                "language": "python",
            }
        )
    )
    env = {**os.environ, "JUPYTER_PATH": str(tmp_path / "jupyter")}
    done = _ezpz_nb("doctor", *BUDGET, cwd=tmp_path, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(
        rf"FAIL  jupyter kernel +python3 runs {re.escape(other)}, which lacks: "
        r"ezpz_nb",
        done.stdout,
    )
    assert f"the python3 kernel found first ({spec})" in done.stdout
    assert "NOT READY: 1 of 14 checks failed (jupyter kernel)" in done.stdout


def test_memory_check_compares_free_memory_with_the_measured_ranks():
    rank = 300 * 1024**2
    short = check_memory([rank] * 4, available=NOTEBOOK_RANKS * rank // 2)
    assert short.ok is False and "close other programs" in short.fix
    assert check_memory([rank] * 4, available=100 * NOTEBOOK_RANKS * rank).ok is True
    assert check_memory([rank] * 4, available=None).ok is None  # cannot tell: a warning
    report = Report([Check("a", True, ""), check_memory([], 10**10)], 1.0)
    assert report.ok and "1 warning(s) (memory)" in report.verdict


def test_doctor_plans_memory_for_the_most_ranks_a_notebook_starts():
    from ezpz_nb.viz.widgets import Explorer

    sources = "\n".join(p.read_text() for p in (ROOT / "notebooks" / "_cells").glob("*.py"))
    asked = [int(a or b) for a, b in re.findall(r"world_size=(\d+)|%%ranks -n (\d+)", sources)]
    assert asked, "no rank counts found in the notebook sources"
    slider = Explorer(run=False).controls["world_size"].max
    assert max(*asked, slider) <= NOTEBOOK_RANKS


# ---------------------------------------------------------------- notebooks


def test_notebooks_copies_all_then_keeps_edits_unless_forced(tmp_path, capsys):
    dest = tmp_path / "my notebooks"
    source = resources.notebooks_dir()
    names = [p.relative_to(source).as_posix() for p in shipped_files()]
    assert "00_setup_check.ipynb" in names and len(names) >= 8
    # The answers go to a folder of their own, not one click from the exercise (issue 45).
    assert "solutions/05_workshop_solutions.ipynb" in names
    assert not [n for n in names if n.endswith("_solutions.ipynb") and "/" not in n]

    done = _in_process(capsys, "notebooks", str(dest))
    assert done.returncode == 0, done.stderr
    copied = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert copied == sorted(names)
    for name in names:
        assert (dest / name).read_bytes() == (source / name).read_bytes()
    assert f"copied {len(names)} file(s) to {dest}" in done.stdout

    edited = dest / "02_dp_sharding.ipynb"
    edited.write_text("my edits")
    (dest / "00_setup_check.ipynb").unlink()
    done = _in_process(capsys, "notebooks", str(dest))
    assert done.returncode == 0, done.stderr
    assert edited.read_text() == "my edits"
    assert "copied 1 file(s)" in done.stdout and "  00_setup_check.ipynb\n" in done.stdout
    skipped = done.stdout.split("skipped", 1)[1]
    assert f"skipped{skipped}".startswith(f"skipped {len(names) - 1} file(s) already in {dest}")
    assert "--force overwrites them" in skipped and "  02_dp_sharding.ipynb" in skipped

    done = _in_process(capsys, "notebooks", str(dest), "--force")
    assert done.returncode == 0, done.stderr
    assert "02_dp_sharding.ipynb (overwritten)" in done.stdout and "skipped" not in done.stdout
    assert edited.read_bytes() == (resources.notebooks_dir() / edited.name).read_bytes()


def test_notebooks_refuses_to_copy_onto_its_source(capsys):
    done = _in_process(capsys, "notebooks", str(resources.notebooks_dir()), "--force")
    assert done.returncode == 2
    assert "is where the notebooks come from; name another folder" in done.stderr


# ---------------------------------------------------------------- lab


def test_lab_folder_serves_a_checkout_as_is_and_copies_an_installed_copy(tmp_path, monkeypatch):
    assert lab_folder() == (ROOT / "notebooks", None)
    # An installed package: its notebooks live in ezpz_nb/_notebooks.
    package = tmp_path / "site" / "ezpz_nb"
    (package / "_notebooks").mkdir(parents=True)
    (package / "_notebooks" / "00_setup_check.ipynb").write_text("{}")
    monkeypatch.setattr(resources, "_PACKAGE", package)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    folder, copy = lab_folder()
    assert folder == work / WORKDIR and copy.copied == ["00_setup_check.ipynb"]
    assert (work / WORKDIR / "00_setup_check.ipynb").read_text() == "{}"
    folder, copy = lab_folder()  # again: the learner's copy is kept
    assert folder == work / WORKDIR and copy.skipped == ["00_setup_check.ipynb"]


def test_lab_binds_loopback_and_allows_root_when_root():
    args = jupyter_args(Path("/x"), port=9, open_browser=False, extra=["--foo"])
    assert args[:2] == ["--ServerApp.ip=127.0.0.1", "--ServerApp.root_dir=/x"]
    assert ("--ServerApp.allow_root=True" in args) == (os.geteuid() == 0)
    assert args[-1] == "--foo" and "--ServerApp.open_browser=False" in args
    assert "--ContentsManager.hide_globs=_cells" in args  # a checkout's sources stay hidden
    assert not any("default_url" in a for a in args)  # /x has no notebook 00 to open on


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@pytest.mark.system
def test_lab_serves_the_notebooks_and_stops_cleanly(tmp_path):
    root = tmp_path / "lab"
    root.mkdir()
    env = lab_env(root)
    # Every kernel imports ezpz_nb at start, which starts its forkserver: stopping the
    # lab must take the kernel and the forkserver down too.
    startup = root / ".ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-ezpz.py").write_text("import ezpz_nb\n")
    port, token = free_port(), secrets.token_hex(16)
    log = (root / "lab.log").open("w")
    proc = subprocess.Popen(
        lab_command(root, port, token),
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    lab = Lab(root, port, token, proc)
    family: list[psutil.Process] = []
    try:
        wait_up(lab, timeout=90)
        with urllib.request.urlopen(lab.url("lab"), timeout=10) as resp:
            assert resp.status == 200
        listed = {item["name"] for item in lab.api("contents")["content"]}
        # The top level lists the notebooks and the solutions/ folder they hide in.
        top = {"solutions" if p.parent.name == "solutions" else p.name for p in shipped_files()}
        assert top <= listed
        listening = [
            c.laddr
            for c in psutil.Process(proc.pid).net_connections("inet")
            if c.status == psutil.CONN_LISTEN
        ]
        assert listening and {a.ip for a in listening} == {"127.0.0.1"}
        assert {a.port for a in listening} == {port}

        lab.api("kernels", method="POST")
        deadline = time.monotonic() + 60
        # The kernel, and the forkserver its `import ezpz_nb` started.
        while len(family) < 2 and time.monotonic() < deadline:
            time.sleep(0.3)
            family = _descendants(proc.pid)
        assert len(family) >= 2, "the kernel did not start its forkserver"

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        gone, alive = psutil.wait_procs(family, timeout=15)
        assert not alive, f"still running after the lab stopped: {alive}"
        assert not list((root / ".jupyter-runtime").glob("jpserver-*.json"))
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in family:  # nothing, unless the test failed
            with suppress(psutil.NoSuchProcess):
                p.kill()
        proc.wait(10)
        log.close()
    log_text = (root / "lab.log").read_text()
    assert f"ezpz-nb lab: serving {root} on 127.0.0.1" in log_text
    assert f"copied {len(shipped_files())} file(s) to {root}" in log_text


class NoRedirect(urllib.request.HTTPRedirectHandler):
    """Report a redirect as an HTTPError instead of following it (to read where it points)."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


@pytest.mark.system
def test_make_lab_serves_the_checkout_notebooks(tmp_path):
    # The README's `make lab`, with JupyterLab told not to open a browser.
    port, token = free_port(), secrets.token_hex(16)
    flags = f"--no-browser --port {port} --IdentityProvider.token={token}"
    log = (tmp_path / "lab.log").open("w")
    proc = subprocess.Popen(
        ["make", "-s", "lab", f"LAB_FLAGS={flags}"],
        cwd=ROOT,
        env=lab_env(tmp_path),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    lab = Lab(tmp_path, port, token, proc)
    try:
        wait_up(lab, timeout=90)
        listed = {item["name"] for item in lab.api("contents")["content"]}
        # notebooks/ itself (the log below says so), less its sources: only the learner's files.
        assert "00_setup_check.ipynb" in listed and (ROOT / "notebooks" / "_cells").is_dir()
        assert not listed & {"_cells", "_build.py"}, listed
        # It opens on notebook 00, not on the Launcher.
        opener = urllib.request.build_opener(NoRedirect)
        with pytest.raises(urllib.error.HTTPError) as moved:
            opener.open(lab.url(""), timeout=10)
        where = moved.value.headers["Location"].split("?")[0]
        assert where.endswith("/lab/tree/00_setup_check.ipynb"), where
        server = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGTERM)  # what Ctrl-C in the terminal reaches
        proc.wait(30)
        gone, alive = psutil.wait_procs(server, timeout=15)
        assert not alive
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        log.close()
    assert "ezpz-nb lab: serving " + str(ROOT / "notebooks") in (tmp_path / "lab.log").read_text()


@pytest.mark.parametrize(
    "argv", [["notebooks"], ["doctor", "--bogus"], ["doctor", "--budget", "0"]]
)
def test_bad_command_lines_are_usage_errors(argv, capsys):
    """Guards: a bad command line is argparse's usage error (status 2), before any check
    runs. In process: the console script is `ezpz_nb.cli:main` (the doctor tests above run
    it as a subprocess), and each subprocess here cost a torch import."""
    done = _in_process(capsys, *argv)
    assert done.returncode == 2 and "usage: ezpz-nb" in done.stderr
