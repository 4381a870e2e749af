"""The shard job with --near-dedup and --decontaminate (pipeline/shard/near_dedup/), end to end.

A small corpus with planted near-copies (a header inserted and the case changed: exact Jaccard >= 0.9), one of
them in a --val-input file, and an evaluation file quoting one training document. Every removed document must
be filtered with its reason, its keeper (or eval file and n-gram) in the sidecar, the counts reconciled, and
the bytes the same on one in-memory worker, the portable runner (EXTERNAL worker pool) and DaskRunner (two
worker processes).
"""
from __future__ import annotations

import dataclasses
import errno
import json
import pathlib

import pytest

from model_contract import decode_example, read_records
from pipeline.config import ShardConfig
from pipeline.errors import RunError
from pipeline.shard import shard_pipeline
from pipeline.shard.near_dedup import band_files, sign
from pipeline.shard.near_dedup import edges as near_edges
from pipeline.shard.near_dedup.transform import NearDedup
from pipeline.shard.near_dedup.windows import RangeWindows
from tests.corpus_fixtures import good_documents, pile_line, write_zst
from tests.e2e.test_dask_runner import dask_cluster  # noqa: F401 - the module's Dask cluster fixture
from tests.ops_fixtures import portable_args, portable_services, run_cli  # noqa: F401
from transforms.shard import pack
from transforms.shard.near_dedup import hashing, minhash, shingling
from transforms.shard.near_dedup.band_index import BAND_RANGES
from transforms.shard.documents import document_id

pytestmark = pytest.mark.timeout(300)
IN_MEMORY = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
PLANTED = 8


def near_copy(text: str) -> str:
    return "Mirrored from an archive.\n" + text.upper()


