# Two commands on a fresh machine: `make serve` and `make test`. Everything else is a step of those.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
LISTEN ?= 127.0.0.1:50051
DATA_DIR ?= ./data
# Node >= 20 runs the TypeScript client tests and the conformance suite against upstream.
HAVE_NODE := $(shell node -e 'process.exit(+process.versions.node.split(".")[0] >= 20 ? 0 : 1)' 2>/dev/null && echo yes)
HAVE_GO := $(shell command -v go >/dev/null 2>&1 && echo yes)
PYTEST_IGNORE := $(if $(HAVE_NODE),,--ignore=tests/conformance)
# The Python suite in this many processes, a test file to each at a time (module fixtures serve
# one file): most of its time is spent waiting on servers, timeouts and subprocesses, so two
# workers on two cores took 858 s where one took 1,330 s. PYTEST_WORKERS=0 runs it in one process.
# Files go out in collection order (tests/conftest.py puts the long ones first); xdist's own order,
# most tests first, left a 190-second file of one test to start last.
PYTEST_WORKERS ?= 2

LITESTREAM_VERSION := v0.5.18
LITESTREAM_BIN := .tools/bin/litestream

.PHONY: setup serve test test-only test-python test-clients test-typescript test-go conformance generate check-generated \
	lint format bench bench-quick bench-history litestream restore checks-then-clients oracle

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

serve: setup
	$(VENV)/bin/sessions-server serve --listen $(LISTEN) --data-dir $(DATA_DIR)

generate: setup
	$(PY) tools/generate.py
	$(if $(HAVE_NODE),clients/typescript/scripts/generate.sh)
	$(if $(HAVE_GO),clients/go/scripts/generate.sh)

check-generated: setup
	$(PY) tools/generate.py --check
	$(if $(HAVE_NODE),clients/typescript/scripts/check-generated.sh)
	$(if $(HAVE_GO),clients/go/scripts/check-generated.sh)

lint: setup
	$(VENV)/bin/buf lint
	$(VENV)/bin/buf format --diff --exit-code
	$(VENV)/bin/buf breaking --against proto/baseline/sessions-v1.binpb
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

format: setup
	$(VENV)/bin/buf format -w
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# What the Python suite needs beyond the Python environment: Litestream (built once into
# .tools/bin, about 250 s of compiling on two cores, unless $LITESTREAM names one) and the
# conformance oracle's packages. `make test` makes them while it sets up the environment and then
# runs the checks and the client tests; the Python suite, last, has both cores to itself. All of
# it keeps two cores busy: on a clean clone the suite started after 388 s, where Litestream's
# build alone took 261 s and the client tests alone 145 s (2026-12-07).
PYTHON_SUITE_NEEDS := $(if $(LITESTREAM),,$(if $(HAVE_GO),$(LITESTREAM_BIN))) $(if $(HAVE_NODE),oracle)

test:
	$(MAKE) --no-print-directory -j4 checks-then-clients $(PYTHON_SUITE_NEEDS)
	$(MAKE) --no-print-directory test-python

# The client tests after the checks: check-generated installs the TypeScript client's packages,
# which its tests would otherwise install at the same time.
checks-then-clients: setup check-generated lint
	$(MAKE) --no-print-directory --output-sync=target test-typescript test-go

oracle:
	tests/conformance/oracle/ensure.sh

test-only: test-python test-clients

# The TypeScript and Go client tests side by side (each spends much of its time waiting on the
# servers it starts): 125 s where one after the other took 200 s. Each one's output comes whole,
# when it ends.
test-clients: setup
	$(MAKE) --no-print-directory --output-sync=target -j2 test-typescript test-go

test-python: setup $(if $(HAVE_NODE),oracle)
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_IGNORE)

test-typescript: setup
	$(if $(HAVE_NODE),clients/typescript/scripts/test.sh,@echo "node >= 20 not found: TypeScript client tests not run")

test-go: setup
	$(if $(HAVE_GO),clients/go/scripts/test.sh,@echo "go not found: Go client tests not run")

# Built with module and build caches of its own, removed after: Litestream's dependencies fill
# 1.7 GB of them, which the tests that follow would have no room for on a small disk.
$(LITESTREAM_BIN):
	@scratch=$$(mktemp -d) && trap 'chmod -R u+w "$$scratch"; rm -rf "$$scratch"' EXIT && \
		GOBIN=$(CURDIR)/.tools/bin GOMODCACHE="$$scratch/mod" GOCACHE="$$scratch/build" \
		go install github.com/benbjohnson/litestream/cmd/litestream@$(LITESTREAM_VERSION)

litestream: $(LITESTREAM_BIN)

# make restore REPLICA=s3://bucket/shard-0 DATA_DIR=./restored [ENDPOINT=https://...] [KEY=object-key] [AT=2026-11-30T18:00:00Z]
restore: setup $(LITESTREAM_BIN)
	LITESTREAM=$(CURDIR)/$(LITESTREAM_BIN) PYTHON=$(CURDIR)/$(PY) deploy/litestream/restore.sh --replica '$(REPLICA)' \
		--data-dir '$(DATA_DIR)' $(if $(ENDPOINT),--endpoint '$(ENDPOINT)') $(if $(KEY),--object-key '$(KEY)') \
		$(if $(AT),--timestamp '$(AT)')

conformance: setup
	tests/conformance/run.sh

bench: setup
	$(PY) bench/run.py --json bench/out/run.json
	$(PY) bench/history.py --json bench/out/history.json

bench-quick: setup
	$(PY) bench/run.py --quick --json bench/out/run-quick.json

bench-history: setup
	$(PY) bench/history.py --json bench/out/history.json
