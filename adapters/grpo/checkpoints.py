"""What a run leaves in its output directory, and how a resume reads it back.

`checkpoints/step-N/` (and `final/`): the weights (`save_pretrained`; the adapters alone with
LoRA), the tokenizer, and `trainer_state.pt` with the optimizer, every RNG state (python, numpy,
torch, the pivot sampler), the step and the run's config; `metrics.jsonl`: one record per step
(and TensorBoard when it is installed). A resumed run restores all of it and may change only
what `RESUME_MAY_CHANGE` names, so it continues as if it had not stopped.

`config` is the run's `GRPOConfig` (a dataclass; this module reads it with `asdict`).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pivot_envs.errors import PivotEnvsError


class RunDirectoryError(PivotEnvsError, ValueError):
    """An output directory that holds another run (a fresh run would mix with it), or a resume
    whose settings differ from those its checkpoint's run trained with."""


def save_checkpoint(
    path: Path,
    model: Any,
    tokenizer: Any,
    optimizer: Any,
    sampler: Any,
    step: int,
    config: Any,
    full: tuple[dict[str, Any], Any] | None = None,
) -> Path:
    """Weights (`save_pretrained`), tokenizer, optimizer, RNG states (python, numpy, torch, pivot sampler) and step.
    `full`: the weights and optimizer state to save instead of the model's and optimizer's own (a sharded
    model's, gathered by `fsdp.full_state`)."""
    import shutil

    import numpy as np
    import torch

    staging = path.with_name(path.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    if full is not None:
        model.save_pretrained(staging, state_dict=full[0])
    else:
        model.save_pretrained(staging)
    if tokenizer is not None:
        tokenizer.save_pretrained(staging)
    torch.save(
        {
            "step": step,
            "optimizer": full[1]
            if full is not None
            else optimizer.state_dict()
            if optimizer is not None
            else None,
            "python_rng": random.getstate(),
            "numpy_rng": np.random.get_state(),
            "torch_rng": torch.get_rng_state(),
            "sampler": sampler.bit_generator.state if sampler is not None else None,
            "config": asdict(config),
        },
        staging / "trainer_state.pt",
    )
    shutil.rmtree(path, ignore_errors=True)
    staging.rename(path)  # a killed save never leaves a half checkpoint behind
    return path


def refuse_earlier_run(out: Path, resuming: bool = False) -> None:
    """A fresh run must not start in an output holding another run's checkpoints or metrics: its
    checkpoints would sit beside the new ones (a later resume could pick the old run's latest)
    and its metrics would be overwritten. Raise naming what is there (`resuming`: a resume found
    no checkpoint to continue from)."""
    found = []
    if (checkpoint := latest_checkpoint(out)) is not None:
        found.append(f"checkpoint {checkpoint.name}")
    metrics = out / "metrics.jsonl"
    if metrics.is_file() and (steps := sum(1 for line in metrics.read_text().splitlines() if line.strip())):
        found.append(f"{steps} step{'s' * (steps != 1)} in metrics.jsonl")
    if found:
        advice = (
            " but no checkpoint to resume from: train"
            if resuming
            else ": continue it with --resume (resume=True) or train"
        )
        raise RunDirectoryError(
            f"{out} holds an earlier run ({', '.join(found)}){advice} into another --out; "
            "nothing there was changed"
        )


# What a resumed run may change: its length, bookkeeping and how the work is laid out, not the method.
RESUME_MAY_CHANGE = frozenset(
    {
        "policy",
        "steps",
        "checkpoint_every",
        "eval_every",
        "eval_pivots",
        "num_envs",
        "tokens_per_pass",
        "fsdp",
        "out",
        "resume",
    }
)


def check_resumable(checkpoint: Path, saved: dict[str, Any], config: Any) -> None:
    """Raise naming the differences when `config` changes what the checkpoint's run trained with
    (`saved`: its config; a resume continues a run as if it had not stopped, other hyperparameters
    make another run)."""
    differences = [
        f"{name}: {saved[name]!r} there, {value!r} now"
        for name, value in asdict(config).items()
        if name not in RESUME_MAY_CHANGE and name in saved and saved[name] != value
    ]
    if differences:
        raise RunDirectoryError(
            f"cannot resume {checkpoint} with other settings ({'; '.join(differences)}): resume with the run's "
            f"own, or start another run from its weights (--policy hf:{checkpoint} --out NEW)"
        )


def latest_checkpoint(out: Path) -> Path | None:
    """The checkpoint of the highest step under `out/checkpoints`, or None."""
    found = [p for p in (out / "checkpoints").glob("step-*") if (p / "trainer_state.pt").is_file()]
    return max(found, key=lambda p: int(p.name.split("-")[1]), default=None)


def load_checkpoint(path: Path, model: Any, optimizer: Any, sampler: Any, config: Any = None) -> int:
    """Restore weights, optimizer and RNG states saved by `save_checkpoint`; returns its step.
    With `config`, first check that it may resume the checkpoint's run (`check_resumable`)."""
    import numpy as np
    import torch

    state = torch.load(path / "trainer_state.pt", weights_only=False)
    if config is not None:
        check_resumable(path, state.get("config") or {}, config)
    from pivot_envs.adapters.grpo import fsdp

    if fsdp.sharded(model):  # the checkpoint holds the whole weights: every rank loads its shards of them
        fsdp.load_full_state(model, optimizer, fsdp.saved_weights(path, model), state["optimizer"])
    elif hasattr(model, "disable_adapter"):  # LoRA: the checkpoint holds the adapters only
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(model, load_file(str(path / "adapter_model.safetensors")))
    else:
        from transformers import AutoModelForCausalLM

        dtype = next(model.parameters()).dtype
        model.load_state_dict(AutoModelForCausalLM.from_pretrained(path, dtype=dtype).state_dict())
    if not fsdp.sharded(model):
        optimizer.load_state_dict(state["optimizer"])
    random.setstate(state["python_rng"])
    np.random.set_state(state["numpy_rng"])
    torch.set_rng_state(state["torch_rng"])
    sampler.bit_generator.state = state["sampler"]
    return int(state["step"])


class MetricsLog:
    """metrics.jsonl (one line per step; on resume the lines after the checkpoint are dropped, the
    others are `kept`) and TensorBoard when it is installed."""

    def __init__(self, out: Path, resume_step: int) -> None:
        self.path = out / "metrics.jsonl"
        lines = []
        if resume_step and self.path.is_file():
            lines = [
                line
                for line in self.path.read_text().splitlines()
                if line and json.loads(line)["step"] <= resume_step
            ]
        self.kept: list[dict[str, Any]] = [json.loads(line) for line in lines]
        self.path.write_text("".join(line + "\n" for line in lines))
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.board: Any = SummaryWriter(str(out / "tensorboard"))
        except ImportError:
            self.board = None

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.board is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "step":
                    self.board.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self.board is not None:
            self.board.close()
