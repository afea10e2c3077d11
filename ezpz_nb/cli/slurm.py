"""``ezpz-nb slurm up|down|status|env``: a two-node Slurm cluster on this machine.

``up`` starts it (:class:`ezpz_nb.slurm.local.LocalSlurm`) and notes it in a pointer
file, so ``ez.submit`` in any notebook finds it without a variable set; ``env`` prints
the shell line that points ``sbatch``/``squeue``/``sinfo`` at it; ``down`` stops it by
PID and removes its folder; ``status`` shows its nodes.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["add_parser", "run_slurm"]


def add_parser(sub: Any) -> None:
    """Add the ``slurm`` subcommand to the dispatcher's subparsers."""
    slurm = sub.add_parser(
        "slurm",
        help="a local two-node Slurm cluster for ez.submit (Linux, root, Debian's packages)",
        description="Start (up), stop (down), show (status) a two-node Slurm cluster on this "
        "machine, or print the shell line that points Slurm's commands at it (env). Everything "
        "it uses is in one temporary folder; nothing is written to /etc.",
    )
    slurm.add_argument("action", choices=("up", "down", "status", "env"))


def run_slurm(args: argparse.Namespace) -> int:
    """Carry out ``args.action``; the exit status."""
    from ezpz_nb.slurm.errors import SlurmError
    from ezpz_nb.slurm.local import LocalSlurm, pointer_path

    found = LocalSlurm.from_pointer()
    if args.action == "up":
        if found is not None:
            print(f"already up: {found.folder}\n{found.status()}")
            return 0
        try:
            cluster = LocalSlurm.start()
        except SlurmError as exc:
            print(f"ezpz-nb slurm up: {exc}", file=sys.stderr)
            return 2
        cluster.save_pointer()
        print(f"up: nodes n1 and n2, everything in {cluster.folder}\n{cluster.status()}")
        print("ez.submit finds it; for a shell: eval $(ezpz-nb slurm env)")
        return 0
    if found is None:
        if args.action == "down":
            pointer_path().unlink(missing_ok=True)
        print("no local Slurm cluster is up (start one: ezpz-nb slurm up)", file=sys.stderr)
        return 1
    if args.action == "env":
        print(f"export SLURM_CONF={found.conf}")
    elif args.action == "status":
        print(found.status())
    else:
        found.stop()
        pointer_path().unlink(missing_ok=True)
        print("down: daemons stopped, folder removed")
    return 0
