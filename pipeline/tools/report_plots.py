"""The report's plots (pipeline/tools/report.py): PNGs drawn on matplotlib's Agg canvas (no pyplot global
state), embedded as base64 data URIs, so the page needs no network.

Data strings enter a plot only through `plot_text` (pipeline/ops/safe_text.py: no control characters, no
mathtext); `_img` writes the one <img> element, its id and alt text escaped.
"""
from __future__ import annotations

import base64
import io

from pipeline.ops import safe_text
from pipeline.tools.report_data import num as _num, split_shares
from pipeline.tools.report_html import escape as _e
from transforms.shard.documents import SPLITS


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

