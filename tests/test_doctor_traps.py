"""What `ezpz-nb doctor` tells each platform: the traps, worded for Windows, macOS, Linux."""

from __future__ import annotations

import pytest

from ezpz_nb.cli.traps import start_method_check, threads_check, torchrun_check, trap_checks


def test_windows_torchrun_says_to_set_use_libuv():
    """Guards: a Windows learner whose torchrun dies with the libuv error is told the fix,
    and that ez.launch is not affected (pytorch issue 139990)."""
    check = torchrun_check("win32", {})
    assert check is not None and check.ok is None
    assert "use_libuv was requested but PyTorch was built without libuv support" in check.detail
    assert "USE_LIBUV=0" in check.fix and "ez.launch uses a file store" in check.fix
    done = torchrun_check("win32", {"USE_LIBUV": " 0 "})
    assert done is not None and done.ok is True


@pytest.mark.parametrize("value", ["1", "", "false", "no"])
def test_windows_torchrun_other_values_still_warn(value):
    """Guards: only USE_LIBUV=0 turns libuv off in torch; other spellings do not."""
    check = torchrun_check("win32", {"USE_LIBUV": value})
    assert check is not None and check.ok is None


@pytest.mark.parametrize("platform", ["linux", "darwin"])
def test_no_libuv_line_off_windows(platform):
    """Guards: Linux and macOS learners are not told about a Windows-only trap."""
    assert torchrun_check(platform, {}) is None
    assert [c.name for c in trap_checks(platform, {}, cores=8)] == ["start method", "threads"]


def test_macos_says_spawn_and_what_it_costs():
    """Guards: on macOS the learner learns ranks are spawned, what each launch pays, and
    that the standby pool is what hides it."""
    cold = start_method_check("darwin", {})
    assert cold.ok is None
    assert cold.detail.startswith("spawn (the platform's default): every rank is a fresh Python")
    assert "imports torch" in cold.detail and "EZPZ_NB_STANDBY" in cold.fix
    warm = start_method_check("darwin", {}, standby=4)
    assert warm.ok is True and "4 standby ranks import it ahead" in warm.detail


def test_start_method_from_the_variable_is_named():
    """Guards: a learner who set EZPZ_NB_START_METHOD sees that it is in effect, and a
    value the platform cannot run is a FAIL saying what to set."""
    forced = start_method_check("linux", {"EZPZ_NB_START_METHOD": "spawn"})
    assert "spawn (EZPZ_NB_START_METHOD)" in forced.detail
    linux = start_method_check("linux", {})
    assert linux.ok is True and linux.detail.startswith("forkserver:")
    bad = start_method_check("win32", {"EZPZ_NB_START_METHOD": "fork"})
    assert bad.ok is False and "set it to 'spawn'" in bad.fix
    fork_mac = start_method_check("darwin", {"EZPZ_NB_START_METHOD": "fork"})
    assert fork_mac.ok is None and "unset EZPZ_NB_START_METHOD" in fork_mac.fix


@pytest.mark.parametrize(
    ("cores", "env", "ok", "says"),
    [
        (8, {}, True, "4 ranks x 2 thread(s) fit 8 cores"),
        (4, {}, True, "4 ranks x 1 thread(s) fit 4 cores"),
        (2, {}, None, "4 ranks x 1 thread on 2 cores: ranks take turns"),
        (8, {"OMP_NUM_THREADS": "8"}, None, "under torchrun 4 processes run 32 threads"),
        (8, {"OMP_NUM_THREADS": "2"}, True, "fit 8 cores"),  # 4 x 2 = 8: exactly full
        (8, {"OMP_NUM_THREADS": "1"}, True, "fit"),
        (8, {"OMP_NUM_THREADS": "lots"}, True, "fit"),  # not a number: torch ignores it
    ],
)
def test_threads_oversubscription(cores, env, ok, says):
    """Guards: ranks x threads beyond the cores is named (ez.launch's split, and a shell's
    OMP_NUM_THREADS that torchrun keeps), and a machine that fits is not warned."""
    check = threads_check(cores, env)
    assert check.ok is ok and says in check.detail
    if ok is None:
        assert check.fix


def test_oversubscribed_torchrun_says_what_to_set():
    """Guards: the fix names a value that fits (cores // ranks), not just "lower it"."""
    check = threads_check(16, {"OMP_NUM_THREADS": "16"})
    assert "set it to 4" in check.fix and "unset OMP_NUM_THREADS" in check.fix
