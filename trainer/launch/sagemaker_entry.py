"""SageMaker training entry point. SageMaker's PyTorch container runs it under torchrun on every host when the
estimator has `distribution={"torch_distributed": {"enabled": True}}`; this maps SageMaker's environment onto
trainer.train's flags:

    SM_CHANNEL_TRAIN   -> --data             (the dataset directory with manifest.json; FSx/S3 FastFile mount)
    /opt/ml/checkpoints -> --checkpoint-dir  (SageMaker syncs it with checkpoint_s3_uri: spot restarts resume)
    SM_OUTPUT_DATA_DIR -> --metrics-file     (metrics.jsonl lands in the job's output.tar.gz)

Hyperparameters arrive as `--key value` arguments and pass through unchanged.
"""
from __future__ import annotations

import os
import sys
from typing import Mapping, Optional, Sequence

CHECKPOINT_DIR = "/opt/ml/checkpoints"


def build_argv(environ: Mapping[str, str], argv: Sequence[str]) -> list:
    args = list(argv)
    if "--data" not in args:
        args += ["--data", environ.get("SM_CHANNEL_TRAIN", "/opt/ml/input/data/train")]
    if "--checkpoint-dir" not in args:
        args += ["--checkpoint-dir", CHECKPOINT_DIR]
    if "--metrics-file" not in args:
        args += ["--metrics-file", os.path.join(environ.get("SM_OUTPUT_DATA_DIR", "/opt/ml/output/data"),
                                                 "metrics.jsonl")]
    if "--device" not in args:
        args += ["--device", "cuda" if int(environ.get("SM_NUM_GPUS", "0") or 0) > 0 else "cpu"]
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from trainer.train import main as train_main
    return train_main(build_argv(os.environ, sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
