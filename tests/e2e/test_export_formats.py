"""Best-fit packing through the shard job, and `pileprep export --format megatron|hf|mds`, each format read back
by its own library (megatron-core's IndexedDataset, datasets.load_dataset, streaming.StreamingDataset) and
compared token for token with the TFRecord shards; exports verified, committed, resumed and kept like shards."""
from __future__ import annotations

import collections
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from model_contract import decode_example, read_records
from pipeline.config import ShardConfig, fingerprint
from pipeline.shard import shard_pipeline
from pipeline.tools import export_formats, export_summary
from pipeline.tools.verify import verify
from tests.corpus_fixtures import write_good_corpus

pytestmark = pytest.mark.formats
SEQ_LEN = 256
IN_MEMORY = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
REPO = pathlib.Path(__file__).resolve().parents[2]


def _config(corpus, out, tokenizer, **overrides) -> ShardConfig:
    return ShardConfig(inputs=(str(corpus / "*"),), output=str(out), tokenizer=tokenizer, seq_len=SEQ_LEN,
                       **{**dict(num_shards=2, val_fraction=0.1, test_fraction=0.1, unit_mb=0.25), **overrides})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    write_good_corpus(root, limit_bytes=400_000)
    return root


@pytest.fixture(scope="module")
def datasets(corpus, tiny_tokenizer, tmp_path_factory):
    base = tmp_path_factory.mktemp("ds")
    out = {}
    for packing in ("concat", "best-fit"):
        path = base / packing
        extra = {"packing": packing, "packing_window": 8} if packing == "best-fit" else {}
        manifest = shard_pipeline.run(_config(corpus, path, tiny_tokenizer, **extra), IN_MEMORY)
        out[packing] = (path, manifest)
    return out


def documents_of(path, manifest, split):
    """{(doc id, copy): tokens} and the order documents first appear, rebuilt from the shards' provenance."""
    pieces = collections.defaultdict(list)
    order = []
    for s in manifest["shards"]:
        if s["split"] != split:
            continue
        for record in read_records(str(path / s["path"])):
            ex = decode_example(record)
            for n, (doc, off) in enumerate(zip(ex["piece_doc_ids"], ex["piece_offsets"]), start=1):
                if off == 0:
                    order.append(int(doc))
                pieces[int(doc)].append((int(off), ex["input_ids"][ex["segment_ids"] == n]))
    docs = {d: np.concatenate([t for _, t in sorted(p, key=lambda p: p[0])]) for d, p in pieces.items()}
    return docs, order


def examples_of(path, manifest, split):
    return [decode_example(r) for s in manifest["shards"] if s["split"] == split
            for r in read_records(str(path / s["path"]))]


# ------------------------------------------------------------------------------------------- packing
def test_default_packing_keeps_config_fingerprint_and_manifest(corpus, tiny_tokenizer, tmp_path):
    base = _config(corpus, tmp_path, tiny_tokenizer)
    explicit = _config(corpus, tmp_path, tiny_tokenizer, packing="concat", packing_window=3)
    assert "packing" not in base.to_manifest_dict() and "packing_window" not in base.to_manifest_dict()
    assert base.to_manifest_dict() == explicit.to_manifest_dict()
    assert fingerprint(base, "t", []) == fingerprint(explicit, "t", [])
    best = _config(corpus, tmp_path, tiny_tokenizer, packing="best-fit")
    assert fingerprint(best, "t", []) != fingerprint(base, "t", [])  # other bytes: another generation
    other_window = _config(corpus, tmp_path, tiny_tokenizer, packing="best-fit", packing_window=3)
    assert fingerprint(best, "t", []) != fingerprint(other_window, "t", [])


def test_default_manifest_has_no_packing_section(datasets):
    _path, manifest = datasets["concat"]
    assert "packing" not in manifest and "packing" not in manifest["config"]


