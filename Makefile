# ddnb: `make lab` sets up and opens JupyterLab; `make test` sets up and runs everything.
# Set-up (scripts/setup.sh) is idempotent: a second run installs nothing.
PYTHON ?= python3
TORCH  ?= 2.13.0
VENV   ?= .venv
PY     := $(VENV)/bin/python
# nbval compares stored outputs; sanitize what varies (times, pids, ports, paths).
NBVAL  := --nbval --nbval-sanitize-with notebooks/sanitize.cfg --nbval-current-env
PYTEST_ARGS ?=
# extra arguments for JupyterLab, e.g. make lab LAB_ARGS="--no-browser --port 8890"
LAB_ARGS ?=
# JupyterLab refuses to run as root (containers, CI machines) unless told
ROOT_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: setup learn lab test test-unit test-notebooks test-learner test-gpu notebooks clean help

help:
	@echo "make lab    set up $(VENV) (torch $(TORCH), Horovod), copy the learner's edition into learn/, open JupyterLab there"
	@echo "make lab RESET=05  copy chapter 05 into learn/ again (your old copy is kept in learn/.reset/)"
	@echo "make test-learner  run every learner's copy (blank answers) top to bottom: none may fail"
	@echo "make test   set up, then run every test and every notebook (nbval)"
	@echo "make notebooks  re-run every notebook in place, storing its outputs (on a quiet machine only)"

setup:
	@PYTHON=$(PYTHON) VENV=$(VENV) TORCH=$(TORCH) bash scripts/setup.sh

# The learner's edition: notebooks/ with every answer cell (tagged `solution`) replaced by its
# stub and no outputs, copied once into learn/ (git-ignored): a learner's work is never
# overwritten; RESET=05 (or 05,09) copies those chapters again. The solved notebooks stay
# in notebooks/; ddnb.exercises.solution("05.1") prints one answer.
RESET ?=
learn: setup
	$(PY) -m ddnb.exercises --into learn $(if $(RESET),--reset $(RESET),)

lab: learn
	$(VENV)/bin/jupyter lab --notebook-dir=learn $(ROOT_ARGS) $(LAB_ARGS)

# Every learner's copy, built afresh, runs top to bottom without an error (checkers given a
# stub print "not attempted yet" and the notebook runs on). `make test` runs two chapters
# of it (tests/test_learner_edition.py); this runs all of them.
test-learner: setup
	rm -rf .learn-test && $(PY) -m ddnb.exercises --into .learn-test
	$(NB_ENV) $(PY) -m pytest .learn-test --nbval-lax -p no:cacheprovider $(PYTEST_ARGS)

# Two runs: the unit and multi-process tests' worlds (processes kept for the whole session)
# are gone before the notebooks start their own clusters.
# --durations: the slowest tests and notebooks, for keeping the whole run short.
# The notebooks run with ATEN_CPU_CAPABILITY=default (no SIMD kernels) against outputs stored
# from a native run (make notebooks): a compared output that depends on the CPU's
# floating-point kernels then fails on every machine, not only on a CPU of another kind.
# NB_ENV= runs them natively.
NB_ENV ?= ATEN_CPU_CAPABILITY=default
test: setup
	$(PY) -m pytest tests -p no:cacheprovider --durations=15 $(PYTEST_ARGS)
	$(NB_ENV) $(PY) -m pytest notebooks $(NBVAL) -p no:cacheprovider --durations=15 $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest tests $(PYTEST_ARGS)

test-notebooks: setup
	$(NB_ENV) $(PY) -m pytest notebooks $(NBVAL) -p no:cacheprovider $(PYTEST_ARGS)

# on a machine with CUDA: the tests marked gpu (skipped everywhere else)
test-gpu: setup
	PY=$(PY) bash scripts/gpu_check.sh $(PYTEST_ARGS)

# one at a time, each only on a quiet machine (it waits, then refuses; FORCE=1 overrides);
# NB=notebooks/05_allreduce.ipynb re-runs one
notebooks: setup
	$(PY) scripts/run_notebooks.py $(or $(NB),notebooks/*.ipynb) $(if $(FORCE),--force,)

clean:
	rm -rf $(VENV) .pytest_cache
