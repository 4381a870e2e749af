"""Secrets stay secret at every sink: with `--s3_endpoint_url=http://USER:SECRET@host`, a run whose S3 calls
fail (against the local moto S3 server) leaves no `SECRET` in what it prints, in its kept worker log (whose
traceback and worker output bypass logging filters), in its run log; and a run that succeeds leaves none in its
manifest. The sink functions are also tested directly (no server needed)."""
from __future__ import annotations

import json
import logging
import pathlib
import re

import pytest

from pipeline.ops.redaction import SinkFormatter
from pipeline.ops.runlog import RunLog, WorkerLog
from tests.corpus_fixtures import pile_line, good_documents, write_zst
from tests.ops_fixtures import run_cli, s3_env, s3_server  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(300)
SECRET = "Sup3rSecretValue"


def _url(endpoint: str) -> str:
    return endpoint.replace("http://", f"http://AKIAUSER:{SECRET}@")


def test_sink_formatter_redacts_tracebacks_and_makes_data_inert():
    try:
        raise ConnectionError(f'Could not connect to the endpoint URL: "http://u:{SECRET}@127.0.0.1:9/b/k"')
    except ConnectionError:
        record = logging.LogRecord("pileprep", logging.ERROR, __file__, 1, "reading %s", ("src\x1b[2J\r\nfake",),
                                   exc_info=__import__("sys").exc_info())
    text = SinkFormatter(logging.Formatter("%(levelname)s %(message)s")).format(record)
    assert SECRET not in text and "***@127.0.0.1" in text
    first = text.splitlines()[0]
    assert first == "ERROR reading src\\x1b[2J\\r\\nfake"  # the data's newline does not start a log line
    assert "\x1b" not in text and "Traceback" in text  # the traceback keeps its own lines


def test_run_log_and_worker_log_tail_are_redacted(tmp_path):
    log = RunLog(str(tmp_path / "run.jsonl"))
    log.event("error", message=f"s3 at http://u:{SECRET}@h:1 failed")
    assert SECRET not in (tmp_path / "run.jsonl").read_text()
    wl = WorkerLog(str(tmp_path))
    wl.path = str(tmp_path / "w.log")
    pathlib.Path(wl.path).write_text(f"worker: GET http://u:{SECRET}@h:1/x failed \x1b[31mred\n")
    assert all(SECRET not in ln and "\x1b" not in ln for ln in wl.tail())
    kept = wl.keep()
    assert SECRET not in pathlib.Path(kept).read_text()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("secrets-corpus")
    write_zst(root / "00.jsonl.zst", [pile_line(t, s) for t, s in good_documents(60_000)])
    return root


def _shard(tokenizer, inputs, output, endpoint, *extra):
    return ["shard", "--input", inputs, "--output", output, "--tokenizer", tokenizer, "--seq-len", "128",
            "--num-shards", "1", "--val-fraction", "0", "--test-fraction", "0", "--progress-every", "0",
            f"--s3_endpoint_url={endpoint}", "--s3_region_name=us-east-1", *extra]


def test_failing_s3_run_keeps_no_secret(tiny_tokenizer, corpus, tmp_path, s3_server, s3_env):
    client = s3_server.client()
    client.create_bucket(Bucket="secrets-in")
    # An archived object: listed and HEAD-able (the driver's checks pass), but its GET fails (InvalidObjectState)
    # inside the job, so the run fails with a traceback and keeps its worker log.
    client.put_object(Bucket="secrets-in", Key="raw/00.jsonl.zst", Body=(corpus / "00.jsonl.zst").read_bytes(),
                      StorageClass="GLACIER")
    staging = tmp_path / "staging"
    run_log = tmp_path / "run.jsonl"
    res = run_cli(_shard(tiny_tokenizer, "s3://secrets-in/raw/*", str(tmp_path / "ds"),
                         _url(s3_server.endpoint), "--staging-dir", str(staging), "--run-log", str(run_log)),
                  timeout_s=200, env=s3_env)
    assert res.returncode == 1, res.stderr[-3000:]
    assert "InvalidObjectState" in res.stderr
    texts = {"stdout": res.stdout, "stderr": res.stderr}
    kept = re.search(r"worker log \((\S+)\)", res.stderr)
    assert kept, res.stderr
    files = [pathlib.Path(kept.group(1))] + [p for p in tmp_path.rglob("*") if p.is_file()]
    texts.update({str(p): p.read_text(errors="replace") for p in files})
    if tmp_path not in files[0].parents:
        files[0].unlink()  # kept in the system temp dir (no staging root was created): not ours to leave
    leaked = [name for name, text in texts.items() if SECRET in text]
    assert not leaked, {name: texts[name][-2000:] for name in leaked}


def test_succeeding_s3_run_writes_no_secret(tiny_tokenizer, corpus, tmp_path, s3_server, s3_env):
    client = s3_server.client()
    client.create_bucket(Bucket="secrets-ok")
    run_log = tmp_path / "run.jsonl"
    res = run_cli(_shard(tiny_tokenizer, str(corpus / "*"), "s3://secrets-ok/ds", _url(s3_server.endpoint),
                         "--run-log", str(run_log)), timeout_s=200, env=s3_env)
    assert res.returncode == 0, res.stderr[-3000:]
    manifest = client.get_object(Bucket="secrets-ok", Key="ds/manifest.json")["Body"].read().decode()
    assert json.loads(manifest)["shards"]
    for text in (manifest, run_log.read_text(), res.stdout, res.stderr):
        assert SECRET not in text
