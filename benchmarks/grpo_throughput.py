"""GRPO update throughput at pivots: our shared-prefix update against trl.GRPOTrainer's per-sequence loss.

Both update the same model on the same pivot-shaped batches (B pivots, G actions each, a long
shared prefix and short actions), one group per forward/backward, token-level loss, AdamW step.
Ours runs the prefix once per group and shares its KV cache with gradients
(`pivot_envs.adapters.grpo.update`); TRL runs G full sequences (`GRPOTrainer.compute_loss`).
Prints a table, writes benchmarks/out/grpo_throughput.json, reports the ratio ours / TRL.

    python benchmarks/grpo_throughput.py                          # CPU, SmolLM2-135M, prefix 1024, action 64, G 8
    python benchmarks/grpo_throughput.py --device cuda --random-init --prefix 1024 4096 --action 64 256
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from peak_memory import best_time_and_peak

# SmolLM2's architectures, for --random-init (no weights needed): 135M (the embedded model) and 1.7B.
COMMON = dict(vocab_size=49152, max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True,
              bos_token_id=1, eos_token_id=2)
SHAPES = {
    "135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                 num_key_value_heads=3, rope_theta=100000.0, **COMMON),
    "1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                 num_key_value_heads=32, rope_theta=130000.0, **COMMON),
}


def load_model(random_init: bool, shape: str, device: str, dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if random_init:
        torch.manual_seed(0)
        return LlamaForCausalLM(LlamaConfig(**SHAPES[shape])).to(device=device, dtype=dtype).eval()
    if shape != "135m":
        raise SystemExit("only the 135M model is embedded: use --random-init for --shape 1.7b")
    from pivot_envs.adapters import smollm2

    return smollm2.load(device=device, dtype=dtype)[0]


def stub_tokenizer():
    """A tiny in-memory tokenizer: TRL's trainer wants one, the update never tokenizes (it gets ids)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "x": 2}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="x")),
                                        pad_token="<pad>", eos_token="<eos>")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return tokenizer


