"""`pileprep report`: distributions from the manifest, a self-contained page, rendered in a real browser."""
from __future__ import annotations

import base64
import html
import json
import os
import re
import stat
import shutil
import subprocess
import sys

import pytest

from pipeline.config import ShardConfig
from pipeline.shard import shard_pipeline
from pipeline.tools import report, report_data, report_plots
from tests.corpus_fixtures import good_documents, write_bad_inputs, write_good_corpus
from transforms.shard import mixture
from tests.ops_fixtures import run_cli, s3_env, s3_server  # noqa: F401 - fixtures

IN_MEMORY = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


UMASK = 0o002  # a group-shared filesystem's umask: published files must come out 0664, not mkstemp's 0600


@pytest.fixture(scope="module")
def corpus_docs(tmp_path_factory):
    root = tmp_path_factory.mktemp("report-corpus")
    docs = write_good_corpus(root, limit_bytes=500_000)
    write_bad_inputs(root)
    return root, docs


@pytest.fixture(scope="module")
def dataset(tiny_tokenizer, tmp_path_factory, corpus_docs):
    root, _docs = corpus_docs
    out = tmp_path_factory.mktemp("report-out") / "ds"
    config = ShardConfig(inputs=(str(root / "*"),), output=str(out), tokenizer=tiny_tokenizer, seq_len=256,
                         num_shards=3, val_fraction=0.1, test_fraction=0.1, unit_mb=0.25)
    old = os.umask(UMASK)
    try:
        return out, shard_pipeline.run(config, IN_MEMORY, progress_every_s=0)
    finally:
        os.umask(old)


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


