"""The p4d.24xlarge launchers cannot run here: check that their resolved commands pass the trainer's own
validation (layout, batch rules) and that their guards (EFA plugin, CUDA torch pin, shared checkpoints) hold."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.trainer_launch import REPO
from trainer.config import ConfigError
from trainer.launch.sagemaker_entry import build_argv, efa_plugin
from trainer.launch.sagemaker_launch import estimator_config, main as sm_main, stage_source
from trainer.args import parse_args

LAUNCH = REPO / "trainer" / "launch"


def _trainer_args(cmd: list) -> list:
    return cmd[cmd.index("trainer.train") + 1:]


def _dry_run(script, args, **env):
    e = dict(os.environ, DRY_RUN="1", PATH=os.environ["PATH"], **env)
    out = subprocess.run(["bash", str(script), *args], env=e, capture_output=True, text=True, timeout=30, check=True)
    return shlex.split(out.stdout.strip().splitlines()[-1])


def _header_example(script) -> list:
    """The usage example in a launcher's header comment, as arguments after the script name."""
    text = (LAUNCH / script).read_text()
    m = re.search(rf"^#\s+.*{re.escape(script)} (.*?)$((?:\n#\s{{5,}}.*$)*)", text, re.M)
    line = (m.group(1) + " " + m.group(2).replace("#", " ")).replace("\\", " ")
    return shlex.split(line)


def test_multinode_torchrun_script():
    args = _header_example("torchrun_multinode.sh")
    cmd = _dry_run(LAUNCH / "torchrun_multinode.sh", args, NNODES="4", NODE_RANK="1", MASTER_ADDR="10.0.0.1")
    assert cmd[0] == "torchrun"
    assert cmd[cmd.index("--nnodes") + 1] == "4" and cmd[cmd.index("--node-rank") + 1] == "1"
    assert cmd[cmd.index("--nproc-per-node") + 1] == "8"
    assert cmd[cmd.index("--rdzv-endpoint") + 1] == "10.0.0.1:29500"
    cfg = parse_args(_trainer_args(cmd), world=32)
    p = cfg.parallel
    assert (p.dp, p.pp, cfg.device, cfg.model.name) == (16, 2, "cuda", "1.3B")
    assert p.dp * p.microbatches * p.microbatch_size == cfg.global_batch == 512
    assert p.microbatches >= 4 * p.pp  # the bubble default


@pytest.mark.parametrize("nodes,args,layout", [
    (4, None, (16, 2)),  # the header's example
    (2, ["--model", "6.7B", "--pp", "4", "--global-batch", "512"], (4, 4)),
])
def test_slurm_batch_file(nodes, args, layout):
    text = (LAUNCH / "p4d.sbatch").read_text()
    assert "#SBATCH --gpus-per-node=8" in text and "#SBATCH --exclusive" in text
    out = re.search(r"^#SBATCH --output=(\S+)", text, re.M).group(1)
    assert "/" not in out, "Slurm opens --output before the script runs: its directory must already exist"
    subprocess.run(["bash", "-n", str(LAUNCH / "p4d.sbatch")], check=True)
    cmd = _dry_run(LAUNCH / "p4d.sbatch", args or _header_example("p4d.sbatch"), SLURM_NNODES=str(nodes),
                   SLURM_JOB_ID="77", SLURM_SUBMIT_DIR=str(REPO))
    assert cmd[cmd.index("--nnodes") + 1] == str(nodes) and cmd[cmd.index("--rdzv-id") + 1] == "pileprep-77"
    cfg = parse_args(_trainer_args(cmd), world=8 * nodes)
    assert (cfg.parallel.dp, cfg.parallel.pp) == layout
    assert cfg.parallel.dp * cfg.parallel.microbatches * cfg.parallel.microbatch_size == 512


