"""The tokenize room's fixtures (tests/unit/tokenize/conftest.py): the trained HF BPE and the per-test tokenizer
cache, so that the whole-job tests here run as their unit neighbours do."""
from tests.unit.tokenize.conftest import _tokenizer_cache, hf_bpe  # noqa: F401 - fixtures, one autouse
