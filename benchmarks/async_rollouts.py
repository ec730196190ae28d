"""Samples per second of the GRPO trainer with synchronous rollouts (max_staleness 0) and sampled ahead (1).

Both runs train the same policy on the bundled tool-use pivots (pivot/tool-use-v0), with the same
seeds and sizes. By default (`--policy random`) an hf policy: a randomly initialised model of
SmolLM2-135M's architecture, `--layers` deep, with SmolLM2's tokenizer, generating in this process.
`--policy SPEC` takes any policy spec instead; `--policy vllm-server:smollm2` samples on a real
`vllm serve` in another process (started once with the test fixture's CPU settings: --max-model-len,
one unbound OpenMP thread; reused by every run and stopped at the end), and the trainer updates
`policy.trainable_model()` on `--device`, syncing each new version to the server over HTTP; each run
first loads the checkpoint's weights back into the server, so every run starts from the same policy.
An hf:... spec, trained in place, is loaded afresh for each run.

Rewards come from a toy verifier (`--verifier has-letter`: the action holds the letter 'a';
`parity`: its CRC-32 is even) so that groups are mixed and every step updates: the models never call
the airline tools. With s = 1 a thread samples the next batch (generation, the envs, the behaviour
logprobs from a copy of the weights) while the current batch updates; samples/s is (steps x B x G)
over the run's wall time, the run's set-up included (not the server's start). The peak memory is
this process's (the trainer's; a vllm-server's engine is not in it), or the accelerator's.

On a CPU, generation and the update compete for the same cores: with 2 cores little is expected
(both halves are compute-bound, so overlapping them mostly interleaves them), even with the server
in another process. The gain is for a GPU, or a server on other hardware, where sampling and the
update run on different devices.

    python benchmarks/async_rollouts.py                            # 4 steps, B 2, G 4, 4 new tokens, 2 layers
    python benchmarks/async_rollouts.py --steps 10 --layers 4 --device cuda
    python benchmarks/async_rollouts.py --policy vllm-server:smollm2 --steps 3 --batch-pivots 2 \
        --group-size 4 --max-new-tokens 8 --verifier parity     # SmolLM2-135M served by vllm serve, CPU
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from toys import HasLetterVerifier, ParityVerifier, cpu_server_options  # noqa: E402  (shared with the tests)

OUT = Path(__file__).resolve().parent / "out" / "async_rollouts.json"
SERVER = "vllm-server:"


def random_policy(layers: int, device: str):
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


def load(args: argparse.Namespace):
    """The policy every run shares (one that takes weights: vllm, vllm-server), else None (built per run)."""
    if args.policy == "random" or args.policy.startswith("hf:"):  # trained in place: one per run
        return None
    from pivot_envs.policy import load_policy

    # the test fixture's settings for a shared CPU, with longer to start
    options = (
        cpu_server_options(start_timeout=900, max_model_len=args.max_model_len)
        if args.policy.startswith(SERVER)
        else {}
    )
    return load_policy(args.policy, **options)


def fresh(args: argparse.Namespace, shared):
    """A run's (policy, model to train): the shared policy reset to its checkpoint's weights, else a new one."""
    if shared is None:
        if args.policy == "random":
            return random_policy(args.layers, args.device), None
        from pivot_envs.policy import load_policy

        return load_policy(args.policy, device=args.device), None
    model = shared.trainable_model().to(args.device)
    shared.update_weights(model.state_dict())  # the run before this one left its trained weights there
    return shared, model


def run(staleness: int, args: argparse.Namespace, pivots: list, out: Path, shared=None) -> dict:
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

    trained_policy, model = fresh(args, shared)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    result = train(
        config,
        pivots,
        policy=trained_policy,
        model=model,
        env_id="pivot/tool-use-v0",
        verifier=ParityVerifier() if args.verifier == "parity" else HasLetterVerifier(),
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
    parser.add_argument("--device", default="cpu", help="where the trainer's model runs")
    parser.add_argument(
        "--policy",
        default="random",
        help="random (a random hf model, --layers deep) or a policy spec, e.g. vllm-server:smollm2",
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=2048,
        help="a started vLLM server's context (longer prompts are fitted to it)",
    )
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
    shared = load(args)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows = [run(staleness, args, pivots, Path(tmp), shared) for staleness in args.staleness]
    finally:
        if shared is not None and hasattr(shared, "close"):
            shared.close()  # stops a server started here
    print(
        f"policy {args.policy}, {args.steps} steps, B {args.batch_pivots}, G {args.group_size}, device {args.device}"
    )
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
