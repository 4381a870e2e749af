"""--incremental --near-dedup (pipeline/shard/near_dedup/, transforms/shard/near_dedup/band_index.py).

Generation A holds distinct documents and one within-A near-copy pair; the train-only addition B holds
near-copies of A's documents (one of them a copy of the A document whose own copy A removed), a new-vs-new pair
and distinct documents. A full build of A and B and "build A, then add B incrementally" must keep the same
documents and filter the same number of near-copies (B's copies of committed documents are
`near_duplicate_of_committed` incrementally, `near_duplicate` in the full build). The planted copies get ids
above their originals': with "committed documents win" that is the condition under which the two can be
equal (docs/NEAR_DEDUP.md), tested on its own in tests/unit/shard/test_near_dedup_band_index.py.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib

import pytest

from pipeline.config import ShardConfig
from pipeline.shard import shard_pipeline
from pipeline.shard.near_dedup import band_files, sign
from pipeline.shard.near_dedup import edges as near_edges
from pipeline.shard.near_dedup.manifest import BAND_INDEXES
from pipeline.shard.near_dedup.windows import RangeWindows
from tests.corpus_fixtures import good_documents, pile_line, write_zst
from tests.e2e.test_near_dedup_pipeline import IN_MEMORY, assert_same_files, shard_doc_ids, sidecar_rows
from transforms.shard.near_dedup import band_index, minhash, shingling
from transforms.shard.near_dedup.band_index import BAND_RANGES
from transforms.shard.documents import document_id

pytestmark = pytest.mark.timeout(300)


def copy_above(text: str) -> str:
    """A near-copy (a header, upper case: exact Jaccard >= 0.9) whose id is larger than the original's."""
    for k in range(100):
        copy = f"Mirrored from archive {k}.\n" + text.upper()
        if document_id(copy) > document_id(text):
            return copy
    raise AssertionError("no variant with a larger id")


def write_corpus(root: pathlib.Path) -> dict:
    docs = [t for t, _s in good_documents(400_000) if len(shingling.normalised_words(t)) >= 60][:44]
    a_docs, b_docs = docs[:20], docs[20:]
    a_copy = copy_above(a_docs[0])  # removed by A itself
    b_of_committed = [copy_above(t) for t in a_docs[1:5]]
    b_of_removed = copy_above("Re-uploaded.\n" + a_docs[0])  # near A's keeper of a cluster A already resolved
    b_pair = copy_above(b_docs[0])  # new vs new
    (root / "in").mkdir(parents=True)
    write_zst(root / "in" / "a.jsonl.zst", [pile_line(t, "A") for t in a_docs + [a_copy]])
    write_zst(root / "in" / "b.jsonl.zst", [pile_line(t, "B") for t in b_docs + b_of_committed + [b_of_removed, b_pair]])
    return {"a_docs": [document_id(t) for t in a_docs], "a_copy": document_id(a_copy),
            "of_committed": {document_id(c): document_id(t) for c, t in zip(b_of_committed, a_docs[1:5])},
            "of_removed": document_id(b_of_removed), "b_pair": document_id(b_pair)}


def config(inputs: str, out: pathlib.Path, tokenizer: str) -> ShardConfig:
    return ShardConfig(inputs=(inputs,), output=str(out), tokenizer=tokenizer, seq_len=128, num_shards=2,
                       unit_mb=0.05, near_dedup=True, near_dedup_verify=True, near_dedup_rounds=3)


@pytest.fixture(scope="module")
def builds(tmp_path_factory, tiny_tokenizer):
    root = tmp_path_factory.mktemp("ndincr")
    plan = write_corpus(root)
    full = shard_pipeline.run(config(str(root / "in" / "*"), root / "full", tiny_tokenizer), IN_MEMORY,
                              progress_every_s=0)
    first = shard_pipeline.run(config(str(root / "in" / "a.*"), root / "inc", tiny_tokenizer), IN_MEMORY,
                               progress_every_s=0)
    added = shard_pipeline.run(config(str(root / "in" / "*"), root / "inc", tiny_tokenizer), IN_MEMORY,
                               incremental_run=True, progress_every_s=0)
    return root, plan, full, first, added


def filtered(manifest: dict) -> dict:
    return {k: v for k, v in manifest["records"].get("filtered", {}).items() if k.startswith("near_duplicate")}


