"""Soak: run everything many times and count what goes wrong, and what is left behind.

* every example under torchrun, ``RUNS`` times per TP size, exactly as
  docs/scale-out.md tells a user (``python -m torch.distributed.run --standalone
  --nproc_per_node=4 -m ezpz_nb.examples.<name> --out DIR``, plus ``--tp-size``);
* docs/scale-out.md's notebook snippet (``ez.launch(tp_broadcast.run, ...)``) as a
  script under torchrun, ``RUNS`` times: ``ez.launch`` runs in place there;
* in one notebook-like process: ``RUNS`` ``ez.launch`` calls and ``RUNS`` Cluster
  lifecycles (start, two runs, close), then the process exits.

After every run it counts the processes that outlived it (anything that
inherited the run's tag and is still alive 5 s after the run ended; those
that were only finishing their own exit are shown apart), the entries left
in the run's private TMPDIR, and the runs whose teardown warned that gloo
worker threads outlived it (the abort-at-exit risk). torch's own folders are
counted apart: torchrun leaves its ``torchelastic_*`` by design, and importing
``torch._dynamo`` (FSDP2 does, in the capstone) makes the compile cache
``torchinductor_<user>`` that every later run of that user reuses. A run that
exceeds ``--limit`` seconds is killed and counts as "hung". Prints one table;
exits 1 if any run failed, left anything or warned.

    python benchmarks/soak.py [--runs 15] [--tp-sizes 1 2] [--nproc 4]
                              [--examples dp_sharding tp_broadcast step_alignment capstone]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from _procs import kill_tagged, new_tag, run_limited, tagged

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ("dp_sharding", "tp_broadcast", "step_alignment", "capstone")
#: Folders torch itself makes in TMPDIR and means to leave (see the module doc).
TORCH_OWN = ("torchelastic_", "torchinductor_")
#: What destroy_distributed() prints when a group outlived the teardown.
OUTLIVE_WARNING = "gloo worker thread(s) outlive destroy_process_group()"


@dataclass
class Row:
    """What one kind of run did over all its repetitions."""

    what: str
    codes: Counter = field(default_factory=Counter)
    procs_exiting: int = 0
    procs_left: int = 0
    temp_left: int = 0
    torch_own_left: int = 0
    groups_outliving: int = 0  # runs whose teardown warned
    # False for the launches inside the notebook-like process: their ranks end with
    # os._exit (no teardown to warn), and the process's one log is not theirs alone.
    checks_warning: bool = True
    seconds: list[float] = field(default_factory=list)
    first_failure: str = ""

    @property
    def runs(self) -> int:
        return sum(self.codes.values())

    @property
    def failures(self) -> int:
        return sum(n for code, n in self.codes.items() if code != 0)

    def add(
        self,
        code: int | str,
        seconds: float,
        procs: int,
        temp: int,
        log: str = "",
        exiting: int = 0,
    ) -> None:
        self.codes[code] += 1
        self.seconds.append(seconds)
        self.procs_exiting += exiting
        self.procs_left += procs
        self.temp_left += temp
        warned = self.checks_warning and OUTLIVE_WARNING in log
        self.groups_outliving += warned
        if (code != 0 or warned) and not self.first_failure:
            self.first_failure = log[-3000:]


#: Seconds a process of a finished run may take to finish exiting by itself (a
#: forkserver that imported torch takes up to about a second to tear down), and the most
#: it may take while it still makes progress (on a busy machine an exit that takes a
#: second alone takes many: a process still working its way out is not left behind).
GRACE_S = 5.0
PROGRESS_CAP_S = 60.0


def _work(pid: int) -> tuple[str, int] | None:
    """``(state, CPU ticks used)`` of ``pid`` from /proc, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            fields = f.read().rpartition(")")[2].split()
        return fields[0], int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


def _still_exiting(pids: list[int], window_s: float = 1.0) -> bool:
    """Whether any of ``pids`` is runnable or used CPU within ``window_s``: judged from
    its CPU ticks, a count, so a slow exit on a loaded machine is told from a process
    that sleeps forever (blocked on a pipe, a lock, a peer)."""
    before = {pid: _work(pid) for pid in pids}
    time.sleep(window_s)
    for pid, was in before.items():
        now = _work(pid)
        if was is None or now is None:
            continue  # gone: not left
        if now[0] == "R" or now[1] > was[1]:
            return True
    return False


