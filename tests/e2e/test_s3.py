"""Input and output on s3:// through Beam's S3 filesystem (boto3), against a real S3-compatible
server (moto's server mode) on 127.0.0.1 that the tests start and kill themselves.
"""
from __future__ import annotations

import hashlib
import json
import os
import time

import pytest

from tests.ops_fixtures import (Service, dataset_files, free_port, real_corpus, run_cli, s3_env,  # noqa: F401
                                s3_server, shard_args, subprocess_env, VENV_BIN)
from tests.conftest import REPO

pytestmark = pytest.mark.timeout(240)


def _upload(client, bucket, prefix, paths):
    for p in paths:
        client.upload_file(str(p), bucket, f"{prefix}/{p.name}")


def _keys(client, bucket, prefix):
    resp = client.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for o in resp.get("Contents", []))


def test_s3_end_to_end_commit_listing_and_incremental(tmp_path, s3_server, s3_env, record_property):
    client = s3_server.client()
    client.create_bucket(Bucket="pile-in")
    client.create_bucket(Bucket="pile-out")
    corpus = real_corpus(tmp_path / "corpus")
    first = sorted(corpus.iterdir())[:-1]
    _upload(client, "pile-in", "raw", first)

    # The same job on local disk, for bytes and wall time.
    local_dir = tmp_path / "local"
    local_dir.mkdir()
    for p in first:
        os.link(p, local_dir / p.name)
    t0 = time.monotonic()
    local = run_cli(shard_args([str(local_dir / "*")], tmp_path / "local-out"), timeout_s=150, env=s3_env)
    t_local = time.monotonic() - t0
    assert local.returncode == 0, local.stderr[-3000:]

    t0 = time.monotonic()
    res = run_cli(shard_args(["s3://pile-in/raw/*"], "s3://pile-out/ds", "--incremental", *s3_server.beam_args()),
                  timeout_s=150, env=s3_env)
    t_s3 = time.monotonic() - t0
    assert res.returncode == 0, res.stderr[-3000:]

    keys = _keys(client, "pile-out", "ds/")
    manifest = json.loads(client.get_object(Bucket="pile-out", Key="ds/manifest.json")["Body"].read())
    assert not [k for k in keys if "_staging" in k], keys  # staging is gone after the commit
    copy = f"ds/generations/{manifest['generation']}.manifest.json"  # the generation's own manifest, beside it
    assert sorted("ds/" + f["path"] for f in manifest["shards"] + manifest["doc_id_indexes"]) == [
        k for k in keys if k not in ("ds/manifest.json", copy)]
    assert client.get_object(Bucket="pile-out", Key=copy)["Body"].read() == client.get_object(
        Bucket="pile-out", Key="ds/manifest.json")["Body"].read()
    for s in manifest["shards"]:  # every listed shard is there, whole
        body = client.get_object(Bucket="pile-out", Key="ds/" + s["path"])["Body"].read()
        assert hashlib.sha256(body).hexdigest() == s["sha256"] and len(body) == s["bytes"]
    # Same bytes as on local disk (document ids do not depend on where the input lives).
    local_manifest = json.loads((tmp_path / "local-out" / "manifest.json").read_text())
    assert [s["sha256"] for s in manifest["shards"]] == [s["sha256"] for s in local_manifest["shards"]]
    ledger = manifest["ledger"]
    assert [r["path"] for r in ledger] == sorted(f"s3://pile-in/raw/{p.name}" for p in first)
    assert all(r.get("etag") and len(r["sha256"]) == 64 for r in ledger)
    record_property("s3_over_local_wall", round(t_s3 / t_local, 3))
    print(f"\nwall time: local disk {t_local:.1f}s, S3 (moto on 127.0.0.1) {t_s3:.1f}s, ratio {t_s3 / t_local:.2f}")

    # Incremental on S3: a new object becomes a second generation; the same schedule again does nothing.
    _upload(client, "pile-in", "raw", [sorted(corpus.iterdir())[-1]])
    res = run_cli(shard_args(["s3://pile-in/raw/*"], "s3://pile-out/ds", "--incremental", *s3_server.beam_args()),
                  timeout_s=150, env=s3_env)
    assert res.returncode == 0, res.stderr[-3000:]
    m2 = json.loads(client.get_object(Bucket="pile-out", Key="ds/manifest.json")["Body"].read())
    assert len(m2["generations"]) == 2 and len(m2["ledger"]) == len(first) + 1
    again = run_cli(shard_args(["s3://pile-in/raw/*"], "s3://pile-out/ds", "--incremental", *s3_server.beam_args()),
                    timeout_s=150, env=s3_env)
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert client.get_object(Bucket="pile-out", Key="ds/manifest.json")["Body"].read() == json.dumps(
        m2, sort_keys=True, indent=1, ensure_ascii=False).encode() + b"\n"


