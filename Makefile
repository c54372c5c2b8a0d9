# The README's two commands are `make demo` and `make test`; everything they need is
# installed and started from here.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV ?= .venv
PY := $(CURDIR)/$(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: demo test install unit lint typecheck bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) examples/multi_domain.py
	$(PY) examples/chaos_demo.py

test: install
	$(PY) -m pytest tests $(PYTEST_ARGS)

unit: install
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check runtime tests bench examples

typecheck: install
	$(VENV)/bin/mypy

bench: install
	$(PY) bench/bench_core.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