def _describe(pids: list[int]) -> str:
    """One line per process: pid, state, CPU ticks and its command, for the report."""
    lines = []
    for pid in pids:
        work = _work(pid)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:160]
        except OSError:
            cmd = "?"
        lines.append(f"  pid {pid} state {work and work[0]} cpu ticks {work and work[1]}: {cmd}")
    return "\n".join(lines)


def leftovers(tmp: str, tag: str, grace_s: float = GRACE_S) -> tuple[int, int, int, int]:
    """What a finished run left: processes still exiting (gone within GRACE_S, or later
    while they still use CPU, up to PROGRESS_CAP_S), processes still alive after it
    (described on stdout, then killed), entries in its TMPDIR, torch's own folders.
    ``grace_s``: GRACE_S, shorter in this function's own test."""
    seen = len(tagged(tag))
    start = time.monotonic()
    while tagged(tag) and time.monotonic() < start + grace_s:
        time.sleep(0.05)
    while (
        (pids := tagged(tag)) and time.monotonic() < start + PROGRESS_CAP_S and _still_exiting(pids)
    ):
        pass
    pids = tagged(tag)
    if pids:
        print(f"left after the run ({time.monotonic() - start:.1f} s):\n{_describe(pids)}")
    left = kill_tagged(tag)
    names = os.listdir(tmp)
    own = sum(n.startswith(TORCH_OWN) for n in names)
    return max(0, seen - left), left, len(names) - own, own


def readme_snippet() -> str:
    """docs/scale-out.md's Python block that runs an example with ez.launch."""
    blocks = (ROOT / "docs" / "scale-out.md").read_text().split("```python\n")[1:]
    found = [b.split("```")[0] for b in blocks if "ez.launch(tp_broadcast.run" in b]
    if not found:
        raise SystemExit("docs/scale-out.md has no ```python block with ez.launch(tp_broadcast.run")
    return found[0]


def torchrun_once(target: list[str], nproc: int, limit_s: float, row: Row) -> str:
    """One README-form torchrun of ``target`` (``-m module ...`` or a script; ``{out}``
    becomes a fresh folder), added to ``row``; returns a progress line."""
    tag = new_tag()
    tmp = tempfile.mkdtemp(prefix="ezpz-soak-")
    out = tempfile.mkdtemp(prefix="ezpz-soak-out-")  # the ledger, outside the counted TMPDIR
    try:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            *(a.replace("{out}", out) for a in target),
        ]
        env = dict(os.environ, TMPDIR=tmp)
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(k, None)
        code, log, secs = run_limited(cmd, tag=tag, limit_s=limit_s, env=env, cwd=str(ROOT))
        exiting, procs, temp, own = leftovers(tmp, tag)
        row.add(code, secs, procs, temp, log, exiting)
        row.torch_own_left += own
        return (
            f"exit {code} in {secs:.1f} s, left {procs} processes (+{exiting} exiting), "
            f"{temp} temp entries"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)


# What the notebook-like process runs: every launch and lifecycle is timed and
# checked, and after each one the process counts what of it is still there.
NOTEBOOK = r"""
import json, os, sys, time
import psutil
import torch.distributed as dist
import ezpz_nb as ez

runs, nproc = int(sys.argv[1]), int(sys.argv[2])
tmp = os.environ["TMPDIR"]

def job(x):
    return dist.get_rank() * x

def left():
    # The forkserver and the resource tracker live as long as this "kernel";
    # every other descendant (a rank, a loader worker) must be gone after a run.
    kids = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and not any(
                    k in " ".join(p.cmdline()) for k in ("forkserver", "resource_tracker")):
                kids.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    temp = [n for n in os.listdir(tmp) if not n.startswith("pymp-")]
    return len(kids), len(temp)

def one(kind):
    t0 = time.perf_counter()
    try:
        if kind == "launch":
            ok = ez.launch(job, 3, world_size=nproc) == [3 * r for r in range(nproc)]
        else:
            with ez.Cluster(nproc) as c:
                ok = c.run(job, 1) == list(range(nproc)) and c.run(job, 2) == [2 * r for r in range(nproc)]
        code = 0 if ok else "wrong result"
    except Exception as exc:
        code = type(exc).__name__
    procs, temp = left()
    print(json.dumps(dict(kind=kind, code=code, seconds=time.perf_counter() - t0,
                          procs=procs, temp=temp)), flush=True)

for kind in ("launch", "cluster"):
    for _ in range(runs):
        one(kind)
"""


