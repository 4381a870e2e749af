#!/usr/bin/env bash
# Multi-node launch of trainer.train with torchrun, one invocation per node (8 GPUs each on p4d.24xlarge).
#   NNODES=4 NODE_RANK=<0..3> MASTER_ADDR=<node 0> trainer/launch/torchrun_multinode.sh --model 1.3B --pp 2 \
#       --global-batch 512 --data /fsx/pile --checkpoint-dir /fsx/ckpt/run1
# dp defaults to (NNODES * GPUS_PER_NODE) / pp; the global batch is the recipe and micro-batches follow from it.
# Before starting torchrun: the trainer's own validation of the resolved layout (python -m trainer.train
# --check-only), the CUDA torch pin and, on more than one node, the EFA plugin. DRY_RUN=1 prints the command.
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
torch_check
if (( NNODES > 1 )); then efa_check; fi
WORLD_SIZE=$(( NNODES * GPUS_PER_NODE )) python -m trainer.train --device cuda --check-only "$@"
exec "${CMD[@]}"
