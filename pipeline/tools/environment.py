"""`pileprep env`: what is installed and active, for bug reports and for checking a worker image.

The C varint codec (model_contract/_varint.c) is optional: an install without a compiler silently falls back to
the numpy path, which is byte-identical but slower at encoding (docs/BENCHMARKS.md, "Varint codec"). This says
which one runs; likewise for the C word-shingle path of --near-dedup (transforms/shard/_shingles.c, bit-identical
to its numpy fallback).
"""
from __future__ import annotations

import importlib.metadata
import platform
import sys

from pipeline.config import PILEPREP_VERSION

PACKAGES = ("apache-beam", "zstandard", "numpy", "protobuf", "pyarrow", "google-crc32c", "boto3",
            "torch", "tensorflow-cpu", "tensorflow", "google-cloud-storage")
# Every library that turns text into ids (each tokenizer format's reference, the fast backends, tiktoken's
# pattern engine): a shard's token ids are only as exact as these versions (a fast backend's version is part of
# its key, transforms/tokenize/tokenizer_backends.py), so a bug report or a worker image check needs all of
# them. Distribution names;
# tests/unit/tools/test_env_versions.py checks that every library transforms/tokenize/ imports is here.
TOKENIZER_LIBRARIES = ("sentencepiece", "tokenizers", "tiktoken", "regex", "gigatoken-cachefix", "kitoken",
                       "splintr-rs")


def package_versions(names=PACKAGES) -> dict:
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def c_codec() -> dict:
    """Whether model_contract's C varint extension is loaded, and from where."""
    from model_contract import example_codec  # noqa: PLC0415

    fast = getattr(example_codec, "_fast", None)
    return {"active": fast is not None, "path": getattr(fast, "__file__", None)}


def c_shingles() -> dict:
    """Whether transforms.shard's C word-shingle extension (_shingles.c, --near-dedup) is loaded, and from where."""
    from transforms.shard.near_dedup import hashing  # noqa: PLC0415

    fast = hashing.fast
    return {"active": fast is not None, "path": getattr(fast, "__file__", None)}


def crc32c_implementation() -> str:
    """Which CRC-32C frames and checks TFRecords (model_contract/crc32c.py): google_crc32c, the C extension or
    numpy. All give the same bytes; only the speed differs."""
    from model_contract import crc32c  # noqa: PLC0415

    return crc32c.IMPLEMENTATION


def report() -> dict:
    return {"pileprep": PILEPREP_VERSION, "python": platform.python_version(), "executable": sys.executable,
            "platform": platform.platform(), "packages": package_versions(),
            "tokenizer_libraries": package_versions(TOKENIZER_LIBRARIES), "c_varint_codec": c_codec(),
            "c_shingles": c_shingles(), "crc32c": crc32c_implementation()}


def format_report(r: dict) -> str:
    codec, shingles = r["c_varint_codec"], r.get("c_shingles", {"active": False, "path": None})
    lines = [f"pileprep        {r['pileprep']}", f"python          {r['python']} ({r['executable']})",
             f"platform        {r['platform']}",
             "C varint codec  " + (f"active ({codec['path']})" if codec["active"]
                                   else "NOT active: numpy fallback (~25x slower encoding); reinstall with a C "
                                        "compiler: pip install -e . --no-build-isolation"),
             "C shingles      " + (f"active ({shingles['path']})" if shingles["active"]
                                   else "NOT active: numpy fallback (--near-dedup's word shingles cost more CPU); "
                                        "reinstall with a C compiler"),
             f"CRC-32C         {r.get('crc32c', '-')}"]
    for name, version in r["packages"].items():
        lines.append(f"{name:<15} {version or '-'}")
    lines.append("tokenizer libraries (a shard's bytes depend on these versions):")
    for name, version in r.get("tokenizer_libraries", {}).items():
        lines.append(f"  {name:<20} {version or '- (not installed)'}")
    return "\n".join(lines)