def make_batch(prefix: int, action: int, groups: int, group_size: int, vocab: int, seed: int):
    """B groups: a random prefix of `prefix` tokens, G actions of action/2..action tokens, advantages +-1."""
    import random

    rng = random.Random(seed)
    batch = []
    for _ in range(groups):
        ids = [rng.randrange(3, vocab) for _ in range(prefix)]
        actions = [[rng.randrange(3, vocab) for _ in range(rng.randint(action // 2, action))] for _ in range(group_size)]
        advantages = [1.0 if i % 2 == 0 else -1.0 for i in range(group_size)]
        batch.append((ids, actions, advantages))
    return batch


def ours(model, batch, device: str, repeats: int):
    import torch
    from pivot_envs.adapters.grpo import Group, GRPOConfig, update

    config = GRPOConfig(learning_rate=1e-7, max_grad_norm=0.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)

    def step():
        groups = [Group(f"p{i}", ids, actions, adv) for i, (ids, actions, adv) in enumerate(batch)]
        update(model, None, optimizer, groups, config)

    return measure(step, device, repeats)


def trl(model, batch, device: str, repeats: int, action: int):
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    group_size = len(batch[0][1])
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, per_device_train_batch_size=group_size, num_generations=group_size,
            max_completion_length=action, use_cpu=not device.startswith("cuda"), report_to="none", beta=0.0,
            loss_type="dapo", learning_rate=1e-7, bf16=next(model.parameters()).dtype == torch.bfloat16,
            gradient_checkpointing=False,  # TRL's default recomputes activations; ours does not, so neither does here
        )
        trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                              train_dataset=Dataset.from_list([{"prompt": "x"}]), processing_class=stub_tokenizer())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7)
    tokens = sum(len(a) for _, actions, _ in batch for a in actions)

    def inputs_of(ids, actions, advantages):
        width = max(len(a) for a in actions)
        completion = torch.zeros(len(actions), width, dtype=torch.long)
        mask = torch.zeros(len(actions), width, dtype=torch.long)
        for row, a in enumerate(actions):
            completion[row, : len(a)] = torch.tensor(a)
            mask[row, : len(a)] = 1
        prompt = torch.tensor([ids] * len(actions))
        return {
            "prompt_ids": prompt.to(device), "prompt_mask": torch.ones_like(prompt).to(device),
            "completion_ids": completion.to(device), "completion_mask": mask.to(device),
            "advantages": torch.tensor(advantages).to(device), "old_per_token_logps": None,
            "num_items_in_batch": torch.tensor(tokens, device=device),
        }

    prepared = [inputs_of(*group) for group in batch]
    trainer.current_gradient_accumulation_steps = len(prepared)

    def step():
        optimizer.zero_grad(set_to_none=True)
        for inputs in prepared:
            trainer.compute_loss(model, inputs).backward()
        optimizer.step()

    return measure(step, device, repeats)


def measure(step, device: str, repeats: int) -> dict[str, float]:
    step()  # warm-up: allocator, kernels, optimizer state
    seconds, peak = best_time_and_peak(step, device, repeats)
    return {"seconds": seconds, "peak_bytes": peak}


def attempt(method, *args):
    """The method's measurement, or None when it runs out of accelerator memory (reported as OOM)."""
    import torch

    try:
        return method(*args)
    except torch.OutOfMemoryError:
        args[0].zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        return None


def cell(value, spec: str) -> str:
    width = int(spec.split(".")[0])
    return format(value, spec) if value is not None else "OOM".rjust(width)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--random-init", action="store_true", help="random weights of SmolLM2's shape (no checkpoint)")
    parser.add_argument("--shape", default="135m", choices=sorted(SHAPES), help="SmolLM2 size (1.7b needs --random-init)")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="default: float32 on cpu, bfloat16 on cuda")
    parser.add_argument("--prefix", type=int, nargs="+", default=[1024], help="prefix lengths (tokens) to measure")
    parser.add_argument("--action", type=int, nargs="+", default=[64], help="longest action (tokens); actions are action/2..action")
    parser.add_argument("--group-size", type=int, default=8, help="G")
    parser.add_argument("--batch-pivots", type=int, default=1, help="B")
    parser.add_argument("--repeats", type=int, default=2, help="timed updates per method (best kept), after one warm-up")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "out" / "grpo_throughput.json"))
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))
    model = load_model(args.random_init, args.shape, args.device, dtype)
    rows = []
    header = f"{'prefix':>6} {'action':>6} {'B':>3} {'G':>3} {'ours s':>8} {'TRL s':>8} {'ours samp/s':>11} {'TRL samp/s':>10} {'ours tok/s':>10} {'TRL tok/s':>9} {'ours MiB':>8} {'TRL MiB':>8} {'speed-up':>8} {'mem ratio':>9}"
    print(f"model: SmolLM2-{args.shape} ({'random init' if args.random_init else 'embedded weights'}), {args.device}, {dtype}, "
          f"{torch.get_num_threads()} CPU threads")
    print(header)
    print("-" * len(header))
    for prefix in args.prefix:
        for action in args.action:
            batch = make_batch(prefix, action, args.batch_pivots, args.group_size, COMMON["vocab_size"], seed=prefix + action)
            samples = args.batch_pivots * args.group_size
            tokens = sum(len(a) for _, actions, _ in batch for a in actions)
            a = attempt(ours, model, batch, args.device, args.repeats)
            b = attempt(trl, model, batch, args.device, args.repeats, action)
            row = {"shape": args.shape, "prefix": prefix, "action": action, "batch_pivots": args.batch_pivots,
                   "group_size": args.group_size, "action_tokens": tokens}
            for name, result in (("ours", a), ("trl", b)):
                row[f"{name}_s"] = result["seconds"] if result else None
                row[f"{name}_samples_per_s"] = samples / result["seconds"] if result else None
                row[f"{name}_tokens_per_s"] = tokens / result["seconds"] if result else None
                row[f"{name}_peak_mib"] = result["peak_bytes"] / 2**20 if result else None
            row["speedup"] = b["seconds"] / a["seconds"] if a and b else None
            row["memory_ratio"] = b["peak_bytes"] / a["peak_bytes"] if a and b and a["peak_bytes"] > 0 else None
            rows.append(row)
            print(f"{prefix:>6} {action:>6} {args.batch_pivots:>3} {args.group_size:>3} {cell(row['ours_s'], '8.2f')} "
                  f"{cell(row['trl_s'], '8.2f')} {cell(row['ours_samples_per_s'], '11.2f')} {cell(row['trl_samples_per_s'], '10.2f')} "
                  f"{cell(row['ours_tokens_per_s'], '10.1f')} {cell(row['trl_tokens_per_s'], '9.1f')} "
                  f"{cell(row['ours_peak_mib'], '8.0f')} {cell(row['trl_peak_mib'], '8.0f')} "
                  f"{cell(row['speedup'], '7.2f')}x {cell(row['memory_ratio'], '8.2f')}x", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": args.device, "dtype": str(dtype), "random_init": args.random_init, "shape": args.shape,
                                          "threads": torch.get_num_threads(), "rows": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
