"""Before a run: every source that `--source-weights` names must appear in the inputs, or the weight is a typo.

The driver reads the first records of input files spread over the listing (bounded in records and bytes per
file, as pipeline/ops/guards.py samples the text field) and counts the source of each parsed document with the
job's own parser (transforms/shard/documents.py). A named source no sampled record carries is a configuration
error naming it and the sources seen, unless `--allow-unknown-sources` (then a warning). Sources that come from
a preset ('pile') are not checked: a preset lists every Pile component, and a corpus may hold only some.
"""
from __future__ import annotations

import logging

from pipeline.errors import ConfigError
from transforms.io import io_utils
from transforms.io.read_records import FileDamage, compression_of, iter_raw_records
from transforms.shard import mixture
from transforms.shard.documents import Document, parse_record

LOG = logging.getLogger("pileprep")
SAMPLE_FILES = 32
SAMPLE_RECORDS_PER_FILE = 400
SAMPLE_BYTES_PER_FILE = 8 << 20  # decompressed bytes scanned per file, at most


def spread(paths: list, n: int) -> list:
    """Up to n paths spread evenly over the (sorted) listing, first and last included."""
    if len(paths) <= n:
        return list(paths)
    return [paths[i] for i in sorted({round(i * (len(paths) - 1) / (n - 1)) for i in range(n)})]


def sample_sources(paths, config, files: int = SAMPLE_FILES, records: int = SAMPLE_RECORDS_PER_FILE,
                   max_bytes: int = SAMPLE_BYTES_PER_FILE) -> tuple:
    """({source: documents sampled}, documents sampled, files read)."""
    seen: dict = {}
    sampled = read_files = 0
    for path in spread(sorted(paths), files):
        try:
            with io_utils.open_read(path) as f:
                read_files += 1
                n = scanned = 0
                for item in iter_raw_records(f, compression_of(path), config.max_line_bytes):
                    if isinstance(item, FileDamage):
                        break
                    scanned += len(item.data)
                    doc = parse_record(item.data, config.text_field, config.source_fields)
                    if isinstance(doc, Document):
                        seen[doc.source] = seen.get(doc.source, 0) + 1
                        sampled += 1
                        n += 1
                    if n >= records or scanned >= max_bytes:
                        break
        except OSError:
            continue  # unreadable files are the readers' business (dead letters), not this check's
    return seen, sampled, read_files


def check_source_weights(config, paths) -> dict:
    """Refuse (ConfigError) or warn about named sources absent from a sample of `paths`; returns the sample."""
    named = mixture.named_sources(config.source_weights) if config.source_weights else []
    if not named or not paths:
        return {}
    seen, sampled, files = sample_sources(paths, config)
    unknown = mixture.unknown_sources(named, seen)
    if unknown and sampled:
        message = mixture.unknown_sources_message(unknown, seen, sampled, files)
        if not config.allow_unknown_sources:
            raise ConfigError(message)
        LOG.warning("%s (running anyway: --allow-unknown-sources)", message)
    return seen
