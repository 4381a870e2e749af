# NCCL / EFA settings for p4d.24xlarge (8x A100 40GB, 4x100 Gbps EFA, GPUDirect RDMA). Sourced by the launchers.
export FI_PROVIDER=efa                 # libfabric's EFA provider (aws-ofi-nccl plugin)
export FI_EFA_USE_DEVICE_RDMA=1        # GPUDirect RDMA over EFA (p4d supports it)
export FI_EFA_FORK_SAFE=1              # data loader forks must not corrupt registered memory
export FI_EFA_SET_CUDA_SYNC_MEMOPS=0   # aws-ofi-nccl syncs itself; the libfabric default costs every transfer
export NCCL_SOCKET_IFNAME=^lo,docker   # bootstrap over the real NIC
export NCCL_BUFFSIZE=8388608
export NCCL_P2P_NET_CHUNKSIZE=524288
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1   # a hung collective aborts instead of waiting forever
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}  # 96 vCPUs / 8 ranks, leaving some for the data loader
export OMP_WAIT_POLICY=PASSIVE

# Without the aws-ofi-nccl plugin NCCL silently falls back to TCP sockets (~10x slower all-reduce on p4d):
# find libnccl-net*.so where NCCL's dlopen looks (LD_LIBRARY_PATH) or where AWS images install it.
efa_check() {
  local d
  for d in ${LD_LIBRARY_PATH//:/ } /opt/amazon/ofi-nccl/lib /opt/amazon/ofi-nccl/lib64 /opt/aws-ofi-nccl/lib \
           /usr/local/lib; do
    if compgen -G "$d/libnccl-net*.so" >/dev/null; then
      case ":${LD_LIBRARY_PATH:-}:" in *":$d:"*) ;; *) export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}";; esac
      return 0
    fi
  done
  echo "error: aws-ofi-nccl (libnccl-net*.so) not found in LD_LIBRARY_PATH or /opt/amazon/ofi-nccl/lib: NCCL would fall back to TCP; install it (AWS EFA installer / DLAMI) or set NNODES=1" >&2
  return 1
}

# The GPU build of the pinned torch (requirements-gpu.txt), checked before any node starts work.
torch_check() {
  local want
  want=$(sed -n 's/^torch==//p' "$(dirname "${BASH_SOURCE[0]}")/requirements-gpu.txt")
  python - "$want" <<'PY' || return 1
import sys
try:
    import torch
except ImportError:
    sys.exit(f"error: torch is not installed: pip install -r trainer/launch/requirements-gpu.txt")
if not torch.__version__.startswith(sys.argv[1]) or not torch.version.cuda:
    sys.exit(f"error: torch {torch.__version__} (cuda {torch.version.cuda}); this trainer needs the CUDA build of "
             f"torch {sys.argv[1]}: pip install -r trainer/launch/requirements-gpu.txt")
PY
}
