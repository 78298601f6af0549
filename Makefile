# openjd-checkpoint: one virtualenv per framework, because Airflow 3.3 and Prefect 3.9 cannot
# share one (their fastapi pins conflict). Each venv is made on first use from pyproject.toml:
#   .venv          core, CLI, lint, type check      (extra [test])
#   .venv-airflow  core + Airflow adapter            (extras [airflow,test])
#   .venv-prefect  core + Prefect integration        (extras [prefect,test])
PYTHON ?= python3
SUM := $(shell cksum pyproject.toml | cut -d' ' -f1)
VENV := .venv
VENV_AIRFLOW := .venv-airflow
VENV_PREFECT := .venv-prefect
VENV_REFERENCE := .venv-reference
STAMP := $(VENV)/.installed-$(SUM)
STAMP_BASE := $(VENV)/.base-$(SUM)
STAMP_AIRFLOW := $(VENV_AIRFLOW)/.installed-$(SUM)
STAMP_PREFECT := $(VENV_PREFECT)/.installed-$(SUM)
# The reference runtime (openjd-cli, on openjd-model 0.13) runs beside ours in side-by-side tests.
REFERENCE_CLI := openjd-cli==0.8.*
STAMP_REFERENCE := $(VENV_REFERENCE)/.installed-$(shell echo '$(REFERENCE_CLI)' | cksum | cut -d' ' -f1)
EXTRAS_AIRFLOW := airflow,test
EXTRAS_PREFECT := prefect,test
PYTEST_CORE := -q --durations=20 tests --ignore=tests/airflow --ignore=tests/prefect

.PHONY: demo test test-core test-airflow test-prefect lint clean venvs

## demo: run the Fibonacci example, interrupt it, resume it (no server needed)
demo: $(STAMP_BASE)
	$(VENV)/bin/python examples/fibonacci/demo.py

## test: every test (lint, type check, core tests, Airflow tests, Prefect tests)
test: lint test-core test-airflow test-prefect

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check $(wildcard core tests examples benchmarks airflow_plugin prefect_integration)
	$(VENV)/bin/mypy

test-core: $(STAMP) $(STAMP_REFERENCE)
	$(VENV)/bin/python -m pytest $(PYTEST_CORE)

test-airflow: $(STAMP_AIRFLOW)
	$(VENV_AIRFLOW)/bin/python -m pytest -q --durations=10 tests/airflow

test-prefect: $(STAMP_PREFECT)
	$(VENV_PREFECT)/bin/python -m pytest -q --durations=10 tests/prefect

venvs: $(STAMP) $(STAMP_REFERENCE) $(STAMP_AIRFLOW) $(STAMP_PREFECT)

# $(1): venv folder, $(2): extras
define make_venv
	$(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip
	$(1)/bin/python -m pip install -q -e '.[$(2)]'
	rm -f $(1)/.installed-*
	touch $@
endef

$(STAMP): pyproject.toml
	$(call make_venv,$(VENV),test)

# The demo needs only the core (no test tools): a quicker first run.
$(STAMP_BASE): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e .
	rm -f $(VENV)/.base-*
	touch $@

$(STAMP_REFERENCE):
	$(PYTHON) -m venv $(VENV_REFERENCE)
	$(VENV_REFERENCE)/bin/python -m pip install -q '$(REFERENCE_CLI)'
	rm -f $(VENV_REFERENCE)/.installed-*
	touch $@

$(STAMP_AIRFLOW): pyproject.toml
	$(call make_venv,$(VENV_AIRFLOW),$(EXTRAS_AIRFLOW))

$(STAMP_PREFECT): pyproject.toml
	$(call make_venv,$(VENV_PREFECT),$(EXTRAS_PREFECT))

clean:
	rm -rf $(VENV) $(VENV_AIRFLOW) $(VENV_PREFECT) $(VENV_REFERENCE) .pytest_cache .mypy_cache .ruff_cache .hypothesis
