"""Data-parallel training under torchrun: each rank takes its share of a step's groups, gradients are summed.

    torchrun --nproc-per-node 2 -m pivot_envs.adapters.grpo --pivots pivots.jsonl --steps 100 --out runs/grpo

`python -m pivot_envs.adapters.grpo` runs `pivotrl train` (the same flags) after joining the
process group torchrun describes in its environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT): gloo on a CPU, nccl with one GPU per rank (`LOCAL_RANK` picks it). Without torchrun
it is one process, as `pivotrl train`.

What `train` (grpo.trainer) does with a `Ranks`:
- every rank draws the same B pivots (the pivot sampler has the same seed everywhere) and takes a
  contiguous share of them (`share`): B/N groups, the same groups in all as one process takes;
  each samples and scores its own share with its own policy and envs (per-pivot seeds, so a
  pivot's samples do not depend on which rank drew it);
- the loss of every rank is divided by the units (tokens or actions) counted over all ranks
  (`total`), and the gradients are summed over the ranks (`all_reduce_gradients`) before clipping,
  so N ranks x B/N groups make the step one process makes with B groups;
- rank 0 alone evaluates, writes metrics.jsonl, logs and saves checkpoints; every rank resumes
  from the checkpoint.

The gradients are all-reduced by hand, not by DDP: a rank runs as many passes as its groups need
(one prefix and one action forward each, grpo.shared_prefix), a number DDP's per-backward
reduction would need to be equal on every rank. A model too large for one device is sharded
with FSDP2 instead (`--fsdp`, grpo.fsdp: the passes are then lined up); see docs/training.md.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pivot_envs.errors import PivotEnvsError

# Gradients are summed in flat buckets of at most this many elements (256 MB in float32): few
# collective calls, and a bounded copy beside the gradients.
BUCKET_ELEMENTS = 1 << 26


class DistributedSetupError(PivotEnvsError, RuntimeError):
    """The process group torchrun described cannot serve this run (too few pivots, a missing device)."""


@dataclass(frozen=True)
class Ranks:
    """This process's place among the data-parallel ranks: `rank` of `world_size`, tensors for
    collectives on `device`. One process is `Ranks()`: every method is then the identity."""

    rank: int = 0
    world_size: int = 1
    device: str = "cpu"

    @property
    def main(self) -> bool:
        """Whether this is rank 0, the one that evaluates, logs and writes."""
        return self.rank == 0

    def share(self, count: int) -> range:
        """This rank's contiguous share of `count` items (the step's pivots): ranks take sizes differing by one at most."""
        return range(count * self.rank // self.world_size, count * (self.rank + 1) // self.world_size)

    def total(self, *values: float) -> list[Any]:
        """Each value summed over the ranks, in its own type (an int stays an int)."""
        if self.world_size == 1:
            return list(values)
        import torch
        import torch.distributed as dist

        summed = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        dist.all_reduce(summed)
        return [type(v)(s) for v, s in zip(values, summed.tolist())]

    def gather(self, items: Sequence[Any]) -> list[Any]:
        """Every rank's `items` (picklable), concatenated in rank order: with contiguous shares, the batch's order."""
        if self.world_size == 1:
            return list(items)
        import torch.distributed as dist

        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, list(items))
        return [item for part in parts for item in part]

    def all_reduce_gradients(self, params: Iterable[Any]) -> None:
        """Sum the gradients of `params` over the ranks, in place (a rank without groups this step adds zeros)."""
        if self.world_size == 1:
            return
        import torch
        import torch.distributed as dist

        grads = []
        for param in params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            grads.append(param.grad)
        for bucket in _buckets(grads, BUCKET_ELEMENTS):
            flat = torch.cat([grad.reshape(-1) for grad in bucket])
            dist.all_reduce(flat)
            offset = 0
            for grad in bucket:
                grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
                offset += grad.numel()

    def broadcast_parameters(self, model: Any) -> None:
        """Give every rank rank 0's weights (as DDP does at its start): ranks that loaded or initialised
        differently train one model."""
        if self.world_size == 1:
            return
        import torch
        import torch.distributed as dist

        with torch.no_grad():
            for tensor in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(tensor.data, src=0)

    def barrier(self) -> None:
        """Wait for every rank (rank 0's writes are then done before another rank reads)."""
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()


def check_split(ranks: Ranks, pivots_per_step: int, reprofiling: bool) -> None:
    """Raise DistributedSetupError when a run cannot be split over `ranks`: online re-profiling (every
    rank would have to agree on the re-profiled pivots), or fewer pivots per step than ranks."""
    if reprofiling and ranks.world_size > 1:
        raise DistributedSetupError(
            "reprofile_every: online re-profiling runs in one process only (every rank "
            "would have to agree on the re-profiled pivots); set it to 0 under torchrun"
        )
    if pivots_per_step < ranks.world_size:
        raise DistributedSetupError(
            f"{pivots_per_step} pivots per step for {ranks.world_size} "
            "ranks: every rank needs one at least (raise --batch-pivots or start fewer ranks)"
        )


def _buckets(tensors: Sequence[Any], limit: int) -> list[list[Any]]:
    """`tensors` in order, grouped while a group holds at most `limit` elements (a larger tensor goes alone)."""
    buckets: list[list[Any]] = []
    size = 0
    for tensor in tensors:
        if buckets and size + tensor.numel() <= limit:
            buckets[-1].append(tensor)
            size += tensor.numel()
        else:
            buckets.append([tensor])
            size = tensor.numel()
    return buckets


def setup() -> Ranks:
    """Join the process group torchrun's environment describes (once; later calls return the same `Ranks`).

    Without torchrun (no WORLD_SIZE, or 1) it is one process: `Ranks()`. With a GPU the backend is
    nccl and this rank's device is `cuda:LOCAL_RANK` (made the current device, so a policy loaded on
    "cuda" afterwards lands on it); without one, gloo on the CPU. A process group made before (by
    accelerate, or a caller of `train`) is used as it is.
    """
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return _ranks_of_group()
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Ranks()
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if local_rank >= torch.cuda.device_count():
            raise DistributedSetupError(
                f"rank with LOCAL_RANK {local_rank} has no GPU: this node has {torch.cuda.device_count()}; "
                "start at most that many processes per node (--nproc-per-node)"
            )
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    return _ranks_of_group()


def _ranks_of_group() -> Ranks:
    import torch
    import torch.distributed as dist

    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    return Ranks(dist.get_rank(), dist.get_world_size(), device)


def main(argv: Sequence[str] | None = None) -> int:
    """`pivotrl train ARGV` as one rank of a torchrun job (`python -m pivot_envs.adapters.grpo`); returns its exit status.

    Ranks other than 0 run quietly (warnings only, nothing on stdout): rank 0 reports for the job.
    """
    from pivot_envs.cli import main as pivotrl

    ranks = setup()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if ranks.main:
            return pivotrl(["train", *argv])
        with contextlib.redirect_stdout(io.StringIO()):
            return pivotrl(["-q", "train", *argv])
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
