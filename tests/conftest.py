"""Shared fixtures: a small SentencePiece model trained here, real data from ../shared/data when present."""
from __future__ import annotations

import contextlib
import os
import pathlib
import sysconfig

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# TensorFlow 2.21 and triton 3.7 (a dependency of torch 2.13's CUDA build, which is what PyPI serves) each carry
# their own LLVM: `import tensorflow; import triton` segfaults the process, the other order works (reproduced in a
# bare interpreter). The suite loads both in one process (tf.data reads shards; sentence-transformers imports
# torch._dynamo, which imports triton), so triton is loaded first. Product code never imports both: TensorFlow only
# in model_contract's tf_feature_spec helpers for tf.data users.
with contextlib.suppress(ImportError):
    import triton  # noqa: F401

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def shared_data(*parts: str) -> pathlib.Path:
    """A file from ../shared/data, or skip the test with the reason (a fresh clone outside CI has none)."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"real sample data not available: {path} is absent (it exists beside the repo in CI)")
    return path


def stdlib_texts(limit_bytes: int, skip: int = 0) -> list:
    """Real text every machine with Python has: standard library sources, in a fixed order."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    out, total = [], 0
    for path in sorted(root.glob("*.py"))[skip:]:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip():
            continue
        out.append((path.name, text))
        total += len(text)
        if total >= limit_bytes:
            break
    return out


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory) -> str:
    """A 1,000-piece BPE model with byte fallback, trained on stdlib text (a few seconds)."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    sentences = [line for _, text in stdlib_texts(3_000_000) for line in text.splitlines() if line.strip()]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences[:60_000]), model_writer=model, vocab_size=1000, model_type="bpe",
        byte_fallback=True, pad_id=0, unk_id=1, bos_id=2, eos_id=3, normalization_rule_name="identity",
        remove_extra_whitespaces=False, num_threads=1, minloglevel=2)
    path = tmp_path_factory.mktemp("tok") / "tiny.model"
    path.write_bytes(model.getvalue())
    return str(path)


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: end-to-end run (runners, CLI, S3, crash, torchrun); tests/e2e/")
    config.addinivalue_line("markers", "unit: a unit test of one module; tests/unit/<room>/")
    config.addinivalue_line("markers", "retrieval_scale: compressed/re-ranked index and range-sharded neighbour search")
    config.addinivalue_line("markers", "formats: Megatron/MDS/HF export or best-fit packing, read back by each "
                            "format's own library (tests/e2e/test_export_formats.py, tests/unit/shard/test_best_fit.py)")


def pytest_collection_modifyitems(config, items):
    """Markers from the folder: tests/unit/<room>/ mirrors the code, tests/e2e/ runs whole commands."""
    for item in items:
        parts = pathlib.Path(str(item.fspath)).relative_to(REPO / "tests").parts
        if parts and parts[0] in ("unit", "e2e"):
            item.add_marker(getattr(pytest.mark, parts[0]))
