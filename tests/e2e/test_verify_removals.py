"""`verify --inputs` accounts for every removal kind (near-duplicate, contaminated, dropped by a source weight
below 1) instead of calling those documents lost, still fails on a real loss, and checks the round trip
decode(tokens) == text, which re-encoding with the same tokenizer cannot (pipeline/tools/verify_inputs.py)."""
from __future__ import annotations

import collections
import io
import json

import numpy as np
import pytest

from pipeline.config import ShardConfig
from pipeline.shard import shard_pipeline
from pipeline.tools import verify
from tests.corpus_fixtures import pile_line
from tests.e2e.test_near_dedup_pipeline import IN_MEMORY, config, write_corpus

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_tokenizer):
    root = tmp_path_factory.mktemp("vrm")
    plan = write_corpus(root)
    sources = collections.Counter(json.loads(line)["meta"]["pile_set_name"]
                                  for f in ("a", "b") for line in _lines(root / "in" / f"{f}.jsonl.zst"))
    light = sorted(sources)[0]  # documents of one source kept with probability 0.4
    cfg = config(root, root / "out", tiny_tokenizer, source_weights=f"{light}=0.4")
    manifest = shard_pipeline.run(cfg, IN_MEMORY, progress_every_s=0)
    return root, plan, manifest, tiny_tokenizer


def _lines(path):
    import zstandard
    return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(path.read_bytes())).read().splitlines()


def _verify(root, out, **kw):
    return verify.verify(str(out), inputs=[str(root / "in" / "*"), str(root / "val.jsonl")], sample=10_000, **kw)


def test_every_removal_kind_is_accounted_for(built):
    root, plan, manifest, _tok = built
    filtered = manifest["records"]["filtered"]
    assert filtered["near_duplicate"] > 0 and filtered["contaminated"] == 1 and filtered["mixture_weight"] > 0
    report = _verify(root, root / "out")
    audit = report.audit
    assert report.ok, report.render()
    assert audit.removed == {"contaminated": 1, "mixture_weight": filtered["mixture_weight"],
                             "near_duplicate": filtered["near_duplicate"]}
    assert audit.documents == manifest["records"]["written"] and audit.round_trip_checked == audit.documents
    assert audit.sampled == audit.documents + sum(audit.removed.values()) + audit.dead_lettered + audit.filtered


def test_only_a_real_mismatch_fails():
    """check_document on its own: absent with no recorded reason, absent although its weight keeps it, written
    although recorded as removed, a near-duplicate whose keeper is gone, an n-gram the text does not hold."""
    from pipeline.tools.verify_inputs import Removals, RoundTrip, Sampled, check_document

    text = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
    doc = Sampled("in.jsonl:1", 1234, text, "Src", None)
    written = {1234: [(0, np.array([5, 6, 3]), "train", "s0")]}

    def run(pieces, removals):
        counts, problems = collections.Counter(), []
        check_document(doc, [5, 6, 3], pieces, removals, RoundTrip(), 3, counts, problems)  # no decode: not checked
        return dict(counts), problems

    assert run(written, Removals()) == ({"written": 1}, [])
    assert "is not in any shard" in run({}, Removals())[1][0]
    keep_all = Removals(weights={"Src": 1.0})
    assert "is not in any shard" in run({}, keep_all)[1][0]
    assert run({}, Removals(weights={"Src": 0.0})) == ({"mixture_weight": 1}, [])
    assert "written 1 time(s)" in run(written, Removals(weights={"Src": 2.0}))[1][0]
    near = {"reason": "near_duplicate", "keeper": 99, "keeper_source": "Src"}
    assert "written and also recorded as removed" in run(written, Removals(rows={1234: near}))[1][0]
    assert "which is not in any shard" in run({}, Removals(rows={1234: near}))[1][0]
    kept = {99: [(0, np.array([1]), "train", "s0")]}
    assert run(kept, Removals(rows={1234: near})) == ({"near_duplicate": 1}, [])
    bad = {"reason": "contaminated", "ngram": "nothing like this text at all"}
    assert "does not hold" in run({}, Removals(rows={1234: bad}))[1][0]
    good = {"reason": "contaminated", "ngram": " ".join(text.split()[1:14])}
    assert run({}, Removals(rows={1234: good})) == ({"contaminated": 1}, [])


def test_a_tokenizer_that_drops_characters_does_not_pass(tmp_path):
    """SentencePiece without byte fallback maps an unseen character to <unk>: re-encoding agrees with the shard,
    decoding does not give the text back. Such a document is dead-lettered (round_trip) or verify fails."""
    import sentencepiece as spm

    model = io.BytesIO()
    words = [f"word{i} alpha beta gamma delta" for i in range(400)]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(words), model_writer=model, vocab_size=120,
                                   model_type="bpe", byte_fallback=False, pad_id=0, unk_id=1, bos_id=2, eos_id=3,
                                   normalization_rule_name="identity", remove_extra_whitespaces=False,
                                   character_coverage=1.0, num_threads=1, minloglevel=2)
    tok = tmp_path / "no-fallback.model"
    tok.write_bytes(model.getvalue())
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(pile_line("alpha beta \u2603 gamma", "S") + pile_line("beta gamma", "S"))
    cfg = ShardConfig(inputs=(str(tmp_path / "in" / "*"),), output=str(tmp_path / "out"), tokenizer=str(tok),
                      seq_len=32, num_shards=1)
    manifest = shard_pipeline.run(cfg, IN_MEMORY, progress_every_s=0)
    report = verify.verify(str(tmp_path / "out"), inputs=[str(tmp_path / "in" / "*")], sample=10)
    if manifest["records"]["dead_lettered"].get("round_trip"):  # the job refused it: verify must agree
        assert report.ok and report.audit.dead_lettered == 1, report.render()
    else:
        problems = report.audit.problems
        assert not report.ok and len(problems) == 1 and "does not round-trip" in problems[0], report.render()
        assert report.audit.documents == 1 and report.audit.round_trip_checked == 1
