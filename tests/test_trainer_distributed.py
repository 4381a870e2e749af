"""Multi-process trainer tests: real `torchrun` processes over gloo on CPU, a tiny model, a few steps."""
from __future__ import annotations

import os

import pytest
import torch

from tests.trainer_fixtures import write_dataset
from tests.trainer_launch import TINY, losses, read_metrics, run_and_kill_after, run_trainer


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(str(tmp_path_factory.mktemp("trainer-data")), seq_len=32, vocab=64, n_docs=400)


def _grads(directory) -> dict:
    out = {}
    for name in sorted(os.listdir(directory)):
        out.update(torch.load(os.path.join(directory, name)))
    return out


@pytest.fixture(scope="module")
def reference_grads(dataset, tmp_path_factory):
    d = tmp_path_factory.mktemp("grads-ref")
    run_trainer(1, ["--data", dataset, *TINY, "--steps", "1", "--microbatches", "1", "--dump-grads", str(d)])
    return _grads(d)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("schedule,partition", [("gpipe", "flops"), ("1f1b", "profile")])
def test_pipeline_gradients_equal_unpipelined(dataset, reference_grads, tmp_path, schedule, partition):
    """PP=2 with 4 micro-batches: every parameter's gradient equals the single-process model's.

    3 blocks + embed + head over 2 stages is uneven: the partition must place every block somewhere. The model is
    tied, so the last stage's head.weight gradient (after the tied all-reduce) must equal the whole tied gradient.
    """
    run_trainer(2, ["--data", dataset, *TINY, "--steps", "1", "--pp", "2", "--microbatches", "4",
                    "--schedule", schedule, "--partition", partition, "--dump-grads", str(tmp_path)])
    got = _grads(tmp_path)
    blocks = {n.split(".")[1] for n in got if n.startswith("blocks.")}
    assert blocks == {"0", "1", "2"}, "a layer was dropped by the partition"
    assert "head.weight" in got and "tok_emb.weight" in got
    torch.testing.assert_close(got["head.weight"], reference_grads["tok_emb.weight"], rtol=1e-4, atol=1e-6)
    for name, g in got.items():
        ref = reference_grads["tok_emb.weight" if name == "head.weight" else name]
        torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-6, msg=f"gradient of {name} differs")


@pytest.mark.timeout(180)
def test_ddp_equals_single_process(dataset, tmp_path):
    """DP=2 (DDP over gloo) gives the same losses, step by step, as one process on the same global batch."""
    common = ["--data", dataset, *TINY, "--steps", "5", "--log-every", "1"]
    run_trainer(1, common + ["--metrics-file", str(tmp_path / "single.jsonl")])
    run_trainer(2, common + ["--dp", "2", "--metrics-file", str(tmp_path / "ddp.jsonl")])
    single, ddp = losses(tmp_path / "single.jsonl"), losses(tmp_path / "ddp.jsonl")
    assert list(single) == [1, 2, 3, 4, 5]
    for step in single:
        assert ddp[step] == pytest.approx(single[step], rel=1e-5), step
    assert single[5] < single[1]


@pytest.mark.timeout(240)
def test_dp2_x_pp2_mesh_matches_single_process(dataset, tmp_path):
    """4 processes, DP=2 x PP=2 on the 2-D mesh, ZeRO-1 optimizer sharding: same losses as one process."""
    common = ["--data", dataset, *TINY, "--steps", "3", "--log-every", "1", "--microbatches", "2"]
    run_trainer(1, common + ["--metrics-file", str(tmp_path / "single.jsonl")])
    run_trainer(4, common + ["--dp", "2", "--pp", "2", "--zero", "--metrics-file", str(tmp_path / "mesh.jsonl")],
                timeout=200)
    single, mesh = losses(tmp_path / "single.jsonl"), losses(tmp_path / "mesh.jsonl")
    for step in single:
        assert mesh[step] == pytest.approx(single[step], rel=1e-5), step


