# Workbench for our transformers and accelerate forks and the PR stack. See utils/workbench/ for each step.
# `make help` lists the targets (the `##` comment on each target's rule) and the variables that pass options.

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
FORK := utils/fork.py
FORK_DIR := build/transformers
FORK_ARGS ?=
PYTEST_ARGS ?= -n auto
REPRO_ARGS ?=
UPGRADE_ARGS ?=
AUTHOR ?=
CLONE_VENV ?= ../clone-venv

# No variable of this interface reaches a command's environment (make puts its command line's variables there, and
# `ACCELERATE=...` would reach the tests); every test run also starts in a defined environment (workbench/testenv.py).
unexport PYTHON FORK_ARGS PYTEST_ARGS REPRO_ARGS UPGRADE_ARGS AUTHOR TRANSFORMERS ACCELERATE TESTS CENSUS_ARGS \
	CLONE PR OPEN_ARGS CLONE_VENV

# Files we own are checked with our pyproject.toml; the PR's overlay files with upstream's own settings.
OWN_PY := utils tests/workbench bench
OVERLAY_PY := $(wildcard src tests/trainer tests/utils)
ACCELERATE_OVERLAY_PY := $(wildcard accelerate)

.PHONY: help fork deps test patches check pr quality repro upgrade open clone-venv
.DEFAULT_GOAL := help

help: ## list the targets, one line each, and the variables that pass options
	@echo "Targets (make <target>):"
	@sed -n 's/^\([a-z][a-z-]*\):.*## \(.*\)/\1|\2/p' $(firstword $(MAKEFILE_LIST)) | awk -F'|' '{printf "  %-10s %s\n", $$1, $$2}'
	@echo "Options: FORK_ARGS (fork.py build, e.g. --force), PYTEST_ARGS (default -n auto), REPRO_ARGS (utils/repro,"
	@echo "  e.g. '--steps 6 --scenarios no_scaler_pt'), UPGRADE_ARGS (--allow-older, --force), TRANSFORMERS=VERSION and"
	@echo "  ACCELERATE=VERSION (upgrade), AUTHOR='Name <email>' (pr), TESTS and CENSUS_ARGS (census), CLONE, PR and"
	@echo "  OPEN_ARGS (open, e.g. --force, --base REF, --venv DIR), CLONE_VENV (clone-venv's venv, default ../clone-venv)"

$(VPY):
	$(PYTHON) -m venv $(VENV)

deps: | $(VPY) ## install the pinned tools into .venv (torch first)
	$(VPY) $(FORK) deps

fork: deps ## .venv + build/transformers and build/accelerate (sdist + overlay + patches), installed editable
	$(VPY) $(FORK) build $(FORK_ARGS)

# As upstream's CI: one OpenMP thread per process (pytest-xdist runs one worker per core). `make test` also runs the
# tests marked `@slow` (the two-process launches), which upstream's per-PR CI leaves to its scheduled runs.
test: export OMP_NUM_THREADS := 1
test: export RUN_SLOW := 1
# utils/testrun.py runs its 4 stages ([k/n] lines; all of them, also after a failure), then prints a summary.
test: fork ## what CI runs: make check, then every test with the global-state plugin, then under upstream's pins
	$(VPY) utils/testrun.py --pytest-args="$(PYTEST_ARGS)"

repro: fork ## the #34053 scenarios, stock next to the fork: tables, build/repro/report.json and repro.png
	$(VPY) utils/repro $(REPRO_ARGS)

# As `make test` runs each PR's tests, so that the rows say what `make test` will.
upgrade: export OMP_NUM_THREADS := 1
upgrade: export RUN_SLOW := 1
upgrade: deps ## move the forks and the stack to new releases (the newest, or TRANSFORMERS=... ACCELERATE=...)
	$(VPY) $(FORK) upgrade $(if $(TRANSFORMERS),--transformers $(TRANSFORMERS)) \
		$(if $(ACCELERATE),--accelerate $(ACCELERATE)) --pytest-args="$(PYTEST_ARGS)" $(UPGRADE_ARGS)

open: fork ## CLONE=../transformers [PR=name]: each PR on a branch of your clone of main, proven there (OPEN_ARGS)
	$(VPY) $(FORK) open --clone "$(CLONE)" $(if $(PR),--pr "$(PR)") $(OPEN_ARGS)

clone-venv: fork ## CLONE=../transformers: a venv (CLONE_VENV) with the clone's own test dependencies, for open's --venv
	$(VPY) $(FORK) clone-venv --clone "$(CLONE)" --out "$(CLONE_VENV)"

patches: | $(VPY) ## export the forks' commits back into the overlays and patches/<upstream>/
	$(VPY) $(FORK) export

check: fork ## the whole stack: levels apply, exported, described, each PR's tests pass and fail without its fix
	$(VPY) $(FORK) check --tests --pytest-args="$(PYTEST_ARGS)"

pr: | $(VPY) ## dist/<NN>-<name>/ per PR, authored by your git identity (or AUTHOR='Name <email>')
	$(VPY) $(FORK) pr --out dist $(if $(AUTHOR),--author '$(subst ','\'',$(AUTHOR))')

quality: fork ## ruff (check + format --check) with upstream's settings
	$(VENV)/bin/ruff check $(OWN_PY)
	$(VENV)/bin/ruff format --check $(OWN_PY)
ifneq ($(OVERLAY_PY),)
	$(VENV)/bin/ruff check --config $(FORK_DIR)/pyproject.toml $(OVERLAY_PY)
	$(VENV)/bin/ruff format --check --config $(FORK_DIR)/pyproject.toml $(OVERLAY_PY)
endif
ifneq ($(ACCELERATE_OVERLAY_PY),)
	$(VENV)/bin/ruff check --config build/accelerate/pyproject.toml $(ACCELERATE_OVERLAY_PY)
	$(VENV)/bin/ruff format --check --config build/accelerate/pyproject.toml $(ACCELERATE_OVERLAY_PY)
endif

# Which tests of a tree leave process-global state changed (utils/census.py), e.g. a clone's tests/trainer:
#   make census TESTS=../transformers/tests/trainer [CENSUS_ARGS="-n 2 -- --timeout 900"]
.PHONY: census
census: | $(VPY) ## which tests of TESTS leave process-global state changed (utils/census.py)
	$(VPY) utils/census.py $(TESTS) $(CENSUS_ARGS)
