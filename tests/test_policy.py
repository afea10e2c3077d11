"""The launcher's policy and failure wording, without processes: hand-made run results.

``decide`` is a pure function over a ``RunResult``; ``RankError`` words what it is
given. Both are tested here with results and failures made by hand, including the
cases a real run makes only rarely (a rank that died while others were stuck).
"""

from __future__ import annotations

import os

import pytest

import ezpz_nb.launcher.failures as failures_mod
from ezpz_nb.launcher import failures, wire
from ezpz_nb.launcher.errors import RankError, ranks_text
from ezpz_nb.launcher.policy import KEPT_NOTE, decide
from ezpz_nb.launcher.run import RunResult

CELL = "/tmp/ipykernel_123/456.py"  # what a notebook cell's frames are named
TORCH = "/site-packages/torch/distributed/distributed_c10d.py"
OURS = os.path.join(os.path.dirname(failures_mod.__file__), "rankgroup.py")


def _raised(rank: int, header: str = "KeyError: 'x'", frames=None, ours: str = ""):
    frames = frames or (wire.Frame(CELL, 6, "f", "d['x']"),)
    return failures.decode(rank, wire.Error((wire.Link(tuple(frames), header),), ours))


def test_all_replied_returns():
    """Guards: a clean run keeps the ranks and returns."""
    d = decide(RunResult(replies={0: 1, 1: 2}))
    assert (d.outcome, d.kill) == ("return", False)


@pytest.mark.parametrize("one_shot", [False, True])
def test_a_raise_with_every_rank_answered_keeps_the_ranks_unless_one_shot(one_shot):
    """Guards: a failure that leaves no rank stuck keeps the cluster's state (not for launch)."""
    d = decide(RunResult(replies={0: 1}, failures={1: _raised(1)}), one_shot=one_shot)
    assert d.outcome == "rank_error" and d.kill is False
    assert d.note == ("" if one_shot else KEPT_NOTE)


def test_a_raise_while_others_wait_kills_and_marks_them_stopped():
    """Guards: ranks stuck in a collective for the failed one are stopped, and said so."""
    d = decide(RunResult(failures={1: _raised(1)}, pending={0, 2}))
    assert d.outcome == "rank_error" and d.kill is True and d.note == ""
    assert {r: f.kind for r, f in d.failures.items()} == {
        0: "stopped",
        1: "exception",
        2: "stopped",
    }


@pytest.mark.parametrize("code", [-9, 3])
def test_a_death_kills_even_when_nobody_waits(code):
    """Guards: a rank that died (signal or exit) leaves a broken group: never kept."""
    d = decide(RunResult(replies={0: 1}, failures={1: failures.from_exit(1, code)}))
    assert d.outcome == "rank_error" and d.kill is True


def test_a_failure_while_starting_kills():
    """Guards: a rank that could not join leaves no usable group."""
    d = decide(RunResult(replies={0: 10}, failures={1: _raised(1)}), starting=True)
    assert d.kill is True and d.note == ""


def test_silence_is_a_hang_and_an_interrupt_wins_over_everything():
    """Guards: pending ranks without a failure are a hang; an interrupt is reported as such
    even when a rank also failed."""
    assert decide(RunResult(replies={1: 0}, pending={0})).outcome == "hang"
    d = decide(RunResult(failures={1: _raised(1)}, pending={0}, interrupted=True))
    assert (d.outcome, d.kill) == ("interrupt", True)


def test_ranks_text_says_ranges_and_lists():
    """Guards the rank lists of headers: a range only from three ranks on."""
    assert ranks_text([1]) == "rank 1"
    assert ranks_text([0, 1, 2, 3]) == "ranks 0-3"
    assert ranks_text([0, 2, 5]) == "ranks 0, 2 and 5"


def test_identical_failures_fold_and_the_rank_is_said_once():
    """Guards: 4 identical tracebacks, and "rank 1 failed: rank 1: KeyError"."""
    err = RankError({r: _raised(r) for r in range(4)})
    text = str(err)
    assert text.splitlines()[0] == "ranks 0-3 failed: KeyError: 'x' (the same on each)"
    assert text.count("Traceback (most recent call last)") == 1
    assert "rank 1: KeyError" not in text
    shown = "\n".join(err._render_traceback_())
    # the header, then the failing line: one frame needs no traceback repeating it
    assert shown.count("KeyError: 'x'") == 1 and "Traceback" not in shown
    assert shown.splitlines()[1] == f'  at File "{CELL}", line 6, in f'


def test_different_failures_are_told_apart():
    """Guards folding too much: a different message or line is its own traceback."""
    other = _raised(2, frames=(wire.Frame(CELL, 9, "f", "d['y']"),))
    err = RankError({0: _raised(0), 1: _raised(1), 2: other, 3: failures.stopped(3)})
    text = str(err)
    assert "ranks 0 and 1 failed: KeyError: 'x' (the same on each)" in text
    assert "rank 2 failed: KeyError: 'x'\n" in text
    assert "rank 3 was still running" in text
    assert text.count("Traceback (most recent call last)") == 2


def test_our_frames_show_only_when_the_failure_is_ours():
    """Guards: ezpz_nb's plumbing in a learner's traceback; and an empty one when it is ours."""
    frames = (wire.Frame(CELL, 3, "f", "dist.init_process_group('nccl')"),) + (
        wire.Frame(OURS, 100, "_init_process_group", "raise RuntimeError('no')"),
    )
    theirs = "\n".join(RankError({0: _raised(0, "RuntimeError: no", frames)})._render_traceback_())
    assert "rankgroup.py" not in theirs and "init_process_group('nccl')" in theirs
    ours = _raised(0, "RuntimeError: no", frames, ours=failures.OUR_FAULT)
    shown = "\n".join(RankError({0: ours})._render_traceback_())
    assert "rankgroup.py" in shown and failures.OUR_FAULT in shown
    assert "inside ezpz_nb, before your function ran" in shown
    assert "rankgroup.py" in str(RankError({0: _raised(0, "RuntimeError: no", frames)}))


