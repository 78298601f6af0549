# openjd-checkpoint: one virtualenv per framework, because Airflow 3.3 and Prefect 3.9 cannot
# share one (their fastapi pins conflict). Each venv is made on first use from pyproject.toml.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: demo test test-core lint clean

## demo: run the Fibonacci example, interrupt it, resume it (no server needed)
demo: $(STAMP)
	$(VENV)/bin/python examples/fibonacci/demo.py

## test: every test (lint, type check, core tests)
test: lint test-core

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check core tests examples
	$(VENV)/bin/mypy

test-core: $(STAMP)
	$(VENV)/bin/python -m pytest -q tests

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
