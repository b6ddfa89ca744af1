# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export OMP_NUM_THREADS ?= 1

.PHONY: demo test test-unit test-integration test-e2e lint docs plan stack stack-down stack-status deploy targets bench-venv predict-venv gpu-bundle clean

$(BIN)/enginefoundry: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	# torch 2.13.0 CPU: pip takes the local wheel where one lies on disk (uv would download CUDA builds).
	# server: the full MLflow for `make stack`'s tracking server (the core needs only mlflow-skinny).
	# docs: MkDocs for the docs site (`make docs`; tests/unit/test_docs.py builds it strictly).
	$(BIN)/pip install -q -e '.[reference,bench,test,server,simulate,docs]'
	touch $@

# AIPerf in its own venv, so its pins (rich~=14.1, pandas, pyzmq) never meet TensorRT-LLM's; the bench stage
# finds .venv-bench/bin/aiperf before PATH (EF_AIPERF overrides both). Same pin as the `bench` extra.
BENCH_VENV := .venv-bench
$(BENCH_VENV)/bin/aiperf:
	test -x $(BENCH_VENV)/bin/python || $(PY) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q -U pip
	$(BENCH_VENV)/bin/pip install -q 'aiperf==0.13.0'
	touch $@

bench-venv: $(BENCH_VENV)/bin/aiperf

# The configuration predictor (AIConfigurator, docs/search.md) in its own venv (~850 MB: pandas, pyarrow, scipy,
# bokeh, plotly, its perf databases); `enginefoundry search` runs .venv-predict/bin/aiconfigurator (EF_PREDICTOR
# overrides). `make test` installs it so the integration tier runs the predictor for real.
PREDICT_VENV := .venv-predict
$(PREDICT_VENV)/bin/aiconfigurator:
	test -x $(PREDICT_VENV)/bin/python || $(PY) -m venv $(PREDICT_VENV)
	$(PREDICT_VENV)/bin/pip install -q -U pip
	$(PREDICT_VENV)/bin/pip install -q 'aiconfigurator==0.12.0'
	touch $@

predict-venv: $(PREDICT_VENV)/bin/aiconfigurator

# What the pipeline needs on a GPU host without a package index (the device tool's lent H100/H200), for the reference
# lane, the gate and the benchmark (scripts/gpu_bundle.py): wheels for CPython $(GPU_PYTHON), manylinux x86-64, less
# what the host has (docs/facts/gpu-host-packages.txt), packed into .gpu-bundle/site.tar.xz; it prints the total.
# On the host: bash scripts/gpu_run.sh (the whole DAG of configs/gpu-sm90-search.yaml; docs/scale.md).
GPU_PYTHON ?= 3.12
gpu-bundle: $(BIN)/enginefoundry
	$(BIN)/python scripts/gpu_bundle.py --out .gpu-bundle --python-version $(GPU_PYTHON)

# Regenerate what lists the GPU pools (deployment.yaml, POOLS below, k8s/) from enginefoundry/catalog/gpu_targets.py.
targets: $(BIN)/enginefoundry
	$(BIN)/python scripts/gen_targets.py

demo: $(BIN)/enginefoundry
	$(BIN)/enginefoundry run configs/tiny-cpu.yaml

# Two pytest-xdist workers (this machine has 2 cores; most of a test's time is a real process starting or a model
# answering): each worker runs its share; the tests of the session's Prefect server stay on one (tests/conftest.py).
TEST_WORKERS ?= 2
# mypy: strict on enginefoundry/ (pyproject.toml [tool.mypy]); default settings on scripts/ and benchmarks/.
MYPY_ELSEWHERE := $(BIN)/mypy --config-file= --python-version 3.11 --ignore-missing-imports --follow-imports=silent \
	scripts benchmarks
PYTEST := $(BIN)/pytest -p no:dash -n $(TEST_WORKERS) --dist loadgroup

test: $(BIN)/enginefoundry $(PREDICT_VENV)/bin/aiconfigurator
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy
	$(MYPY_ELSEWHERE)
	$(PYTEST) --durations=15

# One tier at a time: unit (no process, no network), integration (real services), e2e (CLI and flows).
test-unit: $(BIN)/enginefoundry
	$(PYTEST) tests/unit

test-integration: $(BIN)/enginefoundry $(PREDICT_VENV)/bin/aiconfigurator
	$(PYTEST) tests/integration

test-e2e: $(BIN)/enginefoundry
	$(PYTEST) tests/e2e

# The docs site from docs/ (mkdocs.yml) into site/; --strict fails on a broken link or anchor. The reference pages
# in docs/reference/ and the spec's JSON Schema are generated first (scripts/gen_docs.py).
docs: $(BIN)/enginefoundry
	$(BIN)/python scripts/gen_docs.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: $(BIN)/enginefoundry
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy
	$(MYPY_ELSEWHERE)

plan: $(BIN)/enginefoundry
	$(BIN)/enginefoundry plan configs/llama-3-70b-tp2-a100.yaml
	$(BIN)/enginefoundry plan configs/llama-3.1-8b-multiarch.yaml

# A local cluster-mode stack on loopback: SeaweedFS, PostgreSQL (the database of the next two: a cluster in
# .stack/postgres; needs PostgreSQL's binaries, e.g. `apt-get install postgresql`), MLflow server, Prefect server,
# the test hub and a worker for the cpu pool. `source .stack/env` afterwards points the CLI and Prefect at it.
stack: $(BIN)/enginefoundry
	$(BIN)/python scripts/stack.py up --services s3,postgres,mlflow,prefect,hub --worker-pools cpu

# deployment.yaml on the stack's Prefect server: the work pools first (`prefect deploy` refuses a deployment
# whose pool does not exist), then every deployment. Runs on gpu-* pools wait for a worker of that pool.
STACK_DIR ?= .stack
# BEGIN generated by scripts/gen_targets.py from enginefoundry/catalog/gpu_targets.py: do not edit
POOLS := cpu gpu-sm80 gpu-sm86 gpu-sm89 gpu-sm90 gpu-sm100 gpu-sm120
# END generated
deploy: $(BIN)/enginefoundry
	. $(STACK_DIR)/env && for pool in $(POOLS); do \
	  $(BIN)/prefect --no-prompt work-pool inspect $$pool >/dev/null 2>&1 || \
	  $(BIN)/prefect --no-prompt work-pool create $$pool --type process >/dev/null; done
	. $(STACK_DIR)/env && PROJECT_DIR=$(CURDIR) $(BIN)/prefect --no-prompt deploy --prefect-file deployment.yaml --all

stack-down:
	test ! -x $(BIN)/python || $(BIN)/python scripts/stack.py down

stack-status:
	$(BIN)/python scripts/stack.py status

clean: stack-down
	rm -rf .enginefoundry .stack
