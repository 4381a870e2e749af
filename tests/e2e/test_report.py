"""`pileprep report`: distributions from the manifest, a self-contained page, rendered in a real browser."""
from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys

import pytest

from pipeline.config import ShardConfig
from pipeline.shard import shard_pipeline
from pipeline.tools import report
from tests.corpus_fixtures import write_bad_inputs, write_good_corpus
from tests.ops_fixtures import run_cli, s3_env, s3_server  # noqa: F401 - fixtures

IN_MEMORY = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def dataset(tiny_tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("report-corpus")
    write_good_corpus(root, limit_bytes=500_000)
    write_bad_inputs(root)
    out = tmp_path_factory.mktemp("report-out") / "ds"
    config = ShardConfig(inputs=(str(root / "*"),), output=str(out), tokenizer=tiny_tokenizer, seq_len=256,
                         num_shards=3, val_fraction=0.1, test_fraction=0.1, unit_mb=0.25)
    return out, shard_pipeline.run(config, IN_MEMORY, progress_every_s=0)


def test_histograms_sum_to_the_manifest_document_counts(dataset):
    _out, manifest = dataset
    stats = manifest["statistics"]["sources"]
    assert set(stats) == set(manifest["sources"])
    for source, per in manifest["sources"].items():
        assert sum(stats[source]["length_hist_log2"]) == sum(d["documents"] for d in per.values()), source
    assert sum(sum(s["length_hist_log2"]) for s in stats.values()) == sum(
        s["documents"] for s in manifest["splits"].values())
    for s in stats.values():  # tokenizer efficiency: plausible for code and English with a 1k vocabulary
        assert 1.0 < s["chars_per_token"] <= s["bytes_per_token"] < 8.0
        assert 0.0 <= s["byte_fallback_share"] < 0.5
    assert sum(s.get("duplicates", 0) for s in stats.values()) == manifest["records"]["filtered"].get("duplicate", 0)


def _metrics_file(path):
    lines = [json.dumps({"step": s, "loss": 9.0 / (1 + s / 10), "tokens_per_s": 1000.0 + 10 * s, "step_seconds": 0.5,
                         "data_wait_share": 0.01}) for s in range(5, 45, 5)]
    path.write_text("\n".join(lines) + "\n{not json\n")
    return str(path)


def test_report_page_is_self_contained_with_every_plot(dataset, tmp_path):
    out, manifest = dataset
    written = report.write_report(str(out), metrics_path=_metrics_file(tmp_path / "metrics.jsonl"))
    page = open(written, encoding="utf-8").read()
    assert not re.search(r'(src|href)="(https?:)?//', page), "the page must not load anything from the network"
    plots = re.findall(r'<img class="plot" id="plot-([a-z-]+)"[^>]*src="data:image/png;base64,([^"]+)"', page)
    names = {name for name, _ in plots}
    assert names >= {"tokens-per-source", "length-distribution", "tokenizer-efficiency", "byte-fallback", "shards",
                     "training"}
    for _name, b64 in plots:
        assert base64.b64decode(b64).startswith(PNG_MAGIC)
    for reason in manifest["records"]["dead_lettered"]:
        assert reason in page
    assert "invalid_json" in page and 'class="excerpts"' in page  # excerpts from the dead-letter files
    for row in manifest["inputs"]:
        assert row["path"] in page


def _chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    return exe


def test_report_renders_in_headless_chromium(dataset, tmp_path):
    exe = _chromium()
    out, _manifest = dataset
    page = report.write_report(str(out), str(tmp_path / "report.html"),
                               metrics_path=_metrics_file(tmp_path / "metrics.jsonl"))
    flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--window-size=1200,2400"]
    dom = subprocess.run(flags + ["--dump-dom", "file://" + page], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    imgs = re.findall(r"<img [^>]*>", dom.stdout)
    plots = [tag for tag in imgs if 'class="plot"' in tag]
    assert len(plots) >= 6 and f'data-plots="{len(plots)}"' in dom.stdout
    for tag in plots:
        natural = re.search(r'data-natural="(\d+)x(\d+)"', tag)
        rendered = re.search(r'data-rendered="(\d+)x(\d+)"', tag)
        assert natural and rendered, tag[:200]
        assert min(map(int, natural.groups())) > 50 and min(map(int, rendered.groups())) > 50, tag[:120]
    shot = tmp_path / "shot.png"
    res = subprocess.run(flags + [f"--screenshot={shot}", "file://" + page], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    import matplotlib.image as mpimg
    import numpy as np

    pixels = mpimg.imread(str(shot))[..., :3]
    assert pixels.shape[0] >= 2000 and pixels.shape[1] >= 1000
    not_white = (pixels < 0.9).any(axis=-1).mean()
    assert 0.05 < not_white < 0.95, f"the page looks blank ({not_white:.3f} of pixels not white)"
    assert len(np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 50  # plots, not just text


def test_cli_report_and_inspect_json(dataset, tmp_path, capsys):
    from pipeline import cli

    out, manifest = dataset
    target = tmp_path / "r.html"
    assert cli.main(["report", str(out), "--output", str(target)]) == 0
    assert capsys.readouterr().out.strip() == str(target) and target.stat().st_size > 10_000
    assert cli.main(["inspect", str(out), "--json", "--examples", "1"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["manifest"] == manifest and len(d["examples"]) == 1
    assert len(d["examples"][0]["input_ids"]) == manifest["contract"]["seq_len"]
    assert cli.main(["report", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert "no manifest" in err and len(err.strip().splitlines()) == 1
    res = subprocess.run([sys.executable, "-m", "pipeline.cli", "report", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and "--metrics" in res.stdout


def test_statistics_of_two_generations_add_up():
    from transforms.shard import corpus_stats

    a, b = {}, {}
    for n in (1, 3, 900):
        corpus_stats.add_written(a, "S", n)
    corpus_stats.add_written(b, "S", 5000)
    corpus_stats.add_written(b, "T", 2)
    corpus_stats.add_duplicate(b, "S")
    merged = corpus_stats.merge_sections({"sources": corpus_stats.finish(a), "length_bins": "log2"},
                                         {"sources": corpus_stats.finish(b), "length_bins": "log2"})
    assert sum(merged["sources"]["S"]["length_hist_log2"]) == 4 and merged["sources"]["S"]["duplicates"] == 1
    assert merged["sources"]["S"]["length_hist_log2"][corpus_stats.length_bin(5000)] == 1
    assert sum(merged["sources"]["T"]["length_hist_log2"]) == 1 and corpus_stats.length_bin(1) == 0


def test_inspect_report_and_export_read_s3_datasets(dataset, tmp_path, s3_server, s3_env):
    out, manifest = dataset
    client = s3_server.client()
    client.create_bucket(Bucket="reports")
    for p in sorted(out.rglob("*")):
        if p.is_file() and p.name != "report.html":
            client.upload_file(str(p), "reports", f"ds/{p.relative_to(out)}")
    uri = "s3://reports/ds"
    res = run_cli(["inspect", uri, "--json", "--examples", "1", *s3_server.beam_args()], timeout_s=120, env=s3_env)
    assert res.returncode == 0, res.stderr[-2000:]
    d = json.loads(res.stdout)
    assert d["manifest"] == manifest and d["manifest_path"] == uri + "/manifest.json" and len(d["examples"]) == 1
    res = run_cli(["report", uri, *s3_server.beam_args()], timeout_s=120, env=s3_env)
    assert res.returncode == 0, res.stderr[-2000:]
    page = client.get_object(Bucket="reports", Key="ds/report.html")["Body"].read().decode()
    assert page.count('class="plot"') >= 5 and "invalid_json" in page  # excerpts read from s3 dead letters
    res = run_cli(["export", uri, "--output", str(tmp_path / "pq"), *s3_server.beam_args()], timeout_s=120,
                  env=s3_env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(list((tmp_path / "pq").rglob("*.parquet"))) == len(manifest["shards"])  # <out>/<gen>/<shard>.parquet
    res = run_cli(["inspect", "s3://reports/none", *s3_server.beam_args()], timeout_s=120, env=s3_env)
    assert res.returncode == 2 and "no manifest at s3://reports/none/manifest.json" in res.stderr
