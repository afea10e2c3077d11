"""``check_contract`` under torchrun: run in place on torchrun's ranks.

Usage: ``torchrun --nproc_per_node=4 tests/_verify_torchrun.py FACTORY LAYOUT OUT.json [resume]``
(FACTORY a name in ``_verify_loaders``); rank 0 writes the report's JSON to OUT.
With ``resume``, ``check_resume`` (mid-epoch) instead: its parts run one after the
other in torchrun's processes, each with a fresh loader.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _verify_loaders as loaders
import torch.distributed as dist

from ezpz_nb.verify import VerifyError, check_contract, check_resume

if __name__ == "__main__":
    name, layout, out = sys.argv[1:4]
    resume = sys.argv[4:] == ["resume"]
    try:
        if resume:
            report = check_resume(getattr(loaders, name), layout, scenarios=["mid-epoch"])
        else:
            report = check_contract(getattr(loaders, name), layout, epochs=2, timeout=60)
        text = report.to_json()
    except VerifyError as exc:  # every rank gets it: rank 0 writes it down
        text = f"VerifyError: {exc}"
    if dist.get_rank() == 0:
        Path(out).write_text(text)
