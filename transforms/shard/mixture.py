"""Source mixture weights: how many times each document of a source appears in the train split.

A weight is a number of epochs (the Pile paper's convention): weight 3 writes every document of the source three
times, weight 1.5 writes each once and a second time for half of them, weight 0.3 keeps 30% of them once.
Which documents get the fractional copy (or are kept at all, for weights below 1) is decided by a seeded hash of
the document id, so it is the same on every runner and for every copy of a text. Unlisted sources weigh 1.

Where this happens (docs/DESIGN.md): in the pack stage, after exact dedup, train split only (val and test stay
whole, as evaluation sets must), and a copy keeps its document's id and split. Copy r > 0 gets its own sort
key — a seeded hash of (id, r) inside the same shard's key range — so the copies of one document land at
unrelated places of the shard, never side by side. A document with zero copies is counted as filtered
("mixture_weight"), so read = written + filtered + dead-lettered still reconciles.
"""
from __future__ import annotations

import math
from typing import Iterable, Iterator

from model_contract.hashing import hash64

DROPPED_REASON = "mixture_weight"

# The Pile paper (Gao et al. 2020, Table 1): epochs of each component in the Pile's 1.2 TB training mix,
# keyed by the `meta.pile_set_name` values of the released jsonl.zst files.
PILE_EPOCHS = {
    "Pile-CC": 1.0, "PubMed Central": 2.0, "Books3": 1.5, "OpenWebText2": 2.0, "ArXiv": 2.0, "Github": 1.0,
    "FreeLaw": 1.5, "StackExchange": 2.0, "USPTO Backgrounds": 2.0, "PubMed Abstracts": 2.0,
    "Gutenberg (PG-19)": 2.5, "OpenSubtitles": 1.5, "Wikipedia (en)": 3.0, "DM Mathematics": 2.0,
    "Ubuntu IRC": 2.0, "BookCorpus2": 1.5, "EuroParl": 2.0, "HackerNews": 2.0, "YoutubeSubtitles": 2.0,
    "PhilPapers": 2.0, "NIH ExPorter": 2.0, "Enron Emails": 2.0,
}
# The same table's "percentage of the Pile" column (fractions; they sum to 1.0): the mixture the paper trained on,
# shown beside a dataset's realised mixture in `pileprep report` (pipeline/tools/report.py).
PILE_PAPER_SHARES = {
    "Pile-CC": 0.1811, "PubMed Central": 0.1440, "Books3": 0.1207, "OpenWebText2": 0.1001, "ArXiv": 0.0896,
    "Github": 0.0759, "FreeLaw": 0.0612, "StackExchange": 0.0513, "USPTO Backgrounds": 0.0365,
    "PubMed Abstracts": 0.0307, "Gutenberg (PG-19)": 0.0217, "OpenSubtitles": 0.0155, "Wikipedia (en)": 0.0153,
    "DM Mathematics": 0.0124, "Ubuntu IRC": 0.0088, "BookCorpus2": 0.0075, "EuroParl": 0.0073, "HackerNews": 0.0062,
    "YoutubeSubtitles": 0.0060, "PhilPapers": 0.0038, "NIH ExPorter": 0.0030, "Enron Emails": 0.0014,
}
PRESETS = {"pile": PILE_EPOCHS}


def parse_weights(spec: str) -> dict:
    """'pile', 'Pile-CC=1,Wikipedia (en)=3' or 'pile,Github=0.5' (later items override) -> {source: weight}.

    Raises ValueError naming the bad item; the caller turns it into a configuration error.
    """
    weights: dict = {}
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        if "=" not in item:
            if item not in PRESETS:
                raise ValueError(f"unknown preset {item!r} (known: {', '.join(sorted(PRESETS))}); "
                                 f"or give SOURCE=WEIGHT")
            weights.update(PRESETS[item])
            continue
        name, _, value = item.rpartition("=")
        name = name.strip()
        try:
            weight = float(value)
        except ValueError:
            raise ValueError(f"{item!r}: weight {value.strip()!r} is not a number") from None
        if not name:
            raise ValueError(f"{item!r}: missing source name")
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"{item!r}: weight must be a finite number >= 0")
        weights[name] = weight
    return dict(sorted(weights.items()))


def named_sources(spec: str) -> list:
    """The sources a spec names itself (SOURCE=WEIGHT items), in order; a preset's names are not the user's."""
    return [item.rpartition("=")[0].strip() for item in (p.strip() for p in spec.split(",")) if "=" in item]


