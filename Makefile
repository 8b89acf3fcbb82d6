# Quick start: `make demo`, then `make test`. Both create .venv when missing.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
TORCH   ?= torch==2.13.0
# pip index for torch alone, e.g. https://download.pytorch.org/whl/cpu: PyPI's
# Linux torch is the multi-GB CUDA build (CI passes this; empty = pip's default).
TORCH_INDEX ?=

.PHONY: demo test test-fast lint bench clean install

$(BIN)/python:
	$(PY) -m venv $(VENV)

# Install torch first, pinned, only when absent: a bare `torch` requirement may
# pull a multi-GB CUDA build, while the pin resolves to a local CPU wheel.
# The editable install also compiles the rANS kernel (setup.py), so a change to
# its C source reinstalls.
$(STAMP): pyproject.toml setup.py recurnorm/budget/_ransc.c | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/recurnorm demo --out demo-out --force

# The whole suite, after lint (CI's .ci/run calls this).
test: lint
	$(BIN)/python -m pytest tests

# The suite without the tests marked slow (processes, fuzzing, long training):
# the quick loop while editing. `make test` still runs everything.
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests -m "not slow"

LINT_PATHS := recurnorm tests benchmarks examples
# The code is ruff-formatted (`ruff format $(LINT_PATHS)` before committing); lint fails otherwise.
lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/actionlint
	$(BIN)/python tests/ci_doc_workflow.py > $(VENV)/ci-doc-workflow.yml
	$(BIN)/actionlint $(VENV)/ci-doc-workflow.yml

bench: $(STAMP)
	$(BIN)/python benchmarks/train_speed.py
	$(BIN)/python benchmarks/quant_error.py
	$(BIN)/python benchmarks/pack.py

clean:
	rm -rf $(VENV) demo-out .pytest_cache build recurnorm/budget/_ransc*.so