def test_best_fit_dataset_same_documents_none_that_fits_split(datasets):
    (cpath, cman), (bpath, bman) = datasets["concat"], datasets["best-fit"]
    assert bman["config"]["packing"] == "best-fit" and bman["config"]["packing_window"] == 8
    section = bman["packing"]
    for split in ("train", "val", "test"):
        concat_docs, _ = documents_of(cpath, cman, split)
        fit_docs, _ = documents_of(bpath, bman, split)
        assert concat_docs.keys() == fit_docs.keys()
        for d in concat_docs:
            assert np.array_equal(concat_docs[d], fit_docs[d])
        pieces = collections.Counter(d for ex in examples_of(bpath, bman, split) for d in ex["piece_doc_ids"].tolist())
        for d, tokens in fit_docs.items():
            if tokens.size <= SEQ_LEN:
                assert pieces[d] == 1, f"document {d:x} fits but was split"
        stats = section["splits"][split]
        assert stats["fitting_split"] == 0 and stats["documents"] == len(fit_docs)
        assert stats["pieces"] == sum(pieces.values())
        examples = sum(s["examples"] for s in bman["shards"] if s["split"] == split)
        padding = sum(s["padding_tokens"] for s in bman["shards"] if s["split"] == split)
        assert stats["padding_fraction"] == round(padding / (examples * SEQ_LEN), 8)


def test_best_fit_is_read_by_the_trainer_unchanged(datasets):
    from trainer.config import DataConfig, model_config
    from trainer.data import ShardLoader
    from trainer.dataset import open_dataset
    from trainer.loss import IGNORE_INDEX

    path, manifest = datasets["best-fit"]
    cfg = model_config("tiny", seq_len=SEQ_LEN, vocab_size=manifest["contract"]["tokenizer"]["vocab_size"],
                       n_layers=1, d_model=32, n_heads=2)
    m, mfile = open_dataset(DataConfig(path=str(path)), cfg)
    batch = next(iter(ShardLoader(m, mfile, DataConfig(path=str(path), streams=1, shuffle_buffer=1), SEQ_LEN, 4)))
    seg, labels = batch["segment_ids"].numpy(), batch["labels"].numpy()
    assert batch["input_ids"].shape == (4, SEQ_LEN)
    assert (labels[seg == 0] == IGNORE_INDEX).all()
    # a label never crosses from one document piece to the next
    crossing = (seg[:, 1:] != seg[:, :-1])
    assert (labels[:, :-1][crossing] == IGNORE_INDEX).all()


