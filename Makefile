# Two entry points, both self-contained on a fresh clone with Python 3.10+ and make:
#   make lab   -> create .venv, install, open JupyterLab on notebooks/ (ezpz-nb lab)
#   make test  -> create .venv, install, run lint + unit + multi-process + notebook tests,
#                 then the system tests (soak, benchmarks, wheel, JupyterLab, torchrun, browser)
PYTHON ?= python3
VENV   ?= .venv
# The pinned CPU build that this project is tested with. Elsewhere choose your own
# build, e.g. `make test TORCH=torch` or `make lab TORCH="torch==2.5.1"`.
TORCH  ?= torch==2.13.0
BIN    := $(VENV)/bin
NBTIMEOUT ?= 120

.PHONY: lab test lint format unit system notebooks wheel-test bench bench-smoke compare soak browser tour clean gpu-check compat slurm-long stress

# ipykernel stages the kernel spec in a temporary folder and leaves that folder behind
# (empty): TMPDIR stages it inside the venv, so nothing of the setup stays in /tmp.
# PYTHONWARNINGS: setuptools' "Editable installation" notice (how an editable install
# finds the package), which pip relays as a 10-line BuildBackendWarning a newcomer cannot
# judge; pip's -q leaves every other warning and error shown.
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install -q -e '.[dev,loaders]'
	TMPDIR=$(abspath $(VENV)) $(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

# `ezpz-nb lab` serves notebooks/ on 127.0.0.1 (and allows root: containers and CI
# boxes often are). LAB_FLAGS go to JupyterLab, e.g. LAB_FLAGS=--no-browser.
LAB_FLAGS ?=

lab: $(BIN)/.installed
	$(BIN)/ezpz-nb lab $(LAB_FLAGS)

lint: $(BIN)/.installed
	$(BIN)/ruff check ezpz_nb ezpz_nb_pytest tests benchmarks notebooks setup.py conftest.py
	$(BIN)/ruff format --check ezpz_nb ezpz_nb_pytest tests benchmarks notebooks setup.py conftest.py
	$(BIN)/mypy
	$(BIN)/python notebooks/_build.py --check

# Workers for the test runs. Each worker takes whole files (module fixtures and leak
# checks stay per worker), in the order tests/conftest.py gives them: the slowest first,
# so no long file runs alone at the end (--no-loadscope-reorder keeps that order; xdist
# would otherwise sort files by their number of tests). Three workers on 2 cores: the
# tests that wait for a hang's deadline leave a core idle that the third one fills.
UNIT_WORKERS ?= 3
XDIST = --dist loadfile --no-loadscope-reorder

# The quick tests: pytest's default run leaves out those marked system or browser.
unit: $(BIN)/.installed
	$(BIN)/python -m pytest -q -n $(UNIT_WORKERS) $(XDIST) tests

# The slow ones, as a user or CI runs the project: the short soak, the benchmark and
# compare tools, wheel builds, JupyterLab and `make lab`, torchrun jobs, the installed
# doctor, plain scripts, the browser.
# Two workers: alone, these tests leave about half of 2 cores idle (torchrun agents and
# JupyterLab wait for their processes), two keep both busy (measured: 668 s -> 483 s). The
# browser test's slowest notebook then took 65 s of its 180 s limit. SYSTEM_FLAGS= runs
# them one at a time.
SYSTEM_FLAGS ?= -n 2 $(XDIST)
system: $(BIN)/.installed
	$(BIN)/python -m pytest -q $(SYSTEM_FLAGS) -m "(system or browser) and not slurm_long" tests

# Slurm cases that take whole minutes (a job's time limit is counted in minutes; a node is
# declared failed after SlurmdTimeout, 30 s), on the
# local cluster (tests/test_slurm.py; skipped without Debian's slurm packages), and one
# round of benchmarks/slurm.py (ez.submit, a bare sbatch, submitit if installed).
slurm-long: $(BIN)/.installed
	$(BIN)/python -m pytest -q -m slurm_long tests/test_slurm.py
	$(BIN)/python benchmarks/slurm.py --rounds 1

# NB_IGNORE: notebooks to leave out. `make test` leaves out those the browser test runs
# (tests/browser_notebooks.txt) when Chromium is there to run them: it runs every cell
# as nbmake does and checks more, and each run of 14 alone costs a minute.
NB_IGNORE ?=
BROWSER_RUNS := $(if $(wildcard /usr/bin/chromium),$(shell grep -v '^\#' tests/browser_notebooks.txt | cut -d' ' -f1))

# SPAWN_NOTEBOOKS run with ranks spawned, as macOS and Windows start them
# (EZPZ_NB_START_METHOD=spawn, from the standby pool: --spawn-notebook, in conftest.py),
# the others with Linux's forkserver, all in one run on NB_WORKERS workers. None by
# default: a spawned rank imports torch (about 2 s of CPU) where a forked one imports
# nothing: 01, 07 and 10 took 146 CPU-s spawned, 25 forked (01 alone: 81 and 6).
# Their launch paths run spawned in `make system` instead, in a real kernel
# (tests/test_cell_shapes.py's kernel tests, once per start method): ez.launch, Cluster
# and %%ranks with the cell shapes (code by value into fresh interpreters), a DeviceMesh,
# DataLoader workers forked from a spawned rank, a rank's error, a hang. Before a
# release, e.g.: make notebooks SPAWN_NOTEBOOKS="01_process_groups.ipynb 07_device_mesh.ipynb"
SPAWN_NOTEBOOKS ?=
NB_WORKERS ?= 2

notebooks: $(BIN)/.installed
	$(if $(NB_IGNORE),@echo "nbmake leaves to the browser test: $(NB_IGNORE)")
	cd notebooks && ../$(BIN)/python -m pytest -q -p no:cacheprovider -n $(NB_WORKERS) \
		--nbmake --nbmake-kernel=python3 --nbmake-timeout=$(NBTIMEOUT) \
		$(addprefix --spawn-notebook=,$(SPAWN_NOTEBOOKS)) $(addprefix --ignore=,$(NB_IGNORE)) .

# Rewrites the code in ruff's style; then rebuild the notebooks from their sources.
format: $(BIN)/.installed
	$(BIN)/ruff format ezpz_nb ezpz_nb_pytest tests benchmarks notebooks setup.py conftest.py
	$(BIN)/python notebooks/_build.py

test: NB_IGNORE = $(BROWSER_RUNS)
test: lint unit notebooks system

# The wheel as a participant installs it: built as the README says, installed into a
# fresh venv in a temporary folder outside the repository; there every module imports,
# the entry points run (doctor, notebooks DIR, check, the pytest plugin, tour 00, the
# README's course-CI nbmake step on 05, whose ranks import the checkers), and what the
# notebooks reach beyond the package is checked from DIR: every module their cells import
# (the notebook extra's: 13) imports from the install, and 14's torchrun worker, assembled
# from its %%writefile cells, runs under torchrun (2 ranks importing the install). The
# notebooks run once, in `make test`: the rest of what they do reads nothing the wheel
# adds (nbmake ran 13 and 14 here: 61 s of the 160). WHEEL_FLAGS=--all runs them all here.
# .ci/run runs it after `make test` (which checks a quick version: tests/test_wheel.py).
WHEEL_FLAGS ?=
wheel-test: $(BIN)/.installed
	$(BIN)/python tests/_wheel.py --python $(PYTHON) --torch "$(TORCH)" --timeout $(NBTIMEOUT) $(WHEEL_FLAGS)

# Notebook 12's straggler diagnosis 20 times with both cores kept busy by two spinning
# processes: a verdict that flips with the machine's load is a wrong one. Then the checkers
# of notebooks 11, 12, 15, 16, 17 and 19 on their right answers and dodges over 20 drawn cases
# each (make unit draws 1 or 2; 19's slow dodges are marked system, hence the -m). Not in
# make test: it measures the machine as much as the code, and takes minutes. STRESS_RUNS=... STRESS_BUSY=... to vary it.
STRESS_RUNS ?= 20
STRESS_BUSY ?= 2
stress: $(BIN)/.installed
	$(BIN)/python tests/_stress_straggler.py --runs $(STRESS_RUNS) --busy $(STRESS_BUSY)
	EZPZ_NB_DRAWS=$(STRESS_RUNS) $(BIN)/python -m pytest -q -n 0 -p no:randomly \
		tests/test_text_exercises.py tests/test_dcp_exercise.py tests/test_eval_exercise.py \
		tests/test_mix_exercise.py tests/test_mix_fresh.py tests/test_throughput_exercise.py \
		tests/test_verify_dodges.py
	EZPZ_NB_DRAWS=$(STRESS_RUNS) $(BIN)/python -m pytest -q -n 0 -p no:randomly \
		-m "not browser" tests/test_memory_exercise.py tests/test_flat_held.py

bench: $(BIN)/.installed
	$(BIN)/python benchmarks/launch.py
	$(BIN)/python benchmarks/broadcast.py
	$(BIN)/python benchmarks/plot_speed.py
	$(BIN)/python benchmarks/notebooks.py
	$(BIN)/python benchmarks/doctor.py

# Every benchmark script once, at its smallest (one repetition): does each still run to
# its table? Not in make test (its budget); see benchmarks/smoke.py for the time it takes.
bench-smoke: $(BIN)/.installed
	$(BIN)/python benchmarks/smoke.py

# Before/after on this machine: make bench's figures for commit BASE and this tree,
# measured side by side in one run (two separate make bench runs differ by the
# machine's drift). make compare BASE=HEAD~3 [ARGS="--only launch kernel --rounds 7"]
compare: $(BIN)/.installed
	@test -n "$(BASE)" || { echo "usage: make compare BASE=<commit> [ARGS=...]"; exit 2; }
	$(BIN)/python benchmarks/compare.py --base $(BASE) $(ARGS)

# The unit tests against another torch, in a venv of its own (COMPAT_VENV), e.g.
# make compat TORCH=torch==2.14.1 [COMPAT_TESTS="tests/test_plot.py tests/test_widgets.py"].
# Which releases were run, and passed, is in the README; the floor in pyproject.toml is
# the oldest of them.
COMPAT_VENV ?= .venv-compat
COMPAT_TESTS ?= tests
compat:
	@test "$(TORCH)" != "torch==2.13.0" || { echo "usage: make compat TORCH=torch==X.Y.Z [COMPAT_TESTS=...]"; exit 2; }
	$(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install -q --upgrade pip
	$(COMPAT_VENV)/bin/python -m pip install -q "$(TORCH)"
	$(COMPAT_VENV)/bin/python -m pip install -q -e '.[dev,loaders]'
	TMPDIR=$(abspath $(COMPAT_VENV)) $(COMPAT_VENV)/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	$(COMPAT_VENV)/bin/python -c 'import torch; print("compat: torch", torch.__version__)'
	$(COMPAT_VENV)/bin/python -m pytest -q -n $(UNIT_WORKERS) $(XDIST) $(COMPAT_TESTS)

# Every example under torchrun 15 times per TP size (1 and 2), plus launches and
# Cluster lifecycles in one process: failures, exit codes and leftovers in one table.
soak: $(BIN)/.installed
	$(BIN)/python benchmarks/soak.py

# Only the real-browser test (JupyterLab + Debian's chromium); `make test` runs it too.
browser: $(BIN)/.installed
	$(BIN)/python -m pytest -q -m browser tests/test_browser.py

tour: $(BIN)/.installed
	$(BIN)/python -m ezpz_nb tour

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

gpu-check: $(BIN)/.installed
	bash benchmarks/gpu_check.sh
