"""What a packing did to documents, per source: pure functions over counters, no I/O.

Per source the packer (transforms/shard/pack.py `pack_shard`) counts the documents it wrote, those split over
more than one example, those that fit in one example (EOS included) and of them the ones split anyway, and the
pieces (an example holding part of a document is one piece of it): pieces / documents is the examples per
document. The manifest (pipeline/shard/manifest_builder.py) states them per split and source, with the split's
padding fraction, when the packing is not the default concat (a default dataset's manifest bytes stay as they
were).
"""
from __future__ import annotations

from transforms.shard import best_fit

COUNTERS = ("documents", "split", "fitting", "fitting_split", "pieces")


def concat_pieces(position: int, length: int, seq_len: int) -> int:
    """Examples a document of `length` tokens spans when the concat packer lays it at stream `position`."""
    return (position + length - 1) // seq_len - position // seq_len + 1


def pieces_of(packing: str, position: int, length: int, seq_len: int) -> int:
    if packing == "best-fit":
        return best_fit.pieces_of(length, seq_len)
    return concat_pieces(position, length, seq_len)


def add(stats: dict, source: str, length: int, pieces: int, seq_len: int) -> None:
    """Count one written document of `source` (`stats`: {source: {counter: n}})."""
    per = stats.setdefault(source, dict.fromkeys(COUNTERS, 0))
    fits = length <= seq_len
    per["documents"] += 1
    per["split"] += pieces > 1
    per["fitting"] += fits
    per["fitting_split"] += fits and pieces > 1
    per["pieces"] += pieces


def merge(into: dict, other: dict) -> dict:
    for source, counts in other.items():
        per = into.setdefault(source, dict.fromkeys(COUNTERS, 0))
        for k in COUNTERS:
            per[k] += int(counts.get(k, 0))
    return into


def summary(counts: dict) -> dict:
    """The shares a reader wants from one table of counters (a source's, or a split's total)."""
    docs = counts["documents"]
    return {**{k: counts[k] for k in COUNTERS},
            "split_share": round(counts["split"] / docs, 8) if docs else 0.0,
            "fitting_split_share": round(counts["fitting_split"] / counts["fitting"], 8) if counts["fitting"] else 0.0,
            "examples_per_document": round(counts["pieces"] / docs, 8) if docs else 0.0}


def manifest_section(packing: str, window: int, per_split: dict, padding: dict) -> dict:
    """The manifest's `extra.packing`: per split the totals, the padding fraction and per source the shares.
    `per_split`: {split: {source: counters}}; `padding`: {split: (padding tokens, example tokens)}."""
    splits = {}
    for split in sorted(per_split):
        agg = dict.fromkeys(COUNTERS, 0)
        for counts in per_split[split].values():
            for k in COUNTERS:
                agg[k] += counts[k]
        pad, slots = padding.get(split, (0, 0))
        splits[split] = {**summary(agg), "padding_fraction": round(pad / slots, 8) if slots else 0.0,
                         "sources": {s: summary(c) for s, c in sorted(per_split[split].items())}}
    return {"packing": packing, "window_examples": window, "splits": splits}
