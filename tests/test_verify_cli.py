"""``ezpz-nb check`` and the pytest plugin (``loader_contract``/``loader_resume`` fixtures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ezpz_nb.cli import main

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.timeout(240)

LOADERS = str(Path(__file__).parent / "_verify_loaders.py")


def test_check_exits_0_on_a_right_loader_and_writes_json(tmp_path, capsys):
    """A right loader: exit 0, the table on stdout, the report in --json.

    Guards: a CI step that passes without having checked anything.
    """
    out = tmp_path / "report.json"
    code = main(["check", f"{LOADERS}:right", "--layout", "dp=2,tp=2", "--json", str(out)])
    assert code == 0, capsys.readouterr()
    assert "PASS" in capsys.readouterr().out
    assert json.loads(out.read_text())[0]["verdict"] == "pass"


@pytest.mark.parametrize(
    ("factory", "code", "words"),
    [
        ("unsharded", 1, "dp_duplicate"),
        ("raises_on_rank1", 2, "rank 1: make_loader raised"),
        ("nothing_here", 2, "has no 'nothing_here'"),
    ],
)
def test_check_exits_1_on_a_violation_and_2_when_it_cannot_run(factory, code, words, capsys):
    """A violation exits 1 with the table; a broken factory or name exits 2 with the reason.

    Guards: a violation that CI reads as success, or a crash that reads as a violation.
    """
    assert main(["check", f"{LOADERS}:{factory}", "--epochs", "1"]) == code
    both = capsys.readouterr()
    assert words in both.out + both.err


def test_check_says_not_all_judged_and_strict_exits_1(capsys):
    """One epoch leaves the reshuffle not judged: exit 0 with NOT ALL JUDGED on the
    headline and on stderr; with --strict, exit 1.

    Guards: a CI log whose exit 0 reads as a clean pass of a rule that never ran, and a
    --strict that lets it through.
    """
    assert main(["check", f"{LOADERS}:right", "--epochs", "1"]) == 0
    both = capsys.readouterr()
    said = " ".join(both.out.split())  # the table breaks lines between words
    assert "NOT ALL JUDGED" in said and "PASS" not in said.split(" rule ")[0]
    assert "NOT ALL JUDGED: exit 0" in both.err and "--strict" in both.err
    assert main(["check", f"{LOADERS}:right", "--epochs", "1", "--strict"]) == 1
    assert "not judged: reshuffle" in " ".join(capsys.readouterr().out.split())


@pytest.mark.system  # a fresh pytest run of a user's project, ranks and all: `make system`
def test_plugin_loads_without_torch_and_its_fixture_fails_a_bad_loader(pytester):
    """In a fresh pytest: loading the plugin imports no torch; the fixture passes a right
    loader (warning that one epoch leaves the reshuffle not judged), fails it with
    strict=True, passes it strict with shuffle=False (the reshuffle "not asked", no warning),
    and fails a wrong one with the report's table.

    Guards: a plugin that slows every pytest run of a project (torch at load time), a
    fixture whose failure does not say which rule broke, or one that lets a rule it
    never judged read as a pass.
    """
    pytester.makepyfile(
        test_loaders=f"""
        import sys
        TORCH_AT_COLLECTION = "torch" in sys.modules

        sys.path.insert(0, {str(Path(LOADERS).parent)!r})

        def test_plugin_is_light():
            assert not TORCH_AT_COLLECTION

        def test_right(loader_contract):
            import _verify_loaders as L
            report = loader_contract(L.right, "dp=2", epochs=1)
            assert not report.failed

        def test_wrong(loader_contract):
            import _verify_loaders as L
            loader_contract(L.unsharded, "dp=2", epochs=1)

        def test_strict(loader_contract):
            import _verify_loaders as L
            loader_contract(L.right, "dp=2", epochs=1, strict=True)

        def test_not_asked_is_strict_clean(loader_contract):
            import _verify_loaders as L
            report = loader_contract(L.right, "dp=2", epochs=1, shuffle=False, strict=True)
            assert report.ok and report.rule_verdicts()["reshuffle"] == "not asked"
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-rw")
    result.assert_outcomes(passed=3, failed=2, warnings=1)
    result.stdout.fnmatch_lines(["*ContractViolation*", "*DP replicas get disjoint samples*fail*"])
    result.stdout.fnmatch_lines(["*RulesNotJudged*not judged: reshuffle*"])


def test_plugin_module_imports_nothing_heavy():
    """``import ezpz_nb_pytest`` loads neither torch nor ezpz_nb.

    Guards: an import moved to the module's top (pytest loads the plugin in every
    run of every project that installs ezpz_nb).
    """
    code = "import sys, ezpz_nb_pytest; print(sorted(m for m in ('torch', 'ezpz_nb') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.system  # a torchrun job, as on a cluster: `make system`
def test_check_under_torchrun_exits_1_and_rank_0_prints(tmp_path):
    """`torchrun -m ezpz_nb check`: in place on torchrun's ranks, one table, a failing exit.

    Guards: four copies of the report in a CI log, or a violation torchrun reports as success.
    """
    from test_torchrun import torchrun_cmd

    cmd, env = torchrun_cmd(
        4, "ezpz_nb", "check", f"{LOADERS}:world_sharded", "--layout", "dp=2,tp=2"
    )
    cmd[cmd.index("-m", 3) + 1] = "ezpz_nb"  # the package's own __main__, not an example
    proc = subprocess.run(
        cmd, env=dict(env, TMPDIR=str(tmp_path)), capture_output=True, text=True, timeout=150
    )
    assert proc.returncode != 0
    said = " ".join(proc.stdout.split())  # the table breaks lines between words
    assert said.count("(len(loader.dataset)): FAIL") == 1, proc.stdout + proc.stderr[-2000:]


@pytest.mark.system  # a torchrun job, as on a cluster: `make system`
def test_check_under_torchrun_bad_input_exits_2_on_every_rank(tmp_path):
    """A layout that does not match torchrun's world: every rank exits 2, rank 0 says why once.

    Guards: bad input that exits 1 like a violation under torchrun (the documented
    1 vs 2 lost), or ranks that disagree on the status.
    """
    import re

    from test_torchrun import torchrun_cmd

    cmd, env = torchrun_cmd(2, "ezpz_nb", "check", f"{LOADERS}:right", "--layout", "dp=4")
    cmd[cmd.index("-m", 3) + 1] = "ezpz_nb"
    proc = subprocess.run(
        cmd, env=dict(env, TMPDIR=str(tmp_path)), capture_output=True, text=True, timeout=150
    )
    assert proc.returncode != 0
    # torchrun's summary: "rank : 1 (local_rank: 1)" then "exitcode : 2 (pid: ...)".
    codes = re.findall(
        r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*exitcode\s*:\s*(-?\d+)", proc.stderr
    )
    assert dict(codes) == {"0": "2", "1": "2"}, proc.stderr
    assert proc.stderr.count("exit status 2: the check could not run") == 1, proc.stderr
