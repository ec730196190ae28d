"""SFT warm-up step time, three ways in the same run: full back-propagation (`detach_prefix=False`,
`grpo.groups_logprobs`, the baseline), the prompt without gradient (`detach_prefix=True`) with
every prompt run whole (`share_head=False`), and the default: the prompt without gradient with the
head the batch's prompts have in common run once (`share_head=True`).

Both run one optimizer step (loss, backward, AdamW) of `pivot_envs.adapters.sft` on the same
batches of real expert turns: bundled tool-use pivots encoded by the embedded SmolLM2 policy with
its prompt budget (the default run's ~1000-token prompts, ~60-token actions). Prints a table,
writes benchmarks/out/sft_warm_up.json and the ratio. Time only: on the CPU the resident-set
growth of the second mode hides under the first's, so memory is not reported.

    python benchmarks/sft_warm_up.py                     # CPU, batch 4, prompt budget 1024, 3 batches
    python benchmarks/sft_warm_up.py --device cuda --batches 5
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument(
        "--batches", type=int, default=3, help="distinct batches; each mode steps on all of them"
    )
    parser.add_argument("--max-prompt-tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2, help="repeats per batch; the best time counts")
    parser.add_argument("--out", default=str(Path(__file__).parent / "out" / "sft_warm_up.json"))
    args = parser.parse_args()

    import gymnasium as gym
    import torch

    from pivot_envs.adapters.sft import common_prefix_length, expert_examples, turn_logprobs
    from pivot_envs.policy import load_policy

    policy = load_policy("hf:smollm2", device=args.device, max_prompt_tokens=args.max_prompt_tokens)
    model = policy.model.float()
    env = gym.make("pivot/tool-use-v0")
    pivots = random.Random(0).sample(list(env.unwrapped.pivots), args.batch_size * args.batches)
    env.close()
    examples = expert_examples(policy, pivots)
    batches = [examples[i : i + args.batch_size] for i in range(0, len(examples), args.batch_size)]
    prompt = sum(len(p) for p, _ in examples) / len(examples)
    action = sum(len(a) for _, a in examples) / len(examples)

    optimizer = torch.optim.AdamW(
        model.parameters(), lr=0.0
    )  # lr 0: the weights stay, every step costs the same
    model.train()
    rows = {}
    modes = (
        ("full back-propagation", False, False),
        ("prompt without gradient", True, False),
        ("+ shared head (default)", True, True),
    )
    for name, detach, share in modes:
        seconds = 0.0
        for batch in batches:

            def step(batch=batch, detach=detach, share=share) -> None:
                logprobs, mask = turn_logprobs(model, batch, detach_prefix=detach, share_head=share)
                loss = -(logprobs * mask).sum() / mask.sum()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()

            seconds += min(timed(step, args.device) for _ in range(args.repeats))
        rows[name] = {"seconds_per_step": seconds / len(batches)}

    shared = sum(common_prefix_length([p[:-1] for p, _ in batch]) for batch in batches) / len(batches)
    baseline = rows["full back-propagation"]["seconds_per_step"]
    for row in rows.values():
        row["speedup"] = baseline / row["seconds_per_step"]
    ratio = rows["+ shared head (default)"]["speedup"]
    print(
        f"SmolLM2-135M on {args.device}, batch {args.batch_size}, {len(batches)} batches of bundled tool-use "
        f"expert turns: prompt {prompt:.0f} tokens, action {action:.0f} tokens, common head {shared:.0f} tokens (means)"
    )
    print(f"{'mode':<26} {'s/step':>8} {'vs full':>8}")
    for name, row in rows.items():
        print(f"{name:<26} {row['seconds_per_step']:>8.2f} {row['speedup']:>7.2f}x")
    print(f"the default is {ratio:.2f}x faster per step than full back-propagation")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "args": vars(args),
                "prompt_tokens": prompt,
                "action_tokens": action,
                "common_head_tokens": shared,
                "rows": rows,
                "speedup": ratio,
            },
            indent=2,
        )
    )


def timed(fn, device: str) -> float:
    """Wall time of one call (synchronised on a GPU)."""
    import torch

    started = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