def unknown_sources(named: list, seen: dict) -> list:
    """Named sources that no sampled record carries (`seen`: source -> records sampled)."""
    return [name for name in named if not seen.get(name)]


def unknown_sources_message(unknown: list, seen: dict, sampled: int, files: int) -> str:
    known = ", ".join(repr(k) for k in sorted(seen, key=lambda k: (-seen[k], k))[:30]) or "none"
    return (f"--source-weights: no record of the {sampled:,} sampled from {files} input file(s) has source "
            f"{', '.join(repr(u) for u in unknown)} (sources seen: {known}); fix the name, or pass "
            f"--allow-unknown-sources if it appears only later in the inputs")


MIX_KEY = b"pileprep-mix"  # model_contract/hashing.py `hash64`'s key: independent of the split/order hash


def copies(doc_id: int, weight: float, seed: int) -> int:
    """floor(weight) copies, plus one more when the seeded hash of the id falls below the fractional part."""
    whole = math.floor(weight)
    frac = weight - whole
    if frac <= 0.0:
        return int(whole)
    u = hash64(MIX_KEY, b"keep", seed.to_bytes(8, "little", signed=True),
               doc_id.to_bytes(8, "little")) / 2.0 ** 64
    return int(whole) + (1 if u < frac else 0)


def repeat_key(key: int, doc_id: int, repeat: int, seed: int, lo: int, hi: int) -> int:
    """Sort key of copy `repeat`: the document's own key for the first, a seeded spot in [lo, hi) for others."""
    if repeat == 0:
        return key
    h = hash64(MIX_KEY, b"repeat", seed.to_bytes(8, "little", signed=True), doc_id.to_bytes(8, "little"),
               repeat.to_bytes(4, "little"))
    return lo + h % (hi - lo)


def arrange(documents: Iterable, weights: dict, seed: int, lo: int, hi: int, on_dropped=None) -> Iterator:
    """Expand deduplicated documents into their copies, in sort-key order.

    `documents`: (key, doc_id, source, payload) in key order, keys in [lo, hi). Yields
    (doc_id, source, payload, repeat). Documents with zero copies go to `on_dropped(source, payload)`.
    Holds one shard's document descriptors in memory (the payloads are the caller's, not copied).
    """
    placed = []
    for key, doc_id, source, payload in documents:
        n = copies(doc_id, weights.get(source, 1.0), seed)
        if n == 0:
            if on_dropped is not None:
                on_dropped(source, payload)
            continue
        for r in range(n):
            placed.append((repeat_key(key, doc_id, r, seed, lo, hi), doc_id, r, source, payload))
    placed.sort(key=lambda t: (t[0], t[1], t[2]))
    _separate_copies(placed)
    for _key, doc_id, r, source, payload in placed:
        yield doc_id, source, payload, r


def _separate_copies(placed: list) -> None:
    """Hashed spots make neighbouring copies rare, not impossible: move such a copy on to the first place
    where neither neighbour is the same document (deterministic, in place; a no-op when nothing collides)."""
    i = 1
    while i < len(placed):
        doc = placed[i][1]
        if placed[i - 1][1] == doc:
            k = i + 1
            while k < len(placed) and (placed[k - 1][1] == doc or placed[k][1] == doc):
                k += 1
            if k >= len(placed) and placed[-1][1] == doc:
                i += 1  # nowhere to go (one document dominates the shard): leave it
                continue
            placed.insert(k - 1, placed.pop(i))  # k counted before the pop
            continue
        i += 1


def weighted_factor(source_stats: dict, weights: dict) -> float:
    """Expected tokens after weighting ÷ tokens before, from per-source token counts (for shard sizing)."""
    total = sum(s.get("tokens", 0) for s in source_stats.values())
    if not total:
        return 1.0
    return sum(weights.get(src, 1.0) * s.get("tokens", 0) for src, s in source_stats.items()) / total


def realised_shares(unique_tokens: dict, written_tokens: dict, weights: dict) -> dict:
    """Per source: weight, tokens before and after weighting, and target vs realised share of the split."""
    target_total = sum(weights.get(s, 1.0) * t for s, t in unique_tokens.items())
    written_total = sum(written_tokens.values())
    out = {}
    for source in sorted(set(unique_tokens) | set(written_tokens)):
        w = weights.get(source, 1.0)
        u = unique_tokens.get(source, 0)
        t = written_tokens.get(source, 0)
        out[source] = {"weight": w, "unique_tokens": u, "tokens": t,
                       "target_share": round(w * u / target_total, 8) if target_total else 0.0,
                       "share": round(t / written_total, 8) if written_total else 0.0}
    return out
