# Two commands do everything (see README):
#   make demo   set up .venv and open notebooks/quickstart.ipynb in JupyterLab
#   make test   set up .venv and run every test (lint, types, Python, JS, browser end-to-end)

PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# Installed only where no torch is importable (pinned, so such a machine gets a known build).
TORCH   ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: setup demo test lint typecheck js-test pytest native-check browser bench clean

# A torch that $(PY) already imports (a CUDA build, say) is never downloaded again: a .pth file
# puts the folder it comes from on the venv's path (after the venv's own packages), so the venv
# imports it and pip counts it as installed (the package asks only for torch>=2.1).
$(BIN)/python:
	$(PY) -m venv $(VENV)
	@site=$$($(PY) -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))" \
	    2>/dev/null) && [ -n "$$site" ] \
	  && echo "$$site" > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/reuse_torch.pth" \
	  && echo "make: the venv uses the torch $(PY) imports, from $$site (none is downloaded)" \
	  || true
	@# pip >= 21.3 installs a pyproject package in editable mode; only an older one is upgraded.
	@$(BIN)/python -c "import pip, sys; sys.exit(tuple(map(int, pip.__version__.split('.')[:2])) < (21, 3))" \
	  || $(BIN)/pip install -q --upgrade pip

setup: $(BIN)/python
	@$(BIN)/python -c "import torch" 2>/dev/null \
	  || { echo "make: no torch here: installing $(TORCH) (CPU or CUDA as pip picks;" \
	         "TORCH=... chooses another)"; $(BIN)/pip install -q "$(TORCH)"; }
	$(BIN)/pip install -q -e ".[test]"
	cd js && npm ci --no-audit --no-fund && npm run build

demo: setup
	$(BIN)/jupyter lab notebooks/quickstart.ipynb $$([ "$$(id -u)" = 0 ] && echo --allow-root)

# Debian's chromium for the end-to-end tests (a test tool's own browser download is not used).
# As root on Debian/Ubuntu it is installed with apt (about 120 packages); otherwise the browser
# tests are skipped. NO_APT=1 never installs it.
browser:
	@command -v chromium >/dev/null || { [ -z "$(NO_APT)" ] && [ "$$(id -u)" = 0 ] \
	  && command -v apt-get >/dev/null \
	  && echo "make: installing Debian's chromium with apt-get as root (about 120 packages)" \
	    "for the browser end-to-end tests; NO_APT=1 skips this" \
	  && apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
	  || echo "make: chromium not installed: the browser end-to-end tests will be skipped"
	cd tests/e2e && npm ci --no-audit --no-fund

# lint-imports checks the layers and the no-cycle contracts in pyproject.toml.
lint:
	$(BIN)/ruff check gpumem_widget tests benchmarks scripts hatch_build.py
	$(BIN)/ruff format --check gpumem_widget tests benchmarks scripts hatch_build.py
	$(BIN)/lint-imports

typecheck:
	$(BIN)/mypy
	cd js && npm run typecheck

js-test:
	cd js && npm test

pytest:
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The C reader built with AddressSanitizer and UndefinedBehaviorSanitizer (gcc), its tests and
# both fuzzers run under it at a fixed seed; any report (or warning) fails. Python allocates with
# malloc so the sanitizer sees every block; leaks are not checked (CPython keeps its own at exit);
# a failed allocation is a MemoryError, not a report (a corrupt memo index asks the unpickler
# for gigabytes).
# The ordinary build is put back afterwards, pass or fail.
native-check: $(BIN)/python
	$(BIN)/python hatch_build.py --sanitize
	@status=0; \
	ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 PYTHONMALLOC=malloc \
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so)" sh -c ' \
	  $(BIN)/python -m pytest -x -q -p no:cacheprovider tests/test_snapshot_rows.py \
	    tests/test_snapshot_reader_hostile.py \
	  && $(BIN)/python scripts/fuzz_snapshot_reader.py --seed 0 --rounds 200 \
	  && $(BIN)/python scripts/fuzz_pickle_opcodes.py --seed 0 --cases 1000' || status=$$?; \
	$(BIN)/python hatch_build.py; exit $$status

test: setup browser lint typecheck js-test pytest native-check

# The GPU ones (bench_overhead, bench_estimate) measure what matters only on a CUDA machine.
bench: setup
	for b in overhead estimate snapshot drilldown reader report segments vars; do \
	  $(BIN)/python benchmarks/bench_$$b.py || exit 1; done
	node benchmarks/browser_chart.mjs

clean:
	rm -rf $(VENV) js/node_modules tests/e2e/node_modules gpumem_widget/static
