"""Memory is bounded by the limits, whatever the input on the real CLI in a child process.

The same code paths as bench/memory_bench.py (3 GiB zstd bomb, 300 MB line, a document at the default limit,
4 Mi blank lines), scaled down: inputs of at most 256 MiB decompressed, `--max-line-mb 1`. Peak RSS is the
child's own (tests/measured_cli.py: VmHWM and RUSAGE_CHILDREN inside it), compared with a reference run of the
same command on the good documents alone, measured in the same test.
"""
from __future__ import annotations

import gzip
import json
import os
import pathlib
import subprocess
import sys
import tracemalloc

import pytest

from pipeline.config import MAX_SEQ_LEN, ShardConfig
from pipeline.errors import ConfigError
from tests.corpus_fixtures import good_documents, pile_line
from tests.measured_cli import CHILD_CODE, peak_mb
from tests.unit.io.test_read_records import zstd_bomb

REPO = pathlib.Path(__file__).resolve().parents[2]
IN_MEMORY = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
MiB = 1 << 20



HOSTILE_RECORDS = [pile_line("a good document", "S"),
                   b'{"text": "big", "meta": {"n": ' + b"1" * 5000 + b"}}\n",
                   b"[" * 100_000 + b"]" * 100_000 + b"\n",
                   b'{"text": "first", "text": "second"}\n']


def run_cli_measured(args: list, timeout: int = 300) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", CHILD_CODE, *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=REPO)  # `python -c` puts the working directory first on sys.path
    return proc, peak_mb(proc.stdout)


def shard_args(inputs: str, out: pathlib.Path, tokenizer: str, *extra: str) -> list:
    # SentencePiece itself: the fast backend's memory on texts up to FAST_BACKEND_MAX_CHARS (1 MiB, the scaled-down
    # limit here) is its own figure (bench/memory_bench.py at the default limit; test_long_texts_... below)
    return ["shard", "--input", inputs, "--output", str(out), "--tokenizer", tokenizer, "--seq-len", "256",
            "--num-shards", "1", "--val-fraction", "0", "--test-fraction", "0", "--tokenizer-backend",
            "sentencepiece", *extra, *IN_MEMORY]


# ---------------------------------------------------------------------------------------------- config
def test_seq_len_upper_bound_is_checked_before_any_work(tmp_path, capsys):
    config = ShardConfig(inputs=("x",), output=str(tmp_path / "o"), tokenizer="t", seq_len=1_000_000_000)
    with pytest.raises(ConfigError, match=r"--seq-len 1000000000 is above the limit .* GiB"):
        config.validate()
    ShardConfig(inputs=("x",), output="o", tokenizer="t", seq_len=MAX_SEQ_LEN).validate()
    with pytest.raises(ConfigError, match="--max-zstd-window-mb"):
        ShardConfig(inputs=("x",), output="o", tokenizer="t", max_zstd_window_mb=4096).validate()
    from pipeline.cli import main

    # main accepted it and grew until the kernel killed the job; the input is absent so that main fails safely
    rc = main(["shard", "--input", str(tmp_path / "absent" / "*"), "--output", str(tmp_path / "o"),
               "--tokenizer", "t.model", "--seq-len", "1000000000"])
    err = capsys.readouterr().err
    assert rc == 2 and "--seq-len 1000000000" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------------------- bounded runs
