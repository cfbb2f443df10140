# Workbench for our transformers fork. See utils/fork.py for what each step does.
#   make fork      venv + pinned tools + build/transformers (pristine sdist + overlay + patches), editable install
#   make test      make fork, check the patch series (like CI: stale or non-applying patches fail), then all tests,
#                  then the harness and resume tests again under upstream's pytest pins and plugins (utils/upstream_pins.py)
#   make patches   export the fork's commits back into the overlay and patches/transformers/
#   make check     the series applies to the pinned sdist, is exported, and every patch is described
#   make pr        dist/: a `git am` series for the pristine sdist + PR_DESCRIPTION.md
#   make quality   ruff (check + format --check) with upstream's settings
#   make repro     the #34053 scenarios offline, stock 5.24.0 next to the fork: tables, build/repro/report.json, repro.png
# Extra options for `utils/fork.py build` go in FORK_ARGS, e.g. `make fork FORK_ARGS=-3` or `FORK_ARGS=--force`.

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
FORK := utils/fork.py
FORK_DIR := build/transformers
FORK_ARGS ?=
PYTEST_ARGS ?= -n auto

# Files we own are checked with our pyproject.toml; the PR's overlay files with upstream's own settings.
OWN_PY := utils tests/utils bench
OVERLAY_PY := $(wildcard src tests/trainer)

.PHONY: fork deps test patches check pr quality repro

$(VPY):
	$(PYTHON) -m venv $(VENV)

deps: | $(VPY)
	$(VPY) $(FORK) deps

fork: deps
	$(VPY) $(FORK) build $(FORK_ARGS)

test: fork
	$(VPY) $(FORK) check
	$(VPY) -m pytest $(PYTEST_ARGS) tests
	$(VPY) utils/upstream_pins.py

repro: fork
	$(VPY) utils/repro.py

patches: | $(VPY)
	$(VPY) $(FORK) export

check: | $(VPY)
	$(VPY) $(FORK) check

pr: | $(VPY)
	$(VPY) $(FORK) pr --out dist

quality: fork
	$(VENV)/bin/ruff check $(OWN_PY)
	$(VENV)/bin/ruff format --check $(OWN_PY)
ifneq ($(OVERLAY_PY),)
	$(VENV)/bin/ruff check --config $(FORK_DIR)/pyproject.toml $(OVERLAY_PY)
	$(VENV)/bin/ruff format --check --config $(FORK_DIR)/pyproject.toml $(OVERLAY_PY)
endif