def test_kinds_read_as_sentences():
    """Guards the wording of each kind: one rank, one verb, the kind's own words."""
    lines = str(
        RankError(
            {
                0: failures.from_exit(0, -9),
                1: failures.from_exit(1, 3),
                2: failures.decode(2, wire.Unpicklable("return value (a lock)", "nope")),
            }
        )
    ).splitlines()
    assert lines[0].startswith("rank 0 was killed by SIGKILL")
    assert lines[1].startswith("rank 1 exited with code 3 without replying")
    assert lines[2].startswith("rank 2: its return value (a lock) could not be sent back")


def test_user_frames_skip_library_and_cover_the_chain():
    """Guards the checkers finding the learner's line: library frames are not theirs, and a
    learner's frame in an earlier exception of the chain still counts."""
    first = wire.Link((wire.Frame(CELL, 4, "g", "int('a')"),), "ValueError: a", "")
    last = wire.Link(
        (wire.Frame(CELL, 8, "f", "raise KeyError"), wire.Frame(TORCH, 1, "barrier", "")),
        "KeyError: 'k'",
        "During handling of the above exception, another exception occurred:",
    )
    f = failures.decode(0, wire.Error((first, last)))
    assert [(fr.lineno, fr.name) for fr in f.user_frames()] == [(4, "g"), (8, "f")]
    assert f.exc_type == "KeyError" and f.frames[-1].name == "barrier"


def test_a_rank_back_in_its_loop_reads_as_finished():
    """Guards the interrupt report: a rank whose reply was sent but not yet read (back in
    the rank loop, waiting for a job) is "finished", not "running Python code"; a rank
    inside the learner's code is still blocked there."""
    from ezpz_nb.launcher import rank as rank_mod
    from ezpz_nb.launcher.stacks import stack_from_frames

    loop = [
        wire.Frame(rank_mod.__file__, 10, "main", ""),
        wire.Frame(rank_mod.__file__, 20, "_serve_forever", ""),
    ]
    import multiprocessing.connection as mpc

    recv = [wire.Frame(mpc.__file__, 1, "_recv", "")]
    assert stack_from_frames(1, loop + recv).state == "finished"
    user = [wire.Frame(CELL, 5, "stuck", "dist.barrier()"), wire.Frame(TORCH, 1, "barrier", "")]
    blocked = stack_from_frames(0, loop + user)
    assert (blocked.state, blocked.call) == ("blocked", "barrier")


def test_a_stack_caught_in_torchs_decorator_names_the_call_from_the_users_line():
    """Guards "wrapper() at hangs.py:7": a stack taken as the rank entered c10d's logging
    decorator, before the collective itself, named the decorator."""
    from ezpz_nb.launcher.stacks import stack_from_frames

    user = [
        wire.Frame(CELL, 7, "stuck", "dist.all_reduce(t, op=dist.ReduceOp.SUM)"),
        wire.Frame(TORCH, 1, "wrapper", ""),
    ]
    assert stack_from_frames(0, user).call == "all_reduce"


def test_a_forked_ranks_inherited_cell_frame_is_not_where_it_hung():
    """Guards the fifth trial's "still in its own code" on a busy machine: a rank forked
    from a cell carries the cell's frames above its loop (``check_pack()`` at the cell's
    line); a rank still in the checker's own work below the loop was blamed on that line.
    Only frames below the loop are where a rank is; with none of the learner's there, the
    verdict says the check had not reached their function."""
    import pickle as pickle_mod

    from ezpz_nb.launcher import rank as rank_mod
    from ezpz_nb.launcher.errors import HangError
    from ezpz_nb.launcher.stacks import stack_from_frames
    from ezpz_nb.workshop.verdicts import stopped_by

    inherited = [wire.Frame(CELL, 3, "<module>", "ex.check_pack(pack)")]
    loop = [
        wire.Frame(rank_mod.__file__, 10, "main", ""),
        wire.Frame(rank_mod.__file__, 20, "_serve_forever", ""),
    ]
    checker = [wire.Frame(pickle_mod.__file__, 1, "load", "")]
    starting = stack_from_frames(0, inherited + loop + checker)
    assert starting.state == "blocked" and starting.where is None, starting
    verdict = stopped_by(HangError({0: starting, 1: starting}, 15.0)).message
    assert "had not reached your function yet" in verdict and "line 3" not in verdict, verdict
    # A learner's line below the loop is still where the rank was, and is blamed.
    own = stack_from_frames(0, inherited + loop + [wire.Frame(CELL, 9, "pack", "while True:")])
    assert own.where is not None and "9" in own.where
    verdict = stopped_by(HangError({0: own, 1: starting}, 15.0)).message
    assert "never reached a collective: still in its own code" in verdict, verdict


def test_the_type_of_an_exception_with_a_note_and_no_message_is_its_name():
    """Guards the type read from the header's first line: ``NotImplementedError()`` with a
    note has the note on the next line and no colon, and was typed by the whole header (a
    checker then judged a shipped blank "wrong", not "not done")."""
    link = wire.Link((wire.Frame(CELL, 3, "f", "raise e"),), "NotImplementedError\nsee cell 4", "")
    assert failures.decode(0, wire.Error((link,))).exc_type == "NotImplementedError"
