"""Held-out evaluation with batches of similar prompt length against batches in the pivots' order.

`evaluate.generate_all` (behind `pivotrl eval`, the trainer's held-out evaluation and `pivotrl
reproduce`) takes the pivots longest prompt first, so each batch of 8 holds prompts of similar
length; the baseline takes them in their given order (trajectory by trajectory, short early turns
beside long late ones), as it did before. A batch is left-padded to its longest prompt, so the
baseline prefills padding. Both generate one greedy action per pivot with the same policy on the
same pivots, in the same run, alternating; the table gives each one's wall time and CPU time, the
prefilled token rows (padding included, each batch's shared head counted once) per token of
the prompts, and how many greedy actions and functional rewards differ between the two.

The pivots are `pivotrl reproduce --scale cpu --compared-pivots 0`'s held-out search set (155
pivots, split by trajectory), the policy the embedded SmolLM2-135M (the scale's prompt budget and
48 new tokens).

    python benchmarks/eval_batching.py                # all 155 pivots, 1 round
    python benchmarks/eval_batching.py --pivots 64 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out" / "eval_batching.json"


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def in_given_order(policy, pivots, sampling, batch_size):
    """The baseline: batches in the pivots' order (what generate_all did before)."""
    out = []
    for start in range(0, len(pivots), batch_size):
        out.extend(policy.generate([p.observation for p in pivots[start : start + batch_size]], 1, sampling))
    return out


def prefilled_rows(policy, prompts, batches):
    """Token rows the prefill computes over `batches` (lists of prompt indices): per batch, each
    shared head once plus every row padded to its part's longest tail (as HFPolicy._prefill does)."""
    total = 0
    for rows in batches:
        batch = [prompts[row] for row in rows]
        for head, members in policy._head_groups(batch):
            total += head + len(members) * max(len(batch[m]) - head for m in members)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pivots", type=int, default=0, help="the first N held-out pivots (0: all)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of (given order, by length)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()

    from pivot_envs.adapters.reproduce import measure
    from pivot_envs.adapters.reproduce.experiments import split
    from pivot_envs.adapters.reproduce.scales import get_scale
    from pivot_envs.evaluate import generate_all, length_batches
    from pivot_envs.policy import SamplingParams
    from pivot_envs.scoring import EnvPool, resolve_env

    scale = get_scale("cpu", compared_pivots=0)
    pivots = split(scale).compared["search"]
    pivots = pivots[: args.pivots] if args.pivots > 0 else pivots
    policy = measure.load_policy(scale.policy, scale.device, scale.max_prompt_tokens)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=scale.train.max_new_tokens, seed=0)
    prompts = [policy.encode(p.observation) for p in pivots]
    given = [
        list(range(s, min(s + args.batch_size, len(pivots)))) for s in range(0, len(pivots), args.batch_size)
    ]
    by_length = length_batches(pivots, args.batch_size)

    modes = {
        "given order (baseline)": lambda: in_given_order(policy, pivots, sampling, args.batch_size),
        "by length (generate_all)": lambda: generate_all(policy, pivots, 1, sampling, args.batch_size),
    }
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
    actions: dict[str, list[str]] = {}
    for _ in range(args.rounds):
        for name, run in modes.items():
            wall, cpu = time.perf_counter(), cpu_seconds()
            groups = run()
            times[name].append((time.perf_counter() - wall, cpu_seconds() - cpu))
            actions[name] = [group[0].text for group in groups]
    rewards = {}
    with EnvPool(resolve_env(None, list(pivots)), 2) as pool:
        for name, texts in actions.items():
            scores = pool.score([(p.id, text) for p, text in zip(pivots, texts)])
            rewards[name] = [s.reward if s.valid else None for s in scores]
    base, new = list(modes)
    useful = sum(len(p) for p in prompts)
    rows = {
        base: prefilled_rows(policy, prompts, given),
        new: prefilled_rows(policy, prompts, by_length),
    }
    result = {
        "pivots": len(pivots),
        "batch_size": args.batch_size,
        "rounds": args.rounds,
        "prompt_tokens": useful,
        "load_average": os.getloadavg()[0],
        "modes": {
            name: {
                "wall_s": min(w for w, _ in times[name]),
                "cpu_s": min(c for _, c in times[name]),
                "prefilled_rows": rows[name],
                "accuracy": sum(r or 0.0 for r in rewards[name]) / len(pivots),
            }
            for name in modes
        },
        "wall_ratio": min(w for w, _ in times[base]) / min(w for w, _ in times[new]),
        "cpu_ratio": min(c for _, c in times[base]) / min(c for _, c in times[new]),
        "actions_differing": sum(a != b for a, b in zip(actions[base], actions[new])),
        "rewards_differing": sum(a != b for a, b in zip(rewards[base], rewards[new])),
    }
    print(
        f"{len(pivots)} held-out search pivots, {useful} prompt tokens, batches of {args.batch_size}, "
        f"best of {args.rounds} round(s), load {result['load_average']:.1f}"
    )
    print("| mode | wall s | CPU s | prefilled rows | rows per prompt token | accuracy |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, m in result["modes"].items():
        print(
            f"| {name} | {m['wall_s']:.1f} | {m['cpu_s']:.1f} | {m['prefilled_rows']} | "
            f"{m['prefilled_rows'] / useful:.2f} | {m['accuracy']:.1%} |"
        )
    print(
        f"speed-up: wall {result['wall_ratio']:.2f}x, CPU {result['cpu_ratio']:.2f}x; greedy actions that differ: "
        f"{result['actions_differing']} of {len(pivots)}, rewards that differ: {result['rewards_differing']}"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