def test_export_to_s3_takes_the_outputs_lock(dataset, tmp_path, s3_server, s3_env):
    """Export on an object-store output took no lock (two exports into one prefix raced): it takes the output's
    lock object, a conditional PUT (pipeline/ops/lock.py), with the store's options from the command line."""
    from pipeline.ops import lock
    from tests.ops_fixtures import dataset_files

    # A copy: the export registers a ref in the dataset it reads, and the module's dataset fixture is shared (the
    # umask test below checks the mode of every file in it).
    out, manifest = tmp_path / "dataset", dataset[1]
    shutil.copytree(dataset[0], out)
    client = s3_server.client()
    client.create_bucket(Bucket="exports")
    options = {"s3_endpoint_url": s3_server.endpoint, "s3_region_name": "us-east-1",
               "s3_access_key_id": "testing", "s3_secret_access_key": "testing"}
    before = dataset_files(out)

    def keys():
        listed = client.list_objects_v2(Bucket="exports", Prefix="pq/").get("Contents", [])
        return sorted(o["Key"] for o in listed)

    with lock.OutputLock("s3://exports/pq", options).held():  # another export writing there
        res = run_cli(["export", str(out), "--output", "s3://exports/pq", *s3_server.beam_args()], timeout_s=120,
                      env=s3_env)
        assert keys() == ["pq/" + lock.LOCK_NAME]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1 and "output is locked by" in lines[0], res.stderr[-2000:]
    assert dataset_files(out) == before  # refused before its ref was registered
    res = run_cli(["export", str(out), "--output", "s3://exports/pq", *s3_server.beam_args()], timeout_s=120,
                  env=s3_env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert len([k for k in keys() if k.endswith(".parquet")]) == len(manifest["shards"])
    assert "pq/export.json" in keys() and "pq/" + lock.LOCK_NAME not in keys()  # released


# ------------------------------------------------------------------------------ readable by others
def test_every_file_the_run_and_the_report_publish_has_the_umask_mode(dataset):
    out, _manifest = dataset
    old = os.umask(UMASK)
    try:
        report.write_report(str(out))
    finally:
        os.umask(old)
    files = [p for p in out.rglob("*") if p.is_file() and p.name != ".pileprep.lock"]
    names = {p.name for p in files}
    assert {"manifest.json", "report.html"} <= names and any(n.endswith(".tfrecord") for n in names), names
    wrong = {str(p.relative_to(out)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files
             if stat.S_IMODE(p.stat().st_mode) != 0o666 & ~UMASK}
    assert wrong == {}, wrong


# ------------------------------------------------------------------------------ what it says
def test_headline_mixture_dedup_and_one_decoded_example_per_split(dataset, corpus_docs, tmp_path):
    out, manifest = dataset
    _root, docs = corpus_docs
    run_log = tmp_path / "run.jsonl"
    run_log.write_text(json.dumps({"event": "summary", "wall_s": 12.345}) + "\n")
    page = open(report.write_report(str(out), str(tmp_path / "r.html"), run_log=str(run_log)), encoding="utf-8").read()
    head = dict(report_data.headline(manifest, 12.345))
    assert head["tokens"] == f"{sum(s['tokens'] for s in manifest['splits'].values()):,}"
    assert head["documents"] == f"{sum(s['documents'] for s in manifest['splits'].values()):,}"
    on_disk = sum(s["bytes"] for s in manifest["shards"]) + sum(f["bytes"] for f in manifest["doc_id_indexes"])
    assert report_data.bytes_on_disk(manifest) >= on_disk > 0
    assert head["wall time"] == "12.3 s" and head["generation"] == manifest["generation"]
    assert head["backend"].startswith(manifest.get("tokenizer_backend", {}).get("name", "sentencepiece"))
    for label, value in head.items():
        assert f"<dt>{label}</dt><dd>{html.escape(value)}</dd>" in page
    # Shares: per split they add up to 100%; no weights, so the realised mix is the corpus's own; the Pile
    # paper's share sits beside every source that has a Pile name.
    for split, shares in report_data.split_shares(manifest).items():
        assert abs(sum(shares.values()) - 100.0) < 1e-6, split
    rows = report_data.mixture_rows(manifest)
    assert {r["source"] for r in rows} == set(manifest["sources"])
    for r in rows:
        assert abs(r["corpus_share"] - r["realised_share"]) < 1e-9, r
        expected = mixture.PILE_PAPER_SHARES.get(r["source"])
        assert r["paper_share"] == (100 * expected if expected is not None else None)
    assert any(r["paper_share"] for r in rows) and "the Pile paper" in page
    # Dedup share per source: the fixture's one planted copy is counted against its source.
    dedup = {row[0]: row for row in report_data.dedup_rows(manifest["statistics"]["sources"])}
    assert sum(row[2] for row in dedup.values()) == manifest["records"]["filtered"]["duplicate"] >= 1
    assert all(row[3].endswith("%") for row in dedup.values() if row[1])
    # One decoded example per split, as text from the inputs.
    examples = report_data.decoded_examples(str(out / "manifest.json"), report_manifest(out))
    assert set(examples) == {s for s in ("train", "val", "test") if manifest["splits"].get(s, {}).get("examples")}
    texts = [t for t, _s in docs + good_documents(600_000, skip=40)]  # write_good_corpus's and write_bad_inputs'
    for split, ex in examples.items():
        assert ex["text"] and ex["note"] == "", (split, ex)
        probe = ex["text"].removeprefix("# damaged-file fixture\n").strip()[:40]
        assert any(probe in t for t in texts), (split, probe)
        assert html.escape(ex["text"][:40]) in page


def report_manifest(out):
    from model_contract import load_manifest

    return load_manifest(str(out))


def test_shard_balance_is_one_labelled_panel_per_split_and_plot_text_is_inert(dataset, monkeypatch):
    """Horizontal, readable shard names in one panel per split (never a line from train shards to val ones);
    data strings in plots lose control characters and mathtext (a `$` formula would raise or draw markup)."""
    _out, manifest = dataset
    figures = []
    real_img = report_plots._img
    monkeypatch.setattr(report_plots, "_img", lambda pid, fig, alt, adjust=True: (figures.append((pid, fig)),
                                                                            real_img(pid, fig, alt, adjust))[1])
    report_plots.plot_shards(manifest)
    (_pid, fig), = figures
    splits = [s for s in ("train", "val", "test") if any(sh["split"] == s for sh in manifest["shards"])]
    assert len(fig.axes) == len(splits)
    for ax, split in zip(fig.axes, splits):
        names = [t.get_text() for t in ax.get_yticklabels()]
        assert names == [sh["path"].rsplit("/", 1)[-1].replace(".tfrecord", "") for sh in manifest["shards"]
                         if sh["split"] == split]
        assert all(t.get_rotation() == 0 and t.get_fontsize() >= 8 for t in ax.get_yticklabels())
        assert ax.get_lines() == [] and ax.get_title().startswith(split)
    # the one sanitizer (pipeline/ops/safe_text.py): controls shown escaped, never acted on; `$` escaped
    assert report_plots.plot_text("a\x1b[31mb\nc$\\frac{1}{$") == "a\\x1b[31mb\\nc\\$\\frac{1}{\\$"
    hostile = {**manifest, "sources": {"$\\frac{x$\x1b[2J": per for per in manifest["sources"].values()}}
    assert report_plots.plot_tokens_per_source(hostile).startswith('<img class="plot"')


# ------------------------------------------------------------------------------ data is never code
MARKUP = '<script>document.body.setAttribute("data-pwned","{i}")</script><img src=x onerror="pwn{i}()">"\'&</p>'
# ...and control characters: a terminal escape, a carriage return, NUL, C1 NEL, a bidi override, a line separator.
CONTROLS = "\x1b[2J\r\x00\x85\u202e\u2028"
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _hostile(value, counter):
    """Every string in a manifest (dict keys of sources too) replaced by markup that would run if not escaped."""
    if isinstance(value, dict):
        return {(_hostile(k, counter) if isinstance(k, str) and k not in HOSTILE_KEEP_KEYS else k): _hostile(v, counter)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_hostile(v, counter) for v in value]
    if isinstance(value, str):
        counter[0] += 1
        return MARKUP.format(i=counter[0]) + CONTROLS
    return value


# Structural keys (field names the page looks up) stay; every *value*, and every source or reason name, is markup.
HOSTILE_KEEP_KEYS = None


def hostile_manifest(manifest: dict) -> dict:
    global HOSTILE_KEEP_KEYS
    keep = set()

    def field_names(v):
        if isinstance(v, dict):
            for k, x in v.items():
                keep.add(k)
                field_names(x)
        elif isinstance(v, list):
            for x in v:
                field_names(x)

    field_names(manifest)
    data_keys = set(manifest["sources"]) | set(manifest["statistics"]["sources"]) | set(
        manifest["records"]["filtered"]) | set(manifest["records"]["dead_lettered"])
    HOSTILE_KEEP_KEYS = keep - data_keys
    d = _hostile(manifest, [0])
    d["contract"]["tokenizer"]["model_sha256"] = "<script>/*"  # the case that ran script before
    d["splits"] = manifest["splits"]  # split names are the contract's own (train/val/test)
    return d


def _page_without_own_script(page):
    own = page.rsplit("<script>", 1)
    return own[0] + own[1].split("</script>", 1)[1]


def test_every_string_field_of_the_manifest_is_escaped_on_the_page(dataset):
    _out, manifest = dataset
    bad = hostile_manifest(manifest)
    rows = [{"reason": MARKUP.format(i="dl") + CONTROLS, "file": MARKUP.format(i="f") + CONTROLS, "line": 3,
             "excerpt": MARKUP.format(i="x") + CONTROLS}]
    examples = {"train": {"shard": MARKUP.format(i="s") + CONTROLS, "text": "line 1\nline 2" + MARKUP.format(i="t")
                          + CONTROLS, "ids": [], "note": CONTROLS}}
    page = report.render_report(bad, rows, title=MARKUP.format(i="title") + CONTROLS, examples=examples)
    rest = _page_without_own_script(page)
    assert "<script" not in rest.lower() and "<img src=x" not in rest and "onerror=\"" not in rest
    assert page.count("&lt;script&gt;") > 20 and "&lt;script&gt;/*" in page
    assert rest.count("<img ") == rest.count('<img class="plot"')
    # Control characters from the data reach the page as their visible escapes (pipeline/ops/safe_text.py), never
    # raw; a decoded example keeps its own newlines.
    assert not RAW_CONTROL.search(page), repr(RAW_CONTROL.search(page).group(0))
    assert page.count("\\x1b[2J\\r\\x00\\x85\\u202e\\u2028") > 20 and "line 1\nline 2" in page


def test_the_page_allows_only_its_own_script_by_hash():
    import hashlib

    page = report.render_report(_minimal_manifest())
    csp = html.unescape(re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', page).group(1))
    script = page.rsplit("<script>", 1)[1].split("</script>", 1)[0]
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["script-src"] == f"'sha256-{digest}'" and directives["default-src"] == "'none'"
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp and directives["img-src"] == "data:"
    assert page.index("Content-Security-Policy") < page.index("<style>")


def _minimal_manifest():
    return {"contract": {"version": "1.0", "seq_len": 8, "tokenizer": {"kind": "sentencepiece", "model_sha256": "0" * 64,
                                                                        "vocab_size": 10}},
            "splits": {}, "sources": {}, "records": {}, "shards": [], "padding_fraction": 0.0}


def test_script_in_a_data_field_does_not_run_in_chromium(dataset, tmp_path):
    """The hostile page in a real browser: the page's own script runs (its hash is in the policy), injected
    markup does not, neither escaped (every field) nor raw (an escaping bug, simulated: the policy still holds)."""
    exe = _chromium()
    _out, manifest = dataset
    page = report.render_report(hostile_manifest(manifest), title=MARKUP.format(i="title"),
                                examples={"train": {"shard": "s", "text": MARKUP.format(i="t"), "ids": [], "note": ""}})
    raw = page.replace("<h1>", MARKUP.format(i="raw") + "<h1>", 1)  # unescaped, as a missed field would be
    for name, text in (("escaped", page), ("raw", raw)):
        path = tmp_path / f"{name}.html"
        path.write_text(text, encoding="utf-8")
        dom = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                              f"--user-data-dir={tmp_path / ('profile-' + name)}", "--virtual-time-budget=3000",
                              "--dump-dom", "file://" + str(path)], capture_output=True, text=True, timeout=120)
        assert dom.returncode == 0, dom.stderr[-2000:]
        body = re.search(r"<body[^>]*>", dom.stdout).group(0)
        assert "data-plots=" in body, (name, body)  # the page's own script ran
        assert "data-pwned" not in body, (name, body)  # no injected one did
