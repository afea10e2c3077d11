"""Pure functions checked without starting any rank: the wire protocol, hang-report parsing,
the broadcast's slot layout and the batch tree.

Each of these is also exercised end to end by the multi-process tests; here a failure
points at the function itself, in milliseconds.
"""

from __future__ import annotations

import os
import pickle
import threading
from collections import namedtuple

import pytest
import torch

from ezpz_nb.data.broadcast import ALIGN, _slots
from ezpz_nb.data.tree import flatten_batch, unflatten_batch
from ezpz_nb.launcher import rank as ez_rank
from ezpz_nb.launcher import wire
from ezpz_nb.launcher.stacks import parse_faulthandler, stack_from_frames

TORCH_FILE = os.path.join(os.path.dirname(torch.__file__), "distributed", "distributed_c10d.py")
CELL = "/tmp/ipykernel_123/456.py"  # what a notebook cell's frames are named


# ---------------------------------------------------------------- the wire protocol
@pytest.mark.parametrize(
    "msg",
    [
        wire.Ready(1234),
        wire.Ok({"a": [1, 2]}),
        wire.Error([([("f.py", 3, "g", "x = 1")], "ValueError: no", "")], ours="ours"),
        wire.Unpicklable("return value (a lock)", "TypeError: no"),
        wire.Event({"step": 1}),
    ],
)
def test_rank_messages_round_trip_as_their_own_type(msg):
    back = wire.loads(wire.dumps(msg))
    assert type(back) is type(msg) and back == msg


def test_commands_round_trip_with_plain_pickle():
    assert wire.loads(wire.command(wire.Run(b"job"))) == wire.Run(b"job")
    assert isinstance(pickle.loads(wire.command(wire.Stop())), wire.Stop)


def test_a_job_loads_into_the_rank_namespace_and_cycles_resolve():
    """Guards the RecursionError: helpers that call each other share one globals dict."""
    ns: dict = {"__name__": "__main__"}
    exec("def even(n): return n == 0 or odd(n - 1)\ndef odd(n): return n != 0 and even(n - 1)", ns)
    rank_ns = wire.new_namespace()
    fn = wire.loads_job(wire.dumps_job(ns["even"]), rank_ns)
    assert fn(10) is True and fn(7) is False
    assert fn.__globals__ is rank_ns and rank_ns["odd"](3) is True


def test_an_lru_cache_helper_of_the_notebook_travels_by_value():
    """Guards issue 45's third trial: an ``functools.lru_cache`` (or ``cache``) helper of the
    notebook's ``__main__`` pickled by name, and the rank's ``__main__`` has no such name
    (AttributeError on the rank). It travels by value and gets an empty cache of its own."""
    ns: dict = {"__name__": "__main__"}
    src = (
        "import functools\n"
        "@functools.lru_cache(maxsize=8)\n"
        "def sq(x): return x * x\n"
        "@functools.cache\n"
        "def cube(x): return x ** 3\n"
        "def f(x): return sq(x) + cube(x), sq.cache_info().currsize, sq.cache_parameters()\n"
    )
    exec(src, ns)
    ns["f"](5)  # the notebook's cache is not sent
    fn = wire.loads_job(wire.dumps_job(ns["f"]), wire.new_namespace())
    assert fn(3) == (36, 1, {"maxsize": 8, "typed": False})


def test_an_unknown_persistent_id_is_refused():
    class Other(pickle.Pickler):
        def persistent_id(self, obj):
            return "something-else" if obj == "x" else None

    import io

    buf = io.BytesIO()
    Other(buf).dump(["x"])
    with pytest.raises(pickle.UnpicklingError, match="unknown persistent id"):
        wire.loads_job(buf.getvalue())


# ---------------------------------------------------------------- hang reports
DUMP = f"""\
Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/x/ezpz_nb/launcher/rank.py", line 50 in _watch_parent

Current thread 0x00007f0000000002 (most recent call first):
  File "{TORCH_FILE}", line 4000 in barrier
  File "{TORCH_FILE}", line 80 in wrapper
  File "{CELL}", line 9 in stuck
  File "/x/ezpz_nb/launcher/rank.py", line 240 in _serve_forever
  File "/x/ezpz_nb/launcher/rank.py", line 200 in main
"""


