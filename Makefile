# looprl: `make quickstart` (set up + main job) and `make test` (set up + test suite).
# Setup is idempotent: a stamp file records that the venv matches pyproject.toml.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.looprl-installed

.PHONY: setup quickstart test test-fast bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(PY) $(VENV)
	touch $(STAMP)

quickstart: setup
	$(BIN)/looprl quickstart

test: setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

bench: setup
	for b in benchmarks/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) runs .pytest_cache
