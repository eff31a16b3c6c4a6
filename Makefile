# ampgan: `make help` lists the targets.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export GLOG_v ?= 3

.DEFAULT_GOAL := help
.PHONY: help install browser services train test test-full bench bench-full bench-compare study ui clean lock cluster cluster-stop server server-stop

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

install: $(STAMP)  ## create .venv and install ampgan with pinned dependencies (quick when done)

$(STAMP): pyproject.toml requirements.lock
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c requirements.lock -e '.[dev]'
	@touch $@

browser: install  ## Debian's chromium for the browser test (apt, once; playwright comes from the lock)
	@test -x /usr/bin/chromium || command -v chromium >/dev/null || \
	{ test "$$(id -u)" = 0 && command -v apt-get >/dev/null && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } || \
	{ echo "make: install Debian's chromium (as root: apt-get install -y --no-install-recommends chromium), then run make again" >&2; exit 1; }

services: install  ## Debian's slurm-wlm, munge and postgresql for the cluster / server tests (apt, once)
	@$(PY) -m devtools.services install >/dev/null

cluster: services  ## start a single-node SLURM on this machine (outputs/services/cluster; prints SLURM_CONF)
	@$(PY) -m devtools.services cluster

cluster-stop: install  ## stop it (and its jobs)
	@$(PY) -m devtools.services cluster-stop

server: services  ## start PostgreSQL + mlflow server on 127.0.0.1 (SERVER_PORT=5001; outputs/services/server)
	@$(PY) -m devtools.services server --port $(or $(SERVER_PORT),5001)

server-stop: install  ## stop the mlflow server and PostgreSQL
	@$(PY) -m devtools.services server-stop

train: install  ## run the default experiment, logged to the embedded MLflow store (outputs/mlflow.db)
	$(PY) -m ampgan.train $(ARGS)

test: install browser services  ## the fast test suite
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not slow" --durations=15 $(ARGS)

test-full: install browser services  ## every test, the slow quality runs and sweeps included
	$(PY) -m pytest -q -n 2 --dist loadfile $(ARGS)

bench: install  ## benchmark ampgan against a bare MindSpore loop, the headline figures (outputs/bench/; resumes if stopped)
	$(PY) -m experiments.bench $(ARGS)

bench-full: install  ## every bench section, the long memory run and more rounds (resumes if stopped)
	$(PY) -m experiments.bench --full $(ARGS)

bench-compare: install  ## the last bench table beside the committed one (docs/bench/bench.json)
	$(PY) -m experiments.bench --compare $(ARGS)

STUDIES := wgan_amp collapse underflow classifier_nan clip_threshold lr_sensitivity
study: install  ## run a case study: make study NAME=wgan_amp (ARGS=--full: full length; experiments/README.md)
	@case " $(STUDIES) " in *" $(NAME) "*) ;; \
	  *) echo "make: NAME must be one of: $(STUDIES) (got '$(NAME)')" >&2; exit 2;; esac
	$(PY) -m experiments.$(NAME) $(ARGS)

PORT ?= 5000
ui: install  ## open the MLflow dashboard on 127.0.0.1 (PORT=5000) over outputs/mlflow.db
	$(PY) -m ampgan.tracking ui --port $(PORT)

lock:  ## re-pin requirements.lock from the current .venv
	$(PY) -m pip freeze --exclude-editable | grep -v '^ampgan' > requirements.lock

clean:  ## remove run outputs and MindSpore's scratch files (keeps .venv)
	rm -rf outputs rank_* rewritten_network kernel_meta *.ir .pytest_cache
