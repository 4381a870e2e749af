"""A bad --source-weights SPEC is a bad configuration: exit 2 with exactly one stderr line `pileprep: error: ...`
(common rule of the project; issue 29's P4 "bad configs: exit 2, one line").

Found by the s37 review: the spec is parsed by transforms/shard/mixture.py, whose ValueError reaches
pipeline/cli.py `main` as an internal failure - exit 1, `pileprep: failed: ValueError: ...`. The same at 86b6001
(not a regression of the refactor, but a break of the rule it promises to keep). Fails before any pipeline runs.
"""
from __future__ import annotations

import pytest

from pipeline.cli import main as cli_main
from tests.ops_fixtures import tokenizer_path


@pytest.mark.parametrize("spec", ["PackageDocs=-1", "garbage", "Wikipedia=x", "pile,Github=nan"])
def test_a_bad_source_weights_spec_is_exit_2_in_one_error_line(tmp_path, capsys, spec):
    (tmp_path / "in.jsonl").write_text('{"text": "hello world", "meta": {"pile_set_name": "Wikipedia"}}\n')
    rc = cli_main(["shard", "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out"),
                   "--tokenizer", tokenizer_path(), "--source-weights", spec, "--runner=FnApiRunner"])
    err = capsys.readouterr().err.strip().splitlines()
    assert (rc, len(err)) == (2, 1), (rc, err)
    assert err[0].startswith("pileprep: error: ") and "--source-weights" in err[0], err
