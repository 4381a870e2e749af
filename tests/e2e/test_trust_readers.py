"""Every command that reads a dataset's shards reads them checked, and names its per-shard outputs uniquely.

On a two-generation dataset (two `--incremental` runs, the same shard basenames in both generations) the
neighbours sidecar holds one file per shard and passes `verify`; with one shard file swapped for another the
retrieval build and neighbours jobs refuse by the shard's name and commit nothing.
"""
from __future__ import annotations

import json
import shutil

import pytest

from model_contract import load_manifest
from pipeline.retrieval import build, neighbours
from pipeline.retrieval.config import BuildConfig, NeighboursConfig
from pipeline.tools.verify import verify
from tests.generation_fixtures import two_generation_dataset

IN_MEMORY = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
CHUNK = 32
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def two_generations(tiny_tokenizer, tmp_path_factory):
    out, manifest = two_generation_dataset(tmp_path_factory.mktemp("readers"), tiny_tokenizer)
    db = out.parent / "db"
    build.run(BuildConfig(dataset=str(out), output=str(db), chunk_len=CHUNK, num_db_shards=1, sources=False),
              IN_MEMORY)
    return out, manifest, db


@pytest.fixture(scope="module")
def sidecar(two_generations):
    out, _manifest, db = two_generations
    side = neighbours.run(NeighboursConfig(dataset=str(out), db=str(db), output=str(out.parent / "nb"),
                                           neighbour_len=2 * CHUNK), IN_MEMORY)
    return out.parent / "nb", side


def test_sidecar_of_two_generations_has_one_file_per_shard_and_verifies(two_generations, sidecar):
    out, manifest, db = two_generations
    nb, side = sidecar
    paths = [s["path"] for s in side["shards"]]
    assert len(set(paths)) == len(paths) == len(manifest["shards"])
    aligned = side["retrieval"]["aligned"]
    assert [a["shard"] for a in aligned] == [s["path"] for s in manifest["shards"]]
    assert [a["examples"] for a in aligned] == [s["examples"] for s in manifest["shards"]]
    report = verify(str(nb))
    assert report.mismatches == [], report.mismatches
    load_manifest(str(nb))  # the committed sidecar manifest reads back


@pytest.fixture()
def swapped(two_generations, tmp_path):
    """A copy of the dataset whose first shard file is the second's (valid TFRecord, wrong size and count)."""
    out, manifest, db = two_generations
    copy = tmp_path / "swapped"
    shutil.copytree(out, copy)
    first, second = (copy / s["path"] for s in manifest["shards"][:2])
    shutil.copy(second, first)
    return copy, manifest["shards"][0]["path"], db


def test_retrieval_build_refuses_a_swapped_shard_by_name(swapped, tmp_path):
    copy, name, _db = swapped
    with pytest.raises(Exception, match=rf"shard {name}: \d+ bytes, the manifest says"):
        build.run(BuildConfig(dataset=str(copy), output=str(tmp_path / "db"), chunk_len=CHUNK, num_db_shards=1,
                              sources=False), IN_MEMORY)
    assert not (tmp_path / "db" / "manifest.json").exists()


def test_retrieval_neighbours_refuses_a_swapped_shard_by_name(swapped, tmp_path):
    copy, name, db = swapped
    with pytest.raises(Exception, match=rf"shard {name}: \d+ bytes, the manifest says"):
        neighbours.run(NeighboursConfig(dataset=str(copy), db=str(db), output=str(tmp_path / "nb"),
                                        neighbour_len=2 * CHUNK), IN_MEMORY)
    assert not (tmp_path / "nb" / "manifest.json").exists()
    assert json.loads((copy / "manifest.json").read_text())["shards"][0]["path"] == name  # dataset untouched


def test_retrieval_show_reads_checked_records_and_refuses_an_example_out_of_range(two_generations, sidecar,
                                                                                 swapped):
    """`retrieval show` (pipeline/retrieval/show.py) read its record unchecked: a swapped shard was shown as if
    its neighbours belonged to it, and an example past the shard's end was a StopIteration traceback."""
    from pipeline.errors import ConfigError
    from pipeline.retrieval.show import show

    out, manifest, db = two_generations
    nb, _side = sidecar
    assert f"{manifest['shards'][0]['path']} example 1, chunk" in show(str(out), str(db), str(nb), example=1)
    copy, name, _db = swapped
    with pytest.raises(Exception, match=rf"shard {name}: \d+ bytes, the manifest says"):
        show(str(copy), str(db), str(nb))
    with pytest.raises(ConfigError, match=rf"--example {manifest['shards'][0]['examples']}: {name} holds"):
        show(str(out), str(db), str(nb), example=manifest["shards"][0]["examples"])


def test_every_dataset_reader_refuses_a_sidecar_in_one_line(two_generations, sidecar, tmp_path, capsys):
    """A sidecar's manifest has the dataset format and passes its schema: inspect, report, export and the
    retrieval jobs given one failed on a missing feature (KeyError, exit 1; export left a ref and a directory).
    pipeline/ops/commit.py `require_dataset` refuses it by kind."""
    from pipeline import cli
    from tests.ops_fixtures import dataset_files

    _out, _manifest, db = two_generations
    nb, _side = sidecar
    before = dataset_files(nb)
    for args in (["inspect", str(nb)], ["report", str(nb), "--output", str(tmp_path / "r.html")],
                 ["export", str(nb), "--output", str(tmp_path / "x")],
                 ["retrieval", "build", "--dataset", str(nb), "--output", str(tmp_path / "db"), *IN_MEMORY],
                 ["retrieval", "neighbours", "--dataset", str(nb), "--db", str(db), "--output", str(tmp_path / "n"),
                  *IN_MEMORY],
                 ["retrieval", "show", "--dataset", str(nb), "--db", str(db), "--neighbours", str(nb)]):
        assert cli.main(args) == 2, args
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "it holds a sidecar, not a dataset" in err, (args, err)
    assert dataset_files(nb) == before and not any((tmp_path / name).exists() for name in ("x", "db", "n"))


def test_verify_inspect_and_report_given_a_chunk_database_say_what_it_is(two_generations, tmp_path, capsys):
    """A chunk database's manifest has its own format: parsed as a dataset's it was refused as "not a pileprep
    manifest (format='pileprep.retrieval_db')". pipeline/ops/commit.py `parse_manifest` says what it is."""
    from pipeline import cli
    from tests.ops_fixtures import dataset_files

    _out, _manifest, db = two_generations
    before = dataset_files(db)
    for args in (["verify", str(db)], ["verify", str(db / "manifest.json")], ["inspect", str(db)],
                 ["report", str(db), "--output", str(tmp_path / "r.html")],
                 ["export", str(db), "--output", str(tmp_path / "x")]):
        assert cli.main(args) == 2, args
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "is a retrieval chunk database, not a dataset" in err, (args, err)
    assert dataset_files(db) == before and not any((tmp_path / name).exists() for name in ("r.html", "x"))
