"""pipeline/ops/redaction.py: credentials never reach a message or a log record."""
from __future__ import annotations

import logging

from pipeline.ops import redaction


def test_redaction_removes_userinfo_from_messages_and_log_records():
    from pipeline.ops.redaction import RedactingFilter, redact_userinfo

    text = "cannot reach http://AKIA:s3cr3t@minio:9000/b and s3://u:p@h/x; fine: http://host/a@b"
    assert redact_userinfo(text) == "cannot reach http://***@minio:9000/b and s3://***@h/x; fine: http://host/a@b"
    record = logging.LogRecord("x", logging.WARNING, "f", 1, "endpoint %s failed", ("http://a:s3cr3t@h",), None)
    RedactingFilter().filter(record)
    assert "s3cr3t" not in record.getMessage() and "***@h" in record.getMessage()
    assert "s3cr3t" not in redaction.redact("url http://a:s3cr3t@h")


def test_redaction_hides_the_s3_keys_beam_was_given_by_anyone():
    """Beam's worker main sets a worker's filesystem options itself (not through
    transforms/io/filesystem_options.py): redact still hides the keys Beam's S3 client was built from."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    FileSystems.set_options(PipelineOptions(["--s3_access_key_id=AKIAXAMPLE", "--s3_secret_access_key=wJalrXUtnFE"]))
    try:
        assert redaction.redact("denied for AKIAXAMPLE with wJalrXUtnFE") == "denied for *** with ***"
    finally:
        FileSystems.set_options(PipelineOptions([]))