def notebook_process(runs: int, nproc: int, limit_s: float) -> list[Row]:
    """``runs`` launches and Cluster lifecycles in one process, then that process's exit."""
    tag = new_tag()
    tmp = tempfile.mkdtemp(prefix="ezpz-soak-nb-")
    rows = {
        "launch": Row(f"ez.launch, {nproc} ranks", checks_warning=False),
        "cluster": Row(f"Cluster lifecycle, {nproc} ranks", checks_warning=False),
    }
    exit_row = Row("notebook-like process exit")
    try:
        code, log, secs = run_limited(
            [sys.executable, "-c", NOTEBOOK, str(runs), str(nproc)],
            tag=tag,
            limit_s=limit_s,
            env=dict(os.environ, TMPDIR=tmp),
            cwd=str(ROOT),
        )
        for line in log.splitlines():
            if line.startswith("{"):
                d = json.loads(line)
                rows[d["kind"]].add(d["code"], d["seconds"], d["procs"], d["temp"], log)
        exiting, procs, temp, _ = leftovers(tmp, tag)
        exit_row.add(code, secs, procs, temp, log, exiting)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [rows["launch"], rows["cluster"], exit_row]


def table(rows: list[Row]) -> str:
    head = (
        "run",
        "runs",
        "failures",
        "exit codes seen",
        "leftover processes",
        "leftover temp entries",
        "still exiting at end",
        "torch's own dirs",
        "median s",
        "runs warning of outliving groups",
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        codes = ", ".join(
            f"{c}: {n}" for c, n in sorted(r.codes.items(), key=lambda kv: str(kv[0]))
        )
        med = f"{statistics.median(r.seconds):.2f}" if r.seconds else "-"
        own = str(r.torch_own_left) if r.what.startswith("torchrun") else "-"
        lines.append(
            f"| {r.what} | {r.runs} | {r.failures} | {codes or '-'} | {r.procs_left} | "
            f"{r.temp_left} | {r.procs_exiting} | {own} | {med} | "
            f"{r.groups_outliving if r.checks_warning else '-'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--runs",
        type=int,
        default=15,
        help="runs per example and TP size, and "
        "launches and Cluster lifecycles in the notebook-like process",
    )
    ap.add_argument("--tp-sizes", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--nproc", type=int, default=4, help="ranks per run")
    ap.add_argument("--examples", nargs="+", choices=EXAMPLES, default=list(EXAMPLES))
    ap.add_argument(
        "--limit",
        type=float,
        default=180.0,
        help="seconds one torchrun may take before it counts as hung",
    )
    ap.add_argument(
        "--no-notebook", action="store_true", help="skip the launches in a notebook-like process"
    )
    ap.add_argument(
        "--no-snippet",
        action="store_true",
        help="skip the README's ez.launch snippet under torchrun",
    )
    args = ap.parse_args(argv)
    jobs = [
        (
            f"torchrun {example} --tp-size {tp}",
            ["-m", f"ezpz_nb.examples.{example}", "--out", "{out}", "--tp-size", str(tp)],
        )
        for example in args.examples
        for tp in args.tp_sizes
    ]
    with tempfile.TemporaryDirectory(prefix="ezpz-soak-script-") as scripts:
        if not args.no_snippet:
            script = Path(scripts) / "readme_snippet.py"
            script.write_text(readme_snippet())
            jobs.append(("torchrun README ez.launch snippet", [str(script)]))
        rows = []
        for what, target in jobs:
            row = Row(what)
            for i in range(args.runs):
                done = torchrun_once(target, args.nproc, args.limit, row)
                print(f"{row.what}: run {i + 1}/{args.runs} {done}", file=sys.stderr, flush=True)
            rows.append(row)
    if not args.no_notebook:
        rows += notebook_process(args.runs, args.nproc, args.limit + 30.0 * args.runs)
    examples = [r for r in rows if r.what.startswith("torchrun") and "snippet" not in r.what]
    print(table(rows))
    print(
        f"\ntorchrun examples: {sum(r.failures for r in examples)} failures in "
        f"{sum(r.runs for r in examples)} runs; machine: {os.cpu_count()} cores; "
        f"{args.nproc} processes per run"
    )
    bad = [r for r in rows if r.failures or r.procs_left or r.temp_left or r.groups_outliving]
    for r in bad:
        if r.first_failure:
            print(f"\n--- first failure of {r.what}:\n{r.first_failure}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
