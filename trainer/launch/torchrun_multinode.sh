#!/usr/bin/env bash
# Multi-node launch of trainer.train with torchrun, one invocation per node (8 GPUs each on p4d.24xlarge).
#   NNODES=4 NODE_RANK=<0..3> MASTER_ADDR=<node 0> trainer/launch/torchrun_multinode.sh --model 1.3B --pp 2 ...
# dp defaults to (NNODES * GPUS_PER_NODE) / pp. DRY_RUN=1 prints the command instead of running it.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
source "$HERE/efa_env.sh"
: "${NNODES:=1}" "${NODE_RANK:=0}" "${GPUS_PER_NODE:=8}" "${MASTER_ADDR:=127.0.0.1}" "${MASTER_PORT:=29500}"
: "${RDZV_ID:=pileprep-${SLURM_JOB_ID:-local}}"
CMD=(torchrun --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$GPUS_PER_NODE"
     --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "$RDZV_ID" --max-restarts 0
     -m trainer.train --device cuda "$@")
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  printf '%q ' "${CMD[@]}"; echo
  exit 0
fi
cd "$REPO"
exec "${CMD[@]}"
