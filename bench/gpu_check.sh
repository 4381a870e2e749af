#!/usr/bin/env bash
# One short prepared GPU check (written for a session with one H200; any CUDA GPU works):
# the 125M and 1.3B configs, bf16 autocast, torch.compile, ~60 s of training each on synthetic shards in the
# pileprep format (seq_len 2048, vocab 50304), then one table of tokens/s, TFLOP/s, MFU and peak memory.
# Goal on the H200: MFU >= 45% at 1.3B.   Usage: bash bench/gpu_check.sh   (PY=..., OUT=..., SECONDS_PER=60)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python}"
OUT="${OUT:-/tmp/gpu_check}"
SECONDS_PER="${SECONDS_PER:-60}"
export OMP_WAIT_POLICY=PASSIVE PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name(0))"

if [[ ! -f "$OUT/data/manifest.json" ]]; then
  echo "writing synthetic shards to $OUT/data"
  "$PY" -c "
from tests.trainer_fixtures import write_dataset
write_dataset('$OUT/data', seq_len=2048, vocab=50304, n_docs=3000, n_shards=8, min_len=200, max_len=4000)"
fi

# name  global_batch  microbatches (gradient accumulation)
CONFIGS=("125M 32 2" "1.3B 16 2")
for c in "${CONFIGS[@]}"; do
  read -r model gb mb <<<"$c"
  echo "=== $model: global batch $gb x 2048 tokens, $mb micro-batches, ${SECONDS_PER}s"
  rm -f "$OUT/$model.jsonl"
  timeout $((SECONDS_PER + 300)) "$PY" -m trainer.train --model "$model" --data "$OUT/data" --device cuda \
    --global-batch "$gb" --microbatches "$mb" --steps 100000 --warmup-steps 20 --lr 3e-4 \
    --max-seconds "$SECONDS_PER" --log-every 10 --compile --metrics-file "$OUT/$model.jsonl" \
    2>&1 | tail -n 4 || echo "$model run failed (exit $?)"
done

"$PY" - "$OUT" <<'PYEOF'
import json, os, sys
out = sys.argv[1]
print(f"\n{'model':>6} | {'tokens/s':>10} | {'TFLOP/s':>8} | {'MFU':>6} | {'peak mem GiB':>12} | {'loss':>6} | steps")
for model in ("125M", "1.3B"):
    path = os.path.join(out, f"{model}.jsonl")
    recs = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
    if len(recs) < 2:
        print(f"{model:>6} | no steady-state interval recorded"); continue
    steady = recs[1:]  # the first interval holds compilation
    tok = sum(r["tokens_per_s"] for r in steady) / len(steady)
    tfl = sum(r["tflops_per_device"] for r in steady) / len(steady)
    mfu = [r["mfu"] for r in steady if r["mfu"] is not None]
    mfu_s = f"{100 * sum(mfu) / len(mfu):5.1f}%" if mfu else "   n/a"
    print(f"{model:>6} | {tok:>10,.0f} | {tfl:>8.1f} | {mfu_s:>6} | {max(r['peak_memory_bytes'] for r in recs) / 2**30:>12.1f} "
          f"| {recs[-1]['loss']:>6.3f} | {recs[-1]['step']}")
PYEOF
