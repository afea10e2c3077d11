"""``check_resume(..., via="dcp")`` under torchrun: parts in place, the checkpoint folder shared.

Usage: ``torchrun --nproc_per_node=2 tests/_verify_dcp_torchrun.py OUT.json``. Rank 0 writes
the mid-epoch report's JSON to OUT, then a line with the refusal of ``resume_layout="dp=4"``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ezpz_nb.data.resumable import GlobalOrderLoader
from ezpz_nb.examples.capstone import RuleTokenDataset
from ezpz_nb.verify import VerifyError, check_resume


def masked(layout: Any) -> GlobalOrderLoader:
    """48 rule sequences, 2 per DP rank a step, masks from a per-rank RNG."""
    ds = RuleTokenDataset(num_samples=48)
    return GlobalOrderLoader(ds, 2, layout.dp_rank, layout.dp_size, seed=1, mask_rate=0.25)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    report = check_resume(masked, "dp=2", epochs=1, scenarios=["mid-epoch"], via="dcp")
    try:
        check_resume(masked, "dp=2", scenarios=["mid-epoch"], resume_layout="dp=4", via="dcp")
        refused = "not refused"
    except VerifyError as exc:
        refused = f"VerifyError: {exc}".replace("\n", " ")
    if dist.get_rank() == 0:
        out.write_text(report.to_json() + "\n" + refused)
