"""The p4d.24xlarge launchers cannot run here; check that their commands and configs resolve."""
from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

from tests.trainer_launch import REPO
from trainer.launch.sagemaker_entry import build_argv
from trainer.launch.sagemaker_launch import estimator_config, main as sm_main
from trainer.train import parse_args

LAUNCH = REPO / "trainer" / "launch"


def _trainer_args(cmd: list) -> list:
    return cmd[cmd.index("trainer.train") + 1:]


def _resolve(trainer_args: list, world: int, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", str(world))
    cfg = parse_args(trainer_args)
    assert cfg.parallel.dp * cfg.parallel.pp == world
    return cfg


def _dry_run(script, args, **env):
    e = dict(os.environ, DRY_RUN="1", PATH=os.environ["PATH"], **env)
    out = subprocess.run(["bash", str(script), *args], env=e, capture_output=True, text=True, timeout=30, check=True)
    return shlex.split(out.stdout.strip().splitlines()[-1])


def test_multinode_torchrun_script(monkeypatch):
    cmd = _dry_run(LAUNCH / "torchrun_multinode.sh", ["--model", "1.3B", "--pp", "2", "--data", "/fsx/pile"],
                   NNODES="4", NODE_RANK="1", MASTER_ADDR="10.0.0.1")
    assert cmd[0] == "torchrun"
    assert cmd[cmd.index("--nnodes") + 1] == "4" and cmd[cmd.index("--node-rank") + 1] == "1"
    assert cmd[cmd.index("--nproc-per-node") + 1] == "8"
    assert cmd[cmd.index("--rdzv-endpoint") + 1] == "10.0.0.1:29500"
    cfg = _resolve(_trainer_args(cmd), 32, monkeypatch)
    assert (cfg.parallel.dp, cfg.parallel.pp, cfg.device, cfg.model.name) == (16, 2, "cuda", "1.3B")


def test_slurm_batch_file(monkeypatch):
    text = (LAUNCH / "p4d.sbatch").read_text()
    assert "#SBATCH --gpus-per-node=8" in text and "#SBATCH --exclusive" in text
    subprocess.run(["bash", "-n", str(LAUNCH / "p4d.sbatch")], check=True)
    cmd = _dry_run(LAUNCH / "p4d.sbatch", ["--model", "6.7B", "--pp", "4"], SLURM_NNODES="2",
                   SLURM_JOB_ID="77", SLURM_SUBMIT_DIR=str(REPO))
    assert cmd[cmd.index("--nnodes") + 1] == "2" and cmd[cmd.index("--rdzv-id") + 1] == "pileprep-77"
    cfg = _resolve(_trainer_args(cmd), 16, monkeypatch)
    assert (cfg.parallel.dp, cfg.parallel.pp) == (4, 4)


def test_efa_environment():
    out = subprocess.run(["bash", "-c", f"source {LAUNCH / 'efa_env.sh'} && env"], capture_output=True, text=True,
                         check=True).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"


def test_sagemaker_estimator_config_resolves(monkeypatch):
    cfg = estimator_config(role="arn:aws:iam::1:role/sm", data="s3://b/pile/sample", instances=4, model="1.3B",
                           pp=2, checkpoint_s3="s3://b/ckpt")
    assert cfg["instance_type"] == "ml.p4d.24xlarge" and cfg["instance_count"] == 4
    assert cfg["distribution"] == {"torch_distributed": {"enabled": True}}
    assert os.path.exists(REPO / cfg["entry_point"])
    hp = [x for k, v in cfg["hyperparameters"].items() for x in (f"--{k}", str(v))]
    argv = build_argv({"SM_CHANNEL_TRAIN": "/opt/ml/input/data/train", "SM_NUM_GPUS": "8",
                       "SM_OUTPUT_DATA_DIR": "/opt/ml/output/data"}, hp)
    parsed = _resolve(argv, 32, monkeypatch)
    assert parsed.data.path == "/opt/ml/input/data/train"
    assert parsed.checkpoint_dir == "/opt/ml/checkpoints" and parsed.device == "cuda"
    assert parsed.metrics_file == "/opt/ml/output/data/metrics.jsonl"
    with pytest.raises(ValueError, match="--pp"):
        estimator_config(role="r", data="d", instances=1, pp=3)


def test_sagemaker_launcher_prints_config(capsys):
    assert sm_main(["--role", "r", "--data", "s3://b/d", "--instances", "2"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["hyperparameters"]["dp"] == 16