def test_layouts_the_trainer_refuses_fail_at_parse_time():
    with pytest.raises(ConfigError, match="does not split over dp = 16"):
        parse_args(["--model", "1.3B", "--pp", "2", "--data", "/nonexistent"], world=32)  # default batch 8
    with pytest.raises(ConfigError, match="--microbatches 1 < pipeline stages 2"):
        parse_args(["--pp", "2", "--microbatches", "1", "--data", "/nonexistent"], world=2)
    with pytest.raises(ConfigError, match="does not split into 3 micro-batches"):
        parse_args(["--global-batch", "8", "--microbatches", "3", "--data", "/nonexistent"], world=1)
    with pytest.raises(ConfigError, match="do not split into pipelines"):
        parse_args(["--pp", "3", "--data", "/nonexistent"], world=4)


def test_efa_environment_and_plugin_check(tmp_path):
    def run(ld_path):
        return subprocess.run(["bash", "-c", f"source {LAUNCH / 'efa_env.sh'} && efa_check && env"],
                              capture_output=True, text=True, env=dict(os.environ, LD_LIBRARY_PATH=ld_path))
    missing = run("")
    if any(os.path.exists(os.path.join(d, "libnccl-net.so")) for d in ("/opt/amazon/ofi-nccl/lib",
                                                                       "/opt/aws-ofi-nccl/lib", "/usr/local/lib")):
        pytest.skip("this machine has the plugin installed")
    assert missing.returncode != 0 and "aws-ofi-nccl" in missing.stderr
    (tmp_path / "libnccl-net.so").write_bytes(b"")
    ok = run(str(tmp_path))
    assert ok.returncode == 0, ok.stderr
    env = dict(line.split("=", 1) for line in ok.stdout.splitlines() if "=" in line)
    assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert env["FI_EFA_SET_CUDA_SYNC_MEMOPS"] == "0"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert efa_plugin({"LD_LIBRARY_PATH": str(tmp_path)}) == str(tmp_path / "libnccl-net.so")


def test_gpu_requirements_pin_the_same_torch_as_pyproject():
    setup = (REPO / "pyproject.toml").read_text()
    pins = re.findall(r'"torch==([\d.]+)"', setup)
    gpu = re.findall(r"^torch==([\d.]+)$", (LAUNCH / "requirements-gpu.txt").read_text(), re.M)
    assert pins and gpu == [pins[0]]
    assert "download.pytorch.org/whl/cu" in (LAUNCH / "requirements-gpu.txt").read_text()


def _torch_check(extra_path: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + ":" + os.environ["PATH"])
    if extra_path:
        env["PYTHONPATH"] = extra_path + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(["bash", "-c", f"source {LAUNCH / 'efa_env.sh'} && torch_check"], capture_output=True,
                          text=True, env=env)


def test_torchrun_script_refuses_a_cpu_torch(tmp_path):
    """The launcher's torch check before any node starts work: a CPU build of torch is refused naming
    requirements-gpu.txt. PyPI's torch 2.13.0 (what this machine installs) is the CUDA build, so the CPU build
    is a stand-in package shadowing it on PYTHONPATH: the shell check reads only `__version__` and
    `version.cuda`, exactly what a real CPU wheel has (`2.13.0+cpu`, cuda None)."""
    fake = tmp_path / "cpu" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = '2.13.0+cpu'\n"
                                      "class version:\n    cuda = None\n")
    out = _torch_check(str(tmp_path / "cpu"))
    assert out.returncode != 0 and "requirements-gpu.txt" in out.stderr
    # the installed CUDA build of the pinned version passes the same check
    import torch  # noqa: PLC0415
    if torch.version.cuda:
        assert _torch_check().returncode == 0


def _sm(**kw):
    base = dict(role="arn:aws:iam::1:role/sm", data="s3://b/pile/sample", model="1.3B", pp=2)
    return estimator_config(**{**base, **kw})


