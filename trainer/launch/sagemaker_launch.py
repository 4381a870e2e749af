"""Build (and optionally submit) a SageMaker PyTorch estimator for trainer.train on p4d.24xlarge.

    python -m trainer.launch.sagemaker_launch --role arn:aws:iam::...:role/SM --data s3://bucket/pile/sample \
        --instances 4 --model 1.3B --pp 2 --global-batch 512 \
        --checkpoint-fsx fs-0123:/fsx/ckpt/run1 --subnets subnet-1 --security-group-ids sg-1 [--submit] \
        [any trainer.train option, e.g. --steps 20000 --zero]

Without --submit (or without the `sagemaker` SDK installed) it prints the estimator configuration as JSON.

* The layout is resolved by the trainer's own validation (`trainer.args.parse_args` for instances x GPUs
  processes) before anything is submitted: a refused layout fails here, not on the cluster.
* Every option the launcher does not know is a trainer option: they travel as one `trainer-args`
  hyperparameter (SageMaker passes hyperparameters as `--key value`, which valueless flags cannot use).
* Checkpoints: /opt/ml/checkpoints is local to each node and only rank 0 publishes, so a multi-node job
  checkpoints to shared storage — an FSx for Lustre file system mounted read-write as the `checkpoints`
  channel (needs the VPC subnets and security groups of the file system). Single-node jobs may use
  /opt/ml/checkpoints, synced to --checkpoint-s3.
* source_dir is a staged copy of trainer/ and model_contract/ with requirements.txt = the GPU pins
  (trainer/launch/requirements-gpu.txt), which SageMaker installs before the entry point runs — no .venv,
  no caches.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
from typing import Optional, Sequence

from trainer.config import MODEL_SIZES
from trainer.launch.sagemaker_entry import CHECKPOINT_CHANNEL, build_argv

GPUS = {"ml.p4d.24xlarge": 8, "ml.p4de.24xlarge": 8, "ml.p5.48xlarge": 8}
GPU_MODEL = {"ml.p4d.24xlarge": "A100-40GB", "ml.p4de.24xlarge": "A100-80GB", "ml.p5.48xlarge": "H100"}  # trainer.plan
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPU_REQUIREMENTS = os.path.join(REPO, "trainer", "launch", "requirements-gpu.txt")
PACKAGES = ("trainer", "model_contract")


def stage_source(dest: str) -> str:
    """Copy what the job runs (and its requirements) into `dest`; return it."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".venv", "*.so", ".pytest_cache")
    for pkg in PACKAGES:
        shutil.copytree(os.path.join(REPO, pkg), os.path.join(dest, pkg), ignore=ignore, dirs_exist_ok=True)
    shutil.copy(GPU_REQUIREMENTS, os.path.join(dest, "requirements.txt"))
    return dest


