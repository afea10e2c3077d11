"""Learner code that runs in the notebook's process while a check sends it (issue 45, trial 6).

Pickling the learner's function for the ranks runs code the function carries (an object's
``__reduce__``): in the notebook, where the verdict is made. Every checker goes through
``verdicts.judge``, which pickles the answers once before the check draws anything and
refuses a verdict when the checker's code changed or a thread started (``send_time.py``).
Each dodge here is one of trial 6's classes, written anew.
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest
import torch
import torch.distributed as dist

import ezpz_nb as ez
import ezpz_nb.workshop.exercises as ex
from ezpz_nb.workshop import collectives

CHECKERS = sorted(n for n in ex.__all__ if n.startswith("check_"))
#: The checker's own function, as its module defines it.
SUM_INPUTS = collectives.sum_inputs


@pytest.fixture(scope="module")
def four() -> Iterator[ez.Cluster]:
    with ez.Cluster(4, timeout=120) as cluster:
        yield cluster


@pytest.fixture()
def sum_inputs_kept() -> Iterator[None]:
    """Puts ``collectives.sum_inputs`` back, whatever a dodge made of it."""
    yield
    collectives.sum_inputs = SUM_INPUTS


# ------------------------------------------------------------------ the dodges
def _sum_anything(world: int, seed: int | None) -> list[torch.Tensor]:
    return [torch.zeros(2) for _ in range(world)]


def _no_collective(x: torch.Tensor) -> torch.Tensor:
    return x


def _make_no_collective() -> Any:
    return _no_collective


class PatchesTheChecker:
    """Rewrites the checker's inputs as it is pickled (trial 6: ``packing._check_row``)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def __reduce__(self) -> Any:
        sys.modules["ezpz_nb.workshop.collectives"].sum_inputs = _sum_anything  # type: ignore[attr-defined]
        return _make_no_collective, ()


def _make_no_collective() -> Any:
    return _no_collective


def _knows_the_draw(seed: int) -> Any:
    """Sums the checker's own inputs on the rank: no collective, and right when it knows the seed."""
    calls = iter((None, seed))

    def answer(x: torch.Tensor) -> torch.Tensor:
        return torch.stack(collectives.sum_inputs(dist.get_world_size(), next(calls))).sum(0)

    return answer


