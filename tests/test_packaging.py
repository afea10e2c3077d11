"""The project's own set-up files agree with each other."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; 3.10 has no TOML reader

ROOT = Path(__file__).resolve().parent.parent
# conda-forge names that differ from PyPI's
CONDA_TO_PYPI = {"pytorch": "torch", "pytorch-cpu": "torch"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _conda_names(path: Path) -> set[str]:
    env = yaml.safe_load(path.read_text())
    return {
        CONDA_TO_PYPI.get(_name(d), _name(d)) for d in env["dependencies"] if isinstance(d, str)
    } - {"python", "pip"}


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    """Guards: conda users get the same packages as pip users."""
    project = _pyproject()
    pip_names = {_name(r) for r in project["dependencies"]}
    pip_names |= {_name(r) for r in project["optional-dependencies"]["dev"]}
    assert _conda_names(ROOT / "environment.yml") == pip_names


def test_binder_gets_the_runtime_dependencies_and_installs_the_checkout():
    """Guards: Binder's image has what the notebooks need (the library and the notebook
    extra, no dev tools), a pinned Python,
    and installs ezpz_nb in postBuild (repo2docker runs environment.yml before the
    repository is there, so a `pip: -e .` entry would break the build)."""
    path = ROOT / "binder" / "environment.yml"
    project = _pyproject()
    runtime = project["dependencies"] + project["optional-dependencies"]["notebook"]
    assert _conda_names(path) == {_name(r) for r in runtime}
    deps = yaml.safe_load(path.read_text())["dependencies"]
    assert not [d for d in deps if not isinstance(d, str)], "no pip: section in Binder's file"
    assert [d for d in deps if re.fullmatch(r"python=3\.\d+", d)], "pin Python: python=3.X"
    post = ROOT / "binder" / "postBuild"
    assert os.access(post, os.X_OK), "repo2docker runs postBuild only when it is executable"
    lines = [ln for ln in post.read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines[0] == "set -euo pipefail"
    assert re.fullmatch(r"python -m pip install (--no-cache-dir )?\.", lines[-1])


def test_colab_cell_installs_from_the_project_url():
    """Guards: notebook 00 installs ezpz_nb from the address in the package metadata."""
    url = _pyproject()["urls"]["Repository"]
    source = (ROOT / "notebooks" / "_cells" / "00_setup_check.py").read_text()
    assert f'REPOSITORY = "{url}"' in source
    assert 'f"ezpz_nb[notebook] @ git+{REPOSITORY}"' in source


def test_ci_runs_the_readme_test_command():
    """Guards: CI runs exactly what the README tells a new user to run."""
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    first = readme.split("```")[1]
    assert "make test" in first and "make lab" in first
    assert re.search(r"^make test$", ci, re.M)
    # The wheel test comes after the README's command, never instead of it.
    assert re.search(r"^make test$[\s\S]*^make wheel-test\b", ci, re.M)
    # slurm-long runs beside it (started first), and its status is waited for at the end.
    assert re.search(r"^make slurm-long .*&$[\s\S]*^make test$[\s\S]*^make wheel-test", ci, re.M)
    assert re.search(r"^make wheel-test$[\s\S]*^wait \"\$slurm_long\"", ci, re.M)


def test_github_workflow_runs_the_ci_script():
    """Guards: GitHub runs .ci/run (the README's test command), nothing hand-picked."""
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())
    runs = [step["run"] for job in flow["jobs"].values() for step in job["steps"] if "run" in step]
    assert runs == [".ci/run"]
    assert os.access(ROOT / ".ci" / "run", os.X_OK)


def test_pre_commit_hooks_are_local_and_run_what_make_lint_runs():
    """Guards: a commit checks what `make lint` checks, with no remote hook repository."""
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = {h["id"]: h for repo in config["repos"] for h in repo["hooks"]}
    assert [repo["repo"] for repo in config["repos"]] == ["local"]
    assert {"ruff", "ruff-format", "notebooks"} <= set(hooks)
    makefile = (ROOT / "Makefile").read_text().replace("$(BIN)/", ".venv/bin/")
    lint = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    for hook in ("ruff", "notebooks"):
        assert hooks[hook]["entry"] in lint, (hook, lint)
    assert hooks["ruff-format"]["entry"] == ".venv/bin/ruff format"


def test_notebook_extra_is_in_dev_and_the_library_never_imports_it():
    """Guards: torchdata (notebook 09) reaches every dev and notebook install, while the
    library itself does not depend on it (0.11 is its last release, on private DataLoader
    internals): no module of ezpz_nb imports it."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    notebook = {_name(r) for r in extras["notebook"]}
    assert "torchdata" in notebook
    assert notebook <= {_name(r) for r in extras["dev"]}
    importers = [
        p.relative_to(ROOT)
        for p in (ROOT / "ezpz_nb").rglob("*.py")
        if re.search(r"^\s*(import|from)\s+torchdata\b", p.read_text(), re.M)
    ]
    assert importers == []


def test_readme_course_ci_workflow_is_what_the_wheel_test_runs():
    """Guards: the workflow docs/participants.md gives course repositories is valid YAML and runs
    the steps that `make wheel-test` (tests/_wheel.py) runs against the built wheel."""
    from _wheel import DOCTOR, NBMAKE, TEST_TOOLS

    page = (ROOT / "docs" / "participants.md").read_text()
    snippet = page.split("## Notebooks of your own", 1)[1].split("```yaml", 1)[1]
    flow = yaml.safe_load(snippet.split("```", 1)[0])
    runs = [step["run"] for job in flow["jobs"].values() for step in job["steps"] if "run" in step]
    tools = " ".join(_name(t) for t in TEST_TOOLS)
    assert re.fullmatch(rf"pip install '\S+\.whl\[notebook\]' {tools}", runs[-3])
    assert runs[-2] == " ".join(DOCTOR)
    assert re.fullmatch(rf"cd notebooks && {' '.join(NBMAKE)} --nbmake-timeout=\d+ \.", runs[-1])


def test_readme_is_short_and_every_page_it_links_exists():
    """Guards: the README stays a first-minute page (the rest lives in docs/), and no link
    in the README or a docs page points at a file that is not in the repository."""
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) <= 150
    pages = [readme, *sorted((ROOT / "docs").glob("*.md"))]
    linked = set()
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)", page.read_text()):
            if "://" in target:
                continue
            path = (page.parent / target).resolve()
            assert path.is_file() and ROOT in path.parents, (page.name, target)
            linked.add(path)
    # Every docs page is reachable from the README.
    assert {p.resolve() for p in pages[1:]} <= linked
