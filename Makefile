# Two entry points work on a fresh machine: `make demo` and `make test`.
# Each creates .venv and installs what it needs. torch is pinned to 2.13.0 (a CPU build that
# this machine installs from local disk) and installed first, so nothing later pulls another
# torch: any other spec may download a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_PIN := torch==2.13.0

.PHONY: demo test lint proofs nightly fuzz clean peers gpu-check mutation

$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_PIN)
	$(PIP) install -q -e .
	touch $@

# The DeepSpeed peer (extra `peer`) is pure Python; without build isolation pip would build it
# in an isolated environment that pulls its own (CUDA) torch.
$(VENV)/.test: $(VENV)/.base pyproject.toml
	$(PIP) install -q -e '.[test]' $(TORCH_PIN)
	$(PIP) install -q --no-build-isolation 'deepspeed==0.19.8' $(TORCH_PIN)
	touch $@

# The peers the conformance runner holds to the reference (besides DeepSpeed above): DCP ships with
# torch; megatron-core and awex come without their dependencies (which would replace torch), then
# what their planners import, under a constraint that keeps torch at the pin.
PEER_PKGS := 'megatron-core==0.16.1' 'awex==0.9.0'
PEER_DEPS := 'packaging' 'transformers==5.24.0' 'requests' 'aiohttp' 'psutil'
# megatron-core 0.19.2 (`--planner megatron`; 0.16.1 above is `megatron-0.16`): its wheel is cp312-only,
# but its resharding modules are pure Python and import on this CPython 3.11 with the torch pin once
# triton is there. Both go into a folder of their own (never into the venv's site-packages), which
# the adapter's worker subprocess puts first on sys.path; torch must still be the pin afterwards.
MEGATRON_NEW := 'megatron-core==0.19.2'
TRITON_PIN := 'triton==3.9.0'
MEGATRON_TARGET := $(VENV)/peers/megatron-core-0.19.2

$(VENV)/.peers: $(VENV)/.test
	$(PIP) install -q --no-deps $(PEER_PKGS)
	echo '$(TORCH_PIN)' > $(VENV)/peer-constraints.txt
	$(PIP) install -q -c $(VENV)/peer-constraints.txt $(PEER_DEPS)
	$(PY) -c "import megatron.core.resharding.planner, awex.transfer.transfer_plan" 2>/dev/null
	touch $@

$(VENV)/.peers-megatron-0.19: $(VENV)/.peers
	rm -rf $(MEGATRON_TARGET)
	$(PIP) install -q --no-deps --only-binary :all: --python-version 3.12 --target $(MEGATRON_TARGET) $(MEGATRON_NEW)
	$(PIP) install -q --no-deps --only-binary :all: --target $(MEGATRON_TARGET) $(TRITON_PIN)
	$(PY) -P refplan/conformance/peers/megatron_worker.py $(MEGATRON_TARGET) < /dev/null | grep -q '"ready": "0.19.2"'
	$(PY) -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $@

peers: $(VENV)/.peers $(VENV)/.peers-megatron-0.19

demo: $(VENV)/.base
	$(VENV)/bin/refplan demo
	$(VENV)/bin/refplan sync --nproc 4 --backend gloo --model demo

lint: $(VENV)/.peers-megatron-0.19
	$(VENV)/bin/ruff check refplan tests proofs fuzz
	$(VENV)/bin/mypy refplan

test: lint
	$(PY) -m pytest -n 2 --dist loadgroup tests

# The check to run after every edit: lint, types and the fast core tests (maps, boxes, answer
# checks, plans, refusals, layout rules, file formats, the command's front door, the oracle's
# basics) in under 2 minutes on a quiet 2-core machine; `make test` is the whole suite.
CHECK_TESTS := tests/test_maps.py tests/test_box.py tests/test_check.py tests/test_plan.py tests/test_refusals.py \
	tests/test_layout_rules.py tests/test_input_files.py tests/test_strict_maps.py tests/test_cli.py \
	tests/test_cli_front_door.py tests/test_verify.py

.PHONY: check
check: $(VENV)/.test
	@start=$$(date +%s); \
	$(VENV)/bin/ruff check refplan tests proofs fuzz && $(VENV)/bin/mypy refplan && \
	$(PY) -m pytest -n 2 -p no:cacheprovider $(CHECK_TESTS); code=$$?; \
	echo "make check: $$(( $$(date +%s) - start )) s"; exit $$code

proofs: $(VENV)/.test
	$(PY) proofs/run_all.py

# Long property runs, then the core properties again under the crosshair (solver) backend.
nightly: $(VENV)/.test
	HYPOTHESIS_PROFILE=nightly $(PY) -m pytest -n 2 --dist loadgroup tests
	$(PIP) install -q 'hypothesis-crosshair==0.0.31'
	HYPOTHESIS_PROFILE=crosshair $(PY) -m pytest -n 2 tests/test_properties.py -k core
	rc=0; for p in dcp dcp-lowest megatron megatron-0.16 awex deepspeed; do $(PY) -m refplan.conformance.runner --planner $$p --explore 2000 --seed $$(date +%Y%m%d) || rc=1; done; exit $$rc

FUZZ_SECONDS ?= 180

# atheris 3.0.0 is the only version that installs here (cp311/cp312 wheels only); without it
# fuzz/run.py falls back to its hypothesis engine.
$(VENV)/.fuzz: $(VENV)/.test
	$(PIP) install -q 'atheris==3.0.0' || echo "atheris did not install: make fuzz uses the hypothesis engine"
	touch $@

# Runs every harness for FUZZ_SECONDS in total and prints executions, coverage and findings.
fuzz: $(VENV)/.fuzz
	$(PY) fuzz/run.py all --seconds $(FUZZ_SECONDS)

# On a GPU machine: its own venv (.venv-gpu) with a CUDA build of $(TORCH_PIN), then every CUDA/NCCL
# check in one command (see the script's header).
gpu-check:
	scripts/gpu-check.sh

# Mutation testing of the checker, the oracle and the planner's core (configuration: [tool.mutmut]
# in pyproject.toml; docs/mutation.md). Not part of `make test`: it takes minutes (40 min here under
# other sessions' load, ~29 CPU-minutes; one module group a few minutes).
# mutmut 3.8.1 works on Python 3.11 and pytest 9 here (3.3.1 does not: it reads a pytest attribute
# that pytest 9 removed). tests/mutation_run.py runs it once per group of modules (the checker and
# the oracle; then each core module with its own tests), each in a scratch copy under
# mutants/.work/ (fresh each run), and gathers the results under mutants/; then
# tests/mutation_score.py prints `mutation score: N% (K of M mutants killed)` per module.
# MODULES picks modules (`make mutation MODULES="refplan/plan.py refplan/frames.py"`; empty: all);
# MUTATION_FAIL_UNDER makes it a gate.
MODULES ?=
MUTATION_CHILDREN ?= 2
MUTATION_FAIL_UNDER ?= 90

$(VENV)/.mutation: $(VENV)/.test
	$(PIP) install -q 'mutmut==3.8.1'
	touch $@

mutation: $(VENV)/.mutation
	$(PY) tests/mutation_run.py --max-children $(MUTATION_CHILDREN) $(MODULES) || (tail -40 mutants.log; exit 1)
	$(PY) tests/mutation_score.py --fail-under $(MUTATION_FAIL_UNDER)

clean:
	rm -rf mutants mutants.log $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis fuzz/work fuzz/artifacts
