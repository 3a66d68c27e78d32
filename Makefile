# Two commands do everything (see README):
#   make demo   set up .venv and open notebooks/quickstart.ipynb in JupyterLab
#   make test   set up .venv and run every test (lint, types, Python, JS, browser end-to-end)

PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# Pinned so that a machine without torch gets a known build; an installed torch is never replaced.
TORCH   ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: setup demo test lint typecheck js-test pytest browser bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

setup: $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]"
	cd js && npm ci --no-audit --no-fund && npm run build

demo: setup
	$(BIN)/jupyter lab notebooks/quickstart.ipynb $$([ "$$(id -u)" = 0 ] && echo --allow-root)

# Debian's chromium for the end-to-end test (a test tool's own browser download is not used).
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
	  || echo "chromium not installed: the browser end-to-end test will be skipped"
	cd tests/e2e && npm ci --no-audit --no-fund

# lint-imports checks the layers and the no-cycle contracts in pyproject.toml.
lint:
	$(BIN)/ruff check gpumem_widget tests benchmarks scripts
	$(BIN)/ruff format --check gpumem_widget tests benchmarks scripts
	$(BIN)/lint-imports

typecheck:
	$(BIN)/mypy
	cd js && npm run typecheck

js-test:
	cd js && npm test

pytest:
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test: setup browser lint typecheck js-test pytest

# The GPU ones (bench_overhead, bench_estimate) measure what matters only on a CUDA machine.
bench: setup
	for b in overhead estimate snapshot drilldown report segments vars; do \
	  $(BIN)/python benchmarks/bench_$$b.py || exit 1; done
	node benchmarks/browser_chart.mjs

clean:
	rm -rf $(VENV) js/node_modules tests/e2e/node_modules gpumem_widget/static