@pytest.mark.parametrize("which", ["input", "output"])
def test_missing_bucket_is_a_clear_error(tmp_path, s3_server, s3_env, which):
    client = s3_server.client()
    client.create_bucket(Bucket="exists-in")
    corpus = real_corpus(tmp_path / "corpus", names=("pile/val.jsonl.zst",))
    _upload(client, "exists-in", "raw", list(corpus.iterdir()))
    inp = "s3://no-such-bucket/raw/*" if which == "input" else "s3://exists-in/raw/*"
    out = "s3://no-such-bucket/ds" if which == "output" else "s3://exists-in/ds"
    res = run_cli(shard_args([inp], out, *s3_server.beam_args()), timeout_s=60, env=s3_env)
    assert res.returncode == 2, res.stderr[-2000:]
    assert f"--{which}" in res.stderr and "'no-such-bucket'" in res.stderr and "does not exist" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.fixture
def auth_s3(tmp_path):
    """A second moto server that enforces credentials (after 3 unauthenticated IAM calls that make a user)."""
    import boto3

    port = free_port()
    env = subprocess_env(INITIAL_NO_AUTH_ACTION_COUNT="3")
    service = Service([os.path.join(VENV_BIN, "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                      tmp_path / "moto-auth.log", env=env)
    try:
        service.wait_port(port)
        endpoint = f"http://127.0.0.1:{port}"
        iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bootstrap",
                           aws_secret_access_key="bootstrap")
        iam.create_user(UserName="ci")
        key = iam.create_access_key(UserName="ci")["AccessKey"]
        iam.put_user_policy(UserName="ci", PolicyName="s3", PolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
        s3.create_bucket(Bucket="guarded")
        yield endpoint, key, s3
    finally:
        service.stop()


@pytest.mark.parametrize("how", ["environment", "pipeline-option"])
def test_wrong_credentials_are_a_clear_error_that_prints_no_secret(tmp_path, auth_s3, how):
    endpoint, key, s3 = auth_s3
    corpus = real_corpus(tmp_path / "corpus", names=("pile/val.jsonl.zst",))
    s3.upload_file(str(corpus / "val.jsonl.zst"), "guarded", "raw/val.jsonl.zst")
    secret = "Wr0ngS3cretValue-do-not-print"
    env = subprocess_env(PYTHONPATH=str(REPO), AWS_PROFILE=None, AWS_ACCESS_KEY_ID=None, AWS_SECRET_ACCESS_KEY=None,
                         AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"))
    extra = [f"--s3_endpoint_url={endpoint}", "--s3_region_name=us-east-1"]
    if how == "environment":
        env.update(AWS_ACCESS_KEY_ID=key["AccessKeyId"], AWS_SECRET_ACCESS_KEY=secret)
    else:
        extra += [f"--s3_access_key_id={key['AccessKeyId']}", f"--s3_secret_access_key={secret}"]
    res = run_cli(shard_args(["s3://guarded/raw/*"], "s3://guarded/ds", *extra), timeout_s=60, env=env)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "credentials" in res.stderr and "'guarded'" in res.stderr
    assert secret not in res.stderr + res.stdout
    assert "Traceback" not in res.stderr


# ------------------------------------------------------------------------------ trust on S3
def test_the_output_lock_on_s3_is_a_conditional_put_the_server_honours(s3_server):
    from botocore.exceptions import ClientError

    from pipeline.ops import lock

    client = s3_server.client()
    client.create_bucket(Bucket="locks")
    options = {"s3_endpoint_url": s3_server.endpoint, "s3_region_name": "us-east-1",
               "s3_access_key_id": "testing", "s3_secret_access_key": "testing"}
    first = lock.OutputLock("s3://locks/ds", options)
    with first.held():
        with pytest.raises(ClientError) as info:  # the server itself refuses a second create
            client.put_object(Bucket="locks", Key="ds/" + lock.LOCK_NAME, Body=b"x", IfNoneMatch="*")
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
        with pytest.raises(lock.OutputLockedError, match=r"output is locked by .* pid \d+ since"):
            lock.OutputLock("s3://locks/ds", options).acquire()
        assert first.renew() and not first.lost
        with lock.OutputLock("s3://locks/ds", options).held(break_lock=True):
            assert not first.renew() and first.lost  # broken: the heartbeat notices
    assert _keys(client, "locks", "ds/") == []  # released


def test_an_empty_shard_on_s3_is_written_with_a_single_put(tmp_path, s3_server, s3_env):
    client = s3_server.client()
    client.create_bucket(Bucket="tiny-in")
    client.create_bucket(Bucket="tiny-out")
    corpus = real_corpus(tmp_path / "corpus", names=("pile/test.jsonl.zst",))
    _upload(client, "tiny-in", "raw", list(corpus.iterdir()))
    args = shard_args(["s3://tiny-in/raw/*"], "s3://tiny-out/ds", *s3_server.beam_args())
    args[args.index("--num-shards") + 1] = "8"  # more train shards than documents: some are empty
    res = run_cli(args, timeout_s=150, env=s3_env)
    assert res.returncode == 0, res.stderr[-3000:]
    manifest = json.loads(client.get_object(Bucket="tiny-out", Key="ds/manifest.json")["Body"].read())
    empty = [s for s in manifest["shards"] if s["bytes"] == 0]
    assert empty, "the input was meant to leave some shards empty"
    for s in empty:
        assert client.head_object(Bucket="tiny-out", Key="ds/" + s["path"])["ContentLength"] == 0


def test_credentials_in_an_endpoint_url_are_never_printed_or_logged(tmp_path, s3_env):
    corpus = real_corpus(tmp_path / "corpus", names=("pile/val.jsonl.zst",))
    run_log = tmp_path / "run.jsonl"
    endpoint = f"http://AKIAUSER:s3cr3tpassw0rd@127.0.0.1:{free_port()}"  # nothing listens there
    res = run_cli(shard_args([str(corpus / "*")], "s3://any-bucket/ds", f"--s3_endpoint_url={endpoint}",
                             "--run-log", str(run_log)), timeout_s=120, env=s3_env)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "http://***@127.0.0.1" in res.stderr and "--output" in res.stderr
    for text in (res.stdout, res.stderr, run_log.read_text()):
        assert "s3cr3tpassw0rd" not in text and "AKIAUSER" not in text


# ------------------------------------------------------------------------------ no ACL surprises
def test_every_writer_puts_objects_without_an_acl_header(s3_server, monkeypatch):
    """Every way pileprep writes an object (a streamed shard, an empty shard's single PUT, a published manifest
    or report, the output lock), in this process so that each request boto3 sends can be seen: none carries
    `x-amz-acl` / `x-amz-grant-*`: the bucket's own policy and ownership settings decide who reads, as for
    any object its writer uploads plainly."""
    import botocore.endpoint
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.ops import lock
    from transforms.io import io_utils
    from transforms.io.filesystem_options import set_filesystem_options

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    client = s3_server.client()
    client.create_bucket(Bucket="acl-out")
    sent = []
    real_send = botocore.endpoint.Endpoint._send

    def recording_send(self, request):
        sent.append((request.method, request.url.split("?", 1)[0], dict(request.headers)))
        return real_send(self, request)

    monkeypatch.setattr(botocore.endpoint.Endpoint, "_send", recording_send)
    set_filesystem_options(PipelineOptions(s3_server.beam_args()))  # as every pileprep command sets them
    try:
        with io_utils.open_write("s3://acl-out/ds/gen/train-00000.tfrecord") as f:
            f.write(b"x" * (6 << 20))  # more than one multipart part
        io_utils.write_bytes("s3://acl-out/ds/gen/empty.tfrecord", b"")
        io_utils.publish_bytes("s3://acl-out/ds/manifest.json", b"{}\n")
        io_utils.publish_bytes("s3://acl-out/ds/report.html", b"<!DOCTYPE html>")
        options = {"s3_endpoint_url": s3_server.endpoint, "s3_region_name": "us-east-1"}
        with lock.OutputLock("s3://acl-out/locked", options).held():
            pass
    finally:
        set_filesystem_options(PipelineOptions([]))
    puts = [(u, h) for m, u, h in sent if m in ("PUT", "POST") and "/acl-out/" in u]
    for name in ("train-00000.tfrecord", "empty.tfrecord", "manifest.json", "report.html", lock.LOCK_NAME):
        assert any(u.endswith("/" + name) for u, _h in puts), (name, [u for u, _h in puts])
    for url, headers in puts:
        acl = [h for h in headers if h.lower() == "x-amz-acl" or h.lower().startswith("x-amz-grant")]
        assert not acl, (url, acl)
    assert _keys(client, "acl-out", "ds/") == ["ds/gen/empty.tfrecord", "ds/gen/train-00000.tfrecord",
                                               "ds/manifest.json", "ds/report.html"]
