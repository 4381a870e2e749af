"""`pileprep report DIR`: one self-contained HTML page about a dataset, for people to look at.

Everything comes from the manifest, the dead-letter files (for excerpts) and, optionally, the trainer's metrics
JSON lines and the run's `--run-log` (pipeline/tools/report_data.py gathers them). The data itself is never
re-read, so a report of a terabyte dataset takes a second. The page needs no network: plots are PNGs embedded as
base64 data URIs (pipeline/tools/report_plots.py), styles inline. This module lays out the sections and writes
the page.

`render_report` is pure (manifest dict in, HTML out); `write_report` does the I/O, local or s3:// alike.

Data is never code: every value from the manifest, the dead letters or the data (source names, paths, hashes,
excerpts, decoded text) is made inert by pipeline/ops/safe_text.py and HTML-escaped where it enters the page
(pipeline/tools/report_html.py) and stripped of plot markup where it enters a plot; the page's
Content-Security-Policy allows no network, no inline handlers and only its own script and style by hash, so a
value that escaped anyway could still not run.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from typing import Optional

from pipeline.tools import report_near_dedup
from pipeline.tools.report_data import (decoded_examples, dedup_rows, headline, mixture_rows,
                                        read_dead_letter_rows, read_metrics, read_wall_time, split_shares)
from pipeline.tools.report_data import num as _num
from pipeline.tools.report_html import cell as _cell, escape as _e, escape_lines as _e_lines
from pipeline.tools.report_html import section as _section, table as _table
from pipeline.tools.report_plots import (plot_byte_fallback, plot_length_histograms, plot_mixture, plot_shards,
                                         plot_tokenizer_efficiency, plot_tokens_per_source, plot_training)
from transforms.shard.documents import SPLITS

MAX_EXCERPTS_PER_REASON = 3
REPORT_NAME = "report.html"


def _pct(a: float, b: float) -> str:
    return f"{100 * a / b:.3f}%" if b else "n/a"


_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#222;background:#fff}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;border-bottom:1px solid #ddd;padding-bottom:3px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0;font-size:12.5px}
td,th{border:1px solid #ddd;padding:3px 7px;text-align:right}
th{background:#f3f3f3} td:first-child,th:first-child{text-align:left} .meta{color:#555}
img.plot{display:block;margin:8px 0;max-width:100%;height:auto} code{background:#f5f5f5;padding:0 3px}
.excerpt{font-family:monospace;font-size:11.5px;text-align:left;max-width:520px;word-break:break-all}
dl.headline{display:grid;grid-template-columns:max-content auto;gap:2px 14px;margin:10px 0 4px}
dl.headline dt{color:#555} dl.headline dd{margin:0;font-weight:600}
pre.example{white-space:pre-wrap;word-break:break-word;background:#f7f7f7;padding:6px 8px;max-height:16em;
overflow:auto;font-size:12px} h3{font-size:14px;margin:12px 0 2px}
"""
# After load, record each plot's decoded size on the element: headless checks read it from the dumped DOM.
_SCRIPT = """
window.addEventListener('load', function () {
  var imgs = document.querySelectorAll('img.plot');
  for (var i = 0; i < imgs.length; i++) {
    imgs[i].setAttribute('data-natural', imgs[i].naturalWidth + 'x' + imgs[i].naturalHeight);
    var r = imgs[i].getBoundingClientRect();
    imgs[i].setAttribute('data-rendered', Math.round(r.width) + 'x' + Math.round(r.height));
  }
  document.body.setAttribute('data-plots', imgs.length);
});
"""



