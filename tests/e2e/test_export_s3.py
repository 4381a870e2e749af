"""`pileprep export --format megatron|hf|mds` to an s3:// output (moto's S3 server): the same files, byte for
byte, as a local export; export.json last, no temporary or done-marker object left; resumable through the store;
the previous generation kept, the one before removed; `pileprep verify s3://...` checks it through the store."""
from __future__ import annotations

import hashlib
import json
import unittest.mock

import pytest

from pipeline.tools import export_formats, export_summary
from tests.export_fixtures import build_dataset
from tests.ops_fixtures import s3_server  # noqa: F401 - the module's S3 server fixture

pytestmark = pytest.mark.formats


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, tiny_tokenizer):
    return build_dataset(tmp_path_factory, tiny_tokenizer, 120_000, num_shards=1, val_fraction=0.2,
                         test_fraction=0.1)[0]


@pytest.fixture
def store(s3_server, monkeypatch):  # noqa: F811
    from apache_beam.options.pipeline_options import PipelineOptions

    from transforms.io.filesystem_options import set_filesystem_options

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    client = s3_server.client()
    if "exports" not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket="exports")
    set_filesystem_options(PipelineOptions(s3_server.beam_args()))  # as the CLI sets them
    try:
        yield client, {"s3_endpoint_url": s3_server.endpoint, "s3_region_name": "us-east-1"}
    finally:
        set_filesystem_options(PipelineOptions([]))


def _objects(client, prefix) -> dict:
    listed = client.list_objects_v2(Bucket="exports", Prefix=prefix).get("Contents", [])
    return {o["Key"][len(prefix):]: client.get_object(Bucket="exports", Key=o["Key"])["Body"].read() for o in listed}


def _check_store(client, prefix, local) -> None:
    objects = _objects(client, prefix)
    summary = json.loads(objects.pop("export.json"))
    # the generation's stamp (export_summary.py: what a later export may remove), named after the generation
    assert objects.pop(f"{summary['generation']}/{export_summary.GENERATION_STAMP}") == (
        summary["generation"] + "\n").encode()
    assert summary["files"] == local["files"] and summary["generation"] == local["generation"]
    for row in summary["files"]:
        data = objects.pop(row["path"])
        assert (len(data), hashlib.sha256(data).hexdigest()) == (row["bytes"], row["sha256"])
    return objects


@pytest.mark.parametrize("fmt", ["hf", "mds"])
def test_s3_export_equals_the_local_one_and_commits_last(dataset, store, fmt, tmp_path, capsys):
    client, options = store
    local = export_formats.export_format(str(dataset), fmt, str(tmp_path / "local"))
    remote = export_formats.export_format(str(dataset), fmt, f"s3://exports/{fmt}", s3_options=options)
    assert remote["files"] == local["files"]  # sizes and sha256, file for file
    left = _check_store(client, f"{fmt}/", local)
    assert not left, left  # no temporary, no done marker, no lock, nothing unlisted
    if fmt == "hf":  # verify reads any format's export.json alike: once is enough
        _verify_on_the_store(client, options, f"{fmt}/", local, capsys)


