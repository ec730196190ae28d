"""Shared-prefix generation against `num_return_sequences` expansion (n samples of one long prompt).

A pivot's prompt is a long prefix followed by n short sampled actions. `HFPolicy` prefills the
prefix once and shares its KV cache across the n samples; `model.generate(num_return_sequences=n)`
(the baseline) copies the prompt n times and prefills every copy. This measures, per prefix
length, the wall time and the peak memory of both (and of HFPolicy with sharing off, to separate
the sampling loop from the sharing), each generating exactly `--max-new-tokens` tokens.

    python benchmarks/shared_prefix_generation.py --device cpu --prefix-lengths 512 1024
    python benchmarks/shared_prefix_generation.py --device cuda --random-init

--random-init builds a randomly initialised model of SmolLM2-135M's shape (no weights needed);
prompts are random token ids either way. Memory is torch.cuda.max_memory_allocated on CUDA and
the peak resident-set growth during the call on CPU.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from grpo_throughput import SHAPES, load_model
from peak_memory import best_time_and_peak

OUT = Path(__file__).resolve().parent / "out" / "shared_prefix_generation.json"


def run_generate(model, prompt, n: int, new_tokens: int) -> None:
    import torch

    ids = torch.tensor([prompt], device=model.device)
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            num_return_sequences=n,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=0,
        )
    assert out.shape == (n, len(prompt) + new_tokens)


def run_policy(policy, prompt, n: int, new_tokens: int) -> None:
    from pivot_envs.policy import SamplingParams

    (group,) = policy.generate_ids(
        [prompt], n, SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=0)
    )
    assert all(len(c.token_ids) == new_tokens for c in group)


def main() -> None:
    from pivot_envs.adapters.grpo.config import GRPOConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--random-init", action="store_true", help="random weights of SmolLM2-135M's shape")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16, float16")
    parser.add_argument(
        "--n",
        type=int,
        default=GRPOConfig().group_size,
        help="samples per prompt (the trainer's group size G)",
    )
    parser.add_argument("--prefix-lengths", type=int, nargs="+", default=[512, 2048, 4096])
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="best time over this many runs")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    import torch

    from pivot_envs.adapters.policies.hf import HFPolicy

    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.random_init, "135m", args.device, getattr(torch, args.dtype)).eval()
    # Fixed-length actions for a like-for-like comparison: no stop token.
    shared = HFPolicy(model, None, device=args.device, name="shared", stop_token_ids=[])
    naive = HFPolicy(model, None, device=args.device, name="naive", share_prefix=False, stop_token_ids=[])
    generator = torch.Generator().manual_seed(0)
    rows = []
    for length in args.prefix_lengths:
        prompt = torch.randint(3, SHAPES["135m"]["vocab_size"], (length,), generator=generator).tolist()
        run_policy(shared, prompt[:64], args.n, 2)  # warm-up (kernels, allocator)
        base_t, base_m = best_time_and_peak(
            lambda prompt=prompt: run_generate(model, prompt, args.n, args.max_new_tokens),
            args.device,
            args.repeats,
        )
        naive_t, naive_m = best_time_and_peak(
            lambda prompt=prompt: run_policy(naive, prompt, args.n, args.max_new_tokens),
            args.device,
            args.repeats,
        )
        ours_t, ours_m = best_time_and_peak(
            lambda prompt=prompt: run_policy(shared, prompt, args.n, args.max_new_tokens),
            args.device,
            args.repeats,
        )
        rows.append(
            {
                "prefix_tokens": length,
                "n": args.n,
                "new_tokens": args.max_new_tokens,
                "generate_s": base_t,
                "generate_peak_mib": base_m / 2**20,
                "unshared_policy_s": naive_t,
                "unshared_policy_peak_mib": naive_m / 2**20,
                "shared_policy_s": ours_t,
                "shared_policy_peak_mib": ours_m / 2**20,
                "speedup_vs_generate": base_t / ours_t,
                "memory_ratio_vs_generate": ours_m / base_m if base_m else None,
            }
        )
        print(f"prefix {length}: done", flush=True)

    header = (
        f"{'prefix':>7} {'generate s':>11} {'MiB':>8} {'unshared s':>11} {'MiB':>8} "
        f"{'shared s':>9} {'MiB':>8} {'speedup':>8} {'mem ratio':>9}"
    )
    print(
        f"\nn={args.n}, {args.max_new_tokens} new tokens, device={args.device}, "
        f"{'random init' if args.random_init else 'SmolLM2-135M'}, {args.dtype}"
    )
    print(header)
    for r in rows:
        ratio = f"{r['memory_ratio_vs_generate']:.2f}" if r["memory_ratio_vs_generate"] is not None else "-"
        print(
            f"{r['prefix_tokens']:>7} {r['generate_s']:>11.3f} {r['generate_peak_mib']:>8.1f} "
            f"{r['unshared_policy_s']:>11.3f} {r['unshared_policy_peak_mib']:>8.1f} {r['shared_policy_s']:>9.3f} "
            f"{r['shared_policy_peak_mib']:>8.1f} {r['speedup_vs_generate']:>7.2f}x {ratio:>9}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    meta["torch"] = torch.__version__
    if args.device.startswith("cuda"):
        meta["gpu"] = torch.cuda.get_device_name()
    args.out.write_text(json.dumps({"config": meta, "rows": rows}, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
