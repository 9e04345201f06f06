# The course in two commands: `make run` and `make test`. Each sets itself up on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The torch build to install first. The default is the CPU/CUDA wheel pip picks for this machine;
# override on a GPU host, e.g. `make TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu130" setup`.
TORCH_SPEC ?= torch==2.13.0
# TensorFlow's CUDA build where an NVIDIA driver is present (plain tensorflow would train on the CPU).
TF_EXTRA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo tf-gpu || echo tf)
EXTRAS ?= torch,$(TF_EXTRA),vertex,data,trace,tune,deepspeed,lab,wandb,dev
comma := ,
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
# The Jupyter kernel every notebook names (labkit.notebooks.KERNEL_NAME), registered in
# the environment itself so JupyterLab, papermill, nbval and `labkit run` all start it.
KERNEL_NAME := labkit
KERNEL_DISPLAY_NAME := Python (labkit)
KERNEL_SPEC := $(VENV)/share/jupyter/kernels/$(KERNEL_NAME)/kernel.json
PYTEST_FLAGS ?=
# papermill's per-cell timing metadata is output too: strip it with the outputs.
NBSTRIP_EXTRA_KEYS := metadata.papermill cell.metadata.papermill cell.metadata.execution
export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYTHONUNBUFFERED := 1
# The suite starts hundreds of Python processes (workers, kernels, replicas, CLI runs): each would
# recompile labkit and re-rewrite the test modules' asserts if bytecode caching were off.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup chromium run test check lab lint sync clean

setup: $(STAMP) $(KERNEL_SPEC) chromium

# Re-installed whenever pyproject.toml changes (the stamp is older than it).
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	@if git rev-parse --git-dir >/dev/null 2>&1; then \
		$(VENV)/bin/nbstripout --install --attributes .gitattributes >/dev/null 2>&1 && \
		git config filter.nbstripout.extrakeys "$(NBSTRIP_EXTRA_KEYS)" || true; fi
	@rm -f $(VENV)/.installed-*
	@touch $@
	@echo "labkit environment ready in $(VENV)"

$(KERNEL_SPEC): $(STAMP)
	$(PY) -m ipykernel install --sys-prefix --name $(KERNEL_NAME) --display-name "$(KERNEL_DISPLAY_NAME)" >/dev/null
	@echo "Jupyter kernel '$(KERNEL_DISPLAY_NAME)' registered in $(VENV)"

# Chromium for the browser tests (tests/browser), from the system package manager where this
# user may (root with apt-get); elsewhere one line says how, and those tests skip saying so.
chromium:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Chromium for the browser tests (apt-get install chromium)"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
			|| echo "Chromium could not be installed with apt-get: the browser tests will be skipped"; \
	else echo "Chromium not found: install it with your package manager (e.g. sudo apt-get install chromium) to run the browser tests; they are skipped without it"; fi

run: setup
	$(VENV)/bin/labkit course

# Two pytest-xdist workers: the notebooks (JupyterLab, then nbval) stay together on one of them,
# in order (see conftest.py); TEST_WORKERS=0 runs everything in this one process.
TEST_WORKERS ?= 2

test: setup
	$(PY) -m pytest tests notebooks --nbval-lax --nbval-cell-timeout=900 -n $(TEST_WORKERS) $(PYTEST_FLAGS)

# The fast tier for a change in progress: unit tests only, no multi-process, notebook or browser
# runs (those are marked slow), on the same TEST_WORKERS as `make test`; `make test` runs everything.
check: setup
	$(PY) -m pytest tests -m "not slow and not gpu and not cloud" -q -n $(TEST_WORKERS) $(PYTEST_FLAGS)

lab: setup
	$(VENV)/bin/jupyter lab notebooks

lint: setup
	$(VENV)/bin/ruff check labkit tests benchmarks notebooks/*.py

sync: setup
	$(VENV)/bin/jupytext --sync notebooks/[0-9]*.ipynb
	$(VENV)/bin/nbstripout --extra-keys "$(NBSTRIP_EXTRA_KEYS)" notebooks/[0-9]*.ipynb labkit/assets/*.ipynb

clean:
	rm -rf $(VENV) runs .pytest_cache