def test_parse_faulthandler_returns_the_marked_thread_outermost_first():
    frames = parse_faulthandler(DUMP, "_serve_forever")
    assert [f[2] for f in frames] == ["main", "_serve_forever", "stuck", "wrapper", "barrier"]
    assert parse_faulthandler(DUMP, "no_such_function") == []
    # A second dump (a later SIGUSR1) wins over the first.
    later = DUMP.replace("line 9 in stuck", "line 12 in stuck")
    assert parse_faulthandler(DUMP + later, "_serve_forever")[2][1] == 12


def test_stack_from_frames_names_the_public_call_and_the_users_line():
    stack = stack_from_frames(0, parse_faulthandler(DUMP, "_serve_forever"))
    assert stack.state == "blocked" and stack.call == "barrier"  # not the "wrapper" plumbing
    assert stack.where is not None and "line 9" in stack.where


# ---------------------------------------------------------------- the broadcast's layout
def test_slots_align_each_tensor_to_its_element_size_and_the_end_to_align():
    slots, total = _slots((("int64", (3,)), ("uint8", (5,)), ("complex128", (2,)), ("float32", ())))
    for (start, _), itemsize in zip(slots, (8, 1, 16, 4), strict=True):
        assert start % max(8, itemsize) == 0
    assert [n for _, n in slots] == [24, 5, 32, 4]
    starts = [s for s, _ in slots]
    assert starts == sorted(starts) and all(
        a + n <= b for (a, n), b in zip(slots[:-1], starts[1:], strict=True)
    )
    assert total % ALIGN == 0 and total >= slots[-1][0] + slots[-1][1]


Pair = namedtuple("Pair", "x y")


def test_flatten_unflatten_round_trip_keeps_structure_and_tensor_identity():
    a, b, c = torch.arange(3), torch.ones(2, 2), torch.zeros(())
    batch = {"ids": a, "nested": [b, (c, "label")], "pair": Pair(1, a), 7: None}
    tree, tensors = flatten_batch(batch)
    assert [t is x for t, x in zip(tensors, (a, b, c, a), strict=True)] == [True] * 4
    pickle.dumps(tree)  # the tree travels without tensor data
    back = unflatten_batch(tree, tensors)
    assert back["nested"][1] == (c, "label") and isinstance(back["nested"][1], tuple)
    assert isinstance(back["pair"], Pair) and back["pair"].y is a
    assert list(back) == ["ids", "nested", "pair", 7] and back[7] is None


RANK_FILE = ez_rank.__file__
THREADED = f"""\
Thread 0x00007f0000000003 (most recent call first):
  File "{CELL}", line 4 in loader_state
  File "{RANK_FILE.replace("launcher/rank.py", "workshop/confine.py")}", line 90 in _run

Current thread 0x00007f0000000002 (most recent call first):
  File "{threading.__file__}", line 1100 in join
  File "{RANK_FILE.replace("launcher/rank.py", "workshop/confine.py")}", line 120 in call_confined
  File "{RANK_FILE}", line 240 in _serve_forever
  File "{RANK_FILE}", line 200 in main
"""


def test_a_learner_function_run_in_a_thread_is_where_the_rank_is():
    """Guards hangs in checkers that run the learner's function in a thread of its own
    (notebook 15's confined saves): the main thread only waits in library code, so the
    report named no line of theirs (and a busy-machine message blamed the checker)."""
    stack = stack_from_frames(0, parse_faulthandler(THREADED, "_serve_forever"))
    assert stack.where is not None and "4" in stack.where, stack
    # A later dump wins: once the thread is gone, the main thread alone is shown.
    later = THREADED.split("\n\n", 1)[1]
    frames = parse_faulthandler(THREADED + later, "_serve_forever")
    assert [f.name for f in frames][-1] == "join"
    assert stack_from_frames(0, frames).where is None
