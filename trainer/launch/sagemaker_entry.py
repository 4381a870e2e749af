"""SageMaker training entry point. SageMaker's PyTorch container installs source_dir's requirements.txt (the GPU
pins, trainer/launch/requirements-gpu.txt) and runs this under torchrun on every host when the estimator has
`distribution={"torch_distributed": {"enabled": True}}`; it maps SageMaker's environment onto trainer.train:

    SM_CHANNEL_TRAIN        -> --data            (the dataset directory with manifest.json; FSx/S3 FastFile mount)
    SM_CHANNEL_CHECKPOINTS  -> --checkpoint-dir  (FSx for Lustre, shared by every node: multi-node jobs)
    /opt/ml/checkpoints     -> --checkpoint-dir  (single node: SageMaker syncs it with checkpoint_s3_uri)
    SM_OUTPUT_DATA_DIR      -> --metrics-file    (metrics.jsonl lands in the job's output.tar.gz)

Hyperparameters arrive as `--key value` arguments and pass through; `--trainer-args "..."` carries any other
trainer options (shell-quoted). On more than one host the aws-ofi-nccl plugin must be present (else NCCL would
fall back to TCP): exit 1 naming it.
"""
from __future__ import annotations

import glob
import json
import os
import shlex
import sys
from typing import Mapping, Optional, Sequence

CHECKPOINT_DIR = "/opt/ml/checkpoints"
CHECKPOINT_CHANNEL = "checkpoints"
PLUGIN_DIRS = ("/opt/amazon/ofi-nccl/lib", "/opt/amazon/ofi-nccl/lib64", "/opt/aws-ofi-nccl/lib", "/usr/local/lib")


def build_argv(environ: Mapping[str, str], argv: Sequence[str]) -> list:
    args = list(argv)
    if "--trainer-args" in args:
        i = args.index("--trainer-args")
        args[i:i + 2] = shlex.split(args[i + 1])
    if "--data" not in args:
        args += ["--data", environ.get("SM_CHANNEL_TRAIN", "/opt/ml/input/data/train")]
    if "--checkpoint-dir" not in args:
        args += ["--checkpoint-dir", environ.get(f"SM_CHANNEL_{CHECKPOINT_CHANNEL.upper()}", CHECKPOINT_DIR)]
    if "--metrics-file" not in args:
        args += ["--metrics-file", os.path.join(environ.get("SM_OUTPUT_DATA_DIR", "/opt/ml/output/data"),
                                                 "metrics.jsonl")]
    if "--device" not in args:
        args += ["--device", "cuda" if int(environ.get("SM_NUM_GPUS", "0") or 0) > 0 else "cpu"]
    return args


def efa_plugin(environ: Mapping[str, str]) -> Optional[str]:
    """Path of the aws-ofi-nccl plugin NCCL would load, or None."""
    dirs = [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d] + list(PLUGIN_DIRS)
    for d in dirs:
        found = sorted(glob.glob(os.path.join(d, "libnccl-net*.so")))
        if found:
            return found[0]
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    hosts = json.loads(os.environ.get("SM_HOSTS", "[]"))
    if len(hosts) > 1 and efa_plugin(os.environ) is None:
        print("error: aws-ofi-nccl (libnccl-net*.so) not found: NCCL would fall back to TCP between hosts",
              file=sys.stderr)
        return 1
    from trainer.train import main as train_main
    return train_main(build_argv(os.environ, sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
