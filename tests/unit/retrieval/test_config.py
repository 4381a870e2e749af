"""pipeline/retrieval/config.py: a retrieval job's --output never overlaps its inputs (review33: a sidecar with
--output <dataset>/<generation>/side was committed into the dataset's committed generation directory)."""
from __future__ import annotations

import pytest

from pipeline.errors import ConfigError
from pipeline.retrieval.config import BuildConfig, NeighboursConfig


@pytest.mark.parametrize("rel", ["ds/gen-abc/side", "ds", "db/side", "."])
def test_neighbours_output_inside_or_around_an_input_is_refused(tmp_path, rel):
    cfg = NeighboursConfig(dataset=str(tmp_path / "ds"), db=str(tmp_path / "db"), output=str(tmp_path / rel))
    with pytest.raises(ConfigError, match="overlaps --(dataset|db)"):
        cfg.validate()


@pytest.mark.parametrize("rel", ["ds/db", "ds"])
def test_build_output_inside_the_dataset_is_refused(tmp_path, rel):
    with pytest.raises(ConfigError, match="overlaps --dataset"):
        BuildConfig(dataset=str(tmp_path / "ds"), output=str(tmp_path / rel)).validate()


def test_outputs_beside_the_inputs_pass(tmp_path):
    NeighboursConfig(dataset=str(tmp_path / "ds"), db=str(tmp_path / "db"), output=str(tmp_path / "ds-side")).validate()
    BuildConfig(dataset=str(tmp_path / "ds"), output=str(tmp_path / "ds2")).validate()


def test_rerank_is_an_option_of_the_build_and_part_of_its_identity_only_when_set(tmp_path):
    """review33: `retrieval build --rerank K` (issue 33: "16-64 per query, an option")."""
    import argparse

    from pipeline.retrieval.cli import add_parsers

    root = argparse.ArgumentParser()
    sub = root.add_subparsers(dest="retrieval_command")
    add_parsers(lambda name, help: sub.add_parser(name, help=help))
    args = root.parse_args(["build", "--dataset", "d", "--output", "o", "--index", "IVF64,PQ48np", "--rerank", "32"])
    assert args.rerank == 32
    base = BuildConfig(dataset=str(tmp_path / "ds"), output=str(tmp_path / "db"))
    assert "rerank" not in base.identity()  # databases built before the option keep their fingerprints
    assert BuildConfig(dataset=base.dataset, output=base.output, rerank=32).identity()["rerank"] == 32
    with pytest.raises(ConfigError, match="--rerank"):
        BuildConfig(dataset=base.dataset, output=base.output, rerank=-1).validate()


def test_a_dense_encoders_batch_and_device_are_part_of_the_build_identity(tmp_path):
    """review33: MiniLM's vectors depend on the batch they are encoded in (padding to the batch's longest text:
    a 68-chunk database built with --batch-size 1 and 32 differed in every embeddings file and index part) yet
    both were committed as the same generation, and a build resumed with another --batch-size (or --device)
    would keep the finished shards' vectors and encode the rest differently under one fingerprint."""
    kw = dict(dataset=str(tmp_path / "ds"), output=str(tmp_path / "db"), encoder="minilm")
    ids = {BuildConfig(**kw, batch_size=b, device=d).identity()["encode"] != BuildConfig(**kw).identity()["encode"]
           for b, d in ((1, "cpu"), (64, "cuda"))}
    assert ids == {True}
    bm25 = dict(dataset=kw["dataset"], output=kw["output"])  # BM25 encodes nothing: its batch changes no byte
    assert BuildConfig(**bm25, batch_size=1).identity() == BuildConfig(**bm25).identity()
    assert "encode" not in BuildConfig(**bm25).identity()


def test_the_query_encoders_batch_and_device_are_part_of_the_sidecar_identity(tmp_path):
    """review33: the same for `retrieval neighbours`' query vectors (QueryVectors / Searcher encode in
    --batch-size batches): its fingerprint left them out."""
    kw = dict(dataset=str(tmp_path / "ds"), db=str(tmp_path / "db"), output=str(tmp_path / "nb"))
    assert NeighboursConfig(**kw, batch_size=1).encode_identity() != NeighboursConfig(**kw).encode_identity()
    assert NeighboursConfig(**kw, device="cuda").encode_identity() != NeighboursConfig(**kw).encode_identity()
