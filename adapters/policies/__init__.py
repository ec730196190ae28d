"""Generation backends implementing `pivot_envs.policy.Policy`.

`hf` (transformers, CPU or CUDA), `openai` (any OpenAI-compatible HTTP server), `vllm` (the
offline engine). Each module exposes `from_spec(rest, **options)`, registered under the
entry-point group `pivot_envs.policies`, so `pivot_envs.policy.load_policy("hf:smollm2")` works.
Heavy dependencies are imported by the backend that uses them, not here.
"""
