# The README's two commands, `make demo` and `make test`, set up everything they need on a fresh
# machine. Every target is idempotent: environments are (re)built only when their lock file changes.

PYTHON ?= python3.11
VENV := .venv
ENGINE_VENV := .venv-engine
# A CUDA host gets the GPU build of vLLM; everywhere else the CPU build pinned in the lock file.
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)
ENGINE_LOCK := $(if $(HAS_GPU),requirements/engine-gpu.txt,requirements/engine-cpu.lock)

.PHONY: demo demo-short test faults bench-check unit lint venv engine-venv models prometheus clean-results

# Tonight's job: a handful of ~80k-token documents, each summarized whole on cpu-long, beside chat.
# DEMO_ARGS go to the demo (`make demo DEMO_ARGS="--results /tmp/night"`). `exec` makes the demo
# make's own child, and NIGHTSHIFT_STARTER_PID tells it make's pid: a make killed before the demo
# looked is noticed, and the demo stops (serving/replica_guard.py, `starter_pid`).
demo: venv engine-venv models
	exec env NIGHTSHIFT_STARTER_PID=$$PPID $(VENV)/bin/python -m flows.demo $(DEMO_ARGS)

# Sixteen short documents in map-reduce sections on cpu-small.
demo-short: venv engine-venv models
	exec env NIGHTSHIFT_STARTER_PID=$$PPID $(VENV)/bin/python -m flows.demo --short $(DEMO_ARGS)

test: venv engine-venv models prometheus
	$(VENV)/bin/python -m pytest -q --durations=30

# The fault suite alone (it also runs under `make test`): each case asserts its figure in
# docs/results.md, "Faults".
faults: venv engine-venv models
	$(VENV)/bin/python -m pytest -q -m faults tests/faults

# The Gate-vs-uncontrolled comparison on a real cpu-small replica; run it on a quiet host.
bench-check: venv engine-venv models
	$(VENV)/bin/python -m pytest -q -m benchmark tests/integration/test_gate_slo.py

unit: venv
	$(VENV)/bin/python -m pytest -q tests/unit

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

venv: $(VENV)/.installed
engine-venv: $(ENGINE_VENV)/.installed

$(VENV)/.installed: requirements/control.lock pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements/control.lock
	$(VENV)/bin/pip install -q --no-deps -e .
	touch $@

$(ENGINE_VENV)/.installed: $(ENGINE_LOCK) pyproject.toml
	test -x $(ENGINE_VENV)/bin/python || $(PYTHON) -m venv $(ENGINE_VENV)
	$(ENGINE_VENV)/bin/pip install -q --upgrade pip
	$(ENGINE_VENV)/bin/pip install -q -r $(ENGINE_LOCK)
	# PyPI's torchvision & co. break transformers' model imports beside the CPU torch build.
	$(if $(HAS_GPU),,$(ENGINE_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true)
	$(ENGINE_VENV)/bin/pip install -q --no-deps -e .
	touch $@

models: engine-venv
	$(ENGINE_VENV)/bin/python -m serving.local_models build tiny small long

# The Prometheus sensor's integration test starts a real server on loopback (Debian's package).
prometheus:
	command -v prometheus >/dev/null || (apt-get update && apt-get install -y --no-install-recommends prometheus)

clean-results:
	rm -rf results
