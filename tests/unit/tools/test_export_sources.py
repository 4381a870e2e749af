"""pipeline/tools/export_sources.py: each document's source read again from the ledger's inputs (Megatron
--by-source), prefix names Megatron's blend can hold, and the blend's weights."""
from __future__ import annotations

import json
import types

import numpy as np
import pytest

from model_contract.hashing import sha256_file
from model_contract.manifest_rows import LedgerRow
from pipeline.tools import export_sources
from transforms.shard.documents import document_id

pytestmark = pytest.mark.formats


def _input(path, docs):
    path.write_text("".join(json.dumps({"text": t, "meta": {"pile_set_name": s}}) + "\n" for t, s in docs))
    return str(path)


def _manifest(paths, generations=("g1",), of=None):
    rows = [LedgerRow(p, None, (of or {}).get(p, generations[0]), sha256=sha256_file(p)[1]) for p in paths]
    return types.SimpleNamespace(ledger=rows, generations=[{"name": g} for g in generations],
                                 config={"text_field": "text", "source_fields": ["meta.pile_set_name"]})


def test_first_copy_in_generation_then_path_order_names_the_source(tmp_path):
    a = _input(tmp_path / "a.jsonl", [("one", "Books3"), ("two", "Pile-CC")])
    b = _input(tmp_path / "b.jsonl", [("two", "Github"), ("three", "Github")])
    z = _input(tmp_path / "0.jsonl", [("one", "ArXiv")])  # sorts first, but from the later generation
    found = export_sources.document_sources(_manifest([z, b, a], ("g1", "g2"), {z: "g2"}))
    got = {n: found.names[s] for n, s in zip(("one", "two", "three"),
                                              found.lookup(np.array([document_id(t) for t in ("one", "two", "three")])))}
    assert got == {"one": "Books3", "two": "Pile-CC", "three": "Github"}
    with pytest.raises(export_sources.SourceError, match="in no input"):
        found.lookup(np.array([document_id("four")]))


def test_changed_or_missing_input_is_refused_by_name(tmp_path):
    a = _input(tmp_path / "a.jsonl", [("one", "Books3")])
    manifest = _manifest([a])
    _input(tmp_path / "a.jsonl", [("one", "Github")])
    with pytest.raises(export_sources.SourceError, match="a.jsonl changed since the dataset was made"):
        export_sources.document_sources(manifest)
    (tmp_path / "a.jsonl").unlink()
    with pytest.raises(export_sources.SourceError, match="a.jsonl is gone"):
        export_sources.document_sources(manifest)


def test_prefix_names_hold_no_space_and_never_collide():
    names = export_sources.prefix_names(["Wikipedia (en)", "Pile-CC", "Ubuntu IRC", "Ubuntu_IRC", "(?)"])
    assert names["Wikipedia (en)"] == "Wikipedia_en" and names["Pile-CC"] == "Pile-CC"
    assert names["(?)"] == "source"
    assert len(set(names.values())) == len(names)
    assert all(" " not in n and "/" not in n for n in names.values())


def test_blend_weights_are_token_shares_and_skip_empty_sources():
    assert export_sources.blend(["a", "b", "c"], [300, 0, 100]) == ["0.75000000", "a", "0.25000000", "c"]
