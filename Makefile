# Two commands do everything (see README):
#   make demo   set up .venv and open notebooks/quickstart.ipynb in JupyterLab
#   make test   set up .venv and run every test (lint, types, Python, JS, browser end-to-end)

PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# Installed only where no torch is importable (pinned, so such a machine gets a known build).
TORCH   ?= torch==2.13.0
PYTEST_ARGS ?=
# What `make` last did, so a second `make demo` reinstalls nothing (one file per step).
STAMPS  := .stamps/$(notdir $(abspath $(VENV)))
# The browser bundle and what it is made from (hatch_build.py rebuilds it the same way).
BUNDLE  := gpumem_widget/static/widget.js
JS_SOURCES := $(shell find js/src -type f) js/package.json js/package-lock.json js/build.mjs
# The C reader's source, where hatch_build.py says it is.
READER_SOURCE := $(shell sed -n 's/^SOURCE = ROOT \/ //p' hatch_build.py | tr -d '" ')
# Build tools for wheels (build, hatchling, zig's C compiler, auditwheel), apart from .venv.
BUILDVENV ?= .buildvenv
BUILD_TOOLS := "build>=1.2" "hatchling>=1.21" "ziglang>=0.13" "auditwheel>=6"
DEMO_PORT ?= 8888

.PHONY: setup demo test ci lint typecheck js-test pytest native-check browser bench clean \
	buildvenv wheels test-pythons test-aarch64

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

# Each step runs again only when what it reads changed: the install when pyproject.toml or
# hatch_build.py did (or the venv is new), npm ci when the lock file did, the bundle when js/
# did, the C reader when its source did.
$(STAMPS)/installed: $(BIN)/python pyproject.toml hatch_build.py
	@$(BIN)/python -c "import torch" 2>/dev/null \
	  || { echo "make: no torch here: installing $(TORCH) (CPU or CUDA as pip picks;" \
	         "TORCH=... chooses another)"; $(BIN)/pip install -q "$(TORCH)"; }
	$(BIN)/pip install -q -e ".[test]"
	@mkdir -p $(@D) && touch $@

js/node_modules/.package-lock.json: js/package-lock.json
	cd js && npm ci --no-audit --no-fund
	@touch $@

$(BUNDLE): $(JS_SOURCES) js/node_modules/.package-lock.json
	cd js && npm run build
	@touch $@

$(STAMPS)/reader: $(READER_SOURCE) hatch_build.py $(STAMPS)/installed
	@$(BIN)/python hatch_build.py || echo "make: no C reader here: snapshots are read with the unpickler"
	@touch $@

setup: $(STAMPS)/installed $(BUNDLE) $(STAMPS)/reader

# JupyterLab runs headless; its log goes to $(STAMPS)/jupyter.log and the last line printed is
# the address to open, token included, once the server answers (Ctrl-C stops it).
demo: setup
	@mkdir -p $(STAMPS); log=$(STAMPS)/jupyter.log; : >$$log; \
	$(BIN)/jupyter lab --no-browser --port=$(DEMO_PORT) \
	  $$([ "$$(id -u)" = 0 ] && echo --allow-root) >$$log 2>&1 & pid=$$!; \
	trap 'kill $$pid 2>/dev/null; wait $$pid' INT TERM EXIT; \
	while kill -0 $$pid 2>/dev/null \
	  && ! url=$$(grep -om1 'http://127\.0\.0\.1:[0-9]*/lab?token=[0-9a-f]*' $$log); do sleep 0.1; done; \
	[ -n "$$url" ] || { cat $$log; exit 1; }; \
	echo "make: JupyterLab is running (log: $$log; Ctrl-C stops it). Open:"; \
	echo "$$url" | sed 's#/lab?#/lab/tree/notebooks/quickstart.ipynb?#'; \
	wait $$pid

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

# The checks that time nothing run two at a time (CI has 2 cores; each is mostly one process),
# then the JS tests and pytest, each alone: their browser and kernel tests wait on what they see
# (beside native-check a JS browser test once ran past its 30 s). native-check ends before
# pytest starts (it puts the ordinary C reader back when it ends). `make ci` adds the other
# Pythons and the aarch64 wheel to the first group (.ci/run).
CHECKS := lint typecheck native-check
test: setup buildvenv browser
	$(MAKE) -j2 --output-sync=target $(CHECKS)
	$(MAKE) js-test
	$(MAKE) pytest

ci: setup buildvenv browser
	$(MAKE) -j2 --output-sync=target $(CHECKS) test-pythons test-aarch64
	$(MAKE) js-test
	$(MAKE) pytest

