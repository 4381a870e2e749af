"""Build (and optionally submit) a SageMaker PyTorch estimator for trainer.train on p4d.24xlarge.

    python -m trainer.launch.sagemaker_launch --role arn:aws:iam::...:role/SM --data s3://bucket/pile/sample \
        --instances 4 --model 1.3B --pp 2 --checkpoint-s3 s3://bucket/ckpt/run1 [--submit]

Without --submit (or without the `sagemaker` SDK installed) it prints the estimator configuration as JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from trainer.config import MODEL_SIZES

GPUS = {"ml.p4d.24xlarge": 8, "ml.p4de.24xlarge": 8, "ml.p5.48xlarge": 8}


def estimator_config(*, role: str, data: str, instances: int = 1, instance_type: str = "ml.p4d.24xlarge",
                     model: str = "1.3B", pp: int = 1, microbatches: int = 0, global_batch: int = 512,
                     steps: int = 1000, checkpoint_s3: Optional[str] = None, extra: Sequence[str] = ()) -> dict:
    if instance_type not in GPUS:
        raise ValueError(f"unknown instance type {instance_type}; known: {sorted(GPUS)}")
    if model not in MODEL_SIZES:
        raise ValueError(f"unknown model {model}; known: {sorted(MODEL_SIZES)}")
    world = instances * GPUS[instance_type]
    if world % pp:
        raise ValueError(f"{world} GPUs do not split into pipelines of {pp} stages (--pp)")
    dp = world // pp
    hyper = {"model": model, "dp": dp, "pp": pp, "microbatches": microbatches or max(2 * pp, 1),
             "global-batch": global_batch, "steps": steps}
    env = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1",
           "NCCL_SOCKET_IFNAME": "^lo,docker", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    cfg = {
        "entry_point": "trainer/launch/sagemaker_entry.py",
        "source_dir": ".",
        "role": role,
        "instance_type": instance_type,
        "instance_count": instances,
        "framework_version": "2.5",  # newest SageMaker PyTorch DLC; requirements pin torch==2.13.0 on top
        "py_version": "py311",
        "distribution": {"torch_distributed": {"enabled": True}},
        "hyperparameters": hyper,
        "environment": env,
        "checkpoint_local_path": "/opt/ml/checkpoints",
        "max_run": 5 * 24 * 3600,
        "inputs": {"train": data},
        "extra_args": list(extra),
    }
    if checkpoint_s3:
        cfg["checkpoint_s3_uri"] = checkpoint_s3
    return cfg


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--role", required=True)
    p.add_argument("--data", required=True, help="s3:// or FSx path of the dataset directory (manifest.json)")
    p.add_argument("--instances", type=int, default=1)
    p.add_argument("--instance-type", default="ml.p4d.24xlarge")
    p.add_argument("--model", default="1.3B")
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--microbatches", type=int, default=0)
    p.add_argument("--global-batch", type=int, default=512)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--checkpoint-s3")
    p.add_argument("--submit", action="store_true")
    a, extra = p.parse_known_args(argv)
    cfg = estimator_config(role=a.role, data=a.data, instances=a.instances, instance_type=a.instance_type,
                           model=a.model, pp=a.pp, microbatches=a.microbatches, global_batch=a.global_batch,
                           steps=a.steps, checkpoint_s3=a.checkpoint_s3, extra=extra)
    if not a.submit:
        print(json.dumps(cfg, indent=1, sort_keys=True))
        return 0
    from sagemaker.pytorch import PyTorch  # only needed to submit
    inputs = cfg.pop("inputs")
    cfg.pop("extra_args")
    PyTorch(**cfg).fit(inputs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
