#!/usr/bin/env bash
# The GPU figures of issue 39 in one short call on a lent device machine (one GPU, no network):
# async rollouts against the synchronous loop, and the GRPO update against trl.GRPOTrainer at the
# pivot shapes (prefix 1k-8k, action 64-256, G 8 and 16) with the pass layouts timed per shape. About 10 minutes
# (the 2026-11-28 figures came from this script's steps in two calls). At most 8 files come back: 8 are written.
#
# What it needs beside the repository, prepared here (the machine has torch but no network):
#   .dev/whl/    wheels: this project (pip wheel --no-deps .), gymnasium, farama-notifications,
#                simple-parsing, docstring-parser, transformers 5.24, trl, datasets 4.8, dill, multiprocess
#   .dev/cache/smollm2-135m-instruct/  SmolLM2's tokenizer and config only (no weights: the models
#                are randomly initialised at SmolLM2-135M's shape; speed does not depend on the weights)
# and is run as: run(command="bash benchmarks/gpu_figures.sh", carry=[".dev"]). Figures go to $OUT.
set -uo pipefail
OUT=${OUT:-benchmarks/out/gpu}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .dev/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PIVOT_ENVS_CACHE=$PWD/.dev/cache PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
log="$OUT/gpu.log"
{
  date -u
  nvidia-smi -L
  python3 -c "import torch, transformers, trl, datasets, pyarrow; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__, 'datasets', datasets.__version__, 'pyarrow', pyarrow.__version__)"
} 2>&1 | tee "$log"
step() {  # step SECONDS NAME ARGS...: one benchmark, bounded, its output appended to the log
  local seconds=$1 name=$2
  shift 2
  echo "== $name ($(date -u +%T))" | tee -a "$log"
  timeout "$seconds" "$@" 2>&1 | grep -v "it/s\]\|s/it\]" | tee -a "$log"
  echo "== $name: exit ${PIPESTATUS[0]}" | tee -a "$log"
}
# 0. The update's attention in float32: transformers' sdpa (grouped heads without a mask: the math kernel on CUDA)
#    against pivot_sdpa (heads repeated: the memory-efficient kernel), one 8k prefix, G 8, 30 layers. Its JSON
#    goes into the log (8 files come back, all taken).
step 120 attention python3 benchmarks/attention_memory.py --device cuda --prefix 8192 --layers 30 \
  --out /tmp/attention.json
cat /tmp/attention.json >> "$log" 2>/dev/null
# 1. Sampling ahead (max_staleness 1) against the synchronous loop: hf policy on the GPU, the full 30 layers,
#    the parity verifier (64 random tokens always hold an 'a': has-letter groups would all score 1 and
#    nothing would update); one process per value, so each peak is its own. On 2026-11-28 s = 1 ran out
#    of the H200's memory here while s = 0 fitted (benchmarks/RESULTS.md). The likely cause, read from
#    torch's dispatch rules and not yet measured: SDPA's math kernel in float32, which the trainer now avoids
#    (adapters/attention.py); step 0 measures it.
for s in 0 1; do
  step 90 "async-s$s" python3 benchmarks/async_rollouts.py --device cuda --steps 4 --layers 30 --batch-pivots 8 \
    --group-size 8 --max-new-tokens 64 --pivots 16 --verifier parity --staleness "$s" --out "$OUT/async_s$s.json"
done
# 2. The update against TRL at G 16, prefixes up to 8k (packed at the GPU default of 8192 tokens per pass).
step 200 g16 python3 benchmarks/grpo_throughput.py --random-init --device cuda --prefix 1024 4096 8192 \
  --action 64 256 --group-size 16 --batch-pivots 4 --repeats 3 --out "$OUT/g16.json"
# 3. G 8 at an 8k prefix (1k-4k were measured on 2026-11-27), all three layouts.
step 80 g8-8k python3 benchmarks/grpo_throughput.py --random-init --device cuda --prefix 8192 \
  --action 64 256 --group-size 8 --batch-pivots 4 --repeats 3 --out "$OUT/g8_8k.json"
# 4. Larger passes: the groups packed into passes of 32768 tokens (fewer launches, more memory), and 65536 at 8k.
step 100 tpp32k python3 benchmarks/grpo_throughput.py --random-init --device cuda --prefix 1024 2048 4096 8192 \
  --action 64 256 --group-size 8 --batch-pivots 4 --repeats 3 --tokens-per-pass 32768 --methods packed \
  --out "$OUT/tpp32k.json"
step 60 g16-tpp32k python3 benchmarks/grpo_throughput.py --random-init --device cuda --prefix 1024 4096 8192 \
  --action 64 256 --group-size 16 --batch-pivots 4 --repeats 3 --tokens-per-pass 32768 --methods packed \
  --out "$OUT/g16_tpp32k.json"
step 40 tpp64k python3 benchmarks/grpo_throughput.py --random-init --device cuda --prefix 8192 \
  --action 64 256 --group-size 8 --batch-pivots 4 --repeats 3 --tokens-per-pass 65536 --methods packed \
  --out "$OUT/g8_tpp64k.json"
date -u | tee -a "$log"
