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

.PHONY: lab test lint format unit system notebooks notebooks-spawn wheel-test bench compare soak browser tour clean gpu-check

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e '.[dev,loaders]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

# `ezpz-nb lab` serves notebooks/ on 127.0.0.1 (and allows root: containers and CI
# boxes often are). LAB_FLAGS go to JupyterLab, e.g. LAB_FLAGS=--no-browser.
LAB_FLAGS ?=

lab: $(BIN)/.installed
	$(BIN)/ezpz-nb lab $(LAB_FLAGS)

lint: $(BIN)/.installed
	$(BIN)/ruff check ezpz_nb ezpz_nb_pytest tests benchmarks notebooks setup.py
	$(BIN)/ruff format --check ezpz_nb ezpz_nb_pytest tests benchmarks notebooks setup.py
	$(BIN)/mypy
	$(BIN)/python notebooks/_build.py --check

# The quick tests: pytest's default run leaves out those marked system or browser.
# Two workers, each taking whole files (module fixtures and leak checks stay per worker).
unit: $(BIN)/.installed
	$(BIN)/python -m pytest -q -n 2 --dist loadfile tests

# The slow ones, as a user or CI runs the project: the short soak, the benchmark and
# compare tools, wheel builds, JupyterLab and `make lab`, torchrun jobs, the installed
# doctor, plain scripts, the browser.
# One process by default; SYSTEM_FLAGS="-n 2 --dist loadfile" runs two files at a time,
# as `make unit` does (not yet measured against the browser test's timeouts on 2 cores).
SYSTEM_FLAGS ?=
system: $(BIN)/.installed
	$(BIN)/python -m pytest -q $(SYSTEM_FLAGS) -m "system or browser" tests

# NB_IGNORE: notebooks to leave out. `make test` leaves out those the browser test runs
# (tests/browser_notebooks.txt) when Chromium is there to run them: it runs every cell
# as nbmake does and checks more, and each run of 14 alone costs a minute.
NB_IGNORE ?=
BROWSER_RUNS := $(if $(wildcard /usr/bin/chromium),$(shell grep -v '^\#' tests/browser_notebooks.txt | cut -d' ' -f1))

notebooks: $(BIN)/.installed
	$(if $(NB_IGNORE),@echo "nbmake leaves to the browser test: $(NB_IGNORE)")
	cd notebooks && ../$(BIN)/python -m pytest -q -p no:cacheprovider --nbmake --nbmake-kernel=python3 --nbmake-timeout=$(NBTIMEOUT) $(addprefix --ignore=,$(NB_IGNORE)) .

# The notebooks again as macOS and Windows run them: ranks spawned, from the standby pool.
# Not all of them: a set that takes every launch path once. 00 the doctor and its first
# launches (within its budget); 01 ez.launch, Cluster, %%ranks, a rank's error and a hang;
# 06 the explorer widget's Cluster and live events (Progress); 07 a DeviceMesh (new gloo
# groups on loopback); 10 DataLoader workers inside spawned ranks; 13 check_contract/
# check_resume, whose jobs (module functions, sent by reference) a fresh rank imports.
# 05 is left out: its checkers launch module functions by reference as 13 does, and its
# expected failures are RankErrors as in 01. .ci/run runs it after `make test`.
SPAWN_NOTEBOOKS ?= 00_setup_check.ipynb 01_process_groups.ipynb 06_explorer.ipynb \
	07_device_mesh.ipynb 10_iterable_workers.ipynb 13_your_loader_checked.ipynb

notebooks-spawn: $(BIN)/.installed
	cd notebooks && EZPZ_NB_START_METHOD=spawn ../$(BIN)/python -m pytest -q -p no:cacheprovider --nbmake --nbmake-kernel=python3 --nbmake-timeout=$(NBTIMEOUT) $(SPAWN_NOTEBOOKS)

# Rewrites the code in ruff's style; then rebuild the notebooks from their sources.
format: $(BIN)/.installed
	$(BIN)/ruff format ezpz_nb ezpz_nb_pytest tests benchmarks notebooks setup.py
	$(BIN)/python notebooks/_build.py

test: NB_IGNORE = $(BROWSER_RUNS)
test: lint unit notebooks system

# The wheel as a participant installs it: built as the README says, installed into a
# fresh venv in a temporary folder outside the repository; there every module imports,
# the entry points run (doctor, notebooks DIR, check, the pytest plugin, tour 00) and
# the two notebooks that reach beyond the package (13: the notebook extra; 14: torchrun
# ranks importing the install) run under nbmake. The other notebooks read nothing the
# wheel adds and run once, in `make notebooks`; WHEEL_FLAGS=--all runs them all here.
# .ci/run runs it after `make test` (which checks a quick version: tests/test_wheel.py).
WHEEL_FLAGS ?=
wheel-test: $(BIN)/.installed
	$(BIN)/python tests/_wheel.py --python $(PYTHON) --torch "$(TORCH)" --timeout $(NBTIMEOUT) $(WHEEL_FLAGS)

bench: $(BIN)/.installed
	$(BIN)/python benchmarks/launch.py
	$(BIN)/python benchmarks/broadcast.py
	$(BIN)/python benchmarks/plot_speed.py
	$(BIN)/python benchmarks/notebooks.py
	$(BIN)/python benchmarks/doctor.py

# Before/after on this machine: make bench's figures for commit BASE and this tree,
# measured side by side in one run (two separate make bench runs differ by the
# machine's drift). make compare BASE=HEAD~3 [ARGS="--only launch kernel --rounds 7"]
compare: $(BIN)/.installed
	@test -n "$(BASE)" || { echo "usage: make compare BASE=<commit> [ARGS=...]"; exit 2; }
	$(BIN)/python benchmarks/compare.py --base $(BASE) $(ARGS)

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