def test_sagemaker_multi_node_checkpoints_go_to_shared_storage():
    with pytest.raises(ValueError, match="per node"):
        _sm(instances=4, checkpoint_s3="s3://b/ckpt")
    cfg = _sm(instances=4, checkpoint_fsx="fs-1:/fsx/ckpt", subnets=["subnet-1"], security_group_ids=["sg-1"],
              extra=["--steps", "20", "--zero", "--lr", "2e-4"])
    assert cfg["instance_count"] == 4 and cfg["distribution"] == {"torch_distributed": {"enabled": True}}
    assert cfg["inputs"]["checkpoints"]["file_system_access_mode"] == "rw"
    assert cfg["resolved"]["dp"] == 16 and cfg["resolved"]["checkpoint_dir"] == "/opt/ml/input/data/checkpoints"
    assert "checkpoint_s3_uri" not in cfg
    # what each host runs: SageMaker's `--key value` hyperparameters, mapped by the entry point
    hp = [x for k, v in cfg["hyperparameters"].items() for x in (f"--{k}", str(v))]
    argv = build_argv({"SM_CHANNEL_TRAIN": "/opt/ml/input/data/train", "SM_NUM_GPUS": "8",
                       "SM_CHANNEL_CHECKPOINTS": "/opt/ml/input/data/checkpoints",
                       "SM_OUTPUT_DATA_DIR": "/opt/ml/output/data"}, hp)
    parsed = parse_args(argv, world=32)
    assert parsed.data.path == "/opt/ml/input/data/train" and parsed.parallel.zero  # extra args kept
    assert parsed.steps == 20 and parsed.optim.lr == 2e-4
    assert parsed.checkpoint_dir == "/opt/ml/input/data/checkpoints" and parsed.device == "cuda"
    assert parsed.metrics_file == "/opt/ml/output/data/metrics.jsonl"
    with pytest.raises(ConfigError, match="pipelines"):
        _sm(instances=1, pp=3)


def test_sagemaker_source_is_staged_with_requirements_and_without_venv(tmp_path):
    staged = stage_source(str(tmp_path / "src"))
    names = set(os.listdir(staged))
    assert names == {"trainer", "model_contract", "requirements.txt"}
    assert (tmp_path / "src" / "requirements.txt").read_text() == (LAUNCH / "requirements-gpu.txt").read_text()
    for root, dirs, files in os.walk(staged):
        assert ".venv" not in dirs and "__pycache__" not in dirs
    assert os.path.exists(os.path.join(staged, "trainer", "launch", "sagemaker_entry.py"))


def test_sagemaker_launcher_prints_config(capsys):
    assert sm_main(["--role", "r", "--data", "s3://b/d", "--instances", "1", "--steps", "5", "--zero"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["hyperparameters"]["trainer-args"] == "--zero" and cfg["resolved"]["dp"] == 8
    assert sm_main(["--role", "r", "--data", "s3://b/d", "--instances", "2"]) == 2  # no shared checkpoints


@pytest.mark.timeout(60)
def test_make_train_refuses_a_directory_that_holds_a_run(tmp_path):
    """Without RESUME=1, `make train` on a TRAIN_DIR that already holds a run exits 2 with both ways forward and
    leaves every file where it was (it used to `rm -rf` the directory, checkpoints included)."""
    run = tmp_path / "train"
    (run / "ckpt" / "step_00000020").mkdir(parents=True)
    (run / "ckpt" / "latest").write_text("step_00000020")
    (run / "metrics.jsonl").write_text("{}\n")
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    # -o: take the venv stamp as up to date (never reinstall from a test)
    proc = subprocess.run(["make", "-s", "-o", ".venv/.installed", "-o", ".venv/.installed-test", "train", f"TRAIN_DIR={run}"], cwd=REPO,
                          capture_output=True, text=True, timeout=50)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"make train RESUME=1 TRAIN_DIR={run}" in proc.stderr
    assert f"make train TRAIN_DIR={run}-2" in proc.stderr
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    assert (run / "ckpt" / "latest").read_text() == "step_00000020"
