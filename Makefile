# Two entry points work on a fresh machine: `make demo` and `make test`.
# Each creates .venv and installs what it needs. torch is pinned to 2.13.0 (a CPU build that
# this machine installs from local disk); any other spec may pull a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_PIN := torch==2.13.0

.PHONY: demo test lint typecheck proofs nightly clean

$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e .
	touch $@

$(VENV)/.test: $(VENV)/.base pyproject.toml
	$(PIP) install -q -e '.[test]'
	touch $@

demo: $(VENV)/.base
	$(VENV)/bin/refplan demo

lint: $(VENV)/.test
	$(VENV)/bin/ruff check refplan tests proofs fuzz
	$(VENV)/bin/mypy refplan

typecheck: lint

test: $(VENV)/.test
	$(VENV)/bin/ruff check refplan tests proofs fuzz
	$(VENV)/bin/mypy refplan
	$(PY) -m pytest -n 2 tests

nightly: $(VENV)/.test
	HYPOTHESIS_PROFILE=nightly $(PY) -m pytest -n 2 tests

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
