"""`pileprep report DIR`: one self-contained HTML page about a dataset, for people to look at.

Everything comes from the manifest (the shard job computed the distributions, transforms/shard/corpus_stats.py), the
dead-letter files (for excerpts) and, optionally, the trainer's metrics JSON lines (trainer/metrics.py). The
data itself is never re-read, so a report of a terabyte dataset takes a second. The page needs no network:
plots are PNGs (matplotlib's Agg canvas, no pyplot global state) embedded as base64 data URIs, styles inline.

`render_report` is pure (manifest dict in, HTML out); `write_report` does the I/O, local or s3:// alike.

Data is never code: every value from the manifest, the dead letters or the data (source names, paths, hashes,
excerpts, decoded text) is made inert by pipeline/ops/safe_text.py and HTML-escaped where it enters the page
and stripped of plot markup where it enters a plot; the page's Content-Security-Policy allows no network, no
inline handlers and only its own script and style by hash, so a value that escaped anyway could still not run.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import os
import stat
from typing import Optional

from transforms.shard import mixture as mixture_weights
from pipeline.ops import safe_text
from pipeline.tools import report_near_dedup
from pipeline.tools.report_html import cell as _cell, escape as _e, escape_lines as _e_lines
from pipeline.tools.report_html import section as _section, table as _table
from transforms.shard.documents import SPLITS

MAX_EXCERPTS_PER_REASON = 3
MAX_DEAD_LETTER_ROWS = 2000  # read at most this many dead-letter rows for excerpts (they can be many)
REPORT_NAME = "report.html"


# ------------------------------------------------------------------------------------------------ plots
def plot_text(value, limit: int = 24) -> str:
    """A data string as plain text inside a plot, cut to `limit` characters: the one plot sanitizer
    (pipeline/ops/safe_text.py: no control characters or escape sequences, `$` escaped so matplotlib parses no
    mathtext, where a malformed formula raises and a well-formed one draws markup)."""
    text = str(value)
    text = text if len(text) <= limit else text[:limit - 1] + "…"
    return safe_text.plot(text)


def _figure(width: float = 7.5, height: float = 3.4):
    from matplotlib.figure import Figure  # noqa: PLC0415 - only the report needs matplotlib

    fig = Figure(figsize=(width, height), dpi=100)
    return fig, fig.add_subplot(1, 1, 1)


def _png(fig, adjust: bool = True) -> str:
    buf = io.BytesIO()
    # Fixed margins (room for rotated labels) instead of tight_layout, which draws every figure twice.
    if adjust:
        fig.subplots_adjust(left=0.1, right=0.9, top=0.9, bottom=0.25)
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _img(plot_id: str, fig, alt: str, adjust: bool = True) -> str:
    w, h = (int(round(v * fig.dpi)) for v in fig.get_size_inches())
    return (f'<img class="plot" id="plot-{_e(plot_id)}" alt="{_e(alt)}" width="{w}" '
            f'height="{h}" src="data:image/png;base64,{_png(fig, adjust)}">')


def _bars(ax, labels, series: dict, ylabel: str, log: bool = False) -> None:
    n = max(1, len(series))
    width = 0.8 / n
    for k, (name, values) in enumerate(series.items()):
        ax.bar([i + k * width - 0.4 + width / 2 for i in range(len(labels))], values, width, label=plot_text(name))
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels([plot_text(lab, 20) for lab in labels], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    if n > 1:
        ax.legend(fontsize=8)


def _hbars(labels, series: dict, xlabel: str, title: str, plot_id: str, alt: str) -> str:
    """Horizontal bars, one row per label, read left to right on one linear scale (labels never rotated)."""
    n = max(1, len(series))
    fig, ax = _figure(7.5, max(2.4, 0.75 + 0.28 * len(labels) * max(1, n / 2)))
    height = 0.8 / n
    for k, (name, values) in enumerate(series.items()):
        ax.barh([i + k * height - 0.4 + height / 2 for i in range(len(labels))], values, height,
                label=plot_text(name))
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels([plot_text(lab, 28) for lab in labels], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.set_xlim(0, max([1.0] + [v for vals in series.values() for v in vals]) * 1.08)
    if n > 1:
        ax.legend(fontsize=8, loc="lower right")
    h = fig.get_size_inches()[1]  # margins in inches, so the axis label fits whatever the row count
    fig.subplots_adjust(left=0.3, right=0.97, top=1 - 0.4 / h, bottom=0.6 / h)
    return _img(plot_id, fig, alt, adjust=False)


def split_shares(manifest: dict) -> dict:
    """{split: {source: % of that split's tokens}}: shares are comparable across sources and splits."""
    out = {}
    for split in (s for s in SPLITS if s in manifest["splits"]):
        tokens = {src: _num(per.get(split, {}).get("tokens", 0)) for src, per in manifest["sources"].items()}
        total = sum(tokens.values())
        out[split] = {src: (100.0 * t / total if total else 0.0) for src, t in tokens.items()}
    return out


def plot_tokens_per_source(manifest: dict) -> str:
    sources = sorted(manifest["sources"])
    shares = split_shares(manifest)
    return _hbars(sources, {split: [shares[split].get(src, 0.0) for src in sources] for split in shares},
                  "% of the split's tokens", "token share per source and split", "tokens-per-source",
                  "token share per source and split")


def plot_length_histograms(stats: dict) -> str:
    fig, ax = _figure(7.5, 3.8)
    for source, s in sorted(stats.items()):
        hist = s.get("length_hist_log2") or []
        if not any(hist):
            continue
        edges = [2 ** i for i in range(len(hist) + 1)]
        ax.stairs(hist, edges, label=plot_text(source))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("document length, tokens (log2 bins)")
    ax.set_ylabel("documents")
    ax.set_title("document length distribution per source")
    ax.legend(fontsize=7)
    return _img("length-distribution", fig, "document length distribution per source")


def plot_tokenizer_efficiency(stats: dict) -> str:
    sources = [s for s in sorted(stats) if stats[s].get("tokens")]
    fig, ax = _figure()
    _bars(ax, sources, {"chars / token": [stats[s]["chars_per_token"] for s in sources],
                        "bytes / token": [stats[s]["bytes_per_token"] for s in sources]}, "per token")
    ax.set_title("tokenizer efficiency per source")
    return _img("tokenizer-efficiency", fig, "chars and bytes per token per source")


def plot_byte_fallback(stats: dict) -> str:
    sources = [s for s in sorted(stats) if stats[s].get("tokens")]
    fig, ax = _figure()
    _bars(ax, sources, {"byte-fallback share": [100 * stats[s]["byte_fallback_share"] for s in sources]},
          "% of tokens")
    ax.set_title("byte-fallback tokens per source")
    return _img("byte-fallback", fig, "byte-fallback share per source")


MAX_LABELLED_SHARDS = 40  # beyond this a panel shows shard indexes on an axis, not one label per shard


def plot_shards(manifest: dict) -> str:
    """Balance: examples per shard, one panel per split (a split's shards are never joined to another's);
    up to MAX_LABELLED_SHARDS shards are labelled by name, horizontally, more by index."""
    seq_len = _num(manifest["contract"]["seq_len"]) or 1
    groups: dict = {}
    for s in manifest["shards"]:
        groups.setdefault(str(s["split"]), []).append(s)
    names = [n for n in SPLITS if n in groups] + sorted(n for n in groups if n not in SPLITS)
    rows = [min(len(groups[n]), MAX_LABELLED_SHARDS + 1) for n in names]
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=(7.5, 0.9 + sum(0.5 + 0.22 * r for r in rows)), dpi=100)
    axes = fig.subplots(len(names), 1, squeeze=False, gridspec_kw={"height_ratios": [2 + r for r in rows]})[:, 0]
    for ax, name in zip(axes, names):
        shards = groups[name]
        examples = [_num(s["examples"]) for s in shards]
        padding = [_num(s["padding_tokens"]) / seq_len for s in shards]
        y = range(len(shards))
        ax.barh(list(y), examples, color="#4c72b0", label="examples")
        ax.barh(list(y), padding, color="#dd8452", label="padding (examples' worth)")
        if len(shards) <= MAX_LABELLED_SHARDS:
            ax.set_yticks(list(y))
            ax.set_yticklabels([plot_text(str(s["path"]).rsplit("/", 1)[-1].replace(".tfrecord", ""), 28)
                                for s in shards], fontsize=8)
        else:
            ax.set_ylabel("shard index", fontsize=8)
        ax.invert_yaxis()
        mean = sum(examples) / len(examples) if examples else 0
        spread = (max(examples) - min(examples)) / mean if mean else 0.0
        ax.set_title(f"{plot_text(name, 16)}: {len(shards)} shards, examples per shard "
                     f"{min(examples):,.0f}–{max(examples):,.0f} (spread {spread:.1%})", fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
    axes[0].legend(fontsize=7, loc="lower right")
    axes[-1].set_xlabel("examples per shard")
    h = fig.get_size_inches()[1]
    fig.subplots_adjust(left=0.25, right=0.97, top=1 - 0.35 / h, bottom=0.5 / h, hspace=0.6)
    return _img("shards", fig, "examples and padding per shard, one panel per split", adjust=False)


def plot_mixture(rows: list) -> str:
    """rows from `mixture_rows`: the source's share of the corpus, the Pile paper's, and the realised train mix."""
    labels = [r["source"] for r in rows]
    series = {"share of unique tokens": [r["corpus_share"] for r in rows],
              "the Pile paper": [r["paper_share"] or 0.0 for r in rows],
              "realised (train, after weights)": [r["realised_share"] for r in rows]}
    return _hbars(labels, series, "% of tokens", "mixture: each source's share of tokens", "mixture",
                  "source shares: corpus, Pile paper, realised")


def plot_training(metrics: list) -> str:
    fig, ax = _figure(7.5, 3.6)
    steps = [m["step"] for m in metrics]
    ax.plot(steps, [m["loss"] for m in metrics], "o-", color="#c44e52", label="loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax2 = ax.twinx()
    ax2.plot(steps, [m.get("tokens_per_s", 0) for m in metrics], "s--", color="#4c72b0", label="tokens/s")
    ax2.set_ylabel("tokens/s")
    ax.set_title("training: loss and throughput")
    fig.legend(fontsize=8, loc="upper center")
    return _img("training", fig, "training loss and throughput")


# ------------------------------------------------------------------------------------------------ tables
def _pct(a: float, b: float) -> str:
    return f"{100 * a / b:.3f}%" if b else "n/a"


# ------------------------------------------------------------------------------------------------ page
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


def _num(v) -> float:
    """A count or size from the manifest as a number (0 for anything else), for arithmetic only: display goes
    through `_cell`, which escapes whatever the value is."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else 0


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1024
    return ""


def bytes_on_disk(manifest: dict) -> int:
    """Shards, document-id indexes and dead-letter files the manifest lists (the manifest itself aside)."""
    listed = list(manifest.get("shards", [])) + list(manifest.get("doc_id_indexes", []) or []) + list(
        manifest.get("dead_letter_files", []) or [])
    return int(sum(_num(f.get("bytes", 0)) for f in listed if isinstance(f, dict)))


def headline(manifest: dict, wall_s: Optional[float] = None) -> list:
    """(label, value) pairs for the page's first lines: what a data engineer asks first."""
    c = manifest["contract"]
    tok = c["tokenizer"]
    splits = manifest["splits"]
    backend = manifest.get("tokenizer_backend") or {}
    generations = manifest.get("generations") or []
    tokenizer_name = str(manifest.get("config", {}).get("tokenizer", "?")).rstrip("/").rsplit("/", 1)[-1]
    return [
        ("tokens", f"{int(sum(_num(d.get('tokens', 0)) for d in splits.values())):,}"),
        ("documents", f"{int(sum(_num(d.get('documents', 0)) for d in splits.values())):,}"),
        ("examples", f"{int(sum(_num(d.get('examples', 0)) for d in splits.values())):,} of "
                     f"{c['seq_len']} tokens"),
        ("bytes on disk", _bytes(bytes_on_disk(manifest))),
        ("wall time", f"{wall_s:,.1f} s" if wall_s is not None else "not recorded (pass --run-log FILE of the run)"),
        ("tokenizer", f"{tokenizer_name} ({tok.get('kind', '?')}, vocab {tok.get('vocab_size', '?')}, sha256 "
                      f"{str(tok.get('model_sha256', '?'))[:16]})"),
        ("backend", f"{backend.get('name', 'sentencepiece')}"
                    + (f" ({backend['reason']})" if backend.get("reason") else "")),
        ("generation", f"{manifest.get('generation', '?')}"
                       + (f" ({len(generations)} generations)" if len(generations) > 1 else "")),
    ]


def mixture_rows(manifest: dict) -> list:
    """Per source: its share of the unique train tokens, the Pile paper's share (Gao et al. 2020, Table 1;
    transforms/shard/mixture.py) and the realised share of the train split as written (after weights)."""
    mix = (manifest.get("mixture") or {}).get("sources") or {}
    train = {src: _num(per.get("train", {}).get("tokens", 0)) for src, per in manifest["sources"].items()}
    unique = {src: _num(mix[src].get("unique_tokens", train.get(src, 0))) if src in mix else train.get(src, 0)
              for src in set(train) | set(mix)}
    total_unique = sum(unique.values())
    total_written = sum(train.values())
    rows = []
    for src in sorted(unique):
        paper = mixture_weights.PILE_PAPER_SHARES.get(src)
        rows.append({"source": src, "unique_tokens": unique[src], "weight": mix.get(src, {}).get("weight", 1.0),
                     "corpus_share": 100.0 * unique[src] / total_unique if total_unique else 0.0,
                     "paper_share": 100.0 * paper if paper is not None else None,
                     "realised_share": 100.0 * train.get(src, 0) / total_written if total_written else 0.0})
    return rows


def dedup_rows(stats: dict) -> list:
    """Per source: documents tokenized (before dedup), exact duplicates dropped, and their share."""
    rows = []
    for src, st in sorted(stats.items()):
        seen, dup = _num(st.get("tokenized_documents", 0)), _num(st.get("duplicates", 0))
        rows.append([src, seen, dup, f"{100 * dup / seen:.2f}%" if seen else "n/a"])
    return rows


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


# ------------------------------------------------------------------------------------------------ I/O
def read_metrics(path: str) -> list:
    """Trainer metrics JSON lines (trainer/metrics.py); lines without a step and a finite loss are skipped."""
    from transforms.io import io_utils  # noqa: PLC0415

    out = []
    for line in io_utils.read_bytes(path).decode("utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "step" in rec and isinstance(rec.get("loss"), (int, float)) \
                and math.isfinite(rec["loss"]):
            out.append(rec)
    return sorted(out, key=lambda r: r["step"])


def read_dead_letter_rows(dataset: str, manifest: dict, limit: int = MAX_DEAD_LETTER_ROWS) -> list:
    from transforms.io import io_utils  # noqa: PLC0415

    rows: list = []
    for rel in manifest.get("dead_letters", []):
        if rel.startswith("/") or ".." in rel.split("/"):  # containment: only files inside the dataset
            continue
        for line in io_utils.read_bytes(io_utils.join(dataset, rel)).decode("utf-8", "replace").splitlines():
            if len(rows) >= limit:
                return rows
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def read_wall_time(run_log: str) -> Optional[float]:
    """The wall time of the last run in a `--run-log` file (its `summary` event), or None."""
    from transforms.io import io_utils  # noqa: PLC0415

    wall = None
    for line in io_utils.read_bytes(run_log).decode("utf-8", "replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and rec.get("event") == "summary" and isinstance(rec.get("wall_s"), (int, float)):
            wall = float(rec["wall_s"])
    return wall


def contract_tokenizer(path, info) -> tuple:
    """(the tokenizer at `path`, "") when the file has the contract's sha256, else (None, a one-line note: token
    ids are shown instead). Decoding with another file would show text the data does not hold; the report and
    `pileprep inspect` (pipeline/tools/inspect_dataset.py) both decode only through this check."""
    from transforms.tokenize import tokenizer  # noqa: PLC0415

    try:
        # a directory stands for its tokenizer.json, and the contract holds the options the file does not carry
        # (a tiktoken file's pattern and special tokens, --eos-token): as inspect and verify load it
        model = tokenizer.read_model_bytes(path) if isinstance(path, str) and path else None
        if model is None:
            return None, "token ids: no tokenizer file recorded or given"
        got = hashlib.sha256(model).hexdigest()
        if got != info.model_sha256:
            return None, (f"token ids: the tokenizer file's sha256 {got[:12]}… is not the contract's "
                          f"{str(info.model_sha256)[:12]}… (changed since the run, or another tokenizer)")
        return tokenizer.load_for_info(model, info, path), ""
    except (OSError, ValueError, RuntimeError) as e:
        return None, f"token ids: the tokenizer file cannot be read ({type(e).__name__})"


def decoded_examples(manifest_file: str, manifest) -> dict:
    """{split: {shard, text | ids, note}}: the first document piece of each split's first non-empty shard, decoded
    with the run's tokenizer when the file at the manifest's `config.tokenizer` still has the contract's sha256
    (token ids otherwise). Reads one record per split."""
    from model_contract import decode_example  # noqa: PLC0415
    from pipeline.tools.inspect_dataset import _records  # noqa: PLC0415

    sp, note = contract_tokenizer(manifest.config.get("tokenizer"), manifest.contract.tokenizer)
    out = {}
    for split in SPLITS:
        shard = next((s for s in manifest.shards_for(split) if s.examples), None)
        if shard is None:
            continue
        record = next(iter(_records(manifest_file, shard)), None)
        if record is None:
            continue
        ex = decode_example(record)
        ids = ex["input_ids"][ex["segment_ids"] == 1].tolist()
        text = sp.decode(ids) if sp is not None else None
        if text is not None and len(text) > 1200:
            text = text[:1200] + "…"
        out[split] = {"shard": shard.path, "text": text, "ids": ids[:64], "note": note}
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
