"""Every ``from ezpz_nb... import name`` outside the package resolves.

The package's own imports are checked by importing it; the scripts around it are not:
``benchmarks/dcp_state.py`` imported ``TinyLM`` for a round after it was renamed
``CapstoneLM``, while docs/checkpoint.md quoted its numbers (issue 47 item 4). This
reads every import of ours in benchmarks/, tests/ and the notebooks' sources (at module
level, in functions, anywhere) and resolves each name.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("benchmarks", "tests", "notebooks/_cells")


def _fallbacks(tree: ast.AST) -> set[ast.AST]:
    """Imports in an ``except ImportError`` handler: the old home of a name, kept for
    older trees (benchmarks/compare.py times those); the ``try`` side is checked."""
    out: set[ast.AST] = set()
    for node in ast.walk(tree):
        for handler in node.handlers if isinstance(node, ast.Try) else []:
            caught = {getattr(n, "id", None) for n in ast.walk(handler.type or ast.Pass())}
            if caught & {"ImportError", "ModuleNotFoundError"}:
                out.update(n for b in handler.body for n in ast.walk(b))
    return out


def our_imports(path: Path) -> Iterable[tuple[int, str, str | None]]:
    """``(line, module, name)`` for each import of ours in ``path`` (name None: ``import m``)."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _fallbacks(tree)
    for node in ast.walk(tree):
        if node in skip:
            continue
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] in ("ezpz_nb", "ezpz_nb_pytest"):
                for alias in node.names:
                    yield node.lineno, node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ("ezpz_nb", "ezpz_nb_pytest"):
                    yield node.lineno, alias.name, None


def unresolved(paths: Iterable[Path]) -> list[str]:
    """Each import of ours that fails: the module is missing, or has no such name."""
    bad = []
    for path in paths:
        for line, module, name in our_imports(path):
            where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line}"
            try:
                mod = importlib.import_module(module)
            except ImportError as exc:
                bad.append(f"{where}: import {module}: {exc}")
                continue
            if name is None or name == "*" or hasattr(mod, name):
                continue
            try:
                importlib.import_module(f"{module}.{name}")  # a submodule
            except ModuleNotFoundError:
                bad.append(f"{where}: {module} has no {name!r}")
    return bad


def test_every_import_of_ours_in_benchmarks_tests_and_notebooks_resolves():
    """Guards issue 47 item 4: a renamed or moved name breaks no script silently."""
    paths = [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]
    assert len(paths) > 50  # the folders were found
    assert unresolved(paths) == []


def test_the_check_names_a_missing_name_a_missing_module_and_one_in_a_function(tmp_path):
    """Guards the checker itself: a name the module lacks, a module that does not exist,
    an import inside a function, and what resolves (a submodule, a lazy package name, a
    fallback for older trees in an ``except ImportError``)."""
    script = tmp_path / "bench.py"
    script.write_text(
        "from ezpz_nb.examples.capstone import parallelize\n"
        "from ezpz_nb import launch, viz\n"
        "import ezpz_nb.launcher.wire\n"
        "def f():\n"
        "    from ezpz_nb.examples.capstone import TinyLM\n"
        "    import ezpz_nb.no_such_module\n"
        "try:\n"
        "    from ezpz_nb.data.broadcast import BatchBroadcaster\n"
        "except ModuleNotFoundError:  # an older tree\n"
        "    from ezpz_nb.broadcast import BatchBroadcaster\n"
    )
    assert [b.split(": ", 1)[1] for b in unresolved([script])] == [
        "ezpz_nb.examples.capstone has no 'TinyLM'",
        "import ezpz_nb.no_such_module: No module named 'ezpz_nb.no_such_module'",
    ]


def test_every_lazy_public_name_resolves():
    """Guards the lazy packages' tables (``_WHERE``): a name listed with a wrong module
    fails on its first use only, so each is used here once."""
    import ezpz_nb
    import ezpz_nb.agents

    for package in (ezpz_nb, ezpz_nb.agents):
        missing = [n for n in package.__all__ if getattr(package, n, None) is None]
        assert missing == [], f"{package.__name__}: {missing}"