class ReadsTheDraw:
    """Walks up the frames to the check's drawn seed (trial 6 rewrote ``where`` so)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def __reduce__(self) -> Any:
        frame: FrameType | None = sys._getframe()
        while frame is not None and "seed" not in frame.f_locals:
            frame = frame.f_back
        if frame is None:
            return _make_no_collective, ()
        return _knows_the_draw, (frame.f_locals["seed"],)


class StartsAThread:
    """Leaves a thread waiting in the notebook, which could rewrite the draw later."""

    release = threading.Event()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def __reduce__(self) -> Any:
        threading.Thread(target=self.release.wait, daemon=True).start()
        return _make_no_collective, ()


class FailsOnceThenCheats:
    """Refuses to be pickled once, so that a second pickling (after the draw) runs it again."""

    pickled = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def __reduce__(self) -> Any:
        type(self).pickled += 1
        if type(self).pickled == 1:
            raise TypeError("cannot pickle this the first time")
        return ReadsTheDraw().__reduce__()


# ------------------------------------------------------------------ right answers
SCALE = torch.ones(2)


class Summer:
    """A right answer spread over a class attribute, a default and a closure."""

    op = dist.ReduceOp.SUM

    def __call__(self, x: torch.Tensor, scale: torch.Tensor = SCALE) -> torch.Tensor:
        dist.all_reduce(x, op=self.op)
        return x * scale


def _closure_sum() -> Any:
    ones = torch.ones(2)

    def global_sum(x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        return x * ones

    return global_sum


# ------------------------------------------------------------------ tests
def test_a_reduce_that_patches_a_checker_while_sent_is_refused(sum_inputs_kept):
    """Guards trial 6's send-time patch: code an answer runs as it is pickled rewrote the
    checker's own function in the notebook; the verdict is refused, naming what changed,
    before any rank starts."""
    result = ex.check_global_sum(PatchesTheChecker())
    assert result.status == "refused", result.message
    assert "sending your function to the ranks ran code" in result.message
    assert "collectives.sum_inputs" in result.message
    assert not result.passed


def test_a_checker_patched_in_a_cell_before_the_call_is_refused(sum_inputs_kept):
    """Guards the cell that patches the checker before calling it; once put back, a check
    judges again."""
    collectives.sum_inputs = _sum_anything
    result = ex.check_global_sum(_no_collective)
    assert result.status == "refused", result.message
    assert "changed in this notebook before the check" in result.message
    assert "collectives.sum_inputs" in result.message
    collectives.sum_inputs = SUM_INPUTS
    assert "expected a function" in ex.check_global_sum(42).message


def test_a_frame_lookup_swapped_in_a_cell_is_refused():
    """Guards the seventh trial's swap: an earlier cell replaced ``sys._getframe`` so that
    ``judge`` found no answer to pickle up front (the answer's code then ran after the draw).
    The checkers keep the interpreter's own lookup; a checker whose kept lookup was rebound,
    or that is not Python's own, is refused before any rank starts."""
    from ezpz_nb.workshop import send_time, verdicts

    real = sys._getframe

    def swapped(depth: int = 0) -> FrameType:
        return real(depth + 2)  # one frame too far: the cell, whose code takes no arguments

    class SaysWhenSent:
        """No collective (wrong); notes whether its first pickling ran inside ``sending``."""

        first: list[bool] = []

        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            return x

        def __reduce__(self) -> Any:
            f: FrameType | None = real(1)
            names = set()
            while f is not None:
                names.add(f.f_code.co_name)
                f = f.f_back
            SaysWhenSent.first.append("sending" in names)
            return (_make_no_collective, ())

    sys._getframe = swapped
    try:
        result = ex.check_global_sum(SaysWhenSent())  # judged with the kept lookup: wrong
    finally:
        sys._getframe = real
    assert result.status == "wrong" and "nothing was exchanged" in result.message, result.message
    assert SaysWhenSent.first[:1] == [True], SaysWhenSent.first  # pickled up front
    kept = verdicts._FRAME
    verdicts._FRAME = swapped
    try:
        rebound = ex.check_global_sum(_no_collective)
    finally:
        verdicts._FRAME = kept
    assert rebound.status == "refused", rebound.message
    flag = verdicts._FRAME_IS_THE_INTERPRETERS
    verdicts._FRAME_IS_THE_INTERPRETERS = False  # as if a cell swapped it before the import
    send_time.patched_on_purpose("ezpz_nb.workshop.verdicts", "_FRAME_IS_THE_INTERPRETERS")
    try:
        before = ex.check_global_sum(_no_collective)
    finally:
        verdicts._FRAME_IS_THE_INTERPRETERS = flag
    assert before.status == "refused", before.message
    assert "sys._getframe is not Python's own" in before.message


def test_a_thread_started_while_sent_is_refused():
    """Guards a thread left in the notebook by pickling (it could wait for the draw)."""
    try:
        result = ex.check_global_sum(StartsAThread())
    finally:
        StartsAThread.release.set()
    assert result.status == "refused", result.message
    assert "your function started a thread in the notebook while it was sent" in result.message


def test_a_frame_walk_at_send_time_finds_no_drawn_value(four):
    """Guards trial 6's data-only dodge: code run at pickling walked up to the check's drawn
    values. The answer is pickled before anything is drawn, so it finds none, and an answer
    without a collective is wrong."""
    result = ex.check_global_sum(ReadsTheDraw(), cluster=four)
    assert result.status == "wrong", result.message


def test_an_answer_that_cannot_be_sent_is_not_pickled_again():
    """Guards the second chance: an answer whose pickling fails once is never pickled again
    in the check (that would run its code after the draw); the verdict says it cannot be sent."""
    FailsOnceThenCheats.pickled = 0
    result = ex.check_global_sum(FailsOnceThenCheats())
    assert result.status == "wrong", result.message
    assert "cannot be sent to the ranks" in result.message
    assert FailsOnceThenCheats.pickled == 1


@pytest.mark.parametrize("answer", [Summer(), _closure_sum()], ids=["class", "closure"])
def test_right_answers_with_defaults_closures_and_class_attributes_pass(four, answer):
    """Guards right answers: state carried by a default, a closure or a class attribute is
    sent once and judged on the ranks; two checks in a row (warm ranks) both pass."""
    for _ in range(2):
        result = ex.check_global_sum(answer, cluster=four)
        assert result.status == "correct", result.message


def test_every_checker_takes_its_answers_positionally_and_the_rest_by_keyword():
    """Guards how ``judge`` finds the answers to send first: the calling checker's
    positional parameters. A checker taking a setting positionally would send that."""
    for name in CHECKERS:
        params = inspect.signature(getattr(ex, name)).parameters.values()
        positional = [p.name for p in params if p.kind is not p.KEYWORD_ONLY]
        assert positional and all(p.kind is not p.VAR_POSITIONAL for p in params), name
        assert not {"cluster", "timeout", "seed"} & set(positional), (name, positional)


class _SpyDone(BaseException):
    """Ends a check the spy was sent to (an Exception would be a verdict: "cannot be sent")."""


class _Spy:
    """An answer that records, as it is pickled, what its checker's frame holds then."""

    #: Per checker, the non-callable locals of its frame when the spy was pickled.
    seen: dict[str, dict[str, Any]] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def __reduce__(self) -> Any:
        frame: FrameType | None = sys._getframe()
        while frame is not None and not frame.f_code.co_name.startswith("check_"):
            frame = frame.f_back
        assert frame is not None
        code = frame.f_code
        params = set(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount])
        self.seen[code.co_name] = {
            k: v for k, v in frame.f_locals.items() if k not in params and not callable(v)
        }
        raise _SpyDone  # out of the check at once: nothing of it runs