def test_incremental_addition_keeps_the_documents_a_full_build_keeps(builds):
    root, plan, full, first, added = builds
    assert len(added["generations"]) == 2
    kept_full, kept_inc = shard_doc_ids(root / "full", full), shard_doc_ids(root / "inc", added)
    assert kept_full == kept_inc
    assert not kept_inc & (set(plan["of_committed"]) | {plan["a_copy"], plan["of_removed"], plan["b_pair"]})
    assert set(plan["a_docs"]) <= kept_inc
    # the same number of near-copies filtered; incrementally, B's copies of A's documents say so
    assert filtered(full) == {"near_duplicate": 7}
    assert filtered(added) == {"near_duplicate": 2, "near_duplicate_of_committed": 5}
    for key in ("read", "written"):
        assert full["records"][key] == added["records"][key]
    rows = {r["id"]: r for r in sidecar_rows(root / "inc", added)}
    committed_gen = first["generation"]
    for copy_id, original in [*plan["of_committed"].items(), (plan["of_removed"], plan["a_docs"][0])]:
        assert rows[copy_id]["reason"] == "near_duplicate_of_committed"
        assert (rows[copy_id]["keeper"], rows[copy_id]["keeper_generation"]) == (original, committed_gen)
    assert rows[plan["b_pair"]]["reason"] == "near_duplicate"


def test_each_generation_lists_its_band_index_of_kept_documents_with_sha256(builds):
    root, plan, _full, first, added = builds
    entries = added[BAND_INDEXES]
    assert {e["generation"] for e in entries} == {first["generation"], added["generation"]}
    num_perm = minhash.MinHashParams().num_perm
    indexed = {}
    for e in entries:
        data = (root / "inc" / e["path"]).read_bytes()
        assert e["path"].startswith(e["generation"] + "/near-dedup/")
        assert (len(data), hashlib.sha256(data).hexdigest()) == (e["bytes"], e["sha256"])
        rows = band_index.decode(data, num_perm, e["path"])
        indexed.setdefault(e["generation"], set()).update(int(i) for i in rows["doc_id"])
    # kept documents only, each generation its own: A's removed copy and B's removed copies are not listed
    assert indexed[first["generation"]] == set(plan["a_docs"]) | set(
        i for i in shard_doc_ids(root / "inc", first))
    assert plan["a_copy"] not in indexed[first["generation"]]
    assert not indexed[added["generation"]] & (set(plan["of_committed"]) | {plan["of_removed"], plan["b_pair"]})
    assert indexed[added["generation"]] == shard_doc_ids(root / "inc", added) - indexed[first["generation"]]
    # `pileprep verify` checks the same files (size, sha256, rows sorted and in their range) and passes them
    from pipeline.tools.verify import verify  # noqa: PLC0415

    report = verify(str(root / "inc"))
    assert report.ok and report.files_checked >= len(entries) + len(added["shards"]), report.render()
    # the committed manifest's section for the newest generation summarises only that one
    assert json.loads(json.dumps(added["near_dedup"]["removed"])) == {"near_duplicate": 1,
                                                                     "near_duplicate_of_committed": 5}


def test_the_runner_shuffle_reads_the_committed_band_index_the_same_way(builds, tiny_tokenizer):
    """--shuffle runner: committed rows enter the runner's GroupByKey on band keys (not the staged key ranges)."""
    root, _plan, _full, _first, added = builds
    out = root / "inc-runner"
    for inputs, incremental in ((str(root / "in" / "a.*"), False), (str(root / "in" / "*"), True)):
        cfg = config(inputs, out, tiny_tokenizer)
        got = shard_pipeline.run(dataclasses.replace(cfg, shuffle="runner"), IN_MEMORY,
                                 incremental_run=incremental, progress_every_s=0)
    assert got["records"] == added["records"]
    assert shard_doc_ids(out, got) == shard_doc_ids(root / "inc", added)
    assert sidecar_rows(out, got) == sidecar_rows(root / "inc", added)
    band_bytes = [[(out_dir / e["path"]).read_bytes() for e in m[BAND_INDEXES]]
                  for out_dir, m in ((out, got), (root / "inc", added))]
    assert band_bytes[0] == band_bytes[1]


