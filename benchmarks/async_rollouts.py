"""Samples per second of the GRPO trainer with synchronous rollouts (max_staleness 0) and sampled ahead (1).

Both runs train the same hf policy (a randomly initialised model of SmolLM2-135M's architecture,
`--layers` deep, with SmolLM2's tokenizer) on the bundled tool-use pivots (pivot/tool-use-v0),
with the same seeds and sizes. Rewards come from a toy verifier (the action holds the letter 'a')
so that groups are mixed and every step updates: a random model never calls the airline tools.
With s = 1 a thread samples the next batch (generation with a copy of the weights, the envs,
the behaviour logprobs) while the current batch updates; samples/s is (steps x B x G) over the
run's wall time, the run's set-up included.

On a CPU, generation and the update compete for the same cores: with 2 cores little is expected
(both halves are compute-bound, so overlapping them mostly interleaves them). The gain is for a
GPU, or a vLLM server in another process, where sampling and the update use different hardware.

    python benchmarks/async_rollouts.py                            # 4 steps, B 2, G 4, 4 new tokens, 2 layers
    python benchmarks/async_rollouts.py --steps 10 --layers 4 --device cuda
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out" / "async_rollouts.json"


class HasLetter:
    """The toy verifier: 1 when the action's text holds an 'a' (mixed groups for a random model)."""

    name = "has-letter"

    def verify(self, pivot, action, outcome=None):
        from pivot_envs.verifiers import Verdict

        text = str(action.get("content") if isinstance(action, dict) else action or "").lower()
        return Verdict(1.0 if "a" in text else 0.0, "has_letter" if "a" in text else "no_letter")


class Parity:
    """Another toy verifier: 1 when the CRC-32 of the action's text is even. Groups stay mixed at any length
    (64 random tokens nearly always hold an 'a', so has-letter groups would all score 1 and nothing update)."""

    name = "parity"

    def verify(self, pivot, action, outcome=None):
        import zlib

        from pivot_envs.verifiers import Verdict

        text = str(action.get("content") if isinstance(action, dict) else action or "")
        even = zlib.crc32(text.encode()) % 2 == 0
        return Verdict(1.0 if even else 0.0, "even" if even else "odd")


def policy(layers: int, device: str):
    """A random SmolLM2-135M-shaped model (`layers` deep) with SmolLM2's tokenizer, as an HFPolicy."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from pivot_envs.adapters import smollm2
    from pivot_envs.adapters.policies.hf import HFPolicy

    tokenizer = AutoTokenizer.from_pretrained(smollm2.checkpoint())
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=16384,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
    )
    return HFPolicy(LlamaForCausalLM(config).to(device).eval(), tokenizer, name="hf:random", device=device)


def run(staleness: int, args: argparse.Namespace, pivots: list, out: Path) -> dict:
    from pivot_envs.adapters.grpo import GRPOConfig, train

    config = GRPOConfig(
        steps=args.steps,
        batch_pivots=args.batch_pivots,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        learning_rate=1e-4,
        checkpoint_every=0,
        eval_every=0,
        num_envs=2,
        seed=1,
        max_staleness=staleness,
        out=str(out / f"s{staleness}"),
    )
    import resource

    import torch

    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    result = train(
        config,
        pivots,
        policy=policy(args.layers, args.device),
        env_id="pivot/tool-use-v0",
        verifier=Parity() if args.verifier == "parity" else HasLetter(),
    )
    seconds = time.perf_counter() - began
    # the accelerator's peak of this run; on a CPU the process's peak RSS (monotonic: one --staleness per process)
    peak = (
        torch.cuda.max_memory_allocated() / 2**20
        if args.device.startswith("cuda")
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    )
    history = result.history
    samples = args.steps * args.batch_pivots * args.group_size
    return {
        "max_staleness": staleness,
        "seconds": seconds,
        "samples_per_s": samples / seconds,
        "generate_s": sum(r["time_generate_s"] for r in history),
        "score_s": sum(r["time_score_s"] for r in history),
        "update_s": sum(r["time_update_s"] for r in history),
        "publish_wait_s": sum(r.get("time_publish_s", 0.0) for r in history),
        "groups_trained": sum(r["groups_trained"] for r in history),
        "peak_mib": peak,
        "staleness_mean": sum(r.get("staleness_mean", 0.0) for r in history) / len(history),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-pivots", type=int, default=2, help="B")
    parser.add_argument("--group-size", type=int, default=4, help="G")
    parser.add_argument("--max-new-tokens", type=int, default=4, help="short: mixed has-letter groups")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers of the random model")
    parser.add_argument("--pivots", type=int, default=8, help="the first N bundled tool-use pivots")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--staleness", type=int, nargs="+", default=[0, 1], help="the max_staleness values to run"
    )
    parser.add_argument(
        "--verifier", choices=("has-letter", "parity"), default="has-letter", help="the toy reward"
    )
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()

    import gymnasium as gym

    import pivot_envs

    gym.register_envs(pivot_envs)
    pivots = gym.make("pivot/tool-use-v0").unwrapped.pivots[: args.pivots]
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(staleness, args, pivots, Path(tmp)) for staleness in args.staleness]
    print(
        f"{'s':>2} {'seconds':>8} {'samples/s':>10} {'generate_s':>11} {'score_s':>8} {'update_s':>9} {'trained':>8} {'peak MiB':>9}"
    )
    for row in rows:
        print(
            f"{row['max_staleness']:>2} {row['seconds']:>8.2f} {row['samples_per_s']:>10.2f} "
            f"{row['generate_s']:>11.2f} {row['score_s']:>8.2f} {row['update_s']:>9.2f} {row['groups_trained']:>8} {row['peak_mib']:>9.0f}"
        )
    if len(rows) == 2:
        print(
            f"s={rows[1]['max_staleness']} / s={rows[0]['max_staleness']} samples/s: {rows[1]['samples_per_s'] / rows[0]['samples_per_s']:.2f}"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"settings": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
