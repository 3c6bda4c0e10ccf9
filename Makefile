# Two commands set up and run everything on a fresh machine:
#   make demo   -- the main job
#   make test   -- the whole test suite
# Both create .venv when it is missing and install the project into it.

PYTHON ?= python3
VENV   ?= .venv
# Pinned so that a fresh machine here takes the CPU build from local disk; an
# unpinned torch pulls a multi-GB CUDA build.
TORCH  ?= torch==2.13.0

BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv demo test lint bench protos clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev,train,plots]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/sia demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/sia bench policy

# Regenerate sia_grpc/_proto from protos/ (the committed copy is checked by the tests).
protos: $(STAMP)
	$(BIN)/python scripts/protogen.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
