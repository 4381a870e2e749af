"""`pileprep verify` refuses damaged data, naming the file; its audit proves content.

File checks: a flipped byte, a truncated shard, a 0-byte shard, two shards swapped, a damaged dead letter —
each is exit 1 naming the file; a good dataset is exit 0. Audit: a seeded sample of input documents,
re-tokenized with plain SentencePiece, is found once and token-exact; a document whose tokens were altered in
a shard (with the manifest's checksums updated, as a buggy tokenizer would leave it) fails the audit.
"""
from __future__ import annotations

import hashlib
import json
import pathlib
import shutil

import numpy as np
import pytest

from model_contract import decode_example, encode_example, frame_record, read_records
from pipeline.cli import main as cli_main
from pipeline.config import ShardConfig
from pipeline.shard import shard_pipeline
from pipeline.tools.verify import verify
from pipeline.tools.verify_audit import sample_records
from tests.corpus_fixtures import good_documents, pile_line, write_zst
from tests.ops_fixtures import s3_server  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(300)
FAST = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]


@pytest.fixture(scope="module")
def built(tiny_tokenizer, tmp_path_factory):
    """A small dataset with shards in every split, dead letters, a filtered line and a duplicate."""
    root = tmp_path_factory.mktemp("verify-in")
    docs = good_documents(200_000, doc_chars=1500)
    lines = [pile_line(t, s) for t, s in docs]
    write_zst(root / "a.jsonl.zst", lines[::2])
    bad = [b'{"text": "unterminated\n', b"\n", b'{"text": 42}\n', pile_line(*docs[1])]  # dead, blank, dead, dup
    (root / "b.jsonl").write_bytes(b"".join(lines[1::2]) + b"".join(bad))
    out = tmp_path_factory.mktemp("verify-out") / "ds"
    config = ShardConfig(inputs=(str(root / "*"),), output=str(out), tokenizer=tiny_tokenizer, seq_len=128,
                         num_shards=2, val_fraction=0.2, test_fraction=0.2, unit_mb=0.05)
    manifest = shard_pipeline.run(config, FAST, progress_every_s=0)
    assert manifest["dead_letters"] and len({s["split"] for s in manifest["shards"]}) == 3
    return root, out, manifest


def damaged_copy(out: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    return copy


def verify_cli(dataset, *extra, capsys):
    rc = cli_main(["verify", str(dataset), *extra])
    return rc, capsys.readouterr().out


def test_a_good_dataset_verifies(built, capsys):
    _root, out, manifest = built
    rc, text = verify_cli(out, capsys=capsys)
    assert rc == 0, text
    expected = len(manifest["shards"]) + len(manifest["dead_letters"]) + len(manifest["doc_id_indexes"])
    assert f"{expected} files" in text and "OK" in text


def _flip_byte(p: pathlib.Path):
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))


def _truncate(p: pathlib.Path):
    data = p.read_bytes()
    first = 12 + int.from_bytes(data[:8], "little") + 4  # cut at a record boundary: a valid, shorter TFRecord
    p.write_bytes(data[:first])


@pytest.mark.parametrize("damage", ["flipped_byte", "truncated", "zero_bytes"])
def test_each_damaged_shard_is_named_with_exit_1(built, tmp_path, capsys, damage):
    _root, out, manifest = built
    copy = damaged_copy(out, tmp_path)
    shard = manifest["shards"][-1]["path"]
    target = copy / shard
    {"flipped_byte": _flip_byte, "truncated": _truncate, "zero_bytes": lambda p: p.write_bytes(b"")}[damage](target)
    rc, text = verify_cli(copy, capsys=capsys)
    assert rc == 1, text
    mismatches = [line for line in text.splitlines() if "MISMATCH" in line]
    assert len(mismatches) == 1 and shard in mismatches[0], text


