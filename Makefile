# Workbench for our transformers and accelerate forks and the PR stack. See utils/workbench/ for each step.
#   make fork      venv + pinned tools + build/transformers and build/accelerate (pristine sdist + overlay + patches),
#                  both installed editable
#   make test      make fork, check the stack (the series applies PR after PR, each PR's level - the pristine base plus
#                  the PRs it depends on - applies with git am, everything is exported, and each PR's own tests pass
#                  at its level against the other upstream's release), then all tests with the global-state plugin
#                  (utils/pytest_global_state.py), then the PRs' tests again under upstream's pytest pins and plugins
#                  (utils/upstream_pins.py), and the DeepSpeed fp16 tests with upstream's deepspeed spec
#   make patches   export the forks' commits back into the overlays and patches/<upstream>/
#   make check     the whole stack: every level applies, everything is exported and described, each PR's tests pass
#   make pr        dist/<NN>-<name>/ per PR: its `git am` series + PR_DESCRIPTION.md, authored by your git identity
#   make quality   ruff (check + format --check) with upstream's settings
#   make repro     the #34053 scenarios offline, stock next to the fork: tables, build/repro/report.json, repro.png
#   make open      CLONE=../transformers [PR=name]: each PR on a branch of your clone of upstream main, proven there
#                  (its tests with and without its fix, upstream's tests/trainer on main and on the branch, the GPU
#                  check where CUDA is); OPEN_ARGS for more (utils/workbench/opener.py), e.g. --force
#   make upgrade   move the forks and the stack to new releases (the newest on the package index, or
#                  TRANSFORMERS=5.25.0 ACCELERATE=1.16.0): pin file, forks, patches, stock sources; one row per PR
# Extra options for `utils/fork.py build` go in FORK_ARGS, e.g. `make fork FORK_ARGS=-3` or `FORK_ARGS=--force`.

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
FORK := utils/fork.py
FORK_DIR := build/transformers
FORK_ARGS ?=
PYTEST_ARGS ?= -n auto

# Files we own are checked with our pyproject.toml; the PR's overlay files with upstream's own settings.
OWN_PY := utils tests/workbench bench
OVERLAY_PY := $(wildcard src tests/trainer tests/utils)
ACCELERATE_OVERLAY_PY := $(wildcard accelerate)

.PHONY: fork deps test patches check pr quality repro upgrade open

$(VPY):
	$(PYTHON) -m venv $(VENV)

deps: | $(VPY)
	$(VPY) $(FORK) deps

fork: deps
	$(VPY) $(FORK) build $(FORK_ARGS)

# As upstream's CI: one OpenMP thread per process (pytest-xdist runs one worker per core). `make test` also runs the
# tests marked `@slow` (the two-process launches), which upstream's per-PR CI leaves to its scheduled runs.
test: export OMP_NUM_THREADS := 1
test: export RUN_SLOW := 1
test: fork
	$(VPY) $(FORK) check --tests --pytest-args "$(PYTEST_ARGS)"
	PYTHONPATH=utils $(VPY) -m pytest -p pytest_global_state $(PYTEST_ARGS) tests
	$(VPY) utils/upstream_pins.py
	$(VPY) utils/upstream_pins.py --extra deepspeed --venv build/upstream-pins-deepspeed -- \
		-p no:cacheprovider --timeout 900 -rs -k deepspeed tests/workbench/test_distributed_resume.py

repro: fork
	$(VPY) utils/repro

# As `make test` runs each PR's tests, so that the rows say what `make test` will.
upgrade: export OMP_NUM_THREADS := 1
upgrade: export RUN_SLOW := 1
upgrade: deps
	$(VPY) $(FORK) upgrade $(if $(TRANSFORMERS),--transformers $(TRANSFORMERS)) \
		$(if $(ACCELERATE),--accelerate $(ACCELERATE)) --pytest-args "$(PYTEST_ARGS)"

# The Makefile's own variables stay out of the tests' environment (make exports command-line variables).
open: fork
	env -u CLONE -u PR -u OPEN_ARGS $(VPY) $(FORK) open --clone "$(CLONE)" $(if $(PR),--pr "$(PR)") $(OPEN_ARGS)

patches: | $(VPY)
	$(VPY) $(FORK) export

check: fork
	$(VPY) $(FORK) check --tests --pytest-args "$(PYTEST_ARGS)"

pr: | $(VPY)
	$(VPY) $(FORK) pr --out dist

quality: fork
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
census: | $(VPY)
	$(VPY) utils/census.py $(TESTS) $(CENSUS_ARGS)
