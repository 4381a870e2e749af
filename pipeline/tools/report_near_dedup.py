"""The report's near-duplicates and decontamination section (pipeline/tools/report.py calls `section`).

Everything shown comes from the manifest's `near_dedup` section (pipeline/shard/near_dedup/manifest.py
`manifest_section`): removed share per source, the cluster-size histogram, three example pairs side by side,
and contaminated documents with their evaluation n-gram. Document text is data: every value is escaped, and
the section adds no script (the page's Content-Security-Policy allows only its own, by hash).
"""
from __future__ import annotations

import html

from pipeline.ops import safe_text

REASONS = ("near_duplicate", "near_duplicate_of_committed", "contaminated")
BAR_WIDTH = 40  # characters


def _e(v) -> str:
    """Inert (pipeline/ops/safe_text.py), then escaped, as pipeline/tools/report_html.py `escape` writes a data
    string."""
    return html.escape(safe_text.terminal(v), quote=True)


def _table(headers: list, rows: list, cls: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{_e(cls)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _num(n) -> str:
    return f"{n:,}" if isinstance(n, int) else _e(n)


def _written_documents(manifest: dict) -> dict:
    return {src: sum(v.get("documents", 0) for v in per.values()) for src, per in manifest.get("sources", {}).items()}


def section(manifest: dict) -> str:
    """HTML of the section, or "" when the dataset was built without --near-dedup / --decontaminate."""
    nd = manifest.get("near_dedup")
    if not isinstance(nd, dict):
        return ""
    by_source = nd.get("removed_by_source", {})
    written = _written_documents(manifest)
    sources = sorted(set(written) | {s for per in by_source.values() for s in per})
    rows = []
    for src in sources:
        removed = [int(by_source.get(r, {}).get(src, 0)) for r in REASONS]
        total = written.get(src, 0) + sum(removed)
        share = f"{100 * sum(removed) / total:.2f}%" if total else "n/a"
        rows.append([_e(src), _num(written.get(src, 0))] + [_num(n) for n in removed] + [_e(share)])
    parts = [_table(["source", "written", "near-duplicates", "near a committed document", "contaminated",
                     "removed share"], rows)]
    minhash = nd.get("minhash")
    if minhash:
        # A `--near-dedup-shingles tokens` run records shingles/shingle_tokens (pipeline/shard/near_dedup/partitions.py)
        grams = (f"token {_e(minhash.get('shingle_tokens'))}-grams" if minhash.get("shingles") == "tokens"
                 else f"word {_e(minhash.get('shingle_words'))}-grams")
        parts.append(f"<p>MinHash: {_e(minhash.get('bands'))} bands x {_e(minhash.get('rows'))} rows over {grams}, "
                     f"threshold {_e(minhash.get('threshold'))}"
                     f"{' (verified by exact Jaccard)' if minhash.get('verify') else ''}; "
                     f"{_e(minhash.get('s_curve', ''))}</p>")
    sizes = nd.get("cluster_sizes", {})
    if sizes:
        top = max(sizes.values()) or 1
        # a text bar, not a styled element: the page's Content-Security-Policy may refuse inline styles
        hist = [[_e(k), _num(v), "\u2588" * max(1, round(BAR_WIDTH * v / top))] for k, v in sizes.items()]
        parts.append("<h3>Cluster sizes (documents per cluster, keeper included)</h3>"
                     + _table(["size", "clusters", ""], hist))
    pairs = nd.get("example_pairs", [])
    if pairs:
        rows = [[f"{_e(p.get('source', ''))}<br><code>{_e(p.get('removed'))}</code>",
                 f'<div class="excerpt">{_e(p.get("removed_text", ""))}</div>',
                 f"{_e(p.get('keeper_source', ''))}<br><code>{_e(p.get('keeper'))}</code>",
                 f'<div class="excerpt">{_e(p.get("keeper_text", ""))}</div>', _e(p.get("jaccard"))]
                for p in pairs]
        parts.append("<h3>Example pairs (removed, kept)</h3>"
                     + _table(["removed", "text", "keeper", "text", "est. Jaccard"], rows, "excerpts"))
    contaminated = nd.get("contaminated_examples", [])
    if contaminated:
        rows = [[f"<code>{_e(c.get('id'))}</code>", _e(c.get("source", "")), _e(c.get("eval_file", "")),
                 f'<div class="excerpt">{_e(c.get("ngram", ""))}</div>'] for c in contaminated]
        parts.append("<h3>Contaminated documents</h3>" + _table(["document", "source", "evaluation file",
                                                                 "shared n-gram"], rows, "excerpts"))
    files = nd.get("sidecars", [])
    parts.append(f"<p>sidecar files (removed id, keeper id, estimated Jaccard / eval file and n-gram): "
                 f"{len(files)}</p>")
    return ('<section id="near-duplicates-and-decontamination"><h2>Near-duplicates and decontamination</h2>'
            + "".join(parts) + "</section>")
