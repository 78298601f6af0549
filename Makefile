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
EXTRAS_PREFECT := prefect,dask,test
# CORE_WORKERS > 0 runs the core suite in that many pytest-xdist workers (tests that share a
# module-scoped server or a fixed folder stay in one worker each: xdist_group), TEST_JOBS > 1 runs
# the three suites side by side, each with its own servers on free loopback ports. On 2 cores
# most of the suite waits (subprocesses, servers, sleeps), so 3 and 3 are the measured best:
# about 15 minutes for make test against 38 one test at a time. For one test at a time:
# make test CORE_WORKERS=0 TEST_JOBS=1
CORE_WORKERS ?= 3
TEST_JOBS ?= 3
PYTEST_CORE := -q --durations=20 -n $(CORE_WORKERS) --dist loadgroup tests --ignore=tests/airflow --ignore=tests/prefect
# uv makes the virtualenvs (much faster than pip, with a shared cache); it is pip-installed into a
# bootstrap virtualenv of its own, so a fresh machine needs only Python and make.
UV_VERSION := 0.13.*
VENV_TOOLS := .venv-tools
UV := $(VENV_TOOLS)/bin/uv

.PHONY: demo test test-core test-airflow test-prefect lint clean venvs

## demo: run the Fibonacci example, interrupt it, resume it (no server needed)
demo: $(STAMP_BASE)
	$(VENV)/bin/python examples/fibonacci/demo.py

## test: every test (lint, type check, then the core, Airflow and Prefect suites; each has its own
## servers on free loopback ports, so they can run side by side: TEST_JOBS=3)
test: lint
	@$(MAKE) --no-print-directory -j$(TEST_JOBS) --output-sync=target test-core test-airflow test-prefect

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check $(wildcard core tests examples benchmarks airflow_plugin prefect_integration)
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/python .ci/check_structure.py

test-core: $(STAMP) $(STAMP_REFERENCE)
	$(VENV)/bin/python -m pytest $(PYTEST_CORE)

test-airflow: $(STAMP_AIRFLOW)
	$(VENV_AIRFLOW)/bin/python -m pytest -q --durations=10 tests/airflow

test-prefect: $(STAMP_PREFECT)
	$(VENV_PREFECT)/bin/python -m pytest -q --durations=10 tests/prefect

venvs: $(STAMP) $(STAMP_REFERENCE) $(STAMP_AIRFLOW) $(STAMP_PREFECT)

$(UV):
	$(PYTHON) -m venv $(VENV_TOOLS)
	$(VENV_TOOLS)/bin/python -m pip install -q --disable-pip-version-check 'uv==$(UV_VERSION)'

# $(1): venv folder, $(2): what to install, $(3): the stamp files it replaces. --seed puts pip in the venv too (a test pip-installs
# a wheel into a session, as a job's onEnter would).
# --compile-bytecode: uv, unlike pip, leaves the .pyc files to the first import, which never
# writes them where PYTHONDONTWRITEBYTECODE is set (CI images set it): every start of the CLI
# (and of `openjd run` beside it) then compiled its libraries from source, about half a second.
# The project's own (editable) modules are compiled too, for the same reason.
define make_venv
	$(UV) venv -q --seed --allow-existing --python $(PYTHON) $(1)
	$(UV) pip install -q --compile-bytecode --python $(1)/bin/python $(2)
	$(1)/bin/python -m compileall -q core airflow_plugin prefect_integration >/dev/null || true
	rm -f $(1)/$(3)
	touch $@
endef

$(STAMP): pyproject.toml | $(UV)
	$(call make_venv,$(VENV),-e '.[test]',.installed-*)
	rm -f $(VENV)/.base-*
	touch $(STAMP_BASE)  # the whole install holds the demo's: make demo after it installs nothing

# The demo needs only the core (no test tools): a quicker first run.
$(STAMP_BASE): pyproject.toml | $(UV)
	$(call make_venv,$(VENV),-e .,.base-*)

$(STAMP_REFERENCE): | $(UV)
	$(call make_venv,$(VENV_REFERENCE),'$(REFERENCE_CLI)',.installed-*)

$(STAMP_AIRFLOW): pyproject.toml | $(UV)
	$(call make_venv,$(VENV_AIRFLOW),-e '.[$(EXTRAS_AIRFLOW)]',.installed-*)

$(STAMP_PREFECT): pyproject.toml | $(UV)
	$(call make_venv,$(VENV_PREFECT),-e '.[$(EXTRAS_PREFECT)]',.installed-*)

clean:
	rm -rf $(VENV_TOOLS) $(VENV) $(VENV_AIRFLOW) $(VENV_PREFECT) $(VENV_REFERENCE) .pytest_cache .mypy_cache .ruff_cache .hypothesis