def test_two_swapped_shards_are_both_named(built, tmp_path, capsys):
    _root, out, manifest = built
    copy = damaged_copy(out, tmp_path)
    a, b = [s["path"] for s in manifest["shards"] if s["split"] == "train"][:2]
    data_a, data_b = (copy / a).read_bytes(), (copy / b).read_bytes()
    (copy / a).write_bytes(data_b)
    (copy / b).write_bytes(data_a)
    rc, text = verify_cli(copy, capsys=capsys)
    assert rc == 1
    mismatches = [line for line in text.splitlines() if "MISMATCH" in line]
    assert len(mismatches) == 2 and a in mismatches[0] + mismatches[1] and b in mismatches[0] + mismatches[1]


def test_missing_shard_and_damaged_dead_letter_are_named(built, tmp_path, capsys):
    _root, out, manifest = built
    copy = damaged_copy(out, tmp_path)
    (copy / manifest["shards"][0]["path"]).unlink()
    dead = copy / manifest["dead_letters"][0]
    dead.write_bytes(dead.read_bytes().replace(b"unterminated", b"Unterminated"))
    rc, text = verify_cli(copy, capsys=capsys)
    assert rc == 1
    assert f"shard {manifest['shards'][0]['path']}: missing or unreadable" in text
    assert f"dead letter {manifest['dead_letters'][0]}: sha256" in text


def test_audit_finds_every_sampled_document_once_and_token_exact(built, tiny_tokenizer):
    root, out, _manifest = built
    report = verify(str(out), inputs=[str(root / "*")], sample=10_000, seed=1)
    assert report.ok, report.render()
    a = report.audit
    assert a.sampled == a.documents + a.dead_lettered + a.filtered + 0  # every record accounted for
    assert a.dead_lettered == 2 and a.filtered == 1 and a.documents > 50


def test_audit_skips_a_fifo_and_a_link_to_dev_zero_among_its_inputs(built, tmp_path):
    """`verify --inputs` listed its globs unscreened: a FIFO or a link to /dev/zero matched blocked the audit's
    sample forever (pipeline/ops/input_checks.py `readable_inputs` now screens them as the shard job does)."""
    import os
    import threading

    root, out, _manifest = built
    os.mkfifo(tmp_path / "fifo.jsonl")
    os.symlink("/dev/zero", tmp_path / "zero.jsonl")
    done = []
    # In a daemon thread: a regression blocks in open() or reads /dev/zero forever; the test fails, not hangs.
    worker = threading.Thread(target=lambda: done.append(
        verify(str(out), inputs=[str(root / "*"), str(tmp_path / "*")], sample=20, seed=1)), daemon=True)
    worker.start()
    worker.join(120)
    if worker.is_alive():
        os.close(os.open(tmp_path / "fifo.jsonl", os.O_WRONLY | os.O_NONBLOCK))  # unblock a reader of the FIFO
    assert done, "the audit blocked on a FIFO or /dev/zero"
    assert done[0].ok and done[0].audit.sampled == 20, done[0].render()


def test_audit_sample_is_seeded_and_sized(built):
    root, _out, _manifest = built
    paths = sorted(str(p) for p in root.iterdir())
    first = sample_records(paths, 20, seed=4)
    assert len(first) == 20 and first == sample_records(paths, 20, seed=4)
    assert first != sample_records(paths, 20, seed=5)


