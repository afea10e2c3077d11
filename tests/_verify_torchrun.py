"""``check_contract`` and ``check_resume`` under torchrun: run in place on torchrun's ranks.

Usage: ``torchrun --nproc_per_node=N tests/_verify_torchrun.py LAYOUT OUTDIR CASE [CASE ...]``.
A CASE is ``FACTORY`` (a name in ``_verify_loaders``: ``check_contract``) or
``FACTORY:resume`` (``check_resume``, mid-epoch: its parts run one after the other in
torchrun's processes, each with a fresh loader). The cases run one after the other in
the same job, as a course's CI checks several loaders, a failed one included; rank 0
writes each one's report JSON (or ``VerifyError: ...``) to ``OUTDIR/CASE.json``, the
``:`` as ``-``. One job for several cases: every torchrun job starts N + 1 processes
that import torch. The price: only the first case joins torchrun's group (the later ones
find it joined), and a crash or hang fails every case's test, not only its own.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _verify_loaders as loaders
import torch.distributed as dist

from ezpz_nb.verify import VerifyError, check_contract, check_resume


def judge(case: str, layout: str) -> str:
    """The report of one case as JSON, or the error every rank got."""
    name, _, kind = case.partition(":")
    try:
        if kind == "resume":
            report = check_resume(getattr(loaders, name), layout, scenarios=["mid-epoch"])
        else:
            report = check_contract(getattr(loaders, name), layout, epochs=2, timeout=60)
        return report.to_json()
    except VerifyError as exc:  # every rank gets it: rank 0 writes it down
        return f"VerifyError: {exc}"


def run_job(nproc: int, layout: str, out: Path, cases: list[str]) -> subprocess.CompletedProcess:
    """This file under ``torchrun --standalone --nproc_per_node=nproc``, to the end."""
    from test_torchrun import torchrun_cmd

    cmd, env = torchrun_cmd(nproc, __file__, layout, str(out), *cases)
    return subprocess.run(
        cmd, env=dict(env, TMPDIR=str(out)), capture_output=True, text=True, timeout=240
    )


if __name__ == "__main__":
    layout, out, *cases = sys.argv[1:]
    for case in cases:
        text = judge(case, layout)
        if dist.get_rank() == 0:
            (Path(out) / f"{case.replace(':', '-')}.json").write_text(text)
