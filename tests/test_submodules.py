"""Functions sent by value make the ranks import only the submodules their code reaches.

Guards launches that took seconds in notebooks 07 and 08: once the notebook had
imported ``torch.distributed.tensor``, every function naming ``torch.tensor`` and
``dist`` made each rank import DTensor before it ran.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.distributed.tensor  # the notebook's state under test: DTensor imported

from ezpz_nb.launcher import wire
from ezpz_nb.launcher.settings import PRELOAD_ENV
from ezpz_nb.launcher.submodules import reached

DTENSOR = sys.modules["torch.distributed.tensor"]


def _calls_torch_tensor():
    t = torch.tensor([dist.get_rank()])
    dist.all_reduce(t)
    return "torch.distributed.tensor" in sys.modules


def _uses_dtensor_through_dist():
    return dist.tensor.DTensor.__name__, "torch.distributed.tensor" in sys.modules


def _plain():
    return torch.tensor([dist.get_rank()])


def _via_dist():
    return dist.tensor.DTensor


def _through_a_local(mod):
    m = mod
    return m.tensor


def test_a_name_alone_does_not_reach_the_submodule():
    """Guards the name match: ``torch.tensor`` from ``torch`` is a function, not the submodule
    ``torch.distributed.tensor``; ``dist.tensor`` is the submodule."""
    assert reached(_calls_torch_tensor, [DTENSOR]) == []
    assert reached(_uses_dtensor_through_dist, [DTENSOR]) == [DTENSOR]


def test_a_chain_from_an_unknown_start_keeps_the_submodule():
    """Guards dropping a submodule the code may reach through a local variable."""
    assert reached(_through_a_local, [DTENSOR]) == [DTENSOR]


def test_the_pickled_job_names_dtensor_only_when_the_code_reaches_it():
    """Guards the hook into cloudpickle: the job's bytes carry the module's name or not."""
    # (These two hold no string that names the module themselves.)
    assert b"torch.distributed.tensor" not in wire.dumps(_plain)
    assert b"torch.distributed.tensor" in wire.dumps(_via_dist)


def test_ranks_import_dtensor_only_for_code_that_uses_it():
    """Guards both ends on real ranks: a plain collective leaves DTensor unimported, and a
    function that reaches it through ``dist.tensor`` still finds it there. In a Python of its
    own without ``EZPZ_NB_PRELOAD``: the test run preloads DCP, which imports DTensor into
    every rank's forkserver."""
    # The two functions above, defined in the script (sent by value, as a cell's are): a
    # rank that unpickled them from this module would import it, and its DTensor with it.
    code = (
        "import sys, torch, torch.distributed as dist, torch.distributed.tensor\n"
        "import ezpz_nb as ez\n"
        + inspect.getsource(_calls_torch_tensor)
        + inspect.getsource(_uses_dtensor_through_dist)
        + "print(ez.launch(_calls_torch_tensor, world_size=2))\n"
        "print(ez.launch(_uses_dtensor_through_dist, world_size=2))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != PRELOAD_ENV}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    fresh, reached = done.stdout.strip().splitlines()[-2:]
    assert fresh == str([False, False])
    assert reached == str([("DTensor", True)] * 2)
