# Two entry points: `make demo` (the main job on the embedded default model) and `make test`.
# Each builds its own virtualenv on first use, so a fresh clone needs nothing else.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_ENV ?= iron-man
DEMO_TURNS ?= 3

.PHONY: demo demo-scripted test test-local test-extras test-reliability lint typecheck imports clean

$(VENV)/.dev: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

# The local extra compiles llama-cpp-python from source the first time (about 8 minutes on 2 cores).
# Built for a portable x86-64 baseline (AVX2/FMA/F16C), not -march=native: these machines advertise
# AMX and AVX-512 that a process may not be allowed to run (the server dies with an invalid opcode).
# No pip cache, so a wheel built with other flags is never reused.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF
$(VENV)/.local: $(VENV)/.dev
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install -q --no-cache-dir -e ".[dev,local]"
	touch $@

# Exit 4 (the episode ended as ERROR: the 135M model could not give valid stage output) still shows
# the machinery end to end and is said plainly; any other failure fails the demo.
demo: $(VENV)/.local
	$(VENV)/bin/ncpbench run $(DEMO_ENV) --turns $(DEMO_TURNS) \
	  --narrator local/smollm2-135m --narrator-max-tokens 160 \
	  --auditor local/smollm2-135m --player-mode scripted \
	  --out runs/demo-$(DEMO_ENV).json; code=$$?; \
	  if [ $$code -eq 4 ]; then echo "demo: the smoke-test model's episode ended as ERROR (see above); the run itself worked"; \
	  elif [ $$code -ne 0 ]; then exit $$code; fi

demo-scripted: $(VENV)/.dev
	$(PY) examples/scripted_episode.py

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .

typecheck: $(VENV)/.dev
	$(VENV)/bin/mypy ncpbench agents auditors

# The layering contracts of pyproject.toml ([tool.importlinter]). agents/ and auditors/ install under
# ncpbench/, so the check runs over a copy laid out as installed.
imports: $(VENV)/.dev
	@rm -rf build/imports && mkdir -p build/imports
	@cp -r ncpbench build/imports/ && cp -r agents build/imports/ncpbench/agents && cp -r auditors build/imports/ncpbench/auditors
	cd build/imports && $(CURDIR)/$(VENV)/bin/lint-imports $(CURDIR)/pyproject.toml

test: lint typecheck imports
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-reliability: $(VENV)/.dev
	$(PY) -m pytest -q tests/test_reliability_*.py $(PYTEST_ARGS)

# The optional integrations (inspect_ai, verifiers, Ray) with their own tests; each skips without its extra.
EXTRAS ?= inspect,verifiers,ray
$(VENV)/.extras: $(VENV)/.dev
	$(PY) -m pip install -q -e ".[dev,$(EXTRAS)]"
	touch $@

test-extras: $(VENV)/.extras
	$(PY) -m pytest -q tests/test_integrations_*.py tests/test_ray.py $(PYTEST_ARGS)

test-local: $(VENV)/.local
	$(PY) -m pytest -q -m local_model --run-local $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info
