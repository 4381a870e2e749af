"""No element is lost between the stages of a multi_threading FnApiRunner run (the CLI's default up to 4 cores).

Beam's in-process gRPC workers buffer a bundle's outputs in a TimeBasedBufferingClosableOutputStream
(apache_beam/runners/worker/data_plane.py): a PeriodicThread flushes it every second with `get()` then
`_clear()`, while the bundle's thread writes into the same buffer without the flush lock. Whatever the bundle
writes between the two calls is dropped, silently. On a loaded machine the flusher thread is descheduled in
that window for long enough to lose a run of elements (a chunk database lost 9 documents this way:
pipeline/retrieval/build.py, ReadPieces -> JoinByDocument). Here the window is widened on purpose: the flusher
sleeps inside its flush callback, as a descheduled thread would. pipeline/beam_glue.py turns the periodic
flush off for every pileprep pipeline, so the counts must match exactly.
"""
from __future__ import annotations

import threading
import time

import apache_beam as beam
from apache_beam.runners.worker import data_plane
from apache_beam.testing.util import assert_that, equal_to

from pipeline.beam_glue import pipeline_options

TWO_THREADS = ["--runner=FnApiRunner", "--direct_num_workers=2", "--direct_running_mode=multi_threading"]
ELEMENTS = 1200


def _descheduled_flusher(monkeypatch):
    """The periodic flusher thread stalls 0.3 s between taking the buffer and clearing it (a loaded machine)."""
    original = data_plane._GrpcDataChannel._enqueue_to_send  # noqa: SLF001 - the flush callback's last step

    def slow(self, elem):
        if isinstance(threading.current_thread(), data_plane.PeriodicThread):
            time.sleep(0.3)
        return original(self, elem)

    monkeypatch.setattr(data_plane._GrpcDataChannel, "_enqueue_to_send", slow)  # noqa: SLF001


def _slow_emit(_):
    # ~3 s of output, so the 1 s periodic flush fires while this bundle is still writing
    for i in range(ELEMENTS):
        time.sleep(0.0025)
        yield i % 5, i


def test_no_element_lost_when_the_periodic_flush_is_descheduled(monkeypatch):
    _descheduled_flusher(monkeypatch)
    with beam.Pipeline(options=pipeline_options(TWO_THREADS)) as p:
        counts = (p | beam.Create([0]) | "Emit" >> beam.FlatMap(_slow_emit)
                  | "Group" >> beam.GroupByKey()
                  | "Sizes" >> beam.Map(lambda kv: (kv[0], len(list(kv[1])), sum(kv[1]))))
        want = [(k, ELEMENTS // 5, sum(i for i in range(ELEMENTS) if i % 5 == k)) for k in range(5)]
        assert_that(counts, equal_to(want))
