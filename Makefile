# Two commands set up and run everything on a fresh machine:
#   make demo   -- the main job
#   make test   -- the whole test suite (in parallel, one worker per core)
# and `make test-fast` runs the unit tests of the core and the state machine, `make lint`
# the static checks alone (ruff, the import contracts, mypy), which `make test` runs first.
# Both create .venv when it is missing and install the project into it.

# Debian's own Python where there is one: a venv made from it can be started by the
# job users the node agent runs workers as (docs/security.md, "Node isolation"); one
# made from a Python under /root (pyenv's) cannot, since /root is 0700.
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)
VENV   ?= .venv
# Pinned so that a fresh machine here takes the CPU build from local disk; an
# unpinned torch pulls a multi-GB CUDA build.
TORCH  ?= torch==2.13.0

BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv postgres browser slurm bubblewrap demo test test-fast lint bench protos docs clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(MAKE) --no-print-directory postgres
	$(MAKE) --no-print-directory browser
	$(MAKE) --no-print-directory slurm
	$(MAKE) --no-print-directory bubblewrap
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev,train,plots]"
	touch $(STAMP)

# A PostgreSQL server for the store's tests (sia_grpc/testing/postgres.py starts a
# throwaway one per test process): Debian's package, installed as root where its
# binaries are missing. Without it (not root, no apt-get) those tests skip, saying why.
postgres:
	@if command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; \
	then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; \
	else echo "make postgres: no PostgreSQL server and no root apt-get: its tests will skip"; \
	fi

# A headless browser for the dashboard's tests (tests/dashboard: selenium drives it):
# Debian's chromium and its chromedriver, installed as root where either is missing.
# Without them (not root, no apt-get) those tests skip, saying why.
browser:
	@if command -v chromedriver >/dev/null && command -v chromium >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
			chromium chromium-driver; \
	else echo "make browser: no chromium/chromedriver and no root apt-get: the dashboard's" \
		"browser tests will skip"; \
	fi

# A Slurm cluster for the Slurm bridge's tests (sia_grpc/testing/slurm.py starts a
# throwaway one: slurmctld and several slurmd on one machine): Debian's slurm-wlm,
# installed as root where its binaries are missing. Without it those tests skip, saying why.
slurm:
	@if command -v slurmctld >/dev/null || [ -x /usr/sbin/slurmctld ]; \
	then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm; \
	else echo "make slurm: no Slurm and no root apt-get: the Slurm bridge's live tests will skip"; \
	fi

# bubblewrap for the node agent's sandbox isolation level (and its tests): Debian's
# package, installed as root where it is missing. Without it the agent's strongest
# level is `user`, and the sandbox tests skip, saying why.
bubblewrap:
	@if command -v bwrap >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap; \
	else echo "make bubblewrap: no bwrap and no root apt-get: the sandbox level is unavailable"; \
	fi

demo: $(STAMP)
	$(BIN)/sia demo

# The static checks: style (ruff), the layers' import contracts (lint-imports), the
# types (mypy: the packages and settings of pyproject.toml's [tool.mypy]; its cache,
# .mypy_cache, makes a second run take under a second) and dead code (vulture, with
# pyproject.toml's [tool.vulture]: what may look dead, and why it is not).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/vulture

# The whole suite, one pytest-xdist worker per core (--dist loadgroup is set in
# pyproject.toml: the "heavy" group runs on one worker, one test at a time), after
# the static checks.
test: lint
	$(BIN)/python -m pytest -q -n auto

# The inner loop: goodput models, policies and solvers, the controller's state
# machine (also under chaos), config and validation; no sockets, no processes.
FAST_TESTS := tests/models tests/policy tests/controller/test_state.py \
	tests/chaos/test_chaos_state.py tests/controller/test_validation.py \
	tests/controller/test_config.py

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n auto $(FAST_TESTS)

bench: $(STAMP)
	$(BIN)/sia bench policy

# `make gpu-check`: the GPU path proved in one run (docs/gpu-check.md): NVML discovery,
# the library's overhead, profiling up to an out-of-memory error, the throughput model's
# error, a controller and two torch agents moving a real job, the GPU isolation. Its own
# light install (no PostgreSQL, browser or Slurm, no apt): the venv, $(TORCH) (on a GPU
# machine without the local CPU wheel, pip takes the CUDA build from the registry),
# nvidia-ml-py and this package; nothing is installed when the venv already has them.
# DRY=1: the CPU path (emulated GPUs; the CUDA steps report skipped), installing nothing.
# OUT=DIR (or $$OUT in the environment): where result.json and summary.txt go.
OUT ?= gpu-check
DRY ?=
GPU_READY := import torch, grpc, sia_grpc.controller.shell.server, sia_grpc.nodeagent.torchbackend
ifeq ($(DRY),)
GPU_READY += ; import shutil, pynvml; \
	assert torch.version.cuda or not shutil.which("nvidia-smi"), "a CPU build of torch"
endif

gpu-venv:
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if $(BIN)/python -c '$(GPU_READY)' 2>/dev/null; then \
		echo "gpu-check: $(VENV) has what it needs: nothing to install"; \
	elif [ -n "$(DRY)" ]; then \
		echo "gpu-check: $(VENV) lacks torch or this package; DRY=1 installs nothing:" \
			"run make venv, or make gpu-check without DRY"; exit 2; \
	else \
		$(BIN)/python -m pip install -q "$(TORCH)" nvidia-ml-py \
		&& $(BIN)/python -m pip install -q -e ".[train]" \
		|| { echo "gpu-check: cannot install $(TORCH), nvidia-ml-py and sia-grpc into" \
			"$(VENV): pip needs a package registry (or a wheel cache / --find-links with" \
			"them); see docs/gpu-check.md"; exit 2; }; \
	fi

gpu-check: gpu-venv
	$(BIN)/python -m sia_grpc.bench.gpu_check --out "$(OUT)" $(if $(DRY),--dry)

# Regenerate sia_grpc/_proto from protos/ (the committed copy is checked by the tests).
protos: $(STAMP)
	$(BIN)/python scripts/protogen.py

# Regenerate docs/cli.md, the `sia` command reference, from the parsers
# (sia_grpc/cli/reference.py; tests/docs fails while the committed page differs).
docs: $(STAMP)
	$(BIN)/python -m sia_grpc.cli.reference > docs/cli.md.new && mv docs/cli.md.new docs/cli.md

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
