"""Multi-process trainer tests: real `torchrun` processes over gloo on CPU, a tiny model, a few steps."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from tests.trainer_fixtures import write_dataset
from tests.trainer_launch import TINY, crash_run, losses, run_trainer


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
    run_trainer(1, ["--data", dataset, *TINY, "--steps", "1", "--microbatches", "1"], hooks={"dump_grads": str(d)})
    return _grads(d)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("schedule,partition", [("gpipe", "flops"), ("1f1b", "profile")])
def test_pipeline_gradients_equal_unpipelined(dataset, reference_grads, tmp_path, schedule, partition):
    """PP=2 with 4 micro-batches: every parameter's gradient equals the single-process model's.

    3 blocks + embed + head over 2 stages is uneven: the partition must place every block somewhere. The model is
    tied, so the last stage's head.weight gradient (after the tied all-reduce) must equal the whole tied gradient.
    """
    run_trainer(2, ["--data", dataset, *TINY, "--steps", "1", "--pp", "2", "--microbatches", "4",
                    "--schedule", schedule, "--partition", partition], hooks={"dump_grads": str(tmp_path)})
    got = _grads(tmp_path)
    blocks = {n.split(".")[1] for n in got if n.startswith("blocks.")}
    assert blocks == {"0", "1", "2"}, "a layer was dropped by the partition"
    assert "head.weight" in got and "tok_emb.weight" in got
    torch.testing.assert_close(got["head.weight"], reference_grads["tok_emb.weight"], rtol=1e-4, atol=1e-6)
    for name, g in got.items():
        ref = reference_grads["tok_emb.weight" if name == "head.weight" else name]
        torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-6, msg=f"gradient of {name} differs")


# ---------------------------------------------------------------------------------------------- crash-resume
# Every crashed run: 7 steps, a checkpoint every 3, every process SIGKILLed after step 4 (so `latest` is step 3
# and step 4's work is lost). One uninterrupted single-process run is the reference for every layout (DP, PP and
# one process compute the same losses). Runs are shared between tests through module-scoped fixtures.
CRASH_STEPS, CKPT_EVERY, KILL_AFTER = 7, 3, 4
LAYOUTS = {"pp1": (1, []), "pp2": (2, ["--pp", "2"]), "dp2xpp2-zero": (4, ["--dp", "2", "--pp", "2", "--zero"]),
           "dp2xpp2": (4, ["--dp", "2", "--pp", "2"]), "dp2": (2, ["--dp", "2"])}
DP_PP = {"pp1": (1, 1), "pp2": (1, 2), "dp2xpp2-zero": (2, 2), "dp2xpp2": (2, 2), "dp2": (2, 1)}


def _common(dataset):
    return ["--data", dataset, *TINY, "--steps", str(CRASH_STEPS), "--log-every", "1",
            "--checkpoint-every", str(CKPT_EVERY)]


@pytest.fixture(scope="module")
def uninterrupted(dataset, tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    run_trainer(1, _common(dataset) + ["--metrics-file", str(d / "m.jsonl")])
    return losses(d / "m.jsonl")


@pytest.fixture(scope="module")
def crashed(dataset, tmp_path_factory):
    """layout -> checkpoint directory of a run of that layout killed after step KILL_AFTER (made on demand)."""
    made = {}

    def get(layout):
        if layout not in made:
            d = tmp_path_factory.mktemp(f"crash-{layout}")
            nproc, extra = LAYOUTS[layout]
            crash_run(nproc, _common(dataset) + extra + ["--checkpoint-dir", str(d / "ck"),
                                                         "--metrics-file", str(d / "m.jsonl")], d, KILL_AFTER)
            assert max(losses(d / "m.jsonl")) == KILL_AFTER, "the killed run went on"
            assert (d / "ck" / "latest").read_text() == f"step_{CKPT_EVERY:08d}"
            made[layout] = d
        return made[layout]

    return get


@pytest.mark.timeout(300)
@pytest.mark.parametrize("before,after", [("pp2", "pp2"), ("dp2xpp2-zero", "dp2xpp2-zero"), ("pp2", "pp1"),
                                          ("pp1", "pp2"), ("dp2xpp2-zero", "dp2xpp2"), ("dp2", "pp1")])
def test_crash_resume_is_exact(dataset, uninterrupted, crashed, tmp_path, before, after):
    """Every process of a run is SIGKILLed; the resumed run (same or another layout — pp 2 -> 1 and 1 -> 2 with tied
    embeddings, dp 2 -> 1, with or without ZeRO) prints its resume step and every later step's loss equals the
    uninterrupted run's."""
    ck = tmp_path / "ck"
    shutil.copytree(crashed(before) / "ck", ck)
    nproc, extra = LAYOUTS[after]
    proc = run_trainer(nproc, _common(dataset) + extra + ["--checkpoint-dir", str(ck),
                                                          "--metrics-file", str(tmp_path / "m.jsonl")],
                       hooks={"dump_params": str(tmp_path / "params")}, timeout=150)
    assert f"step_{CKPT_EVERY:08d} at step {CKPT_EVERY} " in proc.stdout
    (dp0, pp0), (dp1, pp1) = (DP_PP[before], DP_PP[after])
    assert f"(was dp={dp0} pp={pp0}, now dp={dp1} pp={pp1};" in proc.stdout
    got = losses(tmp_path / "m.jsonl")
    assert sorted(got) == list(range(CKPT_EVERY + 1, CRASH_STEPS + 1))
    for step, loss in got.items():
        assert loss == pytest.approx(uninterrupted[step], rel=1e-5, abs=1e-6), step
    if after != "pp1":  # the last stage's copy of the tied embedding stayed identical to the first stage's
        params = _grads(tmp_path / "params")  # merged over ranks: rank 0's tok_emb, the last rank's head
        torch.testing.assert_close(params["tok_emb.weight"], params["head.weight"], rtol=0, atol=0)


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
def test_damaged_shard_stops_every_rank_with_one_line(dataset, tmp_path):
    """A shard cut short: each rank's share of the shard checks is gathered, so every rank exits 2 with the same
    one-line error naming the shard, before any training step (no hang while one rank trains alone)."""
    d = tmp_path / "data"
    shutil.copytree(dataset, d)
    shard = d / "gen-test" / "train-00002-of-00003.tfrecord"
    shard.write_bytes(shard.read_bytes()[:100])
    proc = run_trainer(2, ["--data", str(d), *TINY, "--pp", "2", "--steps", "1"], check=False, timeout=90)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2 and len(set(errors)) == 1, proc.stderr[-3000:]
    assert "shard gen-test/train-00002-of-00003.tfrecord: 100 bytes, the manifest says" in errors[0]
    assert "step " not in proc.stdout


@pytest.mark.timeout(240)
@pytest.mark.parametrize("layout", ["dp2", "dp2xpp2-zero"])
def test_parallel_layouts_equal_single_process(uninterrupted, crashed, layout):
    """DP=2 (DDP over gloo), and DP=2 x PP=2 on the 2-D mesh with ZeRO-1: the same losses, step by step, as one
    process on the same global batch (the crashed runs' steps before the kill; no extra runs)."""
    got = losses(crashed(layout) / "m.jsonl")
    assert sorted(got) == list(range(1, KILL_AFTER + 1))
    for step, loss in got.items():
        assert loss == pytest.approx(uninterrupted[step], rel=1e-5), step
    assert uninterrupted[CRASH_STEPS] < uninterrupted[1]
