# The two set-up commands of the README: `make demo` and `make test`. Each makes its own
# virtualenv (.venv) and installs what it needs; nothing is installed by hand.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# Root installs system packages directly; anyone else through sudo.
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo lint test test-oldest test-all dist bench bench-quick profile proto-check redis-server chromium node promtool clean help

help:
	@echo "make demo      run Veil end to end on this machine (the main job): an aggregator on the"
	@echo "               embedded SQLite store (a temporary file), simulated devices, the dashboard"
	@echo "make test      lint, then run the test suite (installs what it needs) on WORKERS=4 processes"
	@echo "               (WORKERS=0: in one); the slowest tests are listed, each test's time is kept in .test-results/"
	@echo "make lint      ruff (lint and format check) and mypy, as configured in pyproject.toml"
	@echo "make test-all  the test suite with the slow statistical tests"
	@echo "make test-oldest  the SDK's tests on the oldest grpcio and protobuf it supports (make test runs it)"
	@echo "make dist      the sdist, the wheel and the npm tarball, into dist/"
	@echo "make bench     run the benchmarks against the peer libraries (bench/results/)"
	@echo "make bench-quick  a minute-long smoke run of the benchmarks (numbers mean nothing)"
	@echo "make profile   py-spy profiles of the aggregator under ingest load (bench/results/profiles/)"
	@echo "make clean     remove the virtualenv and caches"

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.aggregator: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -e '.[aggregator]'
	touch $@

# The development tools are PEP 735 dependency groups (pyproject.toml), not a published extra:
# `pip install --group` needs pip 25.1 or newer, whatever the venv came with.
$(VENV)/.dev: pyproject.toml | $(VENV)/bin/python
	$(PIP) install 'pip>=25.1'
	$(PIP) install -e '.[aggregator]' --group dev
	touch $@ $(VENV)/.aggregator

# The suite runs on WORKERS processes (pytest-xdist), a test file each at a time, so a file's
# module fixtures (its servers, the wheel) start once; WORKERS=0 runs it in this process. Four
# on two cores, because much of a test's time is spent waiting on servers, processes and
# deadlines: on a quiet 2-core machine 3 workers took 290 s of pytest and 4 took 268 s. Every
# run prints its slowest tests (--durations, pyproject.toml) and keeps every test's time in
# $(RESULTS)/*.xml (JUnit XML).
WORKERS ?= 4
XDIST   := -n $(WORKERS) $(if $(filter 0,$(WORKERS)),,--dist loadfile)
RESULTS := .test-results

# The SDK's tests (tests/client, tests/wire) on the oldest grpcio and protobuf pyproject.toml
# allows, pinned in client/oldest-constraints.txt, in a virtualenv of their own: the SDK with its
# grpc extra and the test group, no aggregator extra (its grpcio floor is the newest), so
# test_toy_mechanism.py and tests/client/test_numeric.py, which serve through the daemon, run in
# `make test` only.
OLDEST := .venv-oldest
$(OLDEST)/.installed: pyproject.toml client/oldest-constraints.txt
	rm -rf $(OLDEST)
	$(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip --disable-pip-version-check -q install 'pip>=25.1'
	$(OLDEST)/bin/python -m pip --disable-pip-version-check -q install \
	  --constraint client/oldest-constraints.txt -e '.[grpc]' --group test
	touch $@

test-oldest: $(OLDEST)/.installed redis-server client/js/dist/.built
	$(OLDEST)/bin/python -m pytest -m "not slow" -q -p no:cacheprovider $(XDIST) tests/client tests/wire \
	  --ignore tests/wire/test_toy_mechanism.py --ignore tests/client/test_numeric.py \
	  --junitxml=$(RESULTS)/oldest.xml

# The tests start their own redis-server on free ports; install Debian's where it is missing.
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server (Debian package)"; \
	  $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server; }

# The dashboard test drives headless Chromium; install Debian's where it is missing.
# promtool (Debian's prometheus package) checks the /metrics text in the tests.
promtool:
	@command -v promtool >/dev/null 2>&1 || { \
	  echo "installing promtool (Debian package prometheus)"; \
	  $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; }

chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium (Debian package)"; \
	  $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }

# The TypeScript SDK's tests run under Node; install Debian's nodejs and npm where missing.
node:
	@command -v npm >/dev/null 2>&1 || { \
	  echo "installing nodejs and npm (Debian packages)"; \
	  $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm; }

# client/js: its packages from the lockfile, then built (the Python tests run the built SDK; the
# build puts client/js/proto/veil.proto, the package's copy of the wire contract, beside it for
# gRPC, so it builds outside this repository too; tests/test_package.py fails when the copy drifts).
client/js/dist/.built: client/js/package.json client/js/package-lock.json client/js/proto/veil.proto \
		$(wildcard client/js/src/*.ts client/js/test/*.ts) | node
	cd client/js && npm ci --no-audit --no-fund && npm run build
	touch $@

demo: $(VENV)/.aggregator
	$(VENV)/bin/veil demo

# Lint, format and types first: they take seconds, the tests minutes.
lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: lint $(VENV)/.dev redis-server chromium promtool client/js/dist/.built
	$(PY) -m pytest -m "not slow" -q $(XDIST) --junitxml=$(RESULTS)/default.xml
	$(MAKE) test-oldest

test-all: $(VENV)/.dev redis-server chromium promtool client/js/dist/.built
	$(PY) -m pytest -q $(XDIST) --junitxml=$(RESULTS)/all.xml

# Runs bench_randomize.py, bench_client.py, bench_ingest.py and bench_capacity.py (each writes its own JSON), then
# combines them: bench/results/latest.json, bench/results/throughput.png and one table on stdout.
# Exits non-zero when an exact-count or sanity check failed or a benchmark did not finish.
bench: $(VENV)/.dev redis-server
	$(PY) bench/report.py --run

# The same on smoke runs, in bench/results/quick/ (never over the real results); numbers mean nothing.
bench-quick: $(VENV)/.dev redis-server
	$(PY) bench/report.py --run --quick

profile: $(VENV)/.dev redis-server
	$(PY) bench/profile_ingest.py

# proto/generate.py installs its own pinned protoc (grpcio-tools) under .venv/.
proto-check:
	$(PYTHON) proto/generate.py --check

# What a user installs: the sdist, the wheel built from it, and the npm tarball (with the
# package's veil.proto). tests/test_package.py installs each of them (DIST=elsewhere: it builds
# them into a temporary directory). npm pack without scripts: client/js/dist/.built has built
# the package already (its prepack builds it for an `npm pack` or `npm publish` run by hand).
DIST ?= dist
dist: $(VENV)/.dev client/js/dist/.built
	rm -rf $(DIST)
	$(PY) -m build --no-isolation --outdir $(DIST) .
	cd client/js && npm pack --ignore-scripts --pack-destination $(abspath $(DIST))

clean:
	rm -rf $(VENV) $(OLDEST) $(RESULTS) .pytest_cache .ruff_cache .mypy_cache build dist client/js/node_modules client/js/dist
	find . -name __pycache__ -prune -exec rm -rf {} +
