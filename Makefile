# Quick start: `make demo`, then `make test`. Both create .venv when missing.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
TORCH   ?= torch==2.13.0

.PHONY: demo test lint bench clean install

$(BIN)/python:
	$(PY) -m venv $(VENV)

# Install torch first, pinned, only when absent: a bare `torch` requirement may
# pull a multi-GB CUDA build, while the pin resolves to a local CPU wheel.
# The editable install also compiles the rANS kernel (setup.py), so a change to
# its C source reinstalls.
$(STAMP): pyproject.toml setup.py recurnorm/budget/_ransc.c | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/recurnorm demo --out demo-out --force

test: $(STAMP)
	$(BIN)/python -m pytest tests

lint: $(STAMP)
	$(BIN)/ruff check recurnorm tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/train_speed.py
	$(BIN)/python benchmarks/quant_error.py
	$(BIN)/python benchmarks/pack.py

clean:
	rm -rf $(VENV) demo-out .pytest_cache build recurnorm/budget/_ransc*.so
