"""The dry run's packing estimate (pipeline/tools/dry_run.py): what `--packing best-fit` and concat would do to the
sampled documents, so `--dry-run --packing best-fit` reports its padding and the documents it cuts before a run.

The sampled documents' lengths (tokens + EOS) are recorded as the sample tokenizes them (`RecordingEncoder`, wrapped
around the job's encoder: pipeline/tools/dry_run_sample.py calls only `encode`), then packed by the packers' own
planning: best-fit by transforms/shard/best_fit.py `plan_window` over windows of `--packing-window` examples' worth
of tokens, as transforms/shard/best_fit.py `pack_best_fit` cuts them; concat by the stream positions
(transforms/shard/packing_stats.py `concat_pieces`), one packing group. The counters are the manifest's
(transforms/shard/packing_stats.py): documents split over examples, those that fit in one and were split anyway,
examples per document. Padding: best-fit's is every window's unused tail; concat's is only each shard's last example
(the estimate's examples hold it). A sample smaller than one window packs in a smaller window than the job's, so its
best-fit padding is pessimistic (said in a note); documents come in file order, the job's in key order.
"""
from __future__ import annotations

from dataclasses import dataclass

from transforms.shard import best_fit, packing_stats


class RecordingEncoder:
    """The job's encoder, recording each encoded document's length plus its EOS."""

    def __init__(self, encoder):
        self._encoder = encoder
        self.lengths: list = []

    def encode(self, text):
        ids = self._encoder.encode(text)
        self.lengths.append(len(ids) + 1)
        return ids

    def __getattr__(self, name):
        return getattr(self._encoder, name)


@dataclass
class PackingEstimate:
    packing: str  # the run's --packing
    window_examples: int
    documents: int  # sampled documents packed
    tokens: int
    best_fit: dict[str, float]  # packing_stats.summary(...) + padding_fraction
    concat: dict[str, float]  # packing_stats.summary(...)
    small_sample: bool  # fewer tokens than one best-fit window


def best_fit_counts(lengths: list, seq_len: int, window_examples: int) -> tuple:
    """(counters, padding tokens, example tokens) of best-fit over `lengths`, in windows as pack_best_fit cuts."""
    stats: dict = {}
    padding = slots = 0
    limit = window_examples * seq_len
    window: list = []
    held = 0

    def flush():
        nonlocal padding, slots
        examples = best_fit.plan_window(window, range(len(window)), seq_len)
        slots += len(examples) * seq_len
        padding += sum(seq_len - sum(p[2] for p in pieces) for pieces in examples)

    for n in lengths:
        packing_stats.add(stats, "", n, best_fit.pieces_of(n, seq_len), seq_len)
        window.append(n)
        held += n
        if held >= limit:
            flush()
            window, held = [], 0
    if window:
        flush()
    return stats.get("", dict.fromkeys(packing_stats.COUNTERS, 0)), padding, slots


def concat_counts(lengths: list, seq_len: int) -> dict:
    stats: dict = {}
    position = 0
    for n in lengths:
        packing_stats.add(stats, "", n, packing_stats.concat_pieces(position, n, seq_len), seq_len)
        position += n
    return stats.get("", dict.fromkeys(packing_stats.COUNTERS, 0))


def estimate_packing(lengths: list, seq_len: int, packing: str, window_examples: int) -> PackingEstimate:
    fit, padding, slots = best_fit_counts(lengths, seq_len, window_examples)
    best = {**packing_stats.summary(fit), "padding_fraction": round(padding / slots, 8) if slots else 0.0}
    return PackingEstimate(packing, window_examples, len(lengths), int(sum(lengths)), best,
                           packing_stats.summary(concat_counts(lengths, seq_len)),
                           sum(lengths) < window_examples * seq_len)


def packing_rows(p: PackingEstimate, concat_padding: float) -> list:
    """format_estimate's rows: the chosen packing's figures, the other's beside them."""
    b, c = p.best_fit, p.concat
    return [
        ("packing", p.packing, f"estimated on {p.documents:,} sampled documents"
         + (f"; best-fit window {p.window_examples:,} examples" if p.packing == "best-fit" else "")),
        ("  documents cut", f"{100 * (b if p.packing == 'best-fit' else c)['split_share']:.2f}%",
         f"best-fit {100 * b['split_share']:.2f}% / concat {100 * c['split_share']:.2f}%"),
        ("  that fit, cut", f"{100 * (b if p.packing == 'best-fit' else c)['fitting_split_share']:.2f}%",
         f"of documents that fit in one example: best-fit {100 * b['fitting_split_share']:.2f}% / concat "
         f"{100 * c['fitting_split_share']:.2f}%"),
        ("  padding", f"{100 * (b['padding_fraction'] if p.packing == 'best-fit' else concat_padding):.2f}%",
         f"best-fit {100 * b['padding_fraction']:.2f}% / concat {100 * concat_padding:.2f}% (each shard's last "
         f"example)"),
    ]
