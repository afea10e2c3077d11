"""Build hook: ship the tutorial notebooks inside the wheel.

All metadata is in pyproject.toml. The notebooks stay where people edit and run
them, ``notebooks/`` at the top of the repository; building the wheel copies the
stored ``notebooks/*.ipynb`` (and any ``*.md`` beside them), and the solutions
notebooks of ``notebooks/solutions/``, into the package as ``ezpz_nb/_notebooks/``
(keeping ``solutions/``), so nothing is committed twice. An editable install
copies nothing: ``ezpz_nb.cli.resources.notebooks_dir()`` finds ``notebooks/`` in
the checkout instead.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SOURCE = Path(__file__).resolve().parent / "notebooks"
# ezpz_nb/cli/notebooks.py copies the same patterns out of the installed package.
PATTERNS = ("*.ipynb", "*.md", "solutions/*.ipynb")
TARGET = ("ezpz_nb", "_notebooks")


class BuildPyWithNotebooks(build_py):
    """``build_py`` that also copies the notebooks into the built package."""

    def _notebooks(self) -> list[Path]:
        found = sorted(p for pattern in PATTERNS for p in SOURCE.glob(pattern))
        if not any(p.suffix == ".ipynb" for p in found):
            # A wheel without its notebooks would install fine and fail later, far away.
            raise FileNotFoundError(
                f"no notebooks in {SOURCE}: build from a checkout or an "
                "sdist of ezpz_nb, which hold notebooks/"
            )
        return found

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        target = Path(self.build_lib, *TARGET)
        target.mkdir(parents=True, exist_ok=True)
        for path in self._notebooks():
            dest = target / path.relative_to(SOURCE)
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.copy_file(str(path), str(dest))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if self.editable_mode:
            return outputs
        target = Path(self.build_lib, *TARGET)
        return outputs + [str(target / p.relative_to(SOURCE)) for p in self._notebooks()]


setup(cmdclass={"build_py": BuildPyWithNotebooks})
