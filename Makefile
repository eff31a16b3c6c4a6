# ampgan: `make help` lists the targets.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export GLOG_v ?= 3

.DEFAULT_GOAL := help
.PHONY: help install train test test-full bench ui clean lock

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

install: $(STAMP)  ## create .venv and install ampgan with pinned dependencies (quick when done)

$(STAMP): pyproject.toml requirements.lock
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c requirements.lock -e '.[dev]'
	@touch $@

train: install  ## run the default experiment, logged to the embedded MLflow store (outputs/mlflow.db)
	$(PY) -m ampgan.train $(ARGS)

test: install  ## the fast test suite
	$(PY) -m pytest -q -m "not slow" $(ARGS)

test-full: install  ## every test, the slow quality runs and sweeps included
	$(PY) -m pytest -q $(ARGS)

bench: install  ## benchmark ampgan against a bare MindSpore loop (outputs/bench/)
	$(PY) -m experiments.bench $(ARGS)

PORT ?= 5000
ui: install  ## open the MLflow dashboard on 127.0.0.1 (PORT=5000) over outputs/mlflow.db
	$(PY) -m ampgan.tracking ui --port $(PORT)

lock:  ## re-pin requirements.lock from the current .venv
	$(PY) -m pip freeze --exclude-editable | grep -v '^ampgan' > requirements.lock

clean:  ## remove run outputs and MindSpore's scratch files (keeps .venv)
	rm -rf outputs rank_* rewritten_network kernel_meta *.ir .pytest_cache