# -------------------------------------------------------------------------------------------- exports
@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_megatron_export_read_back_by_indexed_dataset(datasets, packing, tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    path, manifest = datasets[packing]
    out = tmp_path / "megatron"
    summary = export_formats.export_format(str(path), "megatron", str(out))
    gen = summary["generation"]
    assert summary["megatron"]["dtype"] == "uint16"  # Megatron's choice for a vocabulary under 65,500
    for split in ("train", "val", "test"):
        docs, order = documents_of(path, manifest, split)
        ds = IndexedDataset(str(out / gen / f"{split}_text_document"))
        assert len(ds) == len(order) == sum(s["documents"] for s in manifest["shards"] if s["split"] == split)
        assert ds.index.dtype == np.uint16
        for i, doc in enumerate(order):
            assert np.array_equal(ds[i].astype(np.int64), docs[doc]), f"{split} document {i}"
        assert ds[0][-1] == manifest["contract"]["tokenizer"]["eos_id"]
    assert verify(str(out)).ok


def test_hf_export_opened_by_datasets(datasets, tmp_path, monkeypatch):
    import datasets as hf

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path, manifest = datasets["best-fit"]
    out = tmp_path / "hf"
    summary = export_formats.export_format(str(path), "hf", str(out))
    loaded = hf.load_dataset(str(out / summary["generation"]), cache_dir=str(tmp_path / "cache"))
    assert sorted(loaded) == ["test", "train", "val"]
    for split in ("train", "val", "test"):
        want = examples_of(path, manifest, split)
        got = loaded[split]
        assert len(got) == len(want)
        for row, ex in zip(got, want):
            for name in ("input_ids", "segment_ids", "positions", "piece_doc_ids", "piece_offsets"):
                assert np.array_equal(np.asarray(row[name], dtype=np.int64), ex[name]), name
    assert verify(str(out)).ok


def test_mds_export_read_by_streaming_dataset(datasets, tmp_path):
    from streaming import StreamingDataset

    path, manifest = datasets["best-fit"]
    out = tmp_path / "mds"
    summary = export_formats.export_format(str(path), "mds", str(out))
    for split in ("train", "val"):
        want = examples_of(path, manifest, split)
        ds = StreamingDataset(local=str(out / summary["generation"] / split), shuffle=False, batch_size=1)
        assert ds.num_samples == len(want)
        for i, ex in enumerate(want):
            sample = ds[i]
            for name in ("input_ids", "segment_ids", "positions", "piece_doc_ids", "piece_offsets"):
                assert np.array_equal(np.asarray(sample[name], dtype=np.int64), ex[name]), name
    assert verify(str(out)).ok


def test_export_is_deterministic_resumable_and_verified(datasets, tmp_path):
    from pipeline.tools import export_megatron

    path, manifest = datasets["concat"]
    a, b = tmp_path / "a", tmp_path / "b"
    sa = export_formats.export_format(str(path), "megatron", str(a))
    sb = export_formats.export_format(str(path), "megatron", str(b))
    assert sa["files"] == sb["files"]  # byte-identical (sha256 per file)
    gen = sa["generation"]
    # a flipped byte is a mismatch by name
    target = a / gen / "val_text_document.bin"
    data = bytearray(target.read_bytes())
    data[3] ^= 1
    target.write_bytes(bytes(data))
    report = verify(str(a))
    assert not report.ok and any("val_text_document.bin" in m for m in report.mismatches)
    # killed after the train split: its done marker is reused while its files still hash to it; val is redone
    (b / "export.json").unlink()
    (b / export_summary.IN_PROGRESS_MARKER).write_bytes(b"")  # what a first export killed mid-way leaves
    shards = [export_formats_shard(s) for s in manifest["shards"]]
    for split, damaged in (("train", False), ("val", True)):
        key = export_formats._split_key("megatron", export_megatron, [s for s in shards if s.split == split])
        rows = [{**r, "path": r["path"].split("/", 1)[1]} for r in sb["files"] if r["split"] == split]
        marker = b / gen / export_formats.DONE_MARKER.format(split=split)
        marker.write_text(json.dumps({"key": key, "files": rows}))
        if damaged:
            (b / gen / "val_text_document.idx").write_bytes(b"x")
    train_bin, val_idx = b / gen / "train_text_document.bin", b / gen / "val_text_document.idx"
    before = train_bin.stat().st_mtime_ns
    again = export_formats.export_format(str(path), "megatron", str(b))
    assert again["files"] == sb["files"] and verify(str(b)).ok
    assert train_bin.stat().st_mtime_ns == before and val_idx.stat().st_size > 1
    assert not list((b / gen).glob(".pileprep-export-*"))  # markers go once export.json is committed


def export_formats_shard(row):
    from model_contract import ShardInfo

    return ShardInfo(**row)


def test_previous_generation_kept_older_removed(datasets, tmp_path):
    """The generation before the previous one is removed, and only a directory an export created: export.json's
    `previous` was trusted, so a crafted one made the export rmtree a user's directory in the output (issue 32's
    hostile review). A name with `/` or `..` is refused whole; a user's directory is kept (export_summary.py
    `own_generation`; a link inside an output is refused before, pipeline/ops/guards.py)."""
    path, _ = datasets["concat"]
    out = tmp_path / "keep"
    gen = export_formats.export_format(str(path), "megatron", str(out))["generation"]
    assert (out / gen / export_summary.GENERATION_STAMP).is_file()  # the export made it
    for name in ("gen0", "gen1", "mine", "theirs"):
        (out / name).mkdir()
        (out / name / "f").write_text(name)
        if name.startswith("gen"):
            export_summary.stamp_generation(str(out / name))  # as an earlier export made them
    (out / "export.json").write_text(json.dumps({"kind": "export", "format": "megatron", "generation": "gen1",
                                                 "previous": ["gen0", "mine"], "files": []}))
    summary = export_formats.export_format(str(path), "megatron", str(out))
    assert summary["generation"] == gen and summary["previous"] == ["gen1"]
    assert (out / "gen1" / "f").exists() and not (out / "gen0").exists()  # kept for readers / removed
    assert (out / "mine" / "f").read_text() == "mine"  # named by a crafted export.json, not an export's: kept
    assert (out / "theirs" / "f").exists()  # never named by an export.json: never touched
    with pytest.raises(Exception, match="holds a megatron export"):
        export_formats.export_format(str(path), "hf", str(out))
    for crafted in (["../../victim"], ["gen1/.."], "gen1"):
        (out / "export.json").write_text(json.dumps({"kind": "export", "format": "megatron", "generation": gen,
                                                     "previous": crafted, "files": []}))
        with pytest.raises(Exception, match="export.json: previous .* is not a list of generation names"):
            export_formats.export_format(str(path), "megatron", str(out))
        assert (out / "gen1" / "f").exists()


def test_a_refused_by_source_export_leaves_output_and_dataset_as_they_were(datasets, corpus, tmp_path, capsys):
    """--by-source refused (an input of the ledger gone) after the export had registered its ref in the dataset,
    written its in-progress marker and made the generation's directory (issue 32's hostile review): every check
    now runs before the first write, so a refused export leaves both exactly as it found them."""
    from pipeline import cli
    from tests.ops_fixtures import dataset_files

    path, _ = datasets["concat"]
    new, empty = tmp_path / "new", tmp_path / "empty"
    empty.mkdir()
    before = dataset_files(path)
    gone = sorted(corpus.iterdir())[0]
    away = tmp_path / gone.name
    shutil.move(gone, away)
    try:
        for out in (new, empty):
            rc = cli.main(["export", str(path), "--format", "megatron", "--by-source", "--output", str(out)])
            err = capsys.readouterr().err
            assert rc == 2 and len(err.strip().splitlines()) == 1 and f"input {gone} is gone" in err, (rc, err)
    finally:
        shutil.move(away, gone)
    assert not new.exists() and list(empty.iterdir()) == [] and dataset_files(path) == before


def corpus_sources(corpus) -> dict:
    """{document id: source} read from the corpus files here, not through the exporter's reader."""
    import zstandard

    from transforms.shard.documents import document_id

    out = {}
    for f in sorted(corpus.iterdir()):
        data = f.read_bytes()
        if f.suffix == ".zst":
            data = zstandard.ZstdDecompressor().stream_reader(data).read()
        for line in data.decode("utf-8").splitlines():
            record = json.loads(line)
            out.setdefault(document_id(record["text"]), record["meta"]["pile_set_name"])
    return out


def test_megatron_by_source_blend_read_back_per_prefix(datasets, corpus, tmp_path):
    """--by-source: one prefix per split and source, each read back by IndexedDataset holding exactly that source's
    documents in order; blend.json parsed by Megatron's own get_blend_from_list, weights the token shares."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.datasets.utils import get_blend_from_list, normalize

    path, manifest = datasets["concat"]
    out = tmp_path / "by-source"
    summary = export_formats.export_format(str(path), "megatron", str(out), by_source=True)
    gen = summary["generation"]
    source_of = corpus_sources(corpus)
    blend = json.loads((out / gen / "blend.json").read_text())
    assert blend == summary["megatron"]["blend"] and sorted(blend) == ["test", "train", "valid"]
    row_source = {r["path"][:-len(".bin")]: r["source"] for r in summary["files"] if r["path"].endswith(".bin")}
    for split, key in (("train", "train"), ("val", "valid"), ("test", "test")):
        docs, order = documents_of(path, manifest, split)
        prefixes, weights = get_blend_from_list(blend[key])
        assert len(prefixes) == len(manifest["sources"]) == 3
        seen, tokens = 0, []
        for prefix in prefixes:
            source = row_source[prefix]
            want = [d for d in order if source_of[d] == source]
            ds = IndexedDataset(str(out / prefix))
            assert len(ds) == len(want) == manifest["sources"][source][split]["documents"] > 0
            for i, d in enumerate(want):
                assert np.array_equal(ds[i].astype(np.int64), docs[d]), f"{prefix} document {i}"
            seen += len(ds)
            tokens.append(int(ds.index.sequence_lengths.sum()))
        assert seen == len(order)  # every document once, in one source's file
        assert np.allclose(normalize(weights), np.array(tokens) / sum(tokens), atol=1e-7)
    assert verify(str(out)).ok
    with pytest.raises(Exception, match="holds an export with --by-source"):  # never mixed in one output
        export_formats.export_format(str(path), "megatron", str(out))
    with pytest.raises(Exception, match="--by-source: only --format megatron"):
        export_formats.export_format(str(path), "mds", str(tmp_path / "mds"), by_source=True)


def test_cli_export_and_verify(datasets, tmp_path):
    from megatron.core.datasets.utils import get_blend_from_list

    path, _ = datasets["concat"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = tmp_path / "cli"
    run = subprocess.run([sys.executable, "-m", "pipeline.cli", "export", str(path), "--format", "megatron",
                          "--output", str(out), "--by-source"], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    shown = json.loads(run.stdout)
    assert shown["format"] == "megatron" and shown["by_source"] is True
    arguments = shown["megatron_arguments"]
    assert [a.split()[0] for a in arguments] == ["--train-data-path", "--valid-data-path", "--test-data-path"]
    for line in arguments:  # Megatron-LM's own parser; every prefix absolute and there
        prefixes, weights = get_blend_from_list(line.split()[1:])
        assert len(prefixes) == 3 and all(w > 0 for w in weights)
        assert all(os.path.isabs(p) and os.path.exists(p + ".bin") and os.path.exists(p + ".idx") for p in prefixes)
    run = subprocess.run([sys.executable, "-m", "pipeline.cli", "verify", str(out)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0 and "OK" in run.stdout, run.stdout + run.stderr
    shutil.rmtree(out)


# ------------------------------------------------------------------------------------ guards, on their own
def _piece_example(pieces, seq_len=8):
    """A decoded example from [(doc id, offset, tokens)], padded with 0."""
    ids, seg = [], []
    for k, (_d, _o, toks) in enumerate(pieces, start=1):
        ids += toks
        seg += [k] * len(toks)
    pad = seq_len - len(ids)
    return {"input_ids": np.array(ids + [0] * pad), "segment_ids": np.array(seg + [0] * pad),
            "piece_doc_ids": np.array([p[0] for p in pieces]), "piece_offsets": np.array([p[1] for p in pieces])}


def test_megatron_refuses_pieces_that_do_not_make_whole_documents(monkeypatch, tmp_path):
    from pipeline.tools import export_megatron as em

    job = export_formats.SplitJob("megatron", "train", [], "", None, str(tmp_path))

    def run(examples):
        monkeypatch.setattr(em, "_examples", lambda _job: (("s", r, ex) for r, ex in enumerate(examples)))
        plan = em.plan_documents(job)  # both passes into one file: every document in file 0
        return em.write_bins(job, plan, np.zeros(plan[2].size, dtype=np.int64), [str(tmp_path / "x.bin")],
                             np.dtype(np.uint16), eos_id=2)[0]

    lengths = run([_piece_example([(5, 0, [7, 8, 9, 1, 1, 1, 1, 1])]), _piece_example([(5, 8, [4, 2]), (6, 0, [2])])])
    assert lengths.tolist() == [10, 1]
    assert np.fromfile(tmp_path / "x.bin", dtype=np.uint16).tolist() == [7, 8, 9, 1, 1, 1, 1, 1, 4, 2, 2]
    with pytest.raises(em.ExportError, match="continues no piece"):  # a gap: offset 9 where 8 was next
        run([_piece_example([(5, 0, [7, 8, 9, 1, 1, 1, 1, 1])]), _piece_example([(5, 9, [4, 2])])])
    with pytest.raises(em.ExportError, match="does not end with EOS"):
        run([_piece_example([(5, 0, [7, 8, 9])])])
    with pytest.raises(em.ExportError, match="end to end"):
        bad = _piece_example([(5, 0, [7, 2]), (6, 0, [2])])
        bad["segment_ids"][:3] = [2, 1, 1]
        run([bad])


def test_verify_refuses_export_paths_that_leave_the_output(tmp_path):
    out = tmp_path / "exp"
    out.mkdir()
    (tmp_path / "secret").write_text("x")
    (out / "g").mkdir()
    os.symlink(tmp_path / "secret", out / "g" / "link")
    (out / "export.json").write_text(json.dumps({"kind": "export", "format": "megatron", "generation": "g",
                                                 "files": [{"path": "../secret", "bytes": 1, "sha256": "0" * 64},
                                                           {"path": "g/link", "bytes": 1, "sha256": "0" * 64}]}))
    report = verify(str(out))
    assert not report.ok and report.files_checked == 0
    assert any("leaves the output" in m for m in report.mismatches)
    assert any("through a link" in m for m in report.mismatches)


def test_report_states_the_packing_of_a_best_fit_dataset(datasets):
    from pipeline.tools.report import render_report

    page = render_report(datasets["best-fit"][1])
    assert 'id="packing"' in page and "split although they fit" in page and "best-fit" in page
    assert 'id="packing"' not in render_report(datasets["concat"][1])


def test_best_fit_same_bytes_with_the_runner_shuffle(datasets, corpus, tiny_tokenizer, tmp_path):
    """Both packers' call sites (pipeline/shard/shard_pipeline.py, pipeline/shard/runner_shuffle.py) pass the
    packing: the runner's shuffle makes the same shards as the file spill."""
    _path, manifest = datasets["best-fit"]
    again = shard_pipeline.run(_config(corpus, tmp_path / "runner", tiny_tokenizer, packing="best-fit",
                                       packing_window=8, shuffle="runner"), IN_MEMORY)
    assert [(s["path"], s["sha256"]) for s in again["shards"]] == [(s["path"], s["sha256"]) for s in
                                                                   manifest["shards"]]
    assert again["packing"] == manifest["packing"]


def test_dry_run_reports_what_best_fit_would_give(datasets, corpus, tiny_tokenizer, tmp_path):
    """--dry-run --packing best-fit: the padding and the documents cut, from the sample, near the real run's
    (the best-fit dataset of this module), and the examples sized by that padding; nothing written."""
    from pipeline.tools import dry_run

    _path, manifest = datasets["best-fit"]
    never = tmp_path / "never"
    est = dry_run.estimate(_config(corpus, never, tiny_tokenizer, packing="best-fit", packing_window=8), IN_MEMORY,
                           calibrated=False)
    assert not never.exists()
    shards = manifest["shards"]
    real_padding = sum(s["padding_tokens"] for s in shards) / (sum(s["examples"] for s in shards) * SEQ_LEN)
    p = est.packing
    assert p.packing == "best-fit" and p.best_fit["fitting_split"] == 0
    assert abs(p.best_fit["padding_fraction"] - real_padding) <= 0.25 * real_padding
    # 962 estimated, 948 written; sized as concat (no padding but each shard's last example) it was 913
    assert abs(est.examples - sum(s["examples"] for s in shards)) <= 0.025 * sum(s["examples"] for s in shards)
    text = dry_run.format_estimate(est)
    assert re.search(r"packing\s+best-fit", text) and re.search(r"padding\s+\d+\.\d\d%\s+best-fit", text)