def test_bounded_key_windows_read_the_committed_band_index_by_window_to_the_same_bytes(builds, tiny_tokenizer,
                                                                                       monkeypatch):
    """Files shuffle with windows of 4 band rows (band_files.WINDOW_ROWS): the committed generation's band
    index files are read a window's slice at a time; both generations are the bytes of one window per range."""
    root, _plan, _full, _first, added = builds
    monkeypatch.setattr(band_files, "WINDOW_ROWS", 4)
    held = []
    windows = RangeWindows.windows

    def counted(self):
        for parts, committed in windows(self):
            held.append(len(committed))
            yield parts, committed

    monkeypatch.setattr(RangeWindows, "windows", counted)
    out = root / "inc-windows"
    for inputs, incremental in ((str(root / "in" / "a.*"), False), (str(root / "in" / "*"), True)):
        got = shard_pipeline.run(config(inputs, out, tiny_tokenizer), IN_MEMORY, incremental_run=incremental,
                                 progress_every_s=0)
    assert len(held) > 4 * BAND_RANGES and 0 < max(held) <= 4
    assert_same_files(root / "inc", out)
    assert got == added

def test_hot_buckets_with_committed_members_are_streamed_to_the_same_bytes(builds, tiny_tokenizer, monkeypatch):
    """Every bucket of more than one row taken as hot (edges.py HOT_BUCKET_ROWS = 1), committed members
    among them: both generations are the bytes of the default."""
    root, _plan, _full, _first, added = builds
    monkeypatch.setattr(near_edges, "HOT_BUCKET_ROWS", 1)
    monkeypatch.setattr(near_edges, "HOT_CHUNK", 2)
    committed = []
    hot = near_edges.hot_bucket_edges

    def counted(*args):
        committed.append(len(args[3]))
        yield from hot(*args)

    monkeypatch.setattr(near_edges, "hot_bucket_edges", counted)
    out = root / "inc-hot"
    for inputs, incremental in ((str(root / "in" / "a.*"), False), (str(root / "in" / "*"), True)):
        got = shard_pipeline.run(config(inputs, out, tiny_tokenizer), IN_MEMORY, incremental_run=incremental,
                                 progress_every_s=0)
    assert committed and max(committed) > 0
    assert_same_files(root / "inc", out)
    assert got == added

def test_incremental_signatures_from_the_tokenize_stage_are_the_text_paths_bytes(tmp_path, tiny_tokenizer,
                                                                                 monkeypatch):
    """Without --near-dedup-verify the tokenize stage signs the documents (docs/NEAR_DEDUP.md "Signed where the
    text is in memory"); incrementally the near-dedup stage must still leave out exact copies of committed
    documents (their ids are in a committed doc-ids.idx) and pick the same copies as when it reads the text."""
    plan = write_corpus(tmp_path)
    a_text = [t for t, _s in good_documents(400_000) if len(shingling.normalised_words(t)) >= 60][3]
    write_zst(tmp_path / "in" / "c.jsonl.zst", [pile_line(a_text, "C")])  # an exact copy of a committed document

    def build(name):
        def cfg(inputs):
            return dataclasses.replace(config(inputs, tmp_path / name, tiny_tokenizer), near_dedup_verify=False)
        shard_pipeline.run(cfg(str(tmp_path / "in" / "a.*")), IN_MEMORY, progress_every_s=0)
        return shard_pipeline.run(cfg(str(tmp_path / "in" / "*")), IN_MEMORY, incremental_run=True,
                                  progress_every_s=0)

    added = build("tokenize-signed")
    assert filtered(added) == {"near_duplicate": 2, "near_duplicate_of_committed": 5}
    assert sum(added["duplicates_by_source"].values()) == 1
    rows = {r["id"] for r in sidecar_rows(tmp_path / "tokenize-signed", added)}
    assert set(plan["of_committed"]) <= rows and document_id(a_text) not in rows
    with monkeypatch.context() as m:
        m.setattr(sign, "tokenize_signing", lambda _config: None)
        build("text-signed")
    files = [{str(p.relative_to(tmp_path / d)): p.read_bytes() for p in sorted((tmp_path / d).rglob("*"))
              if p.is_file() and "_staging" not in p.parts} for d in ("tokenize-signed", "text-signed")]
    assert files[0].keys() == files[1].keys() and [k for k in files[0] if files[0][k] != files[1][k]] == []