def render_report(manifest: dict, dead_letter_rows: Optional[list] = None, metrics: Optional[list] = None,
                  title: str = "", examples: Optional[dict] = None, wall_s: Optional[float] = None) -> str:
    """The report page for a manifest dict; `dead_letter_rows` give excerpts, `metrics` the trainer's curves,
    `examples` {split: {shard, text | ids, note}} one decoded example per split, `wall_s` the run's wall time."""
    c = manifest["contract"]
    seq_len = _num(c["seq_len"])
    stats = manifest.get("statistics", {}).get("sources", {})
    splits = [s for s in SPLITS if s in manifest["splits"]]
    rec = manifest["records"]
    parts = [f"<h1>pileprep dataset report{': ' + _e(title) if title else ''}</h1>",
             '<dl class="headline">' + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>"
                                               for k, v in headline(manifest, wall_s)) + "</dl>",
             f'<p class="meta">pileprep {_e(manifest.get("pileprep_version", "?"))} · contract {_e(c["version"])} · '
             f'seq_len {_e(c["seq_len"])} · tokenizer sha256 <code>{_e(c["tokenizer"]["model_sha256"])}</code></p>']

    split_rows = []
    for s in splits:
        d = manifest["splits"][s]
        split_rows.append([s, d["shards"], d["examples"], d["documents"], d["tokens"], d["padding_tokens"],
                           _pct(_num(d["padding_tokens"]), _num(d["examples"]) * seq_len)])
    parts.append(_section("Splits", _table(["split", "shards", "examples", "documents", "tokens", "padding tokens",
                                            "padding"], split_rows),
                          f"<p>padding fraction overall: {100 * _num(manifest['padding_fraction']):.4f}%</p>"))

    if examples:
        ex_parts = []
        for split in [s for s in SPLITS if s in examples] + sorted(s for s in examples if s not in SPLITS):
            ex = examples[split]
            body = ex.get("text") if ex.get("text") is not None else " ".join(map(str, ex.get("ids", [])[:64]))
            ex_parts.append(f"<h3>{_e(split)} <span class=\"meta\">{_e(ex.get('shard', ''))}, example 0, first "
                            f"document piece{(' — ' + _e(ex['note'])) if ex.get('note') else ''}</span></h3>"
                            f'<pre class="example">{_e_lines(body)}</pre>')
        parts.append(_section("One example per split, decoded", *ex_parts))

    shares = split_shares(manifest)
    source_rows = []
    for src, per in sorted(manifest["sources"].items()):
        row = [src]
        for s in splits:
            row += [per.get(s, {}).get("documents", 0), per.get(s, {}).get("tokens", 0),
                    f"{shares.get(s, {}).get(src, 0.0):.2f}%"]
        source_rows.append(row)
    headers = ["source"] + [f"{s} {k}" for s in splits for k in ("docs", "tokens", "share")]
    sources_parts = [_table(headers, source_rows)]
    if manifest["sources"]:
        sources_parts.append(plot_tokens_per_source(manifest))
    parts.append(_section("Tokens and documents per source", *sources_parts))

    mix_rows = mixture_rows(manifest)
    if mix_rows:
        mix = manifest.get("mixture") or {}
        parts.append(_section(
            "Mixture", plot_mixture(mix_rows), _table(
                ["source", "weight (epochs)", "unique train tokens", "share of unique tokens", "the Pile paper",
                 "realised (train as written)"],
                [[r["source"], r["weight"], r["unique_tokens"], f"{r['corpus_share']:.2f}%",
                  f"{r['paper_share']:.2f}%" if r["paper_share"] is not None else "—",
                  f"{r['realised_share']:.2f}%"] for r in mix_rows]),
            f"<p>Weights: {_e(json.dumps(mix.get('weights', {}), sort_keys=True)) if mix else 'none (every source 1)'}. "
            "The Pile paper's column is each component's share of the Pile's training mix (Gao et al. 2020, "
            "Table 1), for the sources of that name.</p>"))

    from pipeline.tools.report_packing import packing_section  # noqa: PLC0415 - absent for concat datasets

    parts.append(packing_section(manifest))

    if stats:
        eff_rows = [[src, s.get("tokenized_documents", 0), s.get("chars", 0), s.get("bytes", 0), s.get("tokens", 0),
                     s.get("chars_per_token", 0.0), s.get("bytes_per_token", 0.0),
                     f"{100 * _num(s.get('byte_fallback_share', 0.0)):.3f}%", s.get("duplicates", 0)]
                    for src, s in sorted(stats.items())]
        parts.append(_section(
            "Exact duplicates per source",
            _table(["source", "documents read", "duplicates dropped", "share dropped"], dedup_rows(stats)),
            "<p>Documents tokenized from the inputs and the exact copies removed before packing, by the source of "
            "the removed copy.</p>"))
        parts.append(_section(
            "Document lengths", plot_length_histograms(stats),
            "<p>Documents as written to the shards (after dedup, with mixture copies); bin <i>i</i> holds "
            "lengths in [2<sup>i</sup>, 2<sup>i+1</sup>) tokens without EOS.</p>"))
        parts.append(_section(
            "Tokenizer efficiency and duplicates",
            _table(["source", "documents tokenized", "chars", "bytes", "tokens", "chars/token", "bytes/token",
                    "byte fallback", "exact duplicates dropped"], eff_rows),
            plot_tokenizer_efficiency(stats), plot_byte_fallback(stats)))

    if manifest["shards"]:
        parts.append(_section("Shards", plot_shards(manifest), _table(
            ["shard", "split", "examples", "documents", "tokens", "padding", "bytes", "sha256"],
            [[s["path"], s["split"], s["examples"], s["documents"], s["tokens"],
              _pct(_num(s["padding_tokens"]), _num(s["examples"]) * seq_len), s["bytes"], str(s["sha256"])[:12]]
             for s in manifest["shards"]])))

    reasons = [["filtered", r, n] for r, n in sorted(rec.get("filtered", {}).items())]
    reasons += [["dead-lettered", r, n] for r, n in sorted(rec.get("dead_lettered", {}).items())]
    excerpts: dict = {}
    for row in dead_letter_rows or []:
        if not isinstance(row, dict):
            continue
        lst = excerpts.setdefault(str(row.get("reason", "?")), [])
        if len(lst) < MAX_EXCERPTS_PER_REASON:
            lst.append(row)
    ex_rows = [[r, row.get("file", ""), row.get("line", ""), str(row.get("excerpt", ""))[:300]]
               for r, lst in sorted(excerpts.items()) for row in lst]
    parts.append(_section(
        "Filtered and dead-lettered records",
        f"<p>read {_cell(rec.get('read', 0))} = written {_cell(rec.get('written', 0))} + filtered "
        f"{_cell(sum(_num(v) for v in rec.get('filtered', {}).values()))} + dead-lettered "
        f"{_cell(sum(_num(v) for v in rec.get('dead_lettered', {}).values()))}</p>",
        _table(["kind", "reason", "records"], reasons),
        _table(["reason", "file", "line", "excerpt"], ex_rows, "excerpts") if ex_rows else "",
        f"<p>dead-letter files: {len(manifest.get('dead_letters', []))}</p>"))

    parts.append(report_near_dedup.section(manifest))  # "" without --near-dedup / --decontaminate
    parts.append(_section("Inputs", _table(
        ["file", "bytes", "read", "written", "filtered", "dead-lettered"],
        [[i["path"], i.get("bytes", 0), i["read"], i["written"], sum(_num(v) for v in i["filtered"].values()),
          sum(_num(v) for v in i["dead_lettered"].values())] for i in manifest.get("inputs", [])])))

    if metrics:
        parts.append(_section("Training", plot_training(metrics), _table(
            ["step", "loss", "tokens/s", "step s", "data wait"],
            [[m["step"], m["loss"], m.get("tokens_per_s", 0.0), m.get("step_seconds", 0.0),
              f"{100 * _num(m.get('data_wait_share', 0.0)):.1f}%"] for m in metrics])))

    if manifest.get("retrieval"):
        parts.append(_section("Retrieval", _table(["key", "value"], [
            [k, json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v]
            for k, v in sorted(_flat(manifest["retrieval"]).items())])))

    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{_e(content_security_policy())}">'
            f"<title>pileprep report {_e(title)}</title><style>{_STYLE}</style></head>"
            f"<body>{''.join(parts)}<script>{_SCRIPT}</script></body></html>\n")