def estimator_config(*, role: str, data: str, instances: int = 1, instance_type: str = "ml.p4d.24xlarge",
                     model: str = "1.3B", pp: int = 1, global_batch: int = 512, steps: int = 1000,
                     checkpoint_s3: Optional[str] = None, checkpoint_fsx: Optional[str] = None,
                     subnets: Sequence[str] = (), security_group_ids: Sequence[str] = (),
                     extra: Sequence[str] = (), source_dir: str = "<staged at submit>") -> dict:
    if instance_type not in GPUS:
        raise ValueError(f"unknown instance type {instance_type}; known: {sorted(GPUS)}")
    if model not in MODEL_SIZES:
        raise ValueError(f"unknown model {model}; known: {sorted(MODEL_SIZES)}")
    world = instances * GPUS[instance_type]
    if instances > 1 and not checkpoint_fsx:
        raise ValueError(f"{instances} instances: /opt/ml/checkpoints is per node and only rank 0 publishes, so "
                         f"resume would miss the other nodes' files; give --checkpoint-fsx FS_ID:/PATH (shared)")
    if checkpoint_fsx and not (subnets and security_group_ids):
        raise ValueError("--checkpoint-fsx needs --subnets and --security-group-ids (the file system's VPC)")
    hyper = {"model": model, "pp": pp, "global-batch": global_batch, "steps": steps}
    if extra:
        hyper["trainer-args"] = shlex.join(extra)
    # The trainer's own validation of exactly what each host will run (data and checkpoints as mounted there).
    from trainer.args import parse_args
    env = {"SM_CHANNEL_TRAIN": "/opt/ml/input/data/train", "SM_NUM_GPUS": str(GPUS[instance_type]),
           "SM_OUTPUT_DATA_DIR": "/opt/ml/output/data"}
    if checkpoint_fsx:
        env[f"SM_CHANNEL_{CHECKPOINT_CHANNEL.upper()}"] = f"/opt/ml/input/data/{CHECKPOINT_CHANNEL}"
    argv = build_argv(env, [x for k, v in hyper.items() for x in (f"--{k}", str(v))])
    resolved = parse_args(argv + ["--gpu", GPU_MODEL[instance_type]], world=world)  # + the memory plan
    inputs: dict = {"train": data}
    if checkpoint_fsx:
        fs_id, _, path = checkpoint_fsx.partition(":")
        inputs[CHECKPOINT_CHANNEL] = {"file_system_id": fs_id, "file_system_type": "FSxLustre",
                                      "directory_path": path or "/fsx", "file_system_access_mode": "rw"}
    cfg = {
        "entry_point": "trainer/launch/sagemaker_entry.py",
        "source_dir": source_dir,
        "role": role,
        "instance_type": instance_type,
        "instance_count": instances,
        "framework_version": "2.5",  # newest SageMaker PyTorch DLC; requirements.txt installs torch 2.13.0 (CUDA)
        "py_version": "py311",
        "distribution": {"torch_distributed": {"enabled": True}},
        "hyperparameters": hyper,
        "environment": {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1",
                        "FI_EFA_SET_CUDA_SYNC_MEMOPS": "0", "NCCL_SOCKET_IFNAME": "^lo,docker",
                        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_WAIT_POLICY": "PASSIVE"},
        "max_run": 5 * 24 * 3600,
        "inputs": inputs,
        "resolved": {"dp": resolved.parallel.dp, "pp": resolved.parallel.pp,
                     "microbatches": resolved.parallel.microbatches,
                     "microbatch_size": resolved.parallel.microbatch_size, "checkpoint_dir": resolved.checkpoint_dir},
    }
    if subnets:
        cfg["subnets"], cfg["security_group_ids"] = list(subnets), list(security_group_ids)
    if checkpoint_s3 and not checkpoint_fsx:
        cfg["checkpoint_s3_uri"] = checkpoint_s3
        cfg["checkpoint_local_path"] = "/opt/ml/checkpoints"
    return cfg


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--role", required=True)
    p.add_argument("--data", required=True, help="s3:// or FSx path of the dataset directory (manifest.json)")
    p.add_argument("--instances", type=int, default=1)
    p.add_argument("--instance-type", default="ml.p4d.24xlarge")
    p.add_argument("--model", default="1.3B")
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--global-batch", type=int, default=512)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--checkpoint-s3", help="single node: sync /opt/ml/checkpoints here")
    p.add_argument("--checkpoint-fsx", help="FS_ID:/PATH of an FSx for Lustre checkpoint directory (multi-node)")
    p.add_argument("--subnets", nargs="*", default=[])
    p.add_argument("--security-group-ids", nargs="*", default=[])
    p.add_argument("--submit", action="store_true")
    a, extra = p.parse_known_args(argv)
    try:
        cfg = estimator_config(role=a.role, data=a.data, instances=a.instances, instance_type=a.instance_type,
                               model=a.model, pp=a.pp, global_batch=a.global_batch, steps=a.steps,
                               checkpoint_s3=a.checkpoint_s3, checkpoint_fsx=a.checkpoint_fsx, subnets=a.subnets,
                               security_group_ids=a.security_group_ids, extra=extra)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not a.submit:
        print(json.dumps(cfg, indent=1, sort_keys=True))
        return 0
    from sagemaker.inputs import FileSystemInput  # only needed to submit
    from sagemaker.pytorch import PyTorch
    inputs = {k: FileSystemInput(**v) if isinstance(v, dict) else v for k, v in cfg.pop("inputs").items()}
    cfg.pop("resolved")
    with tempfile.TemporaryDirectory() as staged:
        cfg["source_dir"] = stage_source(staged)
        PyTorch(**cfg).fit(inputs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
