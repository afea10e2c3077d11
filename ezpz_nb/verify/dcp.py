"""``check_resume(..., via="dcp")``: the loader's state goes through ``torch.distributed.checkpoint``.

With ``via="state_dict"`` (the default) each rank's ``state_dict()`` travels back
to the notebook and into the next part's rank of the same number. A real job
instead writes it with ``dcp.save`` beside the model and reads it with
``dcp.load``, where one key written by every rank keeps one rank's value
(:mod:`ezpz_nb.data.checkpoint`). Here every part's ranks save the user's loader
through :class:`~ezpz_nb.data.checkpoint.LoaderCheckpoint` (per-DP-rank keys,
RNG, layout) into a folder of their own, and the next part's ranks load it
from there: only a token naming the folder travels through the notebook. The
resumed batches must hold the straight run's contents, not only its samples
(a forgotten RNG draws other masks). A
resume at another DP size therefore meets the checkpoint's refusal, which the
report shows as the verdict.

The folder is made before the first part and removed after the last, on every
outcome. Under torchrun the ranks of one node share it (a path made from the
run's id); across nodes DCP's ``FileSystemWriter`` needs a filesystem every node
sees, as it does on a cluster.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from typing import Any

from ezpz_nb.verify.report import Report, VerifyError

__all__ = ["VIAS", "DcpLoader", "ThroughDcp", "resume_via"]

#: How a resume check carries the loader's state from one part to the next.
VIAS = ("state_dict", "dcp")


class DcpLoader:
    """The user's loader, whose ``state_dict`` saves through DCP and returns the folder's name.

    ``load_state_dict`` takes that name back and loads through DCP, after
    :meth:`~ezpz_nb.data.checkpoint.LoaderCheckpoint.prepare_load` (which
    refuses a changed layout). Iteration and ``set_epoch`` go to the loader.
    """

    def __init__(self, loader: Any, layout: Any, root: str) -> None:
        from ezpz_nb.data.checkpoint import LoaderCheckpoint

        self.loader, self.root = loader, root
        self.checkpoint = LoaderCheckpoint(loader, layout)
        self._part = 0  # which save this is: one folder per save, named in order

    def __iter__(self) -> Any:
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        """Forward to the loader (it reshuffles)."""
        from ezpz_nb.data.distributed import forward_set_epoch

        forward_set_epoch(self.loader, epoch)

    def state_dict(self) -> dict[str, Any]:
        """``dcp.save`` on every rank (collective), then ``{"dcp": folder}``."""
        import torch.distributed.checkpoint as dcp

        path = os.path.join(self.root, f"save{self._part}")
        with warnings.catch_warnings():
            # An earlier scenario of this check saved here: overwriting it is the point.
            warnings.filterwarnings("ignore", message="Detected an existing checkpoint")
            dcp.save({"data": self.checkpoint}, checkpoint_id=path)
        return {"dcp": path, "part": self._part}

    def load_state_dict(self, token: dict[str, Any]) -> None:
        """``dcp.load`` from the folder a previous part saved to (collective)."""
        import torch.distributed.checkpoint as dcp

        if not isinstance(token, dict) or "dcp" not in token:
            raise VerifyError(f"not a token from DcpLoader.state_dict(): {token!r:.200}")
        self.checkpoint.prepare_load(token["dcp"])
        dcp.load({"data": self.checkpoint}, checkpoint_id=token["dcp"])
        self._part = int(token["part"]) + 1


class ThroughDcp:
    """A loader factory that wraps each loader it makes in a :class:`DcpLoader`.

    ``compare_draws`` asks ``check_resume`` to compare the resumed batches'
    contents with the straight run's, not only their sample ids: the checkpoint
    carries the loader's RNG, so a loader that forgets it draws other masks.
    """

    compare_draws = True

    def __init__(self, make_loader: Callable[..., Any], root: str) -> None:
        self.make_loader, self.root = make_loader, root
        self.__qualname__ = getattr(make_loader, "__qualname__", type(make_loader).__name__)

    def __call__(self, layout: Any, **options: Any) -> DcpLoader:
        return DcpLoader(self.make_loader(layout, **options), layout, self.root)


def _shared_root() -> tuple[str, bool]:
    """A folder for the checkpoints, and whether this process made it (and removes it)."""
    from ezpz_nb.launcher.torchrun import in_torchrun_env

    if not in_torchrun_env():
        return tempfile.mkdtemp(prefix="ezpz-dcp-"), True
    # Every rank of a node computes the same path without talking.
    run = os.environ.get("TORCHELASTIC_RUN_ID", "none") + "-" + os.environ.get("MASTER_PORT", "")
    path = os.path.join(tempfile.gettempdir(), f"ezpz-dcp-{run}")
    os.makedirs(path, exist_ok=True)
    return path, os.environ.get("LOCAL_RANK", "0") == "0"


def resume_via(
    via: str, check: Callable[..., Report], make_loader: Callable[..., Any], **kwargs: Any
) -> Report:
    """Run ``check`` (``check_resume``) with the state carried by ``via`` (see :data:`VIAS`).

    Raises:
        VerifyError: ``via`` unknown.
    """
    if via not in VIAS:
        raise VerifyError(f"via must be one of {VIAS}, got {via!r}")
    if via == "state_dict":
        return check(make_loader, **kwargs)
    root, owner = _shared_root()
    try:
        return check(ThroughDcp(make_loader, root), **kwargs)
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()  # under torchrun: nobody removes the folder while a peer reads it
        if owner:
            shutil.rmtree(root, ignore_errors=True)