def write_corpus(root: pathlib.Path, near_copy=near_copy) -> dict:
    """Files in root/in (train), root/val.jsonl (one held-out near-copy), root/eval.jsonl; returns the plan."""
    docs = good_documents(360_000)
    docs = [(t, s) for t, s in docs if len(shingling.normalised_words(t)) >= 60][:60]
    (root / "in").mkdir(parents=True)
    originals = docs[:PLANTED]
    copies = [(near_copy(t), s) for t, s in originals[1:]]
    write_zst(root / "in" / "a.jsonl.zst", [pile_line(t, s) for t, s in docs[: len(docs) // 2]])
    write_zst(root / "in" / "b.jsonl.zst", [pile_line(t, s) for t, s in docs[len(docs) // 2:] + copies])
    held_out = near_copy(originals[0][0])
    (root / "val.jsonl").write_bytes(pile_line(held_out, "HeldOut"))
    quoted, question = unique_passage(docs[PLANTED:])
    (root / "eval.jsonl").write_text(json.dumps({"question": {"text": question.title() + "?"}}) + "\n")
    return {"originals": [document_id(t) for t, _ in originals], "copies": [document_id(t) for t, _ in copies],
            "held_out": document_id(held_out), "contaminated": document_id(quoted), "texts": dict(
                (document_id(t), t) for t, _ in docs + copies + [(held_out, "HeldOut")])}


def unique_passage(docs: list) -> tuple:
    """(document, 20 of its words) whose 13-word windows no other document has (plain tuples, no hashing)."""
    grams = [{tuple(w[i:i + 13]) for i in range(len(w) - 12)}
             for w in (shingling.normalised_words(t) for t, _ in docs)]
    for d in range(len(docs) - 1, -1, -1):
        words = shingling.normalised_words(docs[d][0])
        others = set().union(*(g for k, g in enumerate(grams) if k != d))
        for start in range(0, len(words) - 20, 7):
            passage = words[start:start + 20]
            if not {tuple(passage[i:i + 13]) for i in range(8)} & others:
                return docs[d][0], " ".join(passage)
    raise AssertionError("no unique passage in the corpus")


def config(root: pathlib.Path, out: pathlib.Path, tokenizer: str, **kw) -> ShardConfig:
    """--near-dedup-verify (staged shingles read back by whichever worker checks a pair) and 3 rounds (pairs
    converge in 2): every unrolled round is a stage, which on DaskRunner costs seconds."""
    kw = {"near_dedup_verify": True, "near_dedup_rounds": 3, "decontaminate": (str(root / "eval.jsonl"),),
          "decontaminate_field": "question.text", **kw}
    return ShardConfig(inputs=(str(root / "in" / "*"),), output=str(out), tokenizer=tokenizer, seq_len=128,
                       num_shards=2, unit_mb=0.05, val_inputs=(str(root / "val.jsonl"),), near_dedup=True, **kw)


def files_of(out: pathlib.Path) -> dict:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and "_staging" not in p.parts}


def shard_doc_ids(out: pathlib.Path, manifest: dict) -> set:
    ids = set()
    for s in manifest["shards"]:
        for record in read_records(str(out / s["path"])):
            ex = decode_example(record)
            ids.update(int(d) for d, off in zip(ex["piece_doc_ids"], ex["piece_offsets"]) if off == 0)
    return ids


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_tokenizer):
    root = tmp_path_factory.mktemp("neardedup")
    plan = write_corpus(root)
    manifest = shard_pipeline.run(config(root, root / "one", tiny_tokenizer), IN_MEMORY, progress_every_s=0)
    return root, plan, manifest, tiny_tokenizer


def sidecar_rows(out: pathlib.Path, manifest: dict) -> list:
    rows = []
    for f in manifest["near_dedup"]["sidecars"]:
        rows += [json.loads(line) for line in (out / f["path"]).read_text().splitlines()]
    return rows


def test_near_copies_and_contaminated_documents_are_filtered_with_keeper_and_reason(built):
    root, plan, manifest, _tok = built
    out = root / "one"
    rows = {r["id"]: r for r in sidecar_rows(out, manifest)}
    near = {i: r for i, r in rows.items() if r["reason"] == "near_duplicate"}
    # each planted copy goes, its original stays; the held-out copy wins over its train original
    for original, copy in zip(plan["originals"][1:], plan["copies"]):
        assert near[copy]["keeper"] == original if original < copy else near[original]["keeper"] == copy
    assert near[plan["originals"][0]]["keeper"] == plan["held_out"]
    # nothing else is removed unless it really is a near-copy (exact Jaccard of the shingles)
    for i, r in near.items():
        truth = minhash.exact_jaccard(shingling.shingles(plan["texts"][i]),
                                      shingling.shingles(plan["texts"][r["keeper"]]))
        assert truth >= 0.8 and abs(truth - r["jaccard"]) < 0.2  # verified: exact Jaccard >= the threshold
    assert rows[plan["contaminated"]]["reason"] == "contaminated"
    assert rows[plan["contaminated"]]["eval_file"].endswith("eval.jsonl")
    assert len(rows[plan["contaminated"]]["ngram"].split()) == 13
    kept = shard_doc_ids(out, manifest)
    assert not kept & set(rows) and plan["held_out"] in kept
    filtered = manifest["records"]["filtered"]
    assert filtered["near_duplicate"] == len(near) == PLANTED
    assert filtered["contaminated"] == 1
    r = manifest["records"]
    assert r["read"] == r["written"] + sum(r["filtered"].values()) + sum(r["dead_lettered"].values())
    by_source = manifest["near_dedup"]["removed_by_source"]
    assert sum(by_source["near_duplicate"].values()) == PLANTED
    assert manifest["near_dedup"]["cluster_sizes"] == {"2": PLANTED}
    pair = manifest["near_dedup"]["example_pairs"][0]
    assert pair["removed_text"] and pair["keeper_text"] and pair["removed"] == min(near)
    assert manifest["contract"]["version"] == "1.4"


def test_rounds_too_few_fail_the_run_naming_the_option(built, tmp_path):
    root, _plan, _manifest, tok = built
    with pytest.raises(RunError, match="--near-dedup-rounds"):
        shard_pipeline.run(config(root, tmp_path / "r", tok, near_dedup_rounds=1,
                                  near_dedup_verify=False), IN_MEMORY, progress_every_s=0)
    assert not (tmp_path / "r" / "manifest.json").exists()


def cli_args(root: pathlib.Path, out: pathlib.Path, tok: str, *extra) -> list:
    return ["shard", "--input", str(root / "in" / "*"), "--output", str(out), "--tokenizer", tok, "--seq-len",
            "128", "--num-shards", "2", "--unit-mb", "0.05", "--val-input", str(root / "val.jsonl"),
            "--near-dedup", "--near-dedup-verify", "--near-dedup-rounds", "3", "--decontaminate",
            str(root / "eval.jsonl"), "--decontaminate-field", "question.text",
            "--progress-every", "0", *extra]


def assert_same_files(reference: pathlib.Path, got: pathlib.Path) -> None:
    a, b = files_of(reference), files_of(got)
    assert a.keys() == b.keys()
    assert [k for k in a if a[k] != b[k]] == []


def test_dask_runner_with_two_workers_writes_the_same_bytes(built, tmp_path, dask_cluster):
    root, _plan, _manifest, tok = built
    res = run_cli(cli_args(root, tmp_path / "dask", tok, "--runner=DaskRunner",
                           f"--dask_client_address={dask_cluster['address']}"), timeout_s=200)
    assert res.returncode == 0, res.stderr[-3000:]
    assert_same_files(root / "one", tmp_path / "dask")


def test_portable_runner_through_its_own_group_by_key_writes_the_same_bytes(built, tmp_path, portable_services):
    """--shuffle runner: band keys meet in the runner's GroupByKey (local runners default to staged files)."""
    root, _plan, _manifest, tok = built
    res = run_cli(cli_args(root, tmp_path / "portable", tok, "--shuffle", "runner",
                           *portable_args(portable_services)), timeout_s=200)
    assert res.returncode == 0, res.stderr[-3000:] + portable_services["logs"][1].read_text()[-2000:]
    assert_same_files(root / "one", tmp_path / "portable")


def test_bounded_key_windows_write_the_same_bytes_as_one_window_per_range(built, tmp_path, monkeypatch):
    """Files shuffle with a window of 4 band rows (band_files.WINDOW_ROWS): every key-range task works
    through dozens of windows, none over the cap unless one fine window alone is, and shards, manifest,
    sidecars and band index are the bytes of the built run (one window per range at this corpus's size)."""
    root, _plan, _manifest, tok = built
    monkeypatch.setattr(band_files, "WINDOW_ROWS", 4)
    seen = []  # (rows held, fine windows in the window), per window of every task
    windows = RangeWindows.windows

    def counted(self):
        for w, (parts, committed) in enumerate(windows(self)):
            seen.append((sum(a.size for _n, a in parts) + len(committed), self.cuts[w + 1] - self.cuts[w]))
            yield parts, committed

    monkeypatch.setattr(RangeWindows, "windows", counted)
    shard_pipeline.run(config(root, tmp_path / "windows", tok), IN_MEMORY, progress_every_s=0)
    # two tasks per range (edges, band index), each through its windows
    assert len(seen) > 2 * BAND_RANGES * 10
    assert all(rows <= 4 or fine == 1 for rows, fine in seen)
    assert sum(rows for rows, _f in seen) > 0
    assert_same_files(root / "one", tmp_path / "windows")


def test_hot_buckets_streamed_in_chunks_write_the_same_bytes(built, tmp_path, monkeypatch):
    """Every bucket of more than one row taken as hot (edges.py HOT_BUCKET_ROWS = 1): its Nodes made
    two at a time (_hot_bucket_edges), not all at once: the bytes of the built run."""
    root, _plan, _manifest, tok = built
    monkeypatch.setattr(near_edges, "HOT_BUCKET_ROWS", 1)
    monkeypatch.setattr(near_edges, "HOT_CHUNK", 2)
    streamed = []
    hot = near_edges.hot_bucket_edges

    def counted(*args):
        streamed.append(args[1])
        yield from hot(*args)

    monkeypatch.setattr(near_edges, "hot_bucket_edges", counted)
    shard_pipeline.run(config(root, tmp_path / "hot", tok), IN_MEMORY, progress_every_s=0)
    assert len(streamed) >= PLANTED
    assert_same_files(root / "one", tmp_path / "hot")

@pytest.mark.parametrize("signed_in_tokenize", [False, True], ids=["text-read", "tokenize-signed"])
def test_a_rerun_after_a_failure_while_packing_skips_the_finished_near_dedup_stage(built, tmp_path, monkeypatch,
                                                                                   signed_in_tokenize):
    """The global stage has its own completion marker (pipeline/shard/resume.py NEAR_DEDUP): a run that fails
    after it keeps it, and the rerun leaves the stage out of its graph and writes the uninterrupted bytes. With
    plain --near-dedup the tokenize stage signs the documents, and each unit's marker names its signatures."""
    root, _plan, _manifest, tok = built
    # (no --decontaminate, so no --decontaminate-field either: an orphan option is refused, pipeline/config.py)
    kw = ({"near_dedup_verify": False, "decontaminate": (), "decontaminate_field": "text"}
          if signed_in_tokenize else {})
    twin = root / "one"
    if signed_in_tokenize:
        twin = tmp_path / "twin"
        shard_pipeline.run(config(root, twin, tok, **kw), IN_MEMORY, progress_every_s=0)
    out = tmp_path / "out"
    pack_shard = pack.pack_shard

    def fail(*_args, **_kw):
        raise OSError(errno.EIO, "injected failure while packing")

    monkeypatch.setattr(pack, "pack_shard", fail)
    with pytest.raises(Exception, match="injected failure while packing"):
        shard_pipeline.run(config(root, out, tok, **kw), IN_MEMORY, progress_every_s=0)
    (staging,) = (out / "_staging").glob("gen-*[!s]")  # (not the .progress directory beside it)
    marker = json.loads((staging / "done" / "near-dedup.json").read_text())
    assert {(r["root"], r["path"]) for r in marker["files"]} >= {("staging", "near-dedup/removals.json"),
                                                                ("data", "near-dedup/summary.json")}
    units = [json.loads(m.read_text()) for m in (staging / "done").glob("unit-*.json")]
    signed = [u for u in units if any(r["path"].endswith(".sigs") for r in u["files"])]
    assert units and len(signed) == (len(units) if signed_in_tokenize else 0)
    monkeypatch.setattr(pack, "pack_shard", pack_shard)

    def stage_again(_self, _units):
        raise AssertionError("the near-dedup stage ran again")

    monkeypatch.setattr(NearDedup, "expand", stage_again)
    shard_pipeline.run(config(root, out, tok, **kw), IN_MEMORY, progress_every_s=0)
    assert_same_files(twin, out)


def test_token_shingles_remove_verbatim_near_copies_from_the_token_ids(tmp_path, tiny_tokenizer):
    """--near-dedup-shingles tokens: shingles from the tokenize stage's ids (no second read of the text; the
    text is still read for --decontaminate). A copy with a header is found; an upper-cased one would not be
    (it tokenizes differently: docs/NEAR_DEDUP.md), so this corpus keeps the copies' case. One in-memory run:
    the runners' byte identity is the words runs' above (same graph after signing)."""
    plan = write_corpus(tmp_path, lambda text: "Mirrored from an archive.\n" + text)
    out = tmp_path / "tokens"
    manifest = shard_pipeline.run(config(tmp_path, out, tiny_tokenizer, near_dedup_shingles="tokens"), IN_MEMORY,
                                  progress_every_s=0)
    rows = {r["id"]: r for r in sidecar_rows(out, manifest)}
    near = {i: r for i, r in rows.items() if r["reason"] == "near_duplicate"}
    for original, copy in zip(plan["originals"][1:], plan["copies"]):
        assert near[copy]["keeper"] == original if original < copy else near[original]["keeper"] == copy
    assert near[plan["originals"][0]]["keeper"] == plan["held_out"]
    assert len(near) == PLANTED and rows[plan["contaminated"]]["reason"] == "contaminated"
    assert manifest["near_dedup"]["minhash"]["shingles"] == "tokens"
    assert manifest["config"]["near_dedup_shingles"] == "tokens"
    r = manifest["records"]
    assert r["read"] == r["written"] + sum(r["filtered"].values()) + sum(r["dead_lettered"].values())


def test_signatures_from_the_tokenize_stage_and_from_the_c_path_write_the_same_bytes(tmp_path, tiny_tokenizer,
                                                                                     monkeypatch):
    """Word shingles without --near-dedup-verify or --decontaminate: the tokenize stage signs each document
    while its text is in memory (tokenize_unit.TokenizeSettings.near_dedup_params) and the near-dedup stage reads no
    text at all. The same bytes as signing re-read text in the near-dedup stage, and as the numpy path without
    the C extension (transforms/shard/_shingles.c). One input file holds no document (its unit has none)."""
    from pipeline.shard.near_dedup import unit_docs

    plan = write_corpus(tmp_path)
    write_zst(tmp_path / "in" / "c.jsonl.zst", [pile_line("   ", "Blank")])  # a unit without a document

    def run(name):
        cfg = dataclasses.replace(config(tmp_path, tmp_path / name, tiny_tokenizer, near_dedup_verify=False),
                                  decontaminate=(), decontaminate_field="text")  # no --decontaminate-field alone
        return shard_pipeline.run(cfg, IN_MEMORY, progress_every_s=0)

    def no_text(*_a, **_k):
        raise AssertionError("the near-dedup stage read the chunk although the tokenize stage signed it")

    with monkeypatch.context() as m:
        m.setattr(unit_docs, "unit_documents", no_text)
        manifest = run("tokenize-signed")
    near = {r["id"]: r for r in sidecar_rows(tmp_path / "tokenize-signed", manifest)}
    for original, copy in zip(plan["originals"][1:], plan["copies"]):
        assert near[copy]["keeper"] == original if original < copy else near[original]["keeper"] == copy
    assert len(near) == PLANTED and manifest["records"]["filtered"]["near_duplicate"] == PLANTED
    with monkeypatch.context() as m:
        m.setattr(sign, "tokenize_signing", lambda _config: None)
        run("text-signed")
    assert_same_files(tmp_path / "tokenize-signed", tmp_path / "text-signed")
    if hashing.fast is not None:
        with monkeypatch.context() as m:
            m.setattr(hashing, "fast", None)
            run("numpy")
        assert_same_files(tmp_path / "tokenize-signed", tmp_path / "numpy")
