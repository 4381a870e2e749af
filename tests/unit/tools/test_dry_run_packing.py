"""pipeline/tools/dry_run_packing.py: the dry run's packing estimate from sampled document lengths."""
from __future__ import annotations

import pytest

from pipeline.tools import dry_run_packing

pytestmark = pytest.mark.formats


def test_best_fit_cuts_no_document_that_fits_and_counts_window_padding():
    # seq_len 10: 6+5 cannot share an example, 4 joins the 6, 5 and 3 share one, 25 = two full pieces + 5 alone
    p = dry_run_packing.estimate_packing([6, 5, 4, 3, 25], 10, "best-fit", window_examples=100)
    b, c = p.best_fit, p.concat
    assert (b["documents"], b["fitting"], b["fitting_split"], b["split"], b["pieces"]) == (5, 4, 0, 1, 7)
    # examples: [10] [10] [6+4] [5+3] [5]: 50 slots, 43 tokens
    assert b["padding_fraction"] == round(7 / 50, 8)
    # concat lays the 5 over the first cut (tokens 6..10): a document that fits is cut
    assert c["fitting_split"] == 1 and c["fitting_split_share"] == 0.25
    assert p.small_sample  # 43 tokens < one window of 100 examples


def test_windows_are_cut_as_the_packer_cuts_them():
    # a window of 1 example (10 tokens) closes once it holds 10: [6, 6] and [4, 4] pack apart, the 6s never meet
    # a 4; a window of 4 examples holds all four documents: 6+4 twice
    lengths = [6, 6, 4, 4]
    wide = dry_run_packing.estimate_packing(lengths, 10, "best-fit", window_examples=4)
    narrow = dry_run_packing.estimate_packing(lengths, 10, "best-fit", window_examples=1)
    assert wide.best_fit["padding_fraction"] == 0.0
    assert narrow.best_fit["padding_fraction"] == round(10 / 30, 8)  # [6] [6] [4+4]
    assert wide.small_sample and not narrow.small_sample  # 20 tokens: under 4 examples, over 1


def test_recording_encoder_counts_each_document_with_its_eos():
    class Encoder:
        vocab = 7

        def encode(self, text):
            return list(range(len(text)))

    rec = dry_run_packing.RecordingEncoder(Encoder())
    assert rec.encode("abc") == [0, 1, 2] and rec.encode("") == []
    assert rec.lengths == [4, 1] and rec.vocab == 7


def test_rows_show_the_chosen_packing_first_and_the_other_beside_it():
    p = dry_run_packing.estimate_packing([6, 5, 4, 3, 25], 10, "concat", window_examples=100)
    rows = dict((r[0].strip(), r[1:]) for r in dry_run_packing.packing_rows(p, concat_padding=0.01))
    assert rows["packing"][0] == "concat" and rows["that fit, cut"][0] == "25.00%"
    assert rows["padding"][0] == "1.00%" and "best-fit 14.00%" in rows["padding"][1]
