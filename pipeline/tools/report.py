"""`pileprep report DIR`: one self-contained HTML page about a dataset, for people to look at.

Everything comes from the manifest (the shard job computed the distributions, transforms/shard/corpus_stats.py), the
dead-letter files (for excerpts) and, optionally, the trainer's metrics JSON lines (trainer/metrics.py). The
data itself is never re-read, so a report of a terabyte dataset takes a second. The page needs no network:
plots are PNGs (matplotlib's Agg canvas, no pyplot global state) embedded as base64 data URIs, styles inline.

`render_report` is pure (manifest dict in, HTML out); `write_report` does the I/O, local or s3:// alike.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
from typing import Optional

from pipeline.tools import report_near_dedup
from transforms.shard.documents import SPLITS

MAX_EXCERPTS_PER_REASON = 3
MAX_DEAD_LETTER_ROWS = 2000  # read at most this many dead-letter rows for excerpts (they can be many)
REPORT_NAME = "report.html"


# ------------------------------------------------------------------------------------------------ plots
def _figure(width: float = 7.5, height: float = 3.4):
    from matplotlib.figure import Figure  # noqa: PLC0415 - only the report needs matplotlib

    fig = Figure(figsize=(width, height), dpi=100)
    return fig, fig.add_subplot(1, 1, 1)


def _png(fig) -> str:
    buf = io.BytesIO()
    # Fixed margins (room for rotated labels) instead of tight_layout, which draws every figure twice.
    fig.subplots_adjust(left=0.1, right=0.9, top=0.9, bottom=0.25)
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _img(plot_id: str, fig, alt: str) -> str:
    w, h = (int(round(v * fig.dpi)) for v in fig.get_size_inches())
    return (f'<img class="plot" id="plot-{plot_id}" alt="{html.escape(alt)}" width="{w}" height="{h}" '
            f'src="data:image/png;base64,{_png(fig)}">')


def _bars(ax, labels, series: dict, ylabel: str, log: bool = False) -> None:
    n = max(1, len(series))
    width = 0.8 / n
    for k, (name, values) in enumerate(series.items()):
        ax.bar([i + k * width - 0.4 + width / 2 for i in range(len(labels))], values, width, label=name)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels([lab[:20] for lab in labels], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    if n > 1:
        ax.legend(fontsize=8)


def plot_tokens_per_source(manifest: dict) -> str:
    sources = sorted(manifest["sources"])
    splits = [s for s in SPLITS if s in manifest["splits"]]
    fig, ax = _figure()
    _bars(ax, sources, {s: [manifest["sources"][src].get(s, {}).get("tokens", 0) for src in sources]
                        for s in splits}, "tokens (log)", log=True)
    ax.set_title("tokens per source and split")
    return _img("tokens-per-source", fig, "tokens per source and split")


def plot_length_histograms(stats: dict) -> str:
    fig, ax = _figure(7.5, 3.8)
    for source, s in sorted(stats.items()):
        hist = s.get("length_hist_log2") or []
        if not any(hist):
            continue
        edges = [2 ** i for i in range(len(hist) + 1)]
        ax.stairs(hist, edges, label=source[:24])
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


def plot_shards(manifest: dict) -> str:
    shards = manifest["shards"]
    seq_len = manifest["contract"]["seq_len"]
    fig, ax = _figure(7.5, 3.6)
    x = range(len(shards))
    ax.bar(x, [s["bytes"] / 2 ** 20 for s in shards], color="#4c72b0", label="MiB")
    ax.set_ylabel("shard size, MiB")
    ax.set_xticks(list(x))
    ax.set_xticklabels([s["path"].rsplit("/", 1)[-1].replace(".tfrecord", "") for s in shards], rotation=60,
                       ha="right", fontsize=6)
    ax2 = ax.twinx()
    ax2.plot(list(x), [s["examples"] for s in shards], "o-", color="#dd8452", label="examples")
    ax2.plot(list(x), [s["padding_tokens"] / seq_len for s in shards], "x:", color="#55a868",
             label="padding (examples' worth)")
    ax2.set_ylabel("examples")
    ax2.legend(fontsize=7, loc="upper right")
    ax.set_title("balance: bytes, examples and padding per shard")
    return _img("shards", fig, "examples and bytes per shard")


def plot_mixture(mixture: dict) -> str:
    sources = sorted(mixture["sources"])
    fig, ax = _figure()
    _bars(ax, sources, {"target": [100 * mixture["sources"][s]["target_share"] for s in sources],
                        "realised": [100 * mixture["sources"][s]["share"] for s in sources]}, "% of train tokens")
    ax.set_title("mixture: target vs realised token share")
    return _img("mixture", fig, "mixture target and realised shares")


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
def _table(headers: list, rows: list, cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return html.escape(str(v))


def _section(title: str, *parts: str) -> str:
    anchor = "".join(c if c.isalnum() else "-" for c in title.lower())
    return f'<section id="{anchor}"><h2>{html.escape(title)}</h2>{"".join(parts)}</section>'


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
                  title: str = "") -> str:
    """The report page for a manifest dict; `dead_letter_rows` give excerpts, `metrics` the trainer's curves."""
    c = manifest["contract"]
    seq_len = c["seq_len"]
    stats = manifest.get("statistics", {}).get("sources", {})
    splits = [s for s in SPLITS if s in manifest["splits"]]
    rec = manifest["records"]
    parts = [f"<h1>pileprep dataset report{': ' + html.escape(title) if title else ''}</h1>",
             f'<p class="meta">pileprep {html.escape(manifest.get("pileprep_version", "?"))} · generation '
             f'<code>{html.escape(str(manifest.get("generation", "?")))}</code> · contract {c["version"]} · '
             f'seq_len {seq_len} · vocab {c["tokenizer"]["vocab_size"]:,} · tokenizer sha256 '
             f'<code>{c["tokenizer"]["model_sha256"][:16]}</code></p>']

    split_rows = []
    for s in splits:
        d = manifest["splits"][s]
        split_rows.append([s, d["shards"], d["examples"], d["documents"], d["tokens"], d["padding_tokens"],
                           _pct(d["padding_tokens"], d["examples"] * seq_len)])
    parts.append(_section("Splits", _table(["split", "shards", "examples", "documents", "tokens", "padding tokens",
                                            "padding"], split_rows),
                          f"<p>padding fraction overall: {100 * manifest['padding_fraction']:.4f}%</p>"))

    source_rows = []
    for src, per in sorted(manifest["sources"].items()):
        row = [src]
        for s in splits:
            row += [per.get(s, {}).get("documents", 0), per.get(s, {}).get("tokens", 0)]
        source_rows.append(row)
    headers = ["source"] + [f"{s} {k}" for s in splits for k in ("docs", "tokens")]
    sources_parts = [_table(headers, source_rows)]
    if manifest["sources"]:
        sources_parts.append(plot_tokens_per_source(manifest))
    parts.append(_section("Tokens and documents per source", *sources_parts))

    if stats:
        eff_rows = [[src, s.get("tokenized_documents", 0), s.get("chars", 0), s.get("bytes", 0), s.get("tokens", 0),
                     s.get("chars_per_token", 0.0), s.get("bytes_per_token", 0.0),
                     f"{100 * s.get('byte_fallback_share', 0.0):.3f}%", s.get("duplicates", 0)]
                    for src, s in sorted(stats.items())]
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
              _pct(s["padding_tokens"], s["examples"] * seq_len), s["bytes"], s["sha256"][:12]]
             for s in manifest["shards"]])))

    if manifest.get("mixture"):
        mix = manifest["mixture"]
        parts.append(_section("Mixture", plot_mixture(mix), _table(
            ["source", "weight (epochs)", "unique tokens", "tokens written", "target share", "realised share"],
            [[s, r["weight"], r["unique_tokens"], r["tokens"], f"{100 * r['target_share']:.3f}%",
              f"{100 * r['share']:.3f}%"] for s, r in sorted(mix["sources"].items())])))

    reasons = [["filtered", r, n] for r, n in sorted(rec.get("filtered", {}).items())]
    reasons += [["dead-lettered", r, n] for r, n in sorted(rec.get("dead_lettered", {}).items())]
    excerpts: dict = {}
    for row in dead_letter_rows or []:
        lst = excerpts.setdefault(row.get("reason", "?"), [])
        if len(lst) < MAX_EXCERPTS_PER_REASON:
            lst.append(row)
    ex_rows = [[r, row.get("file", ""), row.get("line", ""), row.get("excerpt", "")[:300]]
               for r, lst in sorted(excerpts.items()) for row in lst]
    parts.append(_section(
        "Filtered and dead-lettered records",
        f"<p>read {rec.get('read', 0):,} = written {rec.get('written', 0):,} + filtered "
        f"{sum(rec.get('filtered', {}).values()):,} + dead-lettered {sum(rec.get('dead_lettered', {}).values()):,}"
        f"</p>", _table(["kind", "reason", "records"], reasons),
        _table(["reason", "file", "line", "excerpt"], ex_rows, "excerpts") if ex_rows else "",
        f"<p>dead-letter files: {len(manifest.get('dead_letters', []))}</p>"))

    parts.append(report_near_dedup.section(manifest))  # "" without --near-dedup / --decontaminate
    parts.append(_section("Inputs", _table(
        ["file", "bytes", "read", "written", "filtered", "dead-lettered"],
        [[i["path"], i.get("bytes", 0), i["read"], i["written"], sum(i["filtered"].values()),
          sum(i["dead_lettered"].values())] for i in manifest.get("inputs", [])])))

    if metrics:
        parts.append(_section("Training", plot_training(metrics), _table(
            ["step", "loss", "tokens/s", "step s", "data wait"],
            [[m["step"], m["loss"], m.get("tokens_per_s", 0.0), m.get("step_seconds", 0.0),
              f"{100 * m.get('data_wait_share', 0.0):.1f}%"] for m in metrics])))

    if manifest.get("retrieval"):
        parts.append(_section("Retrieval", _table(["key", "value"], [
            [k, json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v]
            for k, v in sorted(_flat(manifest["retrieval"]).items())])))

    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>pileprep report {html.escape(title)}</title><style>{_STYLE}</style></head>"
            f"<body>{''.join(parts)}<script>{_SCRIPT}</script></body></html>\n")


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


def write_report(dataset: str, output: Optional[str] = None, metrics_path: Optional[str] = None) -> str:
    """Render DIR's committed manifest to `output` (default DIR/report.html); returns where it was written."""
    from pipeline.ops import commit  # noqa: PLC0415
    from transforms.io import io_utils  # noqa: PLC0415

    manifest = commit.read_committed(dataset)
    if manifest is None:
        raise FileNotFoundError(f"no manifest at {commit.manifest_location(dataset)}: the dataset is missing or "
                                f"was never committed")
    d = manifest.to_dict()
    page = render_report(d, read_dead_letter_rows(dataset, d), read_metrics(metrics_path) if metrics_path else None,
                         title=dataset.rstrip("/").rsplit("/", 1)[-1])
    output = output or io_utils.join(dataset, REPORT_NAME)
    data = page.encode("utf-8")
    io_utils.publish_bytes(output, data)
    return output
