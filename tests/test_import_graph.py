"""The package's import graph: no circles, and layers that point down only.

Every import counts, as a reader counts them: at module level, inside functions,
and under ``TYPE_CHECKING``. The layers are read from the table in
docs/architecture.md ("The layers, from the bottom up"), so the map and this test
cannot drift apart: a module in no row of the table fails too.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ezpz_nb", "ezpz_nb_pytest")
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# Circles other engineers remove in the same round; the integrator deletes each entry
# when its fix lands (a listed circle that no longer exists fails, as a reminder).
KNOWN_CIRCLES: dict[frozenset[str], str] = {}

Graph = Mapping[str, Mapping[str, int]]  # module -> {imported module: line of the first import}


def modules(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    """Every module of ``packages`` under ``root``, by dotted name (a package by its own)."""
    found: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _owner(name: str, known: Mapping[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is one of our modules (``None``: not ours)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_pkg: bool, known) -> list[str]:
    """Our modules one import statement reaches; ``from pkg import sub`` reaches ``pkg.sub``."""
    if isinstance(node, ast.Import):
        return [t for a in node.names if (t := _owner(a.name, known))]
    base = node.module or ""
    if node.level:  # relative: resolved against the importing module's package
        here = module.split(".") if is_pkg else module.split(".")[:-1]
        here = here[: len(here) - node.level + 1]
        base = ".".join([*here, base] if base else here)
    out = []
    for alias in node.names:
        full = f"{base}.{alias.name}"
        target = full if full in known else _owner(base, known)
        if target:
            out.append(target)
    return out


def import_graph(known: Mapping[str, Path]) -> dict[str, dict[str, int]]:
    """Each module's imports of our modules, wherever in the file they stand."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in known.items():
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _targets(node, module, path.name == "__init__.py", known):
                    if target != module:
                        edges.setdefault(target, node.lineno)
        graph[module] = edges
    return graph


def circles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(graph.get(child, {}))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = stack[stack.index(node) :]
                del stack[stack.index(node) :]
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def cycle_path(graph: Graph, members: list[str]) -> str:
    """One shortest cycle through the component's first module, with the import lines."""
    start, inside = members[0], set(members)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in graph[node]:
            if nxt == start:
                hops = [*paths[node], start]
                return (
                    " -> ".join(
                        f"{a} (line {graph[a][b]})" for a, b in zip(hops, hops[1:], strict=False)
                    )
                    + f" -> {start}"
                )
            if nxt in inside and nxt not in paths:
                paths[nxt] = [*paths[node], nxt]
                queue.append(nxt)
    return " <-> ".join(members)


def unit(module: str) -> str:
    """The table's unit of a module: the package, a top-level module, or a folder."""
    parts = module.split(".")
    return parts[0] if parts[0] != "ezpz_nb" or len(parts) == 1 else ".".join(parts[:2])


def _unit_of_cell(name: str) -> str:
    """``launcher/`` -> ezpz_nb.launcher, ``errors.py`` -> ezpz_nb.errors, ``__init__.py``."""
    name = name.rstrip("/").removesuffix(".py")
    if name in PACKAGES:
        return name
    return "ezpz_nb" if name == "__init__" else f"ezpz_nb.{name}"


