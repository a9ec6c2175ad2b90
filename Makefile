# Two entry points: `make demo` (the main job on the embedded default) and `make test`.
# Each builds its own virtualenv on first use, so a fresh clone needs nothing else.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint typecheck clean

$(VENV)/.dev: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

demo: $(VENV)/.dev
	$(PY) examples/scripted_episode.py

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .

typecheck: $(VENV)/.dev
	$(VENV)/bin/mypy ncpbench agents auditors

test: lint typecheck
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info