def _alter_one_token(copy: pathlib.Path, shard: dict) -> int:
    """Change one token of the first document piece of a shard; fix the manifest's checksum (as a job that
    tokenized wrongly would have written it). Returns the document id."""
    path = copy / shard["path"]
    records = list(read_records(str(path)))
    ex = decode_example(records[0])
    seg = ex["segment_ids"]
    ids = ex["input_ids"].copy()
    ids[np.flatnonzero(seg == 1)[0]] ^= 1
    ex["input_ids"] = ids
    records[0] = encode_example(ex)
    data = b"".join(frame_record(r) for r in records)
    path.write_bytes(data)
    m = json.loads((copy / "manifest.json").read_text())
    for s in m["shards"]:
        if s["path"] == shard["path"]:
            s["bytes"], s["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (copy / "manifest.json").write_text(json.dumps(m, sort_keys=True, indent=1))
    return int(ex["piece_doc_ids"][0])


def test_audit_fails_when_a_documents_tokens_are_altered(built, tmp_path, capsys):
    root, out, manifest = built
    copy = damaged_copy(out, tmp_path)
    doc = _alter_one_token(copy, manifest["shards"][0])
    rc, text = verify_cli(copy, "--inputs", str(root / "*"), "--sample", "10000", capsys=capsys)
    assert rc == 1, text
    assert "MISMATCH" not in text  # the files match the manifest: only the content audit can see this
    problems = [line for line in text.splitlines() if "PROBLEM" in line]
    assert len(problems) == 1 and f"{doc:#x}" in problems[0] and "tokens differ" in problems[0], text


def test_audit_fails_when_a_document_is_missing(built, tmp_path):
    root, out, manifest = built
    copy = damaged_copy(out, tmp_path)
    # drop the last record of a shard (and fix its checksum): its documents are gone
    shard = manifest["shards"][0]
    path = copy / shard["path"]
    records = list(read_records(str(path)))
    lost = {int(d) for d in decode_example(records[-1])["piece_doc_ids"]}
    data = b"".join(frame_record(r) for r in records[:-1])
    path.write_bytes(data)
    m = json.loads((copy / "manifest.json").read_text())
    m["shards"][0]["bytes"], m["shards"][0]["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (copy / "manifest.json").write_text(json.dumps(m))
    report = verify(str(copy), inputs=[str(root / "*")], sample=10_000)
    assert not report.ok and not report.mismatches
    assert any(f"{d:#x}" in p for p in report.audit.problems for d in lost)


def test_verify_an_s3_dataset(built, s3_server):  # noqa: F811
    from apache_beam.options.pipeline_options import PipelineOptions

    from transforms.io.filesystem_options import set_filesystem_options

    _root, out, manifest = built
    client = s3_server.client()
    client.create_bucket(Bucket="verify")
    for p in sorted(out.rglob("*")):
        if p.is_file():
            client.upload_file(str(p), "verify", "ds/" + str(p.relative_to(out)))
    fs_args = s3_server.beam_args() + ["--s3_access_key_id=testing", "--s3_secret_access_key=testing"]
    try:
        good = verify("s3://verify/ds", filesystem_args=fs_args)
        assert good.ok and good.files_checked == len(manifest["shards"]) + len(manifest["dead_letters"]) + 1, \
            good.render()
        shard = manifest["shards"][1]["path"]
        client.put_object(Bucket="verify", Key="ds/" + shard, Body=(out / shard).read_bytes()[:-1])
        bad = verify("s3://verify/ds", filesystem_args=fs_args)
        assert not bad.ok and len(bad.mismatches) == 1 and shard in bad.mismatches[0], bad.render()
    finally:  # verify gave the process S3 options: back to none
        set_filesystem_options(PipelineOptions([]))


def _resolver_refuses_outside_paths() -> bool:
    from model_contract import ContractError, ShardInfo, resolve_shard_path

    try:
        resolve_shard_path("/d/manifest.json", ShardInfo("../x.tfrecord", "train", 0, 0, 0, 0, 0, ""))
    except ContractError:
        return True
    return False


@pytest.mark.skipif(not _resolver_refuses_outside_paths(),
                    reason="model_contract.resolve_shard_path does not refuse paths outside the dataset yet "
                           "(the hardened resolver)")
@pytest.mark.parametrize("bad_path", ["/etc/hostname", "../outside.tfrecord"])
def test_inspect_and_verify_refuse_shard_paths_outside_the_dataset(built, tmp_path, capsys, bad_path):
    from model_contract import ContractError
    from pipeline.tools.inspect_dataset import inspect

    _root, out, _manifest = built
    copy = damaged_copy(out, tmp_path)
    m = json.loads((copy / "manifest.json").read_text())
    m["shards"][0]["path"] = bad_path
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ContractError, match="outside|relative"):
        inspect(str(copy), examples=1)
    rc = cli_main(["verify", str(copy)])  # a manifest that fails its schema: one line, exit 2
    err = capsys.readouterr().err
    assert rc == 2 and bad_path in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------ near-dedup band index (transforms/shard/
# near_dedup/band_index.py): the files an --incremental --near-dedup run trusts to keep near-copies out
def _band_rows(num_perm: int, key_range: int) -> np.ndarray:
    from transforms.shard.near_dedup.band_index import row_dtype

    rows = np.zeros(3, row_dtype(num_perm))
    rows["key"] = (key_range << 60) + np.array([1, 2, 2], dtype=np.uint64)  # top 3 bits: the file's range
    rows["doc_id"], rows["split"] = [7, 3, 9], [0, 1, 2]
    rows["sig"] = np.arange(num_perm, dtype=np.uint32)
    return rows


def _with_band_index(out: pathlib.Path, tmp_path: pathlib.Path, damage=None) -> tuple:
    """A copy of the dataset listing two band index files (ranges 0 and 5) as a --near-dedup build does;
    `damage(rows) -> bytes` rewrites range 5's file and its manifest row to match it (a file damaged before it
    was listed, or a writer bug: size and sha256 alone cannot catch it)."""
    copy = damaged_copy(out, tmp_path)
    m = json.loads((copy / "manifest.json").read_text())
    from transforms.shard.near_dedup.minhash import DEFAULT_BANDS, DEFAULT_ROWS

    m["config"].update(near_dedup=True, near_dedup_bands=DEFAULT_BANDS, near_dedup_rows=DEFAULT_ROWS)
    num_perm = DEFAULT_BANDS * DEFAULT_ROWS
    (copy / m["generation"] / "near-dedup").mkdir()
    listed = []
    for r in (0, 5):
        data = _band_rows(num_perm, r).tobytes() if damage is None or r != 5 else damage(_band_rows(num_perm, r))
        rel = f"{m['generation']}/near-dedup/band-index-r{r:02d}.bin"
        (copy / rel).write_bytes(data)
        listed.append({"generation": m["generation"], "range": r, "path": rel, "bytes": len(data),
                       "sha256": hashlib.sha256(data).hexdigest()})
    m["near_dedup_band_indexes"] = listed
    (copy / "manifest.json").write_text(json.dumps(m))
    return copy, listed[1]["path"]


def test_band_index_files_are_checked_and_a_damaged_one_is_named(built, tmp_path, capsys):
    _root, out, manifest = built
    good, _ = _with_band_index(out, tmp_path / "good")
    rc, text = verify_cli(good, capsys=capsys)
    expected = len(manifest["shards"]) + len(manifest["dead_letters"]) + len(manifest["doc_id_indexes"]) + 2
    assert rc == 0 and f"{expected} files" in text, text

    copy, rel = _with_band_index(out, tmp_path / "flipped")
    _flip_byte(copy / rel)
    rc, text = verify_cli(copy, capsys=capsys)
    mismatches = [line for line in text.splitlines() if "MISMATCH" in line]
    assert rc == 1 and len(mismatches) == 1 and f"band index {rel}: sha256" in mismatches[0], text

    def unsorted(rows):
        return rows[::-1].tobytes()

    def outside(rows):
        rows["key"][2] = (6 << 60) + 5
        return rows.tobytes()

    for name, damage, says in (("unsorted", unsorted, "not sorted"), ("outside", outside, "outside range 5"),
                               ("partial", lambda rows: rows.tobytes()[:-3], "not a whole number")):
        copy, rel = _with_band_index(out, tmp_path / name, damage)
        rc, text = verify_cli(copy, capsys=capsys)
        mismatches = [line for line in text.splitlines() if "MISMATCH" in line]
        assert rc == 1 and len(mismatches) == 1 and f"band index {rel}: " in mismatches[0], (name, text)
        assert says in mismatches[0], (name, text)
