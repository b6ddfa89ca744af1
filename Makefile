# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export OMP_NUM_THREADS ?= 1

.PHONY: demo test lint plan stack stack-down stack-status deploy clean

$(BIN)/enginefoundry: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	# torch 2.13.0 CPU: pip takes the local wheel where one lies on disk (uv would download CUDA builds).
	$(BIN)/pip install -q -e '.[reference,bench,test]'
	touch $@

demo: $(BIN)/enginefoundry
	$(BIN)/enginefoundry run configs/tiny-cpu.yaml

test: $(BIN)/enginefoundry
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/pytest -p no:dash

lint: $(BIN)/enginefoundry
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache

plan: $(BIN)/enginefoundry
	$(BIN)/enginefoundry plan configs/llama-3-70b-tp2-a100.yaml
	$(BIN)/enginefoundry plan configs/llama-3.1-8b-multiarch.yaml

# A local cluster-mode stack on loopback: SeaweedFS, MLflow server, Prefect server, the test hub and a
# worker for the cpu pool. `source .stack/env` afterwards points the CLI and Prefect at it.
stack: $(BIN)/enginefoundry
	$(BIN)/python scripts/stack.py up --services s3,mlflow,prefect,hub --worker-pools cpu

# deployment.yaml on the stack's Prefect server: the work pools first (`prefect deploy` refuses a deployment
# whose pool does not exist), then every deployment. Runs on gpu-* pools wait for a worker of that pool.
STACK_DIR ?= .stack
POOLS := cpu gpu-sm80 gpu-sm89 gpu-sm90 gpu-sm100
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
