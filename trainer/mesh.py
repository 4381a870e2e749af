"""Process groups and the DP x PP x TP device mesh: which rank is which, the device it runs on, and agreeing on
one rank's value.

Layout: world = dp * pp * tp, mesh dims ("dp", "pp", "tp"), rank = (dp_index * pp + pp_index) * tp + tp_index:
the tensor-parallel group is innermost (neighbouring ranks, always within a node: its all-reduces are per layer),
then the stages of one model replica (pipeline P2P stays on NVLink when pp * tp <= 8), and the DP reduction
goes over EFA. With tp = 1 the mesh is the 2-D ("dp", "pp") one.
"""
from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from trainer.config import ParallelConfig


@dataclass
class ParallelEnv:
    rank: int
    world: int
    dp: int
    pp: int
    dp_rank: int
    pp_rank: int
    device: torch.device
    mesh: object
    dp_group: object
    pp_group: object
    tied_group: Optional[object]  # {first stage, last stage} of this replica, when pp > 1
    tp: int = 1
    tp_rank: int = 0
    tp_mesh: Optional[object] = None  # 1-D sub-mesh for parallelize_module (tp > 1)
    dp_mesh: Optional[object] = None  # 1-D sub-mesh for fully_shard

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick_device(kind: str = "auto") -> torch.device:
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def init_distributed(cfg: ParallelConfig, device_kind: str = "auto") -> ParallelEnv:
    """Start the process group (gloo on CPU, NCCL on GPU) and the 2-D mesh. Works under torchrun or alone."""
    if "RANK" not in os.environ:  # a plain `python -m trainer.train`: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    world = int(os.environ["WORLD_SIZE"])
    tp = int(getattr(cfg, "tp", 1) or 1)
    if world != cfg.dp * cfg.pp * tp:
        raise ValueError(f"torchrun started {world} processes but --dp {cfg.dp} x --pp {cfg.pp} x --tp {tp} = "
                         f"{cfg.dp * cfg.pp * tp}: make them agree (--nproc-per-node x nodes = dp x pp x tp)")
    device = pick_device(device_kind)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        # An explicit timeout: at Pile scale the first collective can wait minutes while ranks walk shard
        # offsets (trainer/shard_files.py prepare_shards); NCCL's default would abort the job before it.
        dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None,
                                timeout=datetime.timedelta(minutes=float(getattr(cfg, "timeout_minutes", 60))))
    from torch.distributed.device_mesh import init_device_mesh
    if tp == 1:
        mesh = init_device_mesh(device.type, (cfg.dp, cfg.pp), mesh_dim_names=("dp", "pp"))
    else:
        mesh = init_device_mesh(device.type, (cfg.dp, cfg.pp, tp), mesh_dim_names=("dp", "pp", "tp"))
    rank = dist.get_rank()
    dp_rank, rest = divmod(rank, cfg.pp * tp)
    pp_rank, tp_rank = divmod(rest, tp)
    tied = None
    if cfg.pp > 1:  # every rank must create every group, in the same order
        for r in range(cfg.dp):
            for t in range(tp):
                first = r * cfg.pp * tp + t
                g = dist.new_group([first, first + (cfg.pp - 1) * tp])
                if (r, t) == (dp_rank, tp_rank):
                    tied = g
    return ParallelEnv(rank, world, cfg.dp, cfg.pp, dp_rank, pp_rank, device, mesh,
                       mesh.get_group("dp"), mesh.get_group("pp"), tied, tp=tp, tp_rank=tp_rank,
                       tp_mesh=mesh["tp"] if tp > 1 else None, dp_mesh=mesh["dp"])


def agree_on(obj, src: int = 0):
    """Every rank takes rank src's value (measurements differ per rank; partitions must not)."""
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
