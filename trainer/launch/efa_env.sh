# NCCL / EFA settings for p4d.24xlarge (8x A100 40GB, 4x100 Gbps EFA, GPUDirect RDMA). Sourced by the launchers.
export FI_PROVIDER=efa                 # libfabric's EFA provider (aws-ofi-nccl plugin)
export FI_EFA_USE_DEVICE_RDMA=1        # GPUDirect RDMA over EFA (p4d supports it)
export FI_EFA_FORK_SAFE=1              # data loader forks must not corrupt registered memory
export NCCL_SOCKET_IFNAME=^lo,docker   # bootstrap over the real NIC
export NCCL_BUFFSIZE=8388608
export NCCL_P2P_NET_CHUNKSIZE=524288
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1   # a hung collective aborts instead of waiting forever
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}  # 96 vCPUs / 8 ranks, leaving some for the data loader
export OMP_WAIT_POLICY=PASSIVE
