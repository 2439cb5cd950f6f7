# looprl: `make quickstart` (set up + main job) and `make test` (set up + test suite).
# Setup is idempotent: a stamp file records that the venv matches pyproject.toml.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.looprl-installed
# vLLM lives in its own venv (transformers pins clash); the vllm engine runs it as a worker process
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.looprl-vllm-installed

.PHONY: setup vllm quickstart test test-fast bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(PY) $(VENV)
	touch $(STAMP)

vllm: $(VLLM_STAMP)

$(VLLM_STAMP): scripts/setup_vllm.sh
	bash scripts/setup_vllm.sh $(PY) $(VLLM_VENV)
	touch $(VLLM_STAMP)

quickstart: setup
	$(BIN)/looprl quickstart

test: setup vllm
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

bench: setup
	$(BIN)/python -m pip install -q -e ".[trl]"  # benchmarks/vs_trl.py's baseline
	for b in benchmarks/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache
