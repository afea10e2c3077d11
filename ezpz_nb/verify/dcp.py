"""``check_resume(..., via="dcp")``: the loader's state goes through ``torch.distributed.checkpoint``.

With ``via="state_dict"`` (the default) each rank's ``state_dict()`` travels back
to the notebook and into the next part's rank of the same number. A real job
instead writes it with ``dcp.save`` beside the model and reads it with
``dcp.load``, where one key written by every rank keeps one rank's value
(:mod:`ezpz_nb.data.checkpoint`). Here every part's ranks save the user's loader
through :class:`~ezpz_nb.data.checkpoint.LoaderCheckpoint` (per-DP-rank keys,
RNG, layout) into a folder of their own, and the next part's ranks load it
from there: only a token naming the folder travels through the notebook. As with
``via="state_dict"``, the resumed batches must hold the straight run's samples and
contents (a forgotten RNG draws other masks; :mod:`ezpz_nb.verify.divergence`). A
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
        self._saves = 0  # saves of this part: a resume check saves at its stop and once later
        #: What the last load skipped, in words (empty when it skipped nothing).
        self.load_note = ""

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

        path = os.path.join(self.root, f"save{self._part}.{self._saves}")
        self._saves += 1
        with warnings.catch_warnings():
            # An earlier scenario of this check saved here: overwriting it is the point.
            warnings.filterwarnings("ignore", message="Detected an existing checkpoint")
            dcp.save({"data": self.checkpoint}, checkpoint_id=path)
        return {"dcp": path, "part": self._part, "keys": _key_paths(self.loader.state_dict())}

    def plain_state_dict(self) -> dict[str, Any]:
        """The wrapped loader's own state (what the resume check compares, not the token)."""
        return self.loader.state_dict()

    def load_state_dict(self, token: dict[str, Any]) -> None:
        """``dcp.load`` from the folder a previous part saved to (collective)."""
        import torch.distributed.checkpoint as dcp

        if not isinstance(token, dict) or "dcp" not in token:
            raise VerifyError(f"not a token from DcpLoader.state_dict(): {token!r:.200}")
        # dcp.load fills only the keys of the template it is given: a key the loader's
        # state_dict() grows after its first iteration is skipped by a fresh loader.
        skipped = sorted(set(token.get("keys", ())) - set(_key_paths(self.loader.state_dict())))
        self.load_note = (
            f"the saved state held {', '.join(skipped[:4])}, which a freshly built loader's "
            "state_dict() lacks, so dcp.load (which loads only the keys of the fresh "
            "state_dict it is given) skipped them: make state_dict() return every key from "
            "the start (e.g. the generator's state before the first iteration)"
            if skipped
            else ""
        )
        self.checkpoint.prepare_load(token["dcp"])
        dcp.load({"data": self.checkpoint}, checkpoint_id=token["dcp"])
        self._part = int(token["part"]) + 1


def _key_paths(state: Any, prefix: str = "") -> list[str]:
    """``["sampler.epoch", "rng"]``: the paths of a (nested) state dict's leaves."""
    if not isinstance(state, dict):
        return [prefix] if prefix else []
    return [
        p for k, v in state.items() for p in _key_paths(v, f"{prefix}.{k}" if prefix else str(k))
    ]


class ThroughDcp:
    """A loader factory that wraps each loader it makes in a :class:`DcpLoader`."""

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