# Every other CPython here: each python3.1X on PATH and in pyenv (TEST_PYTHONS=... names others), in
# a venv of its own (.venv-3.X), with the package (its C reader built for that version) and its
# dependencies but no torch: PyPI has only CUDA builds of torch for those (several GB each), and
# this machine's CPU build is for 3.11. So they run the tests that need no torch: the C reader
# against the unpickler on real and hostile files, pickle protocol 5, and the command line.
# The version of .venv's Python is left out: `make pytest` runs all of these there already.
# One target per version (test-python-3.X), so that `make -j2` runs two at a time.
ifndef TEST_PYTHONS
TEST_PYTHONS := $(foreach v,10 11 12 13 14,$(shell command -v python3.$(v))) \
	$(wildcard $(HOME)/.pyenv/versions/3.1*/bin/python3.1?)
endif
# "3.X:interpreter", the first one found of each version; asked of the interpreters only when a
# test-python target needs it (once), so that no other `make` waits for them.
VERSION_OF := import sys; print("%d.%d" % sys.version_info[:2])
PYTHONS_BY_VERSION = $(eval PYTHONS_BY_VERSION := $(shell own=$$($(PY) -c '$(VERSION_OF)' 2>/dev/null); \
	for py in $(TEST_PYTHONS); do v=$$($$py -c '$(VERSION_OF)' 2>/dev/null) \
	  && [ "$$v" != "$$own" ] && echo "$$v:$$py"; done | awk -F: '!seen[$$1]++'))$(PYTHONS_BY_VERSION)
# Each run's address space is capped: uncapped, a test of these grew to 23 GB on Python 3.12
# (killed for memory); capped, the allocation fails at once, as the tests expect.
TEST_MEMORY_KB ?= 8000000
VERSION_TESTS ?= tests/test_snapshot_rows.py tests/test_snapshot_reader_hostile.py tests/test_cli.py \
	tests/test_wheels.py::test_a_snapshot_pickled_with_protocol_5_opens_as_with_protocol_2

TESTED_VERSIONS = $(foreach p,$(PYTHONS_BY_VERSION),$(firstword $(subst :, ,$(p))))

# A recipe, not prerequisites, so that the interpreters are asked only here (jobs: `make -j`'s).
test-pythons:
	@$(MAKE) --no-print-directory $(addprefix test-python-,$(TESTED_VERSIONS))
	@echo "make: tested on Python $(TESTED_VERSIONS)"

.stamps/requirements-without-torch.txt: pyproject.toml
	@mkdir -p $(@D) && $(PY) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	  test = [r for r in p["optional-dependencies"]["test"] if r.split(">")[0] in \
	          ("pytest", "pytest-timeout", "hypothesis", "nbclient", "nbformat", "jupyter_client")]; \
	  print(*[r for r in p["dependencies"] if not r.startswith("torch")], *test, sep="\n")' > $@

test-python-%: .stamps/requirements-without-torch.txt
	@py=$(lastword $(subst :, ,$(filter $*:%,$(PYTHONS_BY_VERSION)))); \
	[ -n "$$py" ] || { echo "make: no Python $* here"; exit 1; }; \
	echo "make: Python $* ($$py): $(VERSION_TESTS)"; \
	{ [ -x .venv-$*/bin/python ] || $$py -m venv .venv-$*; } \
	  && .venv-$*/bin/pip install -q -r $< \
	  && .venv-$*/bin/pip install -q --no-deps -e . \
	  && ulimit -v $(TEST_MEMORY_KB) && .venv-$*/bin/python -m pytest -q -p no:cacheprovider \
	       $(VERSION_TESTS)

# Wheels into dist/: the sdist, the pure wheel, manylinux binary wheels for x86_64 and aarch64
# (scripts/build_wheels.py; tests/test_wheels.py builds and installs them in `make test`).
$(BUILDVENV)/bin/python:
	$(PY) -m venv $(BUILDVENV)
	$(BUILDVENV)/bin/pip install -q $(BUILD_TOOLS)

buildvenv: $(BUILDVENV)/bin/python

wheels: buildvenv
	$(BUILDVENV)/bin/python scripts/build_wheels.py -o dist

# The aarch64 binary wheel run by Debian's aarch64 CPython under qemu-user (on x86_64).
test-aarch64: buildvenv
	scripts/check_aarch64_wheel.sh

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


# The GPU ones (bench_overhead, bench_estimate) measure what matters only on a CUDA machine.
# Every benchmark docs/BENCHMARKS.md quotes, with its defaults (tests/test_setup.py checks the
# list against the page). The GPU ones (overhead, kernel_cost, modules, estimate) measure what
# matters only on a CUDA machine; elsewhere they measure host mode or the CPU.
BENCHES := load session overhead kernel_cost modules estimate snapshot snapshot_views drilldown \
	reader reader_memory report segments history vars workers send_traits
bench: setup
	for b in $(BENCHES); do $(BIN)/python benchmarks/bench_$$b.py || exit 1; done
	node benchmarks/browser_chart.mjs
	node benchmarks/bench_drilldown.mjs js/test/fixtures/drilldown.json

clean:
	rm -rf $(VENV) $(BUILDVENV) .stamps dist js/node_modules tests/e2e/node_modules gpumem_widget/static
