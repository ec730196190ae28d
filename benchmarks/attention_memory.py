"""Peak memory and time of one update pass, transformers' `sdpa` against `pivot_sdpa` (adapters/attention.py).

One group (a prefix of `--prefix` tokens, G actions of `--action` tokens) through `groups_logprobs` with
gradients, then its backward, on a randomly initialised model of SmolLM2-135M's architecture (grouped
query heads: 9 query, 3 key/value), `--layers` deep, in `--dtype`. Each attention runs in a fresh
process, so each peak is its own (the CUDA allocator's peak on a GPU, resident-set growth on a CPU).
The ratio is pivot_sdpa / sdpa, in the same run.

What it shows: on CUDA in float32 a one-prefix pass hands SDPA grouped heads without a mask, which
only the math kernel takes (heads x P x P per layer kept for the backward); `pivot_sdpa` repeats the
heads so the memory-efficient kernel can. On a CUDA device the script also prints which kernels
torch admits for both calls. On a CPU nothing changes (its kernels take grouped heads): the ratio is
1 up to noise, which is what the CPU row records.

    python benchmarks/attention_memory.py                                  # CPU, 1k prefix, 6 layers
    python benchmarks/attention_memory.py --device cuda --prefix 8192 --layers 30
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

OUT = Path(__file__).resolve().parent / "out" / "attention_memory.json"
IMPLEMENTATIONS = ("sdpa", "pivot_sdpa")


def model_of(layers: int, device: str, dtype: str):
    """SmolLM2-135M's architecture, randomly initialised (speed and memory do not depend on the weights)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=16384, tie_word_embeddings=True,
    )  # fmt: skip
    return LlamaForCausalLM(config).to(device=device, dtype=getattr(torch, dtype)).train()


def kernels(device: str, dtype: str, prefix: int) -> dict[str, bool]:
    """Whether torch admits the memory-efficient kernel for the grouped call and for the repeated one (CUDA)."""
    import torch

    make = lambda heads: torch.zeros(1, heads, prefix, 64, device=device, dtype=getattr(torch, dtype))  # noqa: E731
    query, grouped, repeated = make(9), make(3), make(9)
    params = torch.backends.cuda.SDPAParams
    return {
        "grouped_efficient": torch.backends.cuda.can_use_efficient_attention(
            params(query, grouped, grouped, None, 0.0, True, True), True
        ),
        "repeated_efficient": torch.backends.cuda.can_use_efficient_attention(
            params(query, repeated, repeated, None, 0.0, True, False), True
        ),
    }


def one(args: argparse.Namespace) -> dict[str, object]:
    """The measured pass with `args.attention`, in this process."""
    import torch
    from peak_memory import PeakMemory

    from pivot_envs.adapters.attention import use_linear_memory_attention
    from pivot_envs.adapters.grpo.shared_prefix import groups_logprobs

    torch.set_num_threads(args.threads)
    model = model_of(args.layers, args.device, args.dtype)
    if args.attention == "pivot_sdpa":
        assert use_linear_memory_attention(model)
    generator = torch.Generator().manual_seed(1)
    draw = lambda n: torch.randint(0, 49152, (n,), generator=generator).tolist()  # noqa: E731
    groups = [(draw(args.prefix), [draw(args.action) for _ in range(args.group_size)])]
    row: dict[str, object] = {"attention": args.attention}
    try:
        with PeakMemory(args.device) as peak:
            start = time.perf_counter()
            logprobs, mask, _ = groups_logprobs(model, groups)
            (logprobs * mask).sum().backward()
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            row["seconds"] = time.perf_counter() - start
        row["peak_gb"] = peak.peak / 1e9
    except torch.OutOfMemoryError as error:
        row["error"] = f"out of memory: {str(error).splitlines()[0]}"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prefix", type=int, default=1024, help="prefix tokens P")
    parser.add_argument("--action", type=int, default=64, help="tokens per action")
    parser.add_argument("--group-size", type=int, default=8, help="G")
    parser.add_argument("--layers", type=int, default=6, help="decoder layers (SmolLM2-135M has 30)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (CPU)")
    parser.add_argument("--attention", choices=IMPLEMENTATIONS, help=argparse.SUPPRESS)  # one run, in-process
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    if args.attention:
        print(json.dumps(one(args)))
        return
    rows = []
    for name in IMPLEMENTATIONS:
        command = [sys.executable, __file__, *sys.argv[1:], "--attention", name]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode:
            sys.exit(f"{name}: exit {done.returncode}\n{done.stderr[-2000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    settings = {k: v for k, v in vars(args).items() if k != "attention"}
    result: dict[str, object] = {"settings": settings, "rows": rows}
    if args.device.startswith("cuda"):
        result["kernels"] = kernels(args.device, args.dtype, args.prefix)
    base, ours = rows
    if "peak_gb" in base and "peak_gb" in ours:
        result["peak_ratio"] = ours["peak_gb"] / base["peak_gb"]
        result["time_ratio"] = ours["seconds"] / base["seconds"]
    print(
        f"P={args.prefix} G={args.group_size} action={args.action} layers={args.layers} {args.dtype} on {args.device}"
    )
    print(f"{'attention':<12} {'seconds':>9} {'peak GB':>9}")
    for row in rows:
        if "error" in row:
            print(f"{row['attention']:<12} {row['error']}")
        else:
            print(f"{row['attention']:<12} {row['seconds']:>9.2f} {row['peak_gb']:>9.2f}")
    if "peak_ratio" in result:
        print(f"pivot_sdpa / sdpa: peak {result['peak_ratio']:.2f}x, time {result['time_ratio']:.2f}x")
    if "kernels" in result:
        print(f"memory-efficient kernel admitted: {result['kernels']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