@pytest.mark.timeout(600)
def test_hostile_inputs_keep_peak_rss_near_a_normal_run(tmp_path, tiny_tokenizer):
    """A 256 MiB zstd bomb (one line), a 64 MiB line without newline (gzip), a document at the limit, 256 Ki
    blank lines and hostile records, with --max-line-mb 1: the run succeeds, each is accounted for, and peak RSS
    stays within 96 MiB of a run on the good documents alone. Main failed the whole job in Tokenize on the
    >4,300-digit integer, and held the bomb's whole decompressed block plus a copy (> 512 MiB above the
    reference)."""
    good = tmp_path / "good"
    good.mkdir()
    docs = good_documents(100_000)
    (good / "good.jsonl").write_bytes(b"".join(pile_line(t, s) for t, s in docs))
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    (hostile / "good.jsonl").write_bytes((good / "good.jsonl").read_bytes())
    (hostile / "bomb.jsonl.zst").write_bytes(zstd_bomb(256 * MiB, pile_line("after the bomb", "S")))
    (hostile / "noline.jsonl.gz").write_bytes(gzip.compress(b"y" * (64 * MiB), compresslevel=1))
    at_limit = pile_line("z" * (MiB - 64), "S")
    assert MiB - 100 < len(at_limit) - 1 <= MiB
    (hostile / "limit.jsonl").write_bytes(at_limit + pile_line("z" * MiB, "S"))
    (hostile / "blank.jsonl").write_bytes(b"\n" * (256 << 10) + pile_line("after blanks", "S"))
    (hostile / "records.jsonl").write_bytes(b"".join(HOSTILE_RECORDS))

    ref, ref_peak = run_cli_measured(shard_args(str(good / "*"), tmp_path / "ref", tiny_tokenizer,
                                                "--max-line-mb", "1"))
    assert ref.returncode == 0, ref.stderr[-2000:]
    proc, peak = run_cli_measured(shard_args(str(hostile / "*"), tmp_path / "out", tiny_tokenizer,
                                             "--max-line-mb", "1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    per_file = {pathlib.Path(i["path"]).name: i for i in manifest["inputs"]}
    assert per_file["bomb.jsonl.zst"]["dead_lettered"] == {"line_too_long": 1}
    assert per_file["bomb.jsonl.zst"]["written"] == 1  # reading went on after the bomb's line
    assert per_file["noline.jsonl.gz"]["dead_lettered"] == {"line_too_long": 1}
    assert per_file["limit.jsonl"]["written"] == 1 and per_file["limit.jsonl"]["dead_lettered"] == {
        "line_too_long": 1}
    assert per_file["blank.jsonl"]["filtered"] == {"blank_line": 256 << 10} and per_file["blank.jsonl"]["written"] == 1
    for info in per_file.values():
        assert info["read"] == info["written"] + sum(info["filtered"].values()) + sum(info["dead_lettered"].values())
    rows = [json.loads(line) for rel in manifest["dead_letters"]
            for line in (tmp_path / "out" / rel).read_text().splitlines()]
    bomb_row = next(r for r in rows if r["file"].endswith("bomb.jsonl.zst"))
    assert bomb_row["line"] == 1 and bomb_row["reason"] == "line_too_long" and bomb_row["excerpt"].startswith("xxx")
    records = [r for r in rows if r["file"].endswith("records.jsonl")]
    assert sorted((r["line"], r["reason"]) for r in records) == [(2, "number_too_long"), (3, "json_too_deep"),
                                                                 (4, "duplicate_key")]
    assert all(r["excerpt"] for r in records) and per_file["records.jsonl"]["written"] == 1
    assert peak < ref_peak + 96, f"peak RSS {peak:.0f} MB against {ref_peak:.0f} MB for the good documents alone"


def test_tokenizer_training_reader_is_bounded_the_same_way(tmp_path):
    from pipeline.tools.tokenizer_train import train_tokenizer

    corpus = tmp_path / "in"
    corpus.mkdir()
    (corpus / "good.jsonl").write_bytes(b"".join(pile_line(t, s) for t, s in good_documents(60_000)))
    (corpus / "bomb.jsonl.zst").write_bytes(zstd_bomb(64 * MiB, pile_line("after", "S")))
    (corpus / "hostile.jsonl").write_bytes(b'{"text": "n", "n": ' + b"1" * 5000 + b"}\n"
                                           b'{"text": "a", "text": "b"}\n')
    tracemalloc.start()
    try:
        summary = train_tokenizer([str(corpus / "*")], str(tmp_path / "m.model"), 400, max_line_bytes=MiB)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert summary["rejected"] == {"line_too_long": 1, "number_too_long": 1, "duplicate_key": 1}
    assert peak < 32 * MiB, f"Python heap peaked at {peak / MiB:.0f} MiB while reading a 64 MiB line"


def test_many_tiny_records_are_cut_into_bounded_chunks(tmp_path, tiny_tokenizer):
    """Blank, broken or tiny lines cost the tokenize stage a few hundred bytes each (index row, dead-letter row);
    main cut chunks by raw bytes alone, so 32 MiB of 1-byte lines was one chunk of 16 Mi records on one worker."""
    import numpy as np

    from transforms.shard import cut, tokenize_unit
    from transforms.tokenize import tokenizer

    path = tmp_path / "tiny.jsonl"
    path.write_bytes(b"x\n\n" * 7_000 + b'{"text": "a"}\n' * 7_000)
    unit_bytes = 512 << 10
    result = cut.cut_input_file(0, str(path), str(tmp_path / "st"), str(tmp_path / "data"), unit_bytes, MiB)
    assert sum(c.records for c in result.chunks) == 21_000
    assert max(c.records for c in result.chunks) <= unit_bytes // cut.RECORD_OVERHEAD_BYTES + 1
    sp = tokenizer.load_processor(pathlib.Path(tiny_tokenizer).read_bytes())
    settings = tokenize_unit.TokenizeSettings("text", ("meta.pile_set_name",), 0.0, 0.0, 0)
    units = []
    for i, chunk in enumerate(result.chunks):
        if i == 0:
            tracemalloc.start()
        try:
            units.append(tokenize_unit.tokenize_chunk(chunk, sp, np.dtype("<u2"), settings, str(tmp_path / "st"),
                                               str(tmp_path / "data")))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        # one chunk of at most unit_bytes / 256 records stays small; main's one chunk held all 21,000 records
        assert i > 0 or peak < 2 * MiB, f"one chunk's tokenize held {peak / MiB:.1f} MiB"
    assert sum(u.stats.dead_lettered.get("invalid_json", 0) for u in units) == 7_000
    assert sum(u.n_docs for u in units) == 7_000


def test_long_texts_bypass_the_fast_backend_with_identical_ids(tiny_tokenizer):
    """kitoken needs ~125 bytes per byte of a long word (SentencePiece ~57): texts above FAST_BACKEND_MAX_CHARS go
    to the SentencePiece reference, ids unchanged, int32 from the tokenizer on."""
    pytest.importorskip("kitoken")
    import numpy as np

    from transforms.tokenize import tokenizer
    from transforms.tokenize.tokenizer_backends import KitokenEncoder

    model = pathlib.Path(tiny_tokenizer).read_bytes()
    sp = tokenizer.load_processor(model)
    encoder = KitokenEncoder(model, sp, spot_check_every=0)
    seen = []

    class Spy:  # records what reaches kitoken, encodes with the real one
        def __init__(self, kt):
            self.kt = kt

        def encode(self, text, special):
            seen.append(len(text))
            return self.kt.encode(text, special)

    encoder._kt = Spy(encoder._kt)
    long_text = "z" * (tokenizer.FAST_BACKEND_MAX_CHARS + 1)
    texts = ["def f(x):\n    return x\n", long_text, "short"]
    got = tokenizer.encode_batch(encoder, texts)
    assert [a.dtype for a in got] == [np.dtype(np.int32)] * 3
    assert [a.tolist() for a in got] == sp.encode(texts, out_type=int)
    assert sorted(seen) == sorted([len(texts[0]), len(texts[2])])  # the long one never reached kitoken


@pytest.mark.timeout(600)
def test_a_50_mb_document_is_written_token_exact_within_the_worker_bound(tmp_path, tiny_tokenizer):
    """A 50 MB document of ~7 M distinct-ish random words (gigatoken's encode cache fills and is bounded) is
    tokenized in exact pieces (transforms/tokenize/long_documents.py) by gigatoken, not dead-lettered: every
    stored id equals SentencePiece's, and the worker's peak RSS stays within the 1.5 GB per-worker bound."""
    import numpy as np

    from model_contract import Manifest, decode_example, iter_records, resolve_shard_path
    from transforms.tokenize import long_documents, tokenizer

    rng = np.random.default_rng(0)
    letters = rng.integers(ord("a"), ord("z") + 1, size=50 * 10**6, dtype=np.uint8)
    letters[rng.random(letters.size) < 1 / 7] = ord(" ")
    text = letters.tobytes().decode("ascii")
    del letters
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "big.jsonl").write_bytes(pile_line(text, "S") + pile_line("a small one", "S"))
    args = shard_args(str(inputs / "*"), tmp_path / "out", tiny_tokenizer, "--seq-len", "65536")
    args[args.index("sentencepiece")] = "gigatoken"  # the fast backend, parity-checked against SentencePiece
    proc, peak = run_cli_measured(args, timeout=500)
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest_file = str(tmp_path / "out" / "manifest.json")
    manifest = Manifest.from_json(open(manifest_file).read())
    assert manifest.records["written"] == 2 and manifest.records["dead_lettered"] == {}
    assert manifest.extra["tokenizer_backend"]["name"] == "gigatoken"
    pieces: dict = {}
    for shard in manifest.shards:
        with open(resolve_shard_path(manifest_file, shard), "rb") as f:
            for record in iter_records(f):
                ex = decode_example(record)
                for k, (doc, offset) in enumerate(zip(ex["piece_doc_ids"], ex["piece_offsets"]), 1):
                    pieces.setdefault(int(doc), []).append((int(offset), ex["input_ids"][ex["segment_ids"] == k]))
    stored = max((np.concatenate([ids for _o, ids in sorted(p, key=lambda x: x[0])]) for p in pieces.values()),
                 key=len)
    model = pathlib.Path(tiny_tokenizer).read_bytes()
    sp = tokenizer.load_processor(model)
    # SentencePiece over the same pieces (exact: tests/unit/tokenize/test_long_documents.py), on both cores
    bounds = [0, *long_documents.cuts(text), len(text)]
    prefix = long_documents.dummy_prefix(sp, model)
    want = np.concatenate([np.asarray(ids, dtype=np.int32) for ids in sp.encode(
        [text[a + 1 if i and prefix else a:b] for i, (a, b) in enumerate(zip(bounds, bounds[1:]))],
        out_type=int, num_threads=2)])
    assert stored[-1] == sp.eos_id() and np.array_equal(stored[:-1], want)
    print(f"peak RSS {peak:.0f} MB for a 50 MB document")
    assert peak < 1536, f"peak RSS {peak:.0f} MB for a 50 MB document"
