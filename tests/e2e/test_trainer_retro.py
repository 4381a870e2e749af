"""RETRO in the trainer (--retro-sidecar): real shards, a BM25 chunk database and a neighbours sidecar built by
the retrieval pipeline on a tiny corpus; `torchrun` runs the trainer with chunked cross-attention.

* PP=2 (neighbours travel with each micro-batch to both stages) computes the same loss and the same gradient
  of every parameter as one process, and a stopped-and-resumed run continues exactly;
* a sidecar of another shard generation is refused before any process-group work: exit 2, naming it.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from pipeline.config import ShardConfig
from pipeline.retrieval import build, neighbours
from pipeline.retrieval.config import BuildConfig, NeighboursConfig
from pipeline.shard import shard_pipeline
from tests.corpus_fixtures import write_good_corpus
from tests.trainer_launch import REPO, env, losses, run_trainer

SEQ_LEN, CHUNK = 64, 16
IN_MEMORY = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
MODEL = ["--n-layers", "2", "--d-model", "32", "--n-heads", "2", "--data-streams", "2", "--shuffle-buffer", "8",
         "--global-batch", "4", "--threads", "1", "--warmup-steps", "1", "--lr", "1e-2", "--log-every", "1"]


@pytest.fixture(scope="module")
def data(tiny_tokenizer, tmp_path_factory):
    """(dataset dir, sidecar dir): shards, then the chunk database and the aligned neighbours sidecar."""
    root = tmp_path_factory.mktemp("retro-corpus")
    write_good_corpus(root, limit_bytes=40_000, files=1)
    base = tmp_path_factory.mktemp("retro")
    ds, db, nb = base / "ds", base / "db", base / "nb"
    shard_pipeline.run(ShardConfig(inputs=(str(root / "*"),), output=str(ds), tokenizer=tiny_tokenizer,
                                   seq_len=SEQ_LEN, num_shards=2, val_fraction=0.0, test_fraction=0.0,
                                   unit_mb=0.05), IN_MEMORY)
    build.run(BuildConfig(dataset=str(ds), output=str(db), chunk_len=CHUNK, num_db_shards=1), IN_MEMORY)
    neighbours.run(NeighboursConfig(dataset=str(ds), db=str(db), output=str(nb), neighbour_len=2 * CHUNK),
                   IN_MEMORY)
    return str(ds), str(nb)


def _grads(d, ranks):
    out = {}
    for r in ranks:
        out.update(torch.load(f"{d}/grads-rank{r}.pt"))
    return out


@pytest.mark.timeout(300)
def test_retro_pp2_matches_one_process_and_resumes_exactly(data, tmp_path):
    ds, nb = data
    common = ["--data", ds, "--retro-sidecar", nb, "--retro-layers", "0,1", *MODEL, "--steps", "3"]
    run_trainer(1, common + ["--metrics-file", str(tmp_path / "one.jsonl")],
                hooks={"dump_grads": str(tmp_path / "g1")})
    pp = common + ["--pp", "2", "--microbatches", "2", "--partition", "even", "--checkpoint-dir", str(tmp_path / "ck"),
                   "--metrics-file", str(tmp_path / "pp.jsonl")]
    run_trainer(2, pp + ["--stop-at-step", "2"], hooks={"dump_grads": str(tmp_path / "g2")})
    proc = run_trainer(2, pp)
    assert "resumed from" in proc.stdout and "at step 2" in proc.stdout
    one, got = losses(tmp_path / "one.jsonl"), losses(tmp_path / "pp.jsonl")
    assert sorted(got) == [1, 2, 3]
    for step in one:
        assert got[step] == pytest.approx(one[step], rel=1e-5), step
    ref, par = _grads(tmp_path / "g1", [0]), _grads(tmp_path / "g2", [0, 1])
    retro = [n for n in ref if n.startswith("retro.")]
    assert {n.split(".")[1] for n in retro} == {"0", "1"}
    stage1 = _grads(tmp_path / "g2", [1])
    assert any(n.startswith("retro.") for n in stage1)  # the second stage owns a CCA layer: neighbours reach it
    assert set(par) >= set(ref) - {"head.weight"}
    for name, g in ref.items():
        if name in par:
            assert torch.allclose(par[name], g, rtol=1e-4, atol=1e-7), name
    # the neighbours reach the model: CCA's query projection and the encoder's embedding learn
    assert all(ref[f"retro.{i}.cca.q.weight"].abs().sum() > 0 for i in (0, 1))
    assert all(ref[f"retro.{i}.emb.weight"].abs().sum() > 0 for i in (0, 1))


@pytest.mark.timeout(120)
def test_sidecar_of_another_generation_is_refused(data, tmp_path):
    ds, nb = data
    stale = tmp_path / "stale-nb"
    shutil.copytree(nb, stale)
    m = json.loads((stale / "manifest.json").read_text())
    m["retrieval"]["dataset_generation"] = "gen-00000000000000aa"
    (stale / "manifest.json").write_text(json.dumps(m))
    proc = subprocess.run([sys.executable, "-m", "trainer.train", "--data", ds, "--retro-sidecar", str(stale),
                           *MODEL, "--steps", "1"], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=90)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"--retro-sidecar {stale}" in proc.stderr and "generation gen-00000000000000aa" in proc.stderr
    assert "Traceback" not in proc.stderr