def _csp_hash(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode("utf-8")).digest()).decode("ascii") + "'"


def content_security_policy() -> str:
    """Nothing from the network, no inline handlers or injected script: only the page's own script and style
    (by hash), its embedded PNGs (data: URIs), no forms, no base URL."""
    return (f"default-src 'none'; script-src {_csp_hash(_SCRIPT)}; style-src {_csp_hash(_STYLE)}; "
            "img-src data:; base-uri 'none'; form-action 'none'")


def _flat(d: dict, prefix: str = "", depth: int = 0) -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and depth < 1:
            out.update(_flat(v, key + ".", depth + 1))
        else:
            out[key] = v
    return out


_PAGE_START = b"<!DOCTYPE html>\n<html lang=\"en\"><head>"
_PAGE_TITLE = b"<title>pileprep report "


def check_report_output(output: str) -> None:
    """ConfigError (exit 2) when `output` exists and is not a page this command wrote: `--output` naming a
    dataset's manifest.json, a shard or any file of the user's would otherwise be replaced by the page."""
    from pipeline.errors import ConfigError  # noqa: PLC0415
    from transforms.io import io_utils  # noqa: PLC0415

    if not io_utils.exists(output):
        return
    if io_utils.is_local(output) and os.path.isdir(output):
        raise ConfigError(f"--output {output}: it is a directory; the report is one file: name the file")
    if io_utils.is_local(output) and not stat.S_ISREG(os.stat(output).st_mode):  # a FIFO's read would block
        raise ConfigError(f"--output {output}: it is not a regular file: choose another --output")
    with io_utils.open_read(output) as f:
        head = f.read(4096)
    if not (head.startswith(_PAGE_START) and _PAGE_TITLE in head):
        raise ConfigError(f"--output {output}: it exists and is not a pileprep report; a report replaces only an "
                          f"earlier report: choose another --output")


def write_report(dataset: str, output: Optional[str] = None, metrics_path: Optional[str] = None,
                 run_log: Optional[str] = None) -> str:
    """Render DIR's committed manifest to `output` (default DIR/report.html); returns where it was written."""
    from pipeline.ops import commit  # noqa: PLC0415
    from transforms.io import io_utils  # noqa: PLC0415

    output = output or io_utils.join(dataset, REPORT_NAME)
    check_report_output(output)  # before any work
    manifest = commit.read_committed(dataset)
    if manifest is None:
        raise FileNotFoundError(f"no manifest at {commit.manifest_location(dataset)}: the dataset is missing or "
                                f"was never committed")
    d = commit.require_dataset(manifest, dataset).to_dict()
    page = render_report(d, read_dead_letter_rows(dataset, d), read_metrics(metrics_path) if metrics_path else None,
                         title=dataset.rstrip("/").rsplit("/", 1)[-1],
                         examples=decoded_examples(commit.manifest_location(dataset), manifest),
                         wall_s=read_wall_time(run_log) if run_log else None)
    data = page.encode("utf-8")
    io_utils.publish_bytes(output, data)
    return output