@pytest.mark.timeout(240)
def test_sigkill_and_resume_continues_losses(dataset, tmp_path):
    """PP=2 run killed with SIGKILL mid-run resumes from the latest checkpoint; losses equal an uninterrupted run."""
    common = ["--data", dataset, *TINY, "--steps", "8", "--log-every", "1", "--pp", "2", "--microbatches", "2",
              "--checkpoint-every", "3"]
    run_trainer(2, common + ["--checkpoint-dir", str(tmp_path / "ck-a"), "--metrics-file", str(tmp_path / "a.jsonl")])
    ref = losses(tmp_path / "a.jsonl")

    b_metrics = tmp_path / "b.jsonl"
    run_and_kill_after(2, common + ["--checkpoint-dir", str(tmp_path / "ck-b"), "--metrics-file", str(b_metrics)],
                       str(b_metrics), kill_after_step=4)
    assert (tmp_path / "ck-b" / "latest").read_text() == "step_00000003"
    proc = run_trainer(2, common + ["--checkpoint-dir", str(tmp_path / "ck-b"), "--metrics-file", str(b_metrics)])
    assert "resumed from" in proc.stdout
    records = read_metrics(b_metrics)
    after = [r for r in records if r["step"] > 3][-5:]  # the resumed run's steps 4..8
    assert [r["step"] for r in after] == [4, 5, 6, 7, 8]
    for r in after:
        assert r["loss"] == pytest.approx(ref[r["step"]], rel=1e-5, abs=1e-6), r["step"]

    # Tied embeddings across stages stay identical: stage 0's tok_emb equals the last stage's head copy.
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    dcp_to_torch_save(str(tmp_path / "ck-b" / "step_00000008"), str(tmp_path / "final.pt"))
    sd = torch.load(tmp_path / "final.pt", weights_only=False)["model"]
    torch.testing.assert_close(sd["tok_emb.weight"], sd["head.weight"], rtol=0, atol=0)


@pytest.mark.timeout(240)
def test_resume_with_another_dp_size(dataset, tmp_path):
    """Checkpoint at DP=2, resume at DP=1: the same global batches and losses as the uninterrupted DP=2 run."""
    common = ["--data", dataset, *TINY, "--log-every", "1", "--steps", "6", "--checkpoint-every", "3"]
    run_trainer(2, common + ["--dp", "2", "--checkpoint-dir", str(tmp_path / "a"),
                             "--metrics-file", str(tmp_path / "a.jsonl")])
    ref = losses(tmp_path / "a.jsonl")
    run_trainer(2, common + ["--dp", "2", "--checkpoint-dir", str(tmp_path / "b"), "--stop-at-step", "3"])
    proc = run_trainer(1, common + ["--checkpoint-dir", str(tmp_path / "b"),
                                    "--metrics-file", str(tmp_path / "b1.jsonl")])
    assert "was dp=2" in proc.stdout and "now dp=1" in proc.stdout
    got = losses(tmp_path / "b1.jsonl")
    assert sorted(got) == [4, 5, 6]
    for step, loss in got.items():
        assert loss == pytest.approx(ref[step], rel=1e-5), step


@pytest.mark.timeout(120)
def test_contract_mismatch_is_one_clear_error(dataset):
    """Wrong seq_len and too small a vocabulary: one error naming both, raised before any rendezvous."""
    proc = run_trainer(2, ["--data", dataset, "--seq-len", "64", "--vocab-size", "32", "--pp", "2",
                           "--threads", "1"], check=False, timeout=90)
    assert proc.returncode != 0
    out = proc.stderr
    assert "error: data does not match the trainer config (5 mismatches)" in out
    assert "seq_len: data has 32, trainer config has 64" in out
    assert "vocab_size: tokenizer emits ids up to 63, trainer's vocab_size is 32" in out
    assert "feature 'segment_ids': shape [32], trainer expects [64]" in out
    assert "contract.ContractMismatchError" not in out  # a clean message from the trainer (torchrun adds its own)


@pytest.mark.timeout(120)
def test_too_few_microbatches_is_a_clear_error(dataset):
    proc = run_trainer(2, ["--data", dataset, *TINY, "--pp", "2", "--microbatches", "1", "--steps", "1"],
                       check=False, timeout=90)
    assert proc.returncode != 0
    assert "--microbatches 1 < pipeline stages 2" in proc.stderr