def test_no_checker_draws_before_its_answers_are_sent():
    """Guards "before anything is drawn": when the answers are pickled, the checker's frame
    holds nothing drawn (a value that differs between two checks). No rank starts."""
    drawn = set()
    for name in CHECKERS:
        checker = getattr(ex, name)
        count = sum(
            p.kind is not p.KEYWORD_ONLY for p in inspect.signature(checker).parameters.values()
        )
        held: list[dict[str, Any]] = []
        while len(held) < 2 and (not held or held[0]):  # a second check only if it held any
            _Spy.seen.clear()
            with pytest.raises(_SpyDone):
                checker(*[_Spy() for _ in range(count)])
            held.append(_Spy.seen.get(name, {}))
        if len(held) == 2 and held[0] != held[1]:
            drawn.add(name)
    assert not drawn, f"checkers that draw before their answers are sent: {sorted(drawn)}"


# ------------------------------------------- hooks the notebook leaves running (trial 6b)
def _notebook_code(source: str) -> dict[str, Any]:
    """Names ``source`` defines as a notebook cell would: in ``__main__``'s namespace."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(source, "/tmp/ipykernel_1/2345.py", "exec"), namespace)
    return namespace


def test_a_profile_function_set_by_an_earlier_cell_is_refused():
    """Guards trial 6b's profile hook (it zeroed 12's counts and rewrote 16's verdict): a
    profile or trace function of the notebook's own refuses the check; once removed, the
    check judges. One of the library's own (a debugger's) does not count."""
    hook = _notebook_code("def hook(frame, event, arg):\n    return None\n")["hook"]
    sys.setprofile(hook)
    try:
        result = ex.check_global_sum(_no_collective)
    finally:
        sys.setprofile(None)
    assert result.status == "refused", result.message
    assert "a profile function (sys.setprofile)" in result.message
    assert "expected a function" in ex.check_global_sum(42).message


def test_a_thread_an_earlier_cell_started_and_a_gc_callback_are_refused():
    """Guards trial 6b's copier thread (15) and gc callback (16): code of the notebook's own
    that runs beside the check refuses it, each named."""
    import gc

    cell = _notebook_code(
        "import threading\nstop = threading.Event()\n"
        "def copier():\n    stop.wait(60)\n"
        "def callback(phase, info):\n    pass\n"
    )
    t = threading.Thread(target=cell["copier"], name="copier", daemon=True)
    t.start()
    gc.callbacks.append(cell["callback"])
    try:
        result = ex.check_global_sum(_no_collective)
    finally:
        gc.callbacks.remove(cell["callback"])
        cell["stop"].set()
        t.join()
    assert result.status == "refused", result.message
    assert "a thread started in the notebook ('copier')" in result.message
    assert "a garbage collector callback" in result.message


def test_a_standard_library_function_patched_in_a_cell_is_refused():
    """Guards trial 6b's patched builtins.abs and random.Random.sample (the checker computes
    with them): refused, naming what changed."""
    import builtins
    import random

    real_abs, real_sample = builtins.abs, random.Random.sample
    builtins.abs = _notebook_code("def abs(x):\n    return 0.0\n")["abs"]
    try:
        result = ex.check_global_sum(_no_collective)
    finally:
        builtins.abs = real_abs
    assert result.status == "refused", result.message
    assert "builtins.abs" in result.message
    random.Random.sample = lambda self, population, k: []  # type: ignore[method-assign]
    try:
        result = ex.check_global_sum(_no_collective)
    finally:
        random.Random.sample = real_sample  # type: ignore[method-assign]
    assert result.status == "refused" and "random.Random" in result.message, result.message
