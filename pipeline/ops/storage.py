"""Object-store preflight: fail in seconds, with a clear message and no secret, before any work starts.

Beam's S3 filesystem reports a missing bucket on input as "nothing matches" and on output only when the first
worker writes (after the tokenizer and the listing, from deep in a worker's traceback). `preflight()` asks
the store directly, with the same settings Beam's S3 client uses (`--s3_endpoint_url`, `--s3_region_name`,
`--s3_access_key_id`/`--s3_secret_access_key`/`--s3_session_token`, `--s3_verify`, `--s3_disable_ssl`, else
boto3's usual chain: AWS_* environment variables, AWS_PROFILE / ~/.aws, instance or task role), and turns
the answer into a ConfigError that names the knob. Messages never contain key material: only where the
credentials came from (boto3's provider name) and the bucket/endpoint.
"""
from __future__ import annotations

import logging
from typing import Optional

from pipeline.errors import ConfigError
from pipeline.ops.redaction import redact_userinfo
from transforms.io import io_utils

LOG = logging.getLogger("pileprep.storage")
CREDENTIAL_HINT = ("check the credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws, "
                   "an instance/task role, or --s3_access_key_id/--s3_secret_access_key")


def _bucket_key(path: str) -> tuple:
    rest = path.split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    return bucket, key


def s3_client(options: Optional[dict]):
    """A boto3 S3 client built from Beam's s3_* options (one implementation: transforms/io/io_utils.py)."""
    return io_utils.s3_client(options)


def _credential_source(session) -> str:
    try:
        creds = session.get_credentials()
    except Exception:  # noqa: BLE001
        return "unknown"
    return "none found" if creds is None else getattr(creds, "method", "unknown")


def check_s3_path(path: str, options: Optional[dict], flag: str, write: bool = False) -> None:
    """Head the bucket (and for outputs put + delete a probe object); ConfigError on any failure."""
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

    bucket, key = _bucket_key(path)
    session, client = s3_client(options)
    where = f"bucket '{bucket}'" + (f" at {redact_userinfo(options.get('s3_endpoint_url'))}" if (options or {}).get(
        "s3_endpoint_url") else "")
    source = _credential_source(session)
    try:
        try:
            client.head_bucket(Bucket=bucket)
        except ClientError as e:  # HEAD answers carry no body: ask again with a GET for the precise code
            if str(e.response.get("Error", {}).get("Code")) != "403":
                raise
            client.list_objects_v2(Bucket=bucket, MaxKeys=1)
        if write:
            probe = (key.rstrip("/") + "/" if key else "") + "_staging/.pileprep-write-probe"
            client.put_object(Bucket=bucket, Key=probe, Body=b"")
            client.delete_object(Bucket=bucket, Key=probe)
    except ClientError as e:
        err = e.response.get("Error", {})
        code = str(err.get("Code", "")) or str(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
        if code in ("404", "NoSuchBucket", "NotFound"):
            raise ConfigError(f"{flag} {path}: {where} does not exist; create it or fix the path") from None
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken",
                    "AuthFailure", "UnrecognizedClientException"):
            raise ConfigError(f"{flag} {path}: {where} rejected the credentials ({code}; credentials from "
                              f"{source}); {CREDENTIAL_HINT}") from None
        if code in ("403", "AccessDenied", "Forbidden", "AllAccessDisabled"):
            raise ConfigError(f"{flag} {path}: access to {where} denied ({code}; credentials from {source}) — "
                              f"{'write' if write else 'read/list'} permission is needed; {CREDENTIAL_HINT}"
                              ) from None
        raise ConfigError(f"{flag} {path}: {where} answered {code or 'an error'}; credentials from {source}"
                          ) from None
    except BotoCoreError as e:
        name = type(e).__name__
        if name in ("NoCredentialsError", "PartialCredentialsError"):
            raise ConfigError(f"{flag} {path}: no usable credentials for {where} ({name}); {CREDENTIAL_HINT}"
                              ) from None
        # EndpointConnectionError & co: say where we tried, not what we sent.
        raise ConfigError(f"{flag} {path}: cannot reach {where} ({name}); check --s3_endpoint_url / network"
                          ) from None


def preflight(inputs, output: str, staging_dir: Optional[str], options: Optional[dict]) -> None:
    """Check every object-store bucket the job touches, once each."""
    seen = set()
    checks = [(g, "--input", False) for g in inputs] + [(output, "--output", True)]
    if staging_dir:
        checks.append((staging_dir, "--staging-dir", True))
    for path, flag, write in checks:
        if io_utils.is_local(path) or not path.startswith("s3://"):
            continue
        bucket, _ = _bucket_key(path)
        if (bucket, write) in seen:
            continue
        seen.add((bucket, write))
        check_s3_path(path, options, flag, write=write)