def _verify_on_the_store(client, options, prefix, local, capsys) -> None:
    """`pileprep verify s3://...` reads export.json and hashes every object through the store: exit 0; a flipped
    byte in one object, another cut short and a third gone: exit 1, each named."""
    from pipeline import cli

    url = f"s3://exports/{prefix.rstrip('/')}"
    beam_args = [f"--{k}={v}" for k, v in sorted(options.items())]  # as a user gives them after the command
    assert cli.main(["verify", url, *beam_args]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert f": {len(local['files'])} files," in out and "export of generation" in out, out
    flipped, cut, gone = (local["files"][i]["path"] for i in (0, 1, -1))
    data = bytearray(client.get_object(Bucket="exports", Key=prefix + flipped)["Body"].read())
    data[len(data) // 2] ^= 0x01
    client.put_object(Bucket="exports", Key=prefix + flipped, Body=bytes(data))
    client.delete_object(Bucket="exports", Key=prefix + gone)
    short = client.get_object(Bucket="exports", Key=prefix + cut)["Body"].read()[:-1]
    client.put_object(Bucket="exports", Key=prefix + cut, Body=short)
    assert cli.main(["verify", url, *beam_args]) == 1
    out = capsys.readouterr().out
    assert f"{flipped}: sha256" in out and f"{gone}: missing" in out, out
    assert f"{cut}: {len(short)} bytes, export.json says {len(short) + 1}" in out, out


def test_s3_megatron_export_resumes_and_keeps_the_previous_generation(dataset, store, tmp_path):
    """The bytes of a local export (read back by IndexedDataset in test_export_formats.py); a run killed after
    train reuses train's objects through its done marker; the previous generation kept, the one before removed."""
    from pipeline.tools import export_megatron

    client, options = store
    out = "s3://exports/resume"
    local = export_formats.export_format(str(dataset), "megatron", str(tmp_path / "local"))
    first = export_formats.export_format(str(dataset), "megatron", out, s3_options=options)
    assert first["files"] == local["files"]
    gen = first["generation"]
    assert not _check_store(client, "resume/", local)
    # killed after train (its done marker there), over an export.json that committed gen1 (gen0 before it)
    rows = [{**r, "path": r["path"].split("/", 1)[1]} for r in first["files"] if r["split"] == "train"]
    shards = [s for s in _manifest(dataset).shards if s.split == "train"]
    key = export_formats._split_key("megatron", export_megatron, shards)
    client.put_object(Bucket="exports", Key=f"resume/{gen}/.pileprep-export-train.done.json",
                      Body=json.dumps({"key": key, "files": rows}).encode())
    for name in ("gen0", "gen1", "mine"):
        client.put_object(Bucket="exports", Key=f"resume/{name}/f", Body=name.encode())
        if name != "mine":  # as an export made them; `mine` is a user's prefix a crafted `previous` names
            client.put_object(Bucket="exports", Key=f"resume/{name}/{export_summary.GENERATION_STAMP}", Body=b"")
    client.put_object(Bucket="exports", Key="resume/export.json", Body=json.dumps(
        {"kind": "export", "format": "megatron", "generation": "gen1", "previous": ["gen0", "mine"],
         "files": []}).encode())
    uploads = []
    real_put = export_formats.SplitJob.put_many

    def counting(self, names, fill):
        uploads.extend(names)
        return real_put(self, names, fill)

    with unittest.mock.patch.object(export_formats.SplitJob, "put_many", counting):
        again = export_formats.export_format(str(dataset), "megatron", out, s3_options=options)
    assert again["files"] == first["files"] and again["previous"] == ["gen1"]
    assert not any(n.startswith("train_") for n in uploads) and "val_text_document.bin" in uploads
    left = _check_store(client, "resume/", local)
    assert set(left) == {"gen1/f", f"gen1/{export_summary.GENERATION_STAMP}", "mine/f"}, left  # gen0 removed;
    # `mine` kept (no stamp); no done marker, no lock left


def _manifest(dataset):
    from pipeline.ops import commit

    return commit.read_committed(str(dataset))


def test_shard_format_megatron_to_an_s3_output(store, tiny_tokenizer, tmp_path, capsys):
    """`pileprep shard --format tfrecord,megatron,parquet --output s3://...`: the shard job commits on the store,
    then the exports of that generation go to OUTPUT/megatron/ and OUTPUT/parquet/ through the store: the files of
    the same command with a local output, byte for byte (sizes and sha256 in export.json, Parquet's hashed back
    from the store), and `pileprep verify s3://.../F` passes, and finds a flipped byte in a Parquet object."""
    from pipeline import cli
    from tests.corpus_fixtures import write_good_corpus
    from tests.export_fixtures import IN_MEMORY

    client, options = store
    write_good_corpus(tmp_path / "in", limit_bytes=60_000)
    beam_args = [f"--{k}={v}" for k, v in sorted(options.items())]

    def shard(out):
        return cli.main(["shard", "--input", str(tmp_path / "in" / "*"), "--output", out, "--tokenizer",
                         tiny_tokenizer, "--seq-len", "128", "--num-shards", "1", "--val-fraction", "0.2",
                         "--test-fraction", "0.1", "--progress-every", "0", "--format", "tfrecord,megatron,parquet",
                         *IN_MEMORY, *beam_args])

    assert shard(str(tmp_path / "local")) == 0, capsys.readouterr().err
    local = json.loads((tmp_path / "local" / "megatron" / "export.json").read_text())
    local_parquet = json.loads((tmp_path / "local" / "parquet" / "export.json").read_text())
    capsys.readouterr()
    assert shard("s3://exports/sharded") == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "--format megatron:" in printed and "s3://exports/sharded/megatron" in printed, printed
    left = _check_store(client, "sharded/megatron/", local)
    assert not left, left  # no temporary, no done marker, no lock, nothing unlisted
    manifest = json.loads(client.get_object(Bucket="exports", Key="sharded/manifest.json")["Body"].read())
    assert manifest["generation"] == local["generation"]
    parquet = _objects(client, "sharded/parquet/")
    assert json.loads(parquet.pop("export.json"))["files"] == local_parquet["files"]
    stamps = {f"{f['path'].split('/')[0]}/{export_summary.GENERATION_STAMP}" for f in local_parquet["files"]}
    assert {k: parquet.pop(k) for k in sorted(stamps)} == {k: f"{k.split('/')[0]}\n".encode() for k in stamps}
    assert sorted(parquet) == sorted(f["path"] for f in local_parquet["files"])
    for fmt in ("megatron", "parquet", ""):
        url = f"s3://exports/sharded/{fmt}".rstrip("/")
        assert cli.main(["verify", url, *beam_args]) == 0, (url, capsys.readouterr())
    key = "sharded/parquet/" + local_parquet["files"][0]["path"]
    data = bytearray(client.get_object(Bucket="exports", Key=key)["Body"].read())
    data[len(data) // 2] ^= 0x01
    client.put_object(Bucket="exports", Key=key, Body=bytes(data))
    capsys.readouterr()
    assert cli.main(["verify", "s3://exports/sharded/parquet", *beam_args]) == 1
    assert f"{local_parquet['files'][0]['path']}: sha256" in capsys.readouterr().out
