# Two commands on a fresh machine: `make serve` and `make test`. Everything else is a step of those.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
LISTEN ?= 127.0.0.1:50051
DATA_DIR ?= ./data

.PHONY: setup serve test test-only generate check-generated lint format

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

check-generated: setup
	$(PY) tools/generate.py --check

lint: setup
	$(VENV)/bin/buf lint
	$(VENV)/bin/buf format --diff --exit-code
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

format: setup
	$(VENV)/bin/buf format -w
	$(VENV)/bin/ruff check --fix .

test: setup check-generated lint test-only

test-only: setup
	$(PY) -m pytest