def layers(text: str) -> dict[str, set[str]]:
    """Each unit of the layer table and the units it may import (its own always)."""
    section = text.split("## The layers, from the bottom up", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| `")]
    names = [[_unit_of_cell(n) for n in re.findall(r"`([^`]+)`", r.split("|")[1])] for r in rows]
    allowed: dict[str, set[str]] = {}
    for i, row in enumerate(rows):
        rule = row.rstrip(" |").rsplit("|", 1)[1]
        may = {_unit_of_cell(n) for n in re.findall(r"`([^`]+)`", rule)}
        if "the bottom" in rule:
            may |= set(names[0])
        if "everything below" in rule:
            may |= {u for r in names[:i] for u in r}
        elif "everything" in rule:
            may |= {u for r in names for u in r}
        if "each other" in rule:
            may |= set(names[i])
        for u in names[i]:
            allowed[u] = may | {u}
    return allowed


def upward(graph: Graph, allowed: Mapping[str, set[str]]) -> list[str]:
    """Every import the layer table does not allow, and every module in no row of it."""
    bad = []
    for module, edges in graph.items():
        mine = unit(module)
        if mine not in allowed:
            bad.append(f"{module}: its unit {mine} is in no row of the layer table")
            continue
        for target, line in edges.items():
            if unit(target) not in allowed[mine]:
                bad.append(f"{module} (line {line}) imports {target}, a layer it may not import")
    return bad


def _known_left(found: list[list[str]]) -> tuple[list[str], list[str]]:
    """(circles not known, known circles that no longer exist)."""
    sets = {frozenset(c) for c in found}
    new = [c for c in found if frozenset(c) not in KNOWN_CIRCLES]
    gone = [f"{sorted(k)} ({why})" for k, why in KNOWN_CIRCLES.items() if k not in sets]
    return [" / ".join(c) for c in new], gone


def test_the_package_has_no_import_circle():
    """Guards issue 36 item 6: 0 import circles, counting imports inside functions and
    under TYPE_CHECKING (cli/doctor <-> cli/traps and agents <-> torchrun_args were two)."""
    graph = import_graph(modules(ROOT))
    found = circles(graph)
    new, gone = _known_left(found)
    paths = [cycle_path(graph, c) for c in found if " / ".join(c) in new]
    assert not paths, "import circles (move the shared names below both):\n" + "\n".join(paths)
    assert not gone, "known circles that are fixed: remove them from KNOWN_CIRCLES: " + str(gone)


def test_layers_point_down_only():
    """Guards docs/architecture.md's layer table: no import from a lower layer to a higher
    one, and no module outside the table (the map names every folder)."""
    allowed = layers(ARCHITECTURE.read_text())
    bad = upward(import_graph(modules(ROOT)), allowed)
    assert not bad, "imports against the layer table:\n" + "\n".join(bad)


def _tree(tmp_path: Path, files: Mapping[str, str]) -> dict[str, Path]:
    for name, body in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    return modules(tmp_path, ("ezpz_nb",))


def test_the_graph_sees_imports_in_functions_and_type_checking(tmp_path):
    """Guards the checker itself: a circle closed only inside a function or under
    TYPE_CHECKING, through a relative import, is found and named with its lines."""
    known = _tree(
        tmp_path,
        {
            "ezpz_nb/__init__.py": "",
            "ezpz_nb/cli/__init__.py": "",
            "ezpz_nb/cli/a.py": "from ezpz_nb.cli import b\n",
            "ezpz_nb/cli/b.py": "def f():\n    from . import c\n",
            "ezpz_nb/cli/c.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import X\n"
            ),
            "ezpz_nb/cli/d.py": "import ezpz_nb.cli.a\n",
        },
    )
    graph = import_graph(known)
    assert circles(graph) == [["ezpz_nb.cli.a", "ezpz_nb.cli.b", "ezpz_nb.cli.c"]]
    assert cycle_path(graph, ["ezpz_nb.cli.a", "ezpz_nb.cli.b", "ezpz_nb.cli.c"]) == (
        "ezpz_nb.cli.a (line 1) -> ezpz_nb.cli.b (line 2) -> ezpz_nb.cli.c (line 3) -> ezpz_nb.cli.a"
    )
    assert graph["ezpz_nb.cli.d"] == {"ezpz_nb.cli.a": 1}


def test_the_layer_rule_names_an_upward_import(tmp_path):
    """Guards the checker itself: a bottom module importing a front end, a module in no
    row, and the table's words ("the bottom", "everything below", "each other")."""
    table = (
        "## The layers, from the bottom up\n\n| layer | what | may import |\n|---|---|---|\n"
        "| `errors.py` | e | nothing of ours |\n| `data/` | d | the bottom |\n"
        "| `viz/`, `workshop/` | v | everything below, and each other |\n"
        "| `cli/` | c | everything |\n\n## Next\n"
    )
    allowed = layers(table)
    assert allowed["ezpz_nb.data"] == {"ezpz_nb.data", "ezpz_nb.errors"}
    assert "ezpz_nb.workshop" in allowed["ezpz_nb.viz"]
    known = _tree(
        tmp_path,
        {
            "ezpz_nb/errors.py": "def f():\n    from ezpz_nb.cli import main\n",
            "ezpz_nb/cli/__init__.py": "main = 1\n",
            "ezpz_nb/viz/__init__.py": "from ezpz_nb import workshop, data\n",
            "ezpz_nb/workshop/__init__.py": "",
            "ezpz_nb/data/__init__.py": "",
            "ezpz_nb/stray.py": "",
        },
    )
    assert upward(import_graph(known), allowed) == [
        "ezpz_nb.errors (line 2) imports ezpz_nb.cli, a layer it may not import",
        "ezpz_nb.stray: its unit ezpz_nb.stray is in no row of the layer table",
    ]


# ------------------------------------------------------------------ the launcher's two sides

# Each launcher module by the process that loads it (docs/architecture.md's "side" column
# says the same; test_rank_imports.py starts a rank and checks what it really loaded).
#: What a rank process runs: its loop, its group, its state, a %%ranks cell; and the
#: forkserver's own preload, which every rank forked from it inherits.
RANK_SIDE = frozenset(
    f"ezpz_nb.launcher.{m}" for m in ("rank", "rankgroup", "runtime", "cells", "forkserver")
)
#: What both ends of the pipe use: the protocol, a failure's and a stack's both ends, the
#: shared settings, which cell a frame is in; and below the launcher, the package itself
#: (its names load on use), errors and the publish channel.
BOTH_SIDES = frozenset(
    [
        "ezpz_nb",
        "ezpz_nb._lazy",
        "ezpz_nb.errors",
        "ezpz_nb.events",
        "ezpz_nb.launcher",
        *(
            f"ezpz_nb.launcher.{m}"
            for m in ("settings", "wire", "failures", "stacks", "kernel", "submodules")
        ),
    ]
)
#: What only the notebook runs (and a torchrun process, which plays the notebook's part
#: for ``torchrun.py``): clusters, processes, the session and pool, the error wording.
NOTEBOOK_SIDE = frozenset(
    f"ezpz_nb.launcher.{m}"
    for m in (
        "cluster",
        "on_ranks",
        "procs",
        "children",
        "pool",
        "run",
        "runclock",
        "plain",
        "policy",
        "session",
        "startup",
        "shutdown",
        "output",
        "errors",
        "torchrun",
    )  # fmt: skip
) | {"ezpz_nb.magic"}


def _side_column(text: str) -> dict[str, str]:
    """``{module: side}`` from docs/architecture.md's launcher table (first word of the column)."""
    section = text.split("## The launcher, module by module", 1)[1].split("\n## ", 1)[0]
    sides = {}
    for row in section.splitlines():
        cells = row.split("|")
        if len(cells) < 4 or not cells[1].strip().startswith("`"):
            continue
        side = cells[2].split()[0] if cells[2].split() else ""
        for name in re.findall(r"`([^`]+)\.py`", cells[1]):
            sides[f"ezpz_nb.launcher.{name}"] = side
    return sides


def test_every_launcher_module_has_one_side_and_the_map_agrees():
    """Guards issue 47 item 1: each launcher module is listed on one side here, and
    docs/architecture.md's table gives it the same side (a new module must say which)."""
    launcher = {m for m in modules(ROOT) if m.startswith("ezpz_nb.launcher.")}
    sides = {"rank": RANK_SIDE, "both": BOTH_SIDES, "notebook": NOTEBOOK_SIDE}
    listed = [m for s in sides.values() for m in s if m.startswith("ezpz_nb.launcher.")]
    assert sorted(listed) == sorted(launcher), "list each launcher module on exactly one side"
    documented = _side_column(ARCHITECTURE.read_text())
    expected = {m: side for side, ms in sides.items() for m in ms if m in launcher}
    assert documented == expected


def test_the_rank_side_imports_nothing_of_the_notebook_side():
    """Guards issue 47 item 1: from the rank's modules, no import (at module level, in a
    function or under TYPE_CHECKING) reaches the notebook side."""
    graph = import_graph(modules(ROOT))
    seen, todo = set(), list(RANK_SIDE)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, {}))
    assert seen <= RANK_SIDE | BOTH_SIDES, sorted(seen - RANK_SIDE - BOTH_SIDES)


def _assigned(tree: ast.Module, name: str) -> object:
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
            name
        ]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"no {name} = ... at module level")


def test_stacks_rank_loop_names_the_ranks_loop_function():
    """Guards the hang report's cut between our frames and the learner's: stacks.RANK_LOOP
    must be the function in rank.py that loops over runs and calls the learner's function,
    and the rank's main must call it (a rename in rank.py alone fails here)."""
    stacks = ast.parse((ROOT / "ezpz_nb/launcher/stacks.py").read_text())
    rank = ast.parse((ROOT / "ezpz_nb/launcher/rank.py").read_text())
    loop = _assigned(stacks, "RANK_LOOP")
    functions = {n.name: n for n in rank.body if isinstance(n, ast.FunctionDef)}
    assert loop in functions, f"rank.py defines no {loop}()"
    body = list(ast.walk(functions[loop]))
    assert any(isinstance(n, ast.While) for n in body), f"{loop} has no loop"
    calls = {n.func.id for n in body if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "fn" in calls, f"{loop} does not call the job's fn"
    main = [n for n in ast.walk(functions["main"]) if isinstance(n, ast.Call)]
    assert any(getattr(c.func, "id", None) == loop for c in main), f"main does not call {loop}"
