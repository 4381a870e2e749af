"""`pileprep verify DIR`: prove a committed dataset is the one its manifest describes, and (with `--inputs`) that
it holds what its inputs say it should.

1. Files (pipeline/tools/verify_files.py). Every shard, dead-letter file, document-id index and near-dedup band
   index file the manifest names, hashed and compared with the size and sha256 the manifest recorded; an
   export's files (local or s3://) against its export.json instead (pipeline/tools/export_verify.py).
2. Content audit (`--inputs GLOB --sample N`, pipeline/tools/verify_audit.py). A seeded sample of input records
   re-read and re-tokenized independently of the shard job's code, each document found once and token-exact in
   the shards, or recorded as removed (pipeline/tools/verify_inputs.py), or dead-lettered, or filtered.

Library code: returns a `VerifyReport` (pipeline/tools/verify_report.py); the CLI prints it and exits 1 unless
`report.ok`.
"""
from __future__ import annotations

import os
from typing import Optional

from model_contract import MANIFEST_NAME
from pipeline.tools.verify_audit import audit_content
from pipeline.tools.verify_files import check_files
from pipeline.tools.verify_report import VerifyReport
from transforms.io import io_utils


def verify(dataset: str, inputs: Optional[list] = None, sample: int = 200, seed: int = 0,
           tokenizer_path: Optional[str] = None, filesystem_args: Optional[list] = None) -> VerifyReport:
    """Check `dataset` (a directory or prefix holding manifest.json); see the module doc."""
    from apache_beam.options.pipeline_options import PipelineOptions  # noqa: PLC0415

    from transforms.io.filesystem_options import set_filesystem_options  # noqa: PLC0415

    if filesystem_args:
        set_filesystem_options(PipelineOptions(list(filesystem_args)))
    report = VerifyReport(dataset)
    manifest_file = dataset if dataset.endswith(".json") else io_utils.join(dataset, MANIFEST_NAME)
    if not dataset.endswith(".json"):
        from pipeline.tools import export_verify  # noqa: PLC0415

        if export_verify.is_export(dataset):  # an export's files against its export.json, local or s3://
            export_verify.verify_export(dataset, report)  # (a local link there is a mismatch it names)
            return report
    if io_utils.is_local(manifest_file):  # before any read: never through a link inside the dataset
        from pipeline.ops import guards  # noqa: PLC0415

        guards.check_no_links_inside(os.path.dirname(manifest_file) or ".", "verify")
    if not io_utils.exists(manifest_file):
        report.mismatches.append(f"{manifest_file}: no manifest (never committed, or not a dataset)")
        return report
    try:  # a manifest that fails its schema is a ContractError: one line, exit 2 (pipeline/errors.py)
        from pipeline.ops import commit  # noqa: PLC0415

        manifest = commit.parse_manifest(io_utils.read_bytes(manifest_file).decode("utf-8"), dataset)
    except UnicodeDecodeError as e:
        report.mismatches.append(f"{manifest_file}: damaged manifest: {e}")
        return report
    check_files(manifest, manifest_file, report)
    if inputs:
        report.audit = audit_content(manifest, manifest_file, list(inputs), sample, seed, tokenizer_path)
    return report

