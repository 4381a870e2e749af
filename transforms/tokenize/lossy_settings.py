"""tokenizer.json settings that lose text: refused (FormatError, exit 2, one line naming the field) or, for a
normalizer, named so that a warning and `verify --inputs` can say what the ids stand for.

HF `tokenizers` applies these inside `encode`, so the ids it gives are "exact" to the library and still not the
document (hostile review of issue 28, F2, docs/wip/hostile-review-issue28.md):
- `truncation` cuts every document to `max_length` ids, `padding` adds pad ids to every document;
- a pre-tokenizer that removes what it splits on (`Split`/`Punctuation` with `behavior: "Removed"`, and
  `Whitespace`, `WhitespaceSplit`, `BertPreTokenizer`, `CharDelimiterSplit`, which always do) drops that text;
- a byte-level pre-tokenizer without a ByteLevel decoder (`decoder: null`) decodes to `Ġ`-junk: the ids cannot be
  read back as the text (`verify --inputs` and `inspect` decode them).
Each is found anywhere in the spec's tree (a `Sequence` of pre-tokenizers included).

A normalizer that only deletes text (`Replace` with empty `content`, `Strip`) is refused like a removing Split.
Any other normalizer (Lowercase, StripAccents, Replace with text, NFKC, ...) is NOT refused: it is the tokenizer's
design (BERT lowercases, T5 applies NFKC), the ids are exactly the library's, and refusing it would refuse those models.
What it changes is what the ids stand for: the normalized text. So the shard job warns once per process
(`warn_normalizer`), and `verify --inputs` checks decode(ids) against the text as the normalizer rewrites it
(pipeline/tools/verify_inputs.py `RoundTrip`).
"""
from __future__ import annotations

import json
import logging

from transforms.tokenize.tokenizer_errors import FormatError

LOG = logging.getLogger("pileprep.tokenizer")  # the run's own logger: shown on the driver's stderr (pipeline/cli.py)
# HF tokenizers' pre-tokenizers that drop the characters they split on whatever their settings
# (tokenizers/src/pre_tokenizers/: whitespace.rs, bert.rs, delimiter.rs use SplitDelimiterBehavior::Removed)
_DROPPING_PRE_TOKENIZERS = ("Whitespace", "WhitespaceSplit", "BertPreTokenizer", "CharDelimiterSplit")
# Normalizers that change text the decoder does not restore (Prepend is undone by the usual Strip decoder;
# ByteLevel maps bytes one to one)
LOSSY_NORMALIZERS = ("Lowercase", "Strip", "StripAccents", "Replace", "NFC", "NFD", "NFKC", "NFKD", "Nmt",
                     "Precompiled", "BertNormalizer")
_warned: set = set()


def _nodes(node, where: str):
    """Every (path, dict) of a spec subtree that has a "type", depth first."""
    if isinstance(node, dict):
        if "type" in node:
            yield where, node
        for key, value in node.items():
            yield from _nodes(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _nodes(value, f"{where}[{i}]")


def _types(node, where: str) -> set:
    return {n.get("type") for _w, n in _nodes(node, where)}


def _brief(value) -> str:
    return json.dumps(value, sort_keys=True)[:60]


def check_lossless(spec: dict) -> None:
    """FormatError for the first setting of the tokenizer.json that drops or cuts text, naming its field."""
    for knob, effect in (("truncation", "cuts every document to its max_length ids"),
                         ("padding", "adds pad ids to every document")):
        if spec.get(knob) is not None:
            raise FormatError(f"the tokenizer.json has {knob} = {_brief(spec[knob])}: HF tokenizers "
                                      f"{effect}, so the ids would not be the document's; set it to null")
    for where, node in _nodes(spec.get("pre_tokenizer"), "pre_tokenizer"):
        kind = node.get("type")
        if node.get("behavior") == "Removed" or kind in _DROPPING_PRE_TOKENIZERS:
            removed = node.get("behavior") == "Removed"
            what = 'behavior "Removed"' if removed else "no behavior but removing what it splits on"
            fix = 'use behavior "Isolated"' if removed else 'use a Split with behavior "Isolated"'
            raise FormatError(f"the tokenizer.json's {where} is a {kind} pre-tokenizer with {what}: the text "
                                      f"it splits on would be dropped from every document; {fix}")
    for where, node in _nodes(spec.get("normalizer"), "normalizer"):
        deletes = _deleting_normalizer(node)
        if deletes:
            raise FormatError(f"the tokenizer.json's {where} is a {node.get('type')} normalizer that {deletes}: "
                              f"that text would be dropped from every document (and verify would judge the ids "
                              f"against the text without it); remove it")
    _check_prefix_space(spec)
    pre_types = _types(spec.get("pre_tokenizer"), "pre_tokenizer")
    decoder_types = _types(spec.get("decoder"), "decoder")
    for kind in ("ByteLevel", "Metaspace"):  # pre-tokenizers that rewrite characters; their decoder undoes it
        if kind in pre_types and kind not in decoder_types:
            raise FormatError(f"the tokenizer.json has a {kind} pre-tokenizer but decoder = "
                                      f"{_brief(spec.get('decoder'))}: its ids cannot be decoded back to the text; "
                                      f"add a {kind} decoder")


def byte_level_pre_tokenizers(spec: dict) -> list:
    """The ByteLevel pre-tokenizers of a tokenizer.json's spec (alone or in a Sequence), as their dicts."""
    pre = spec.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    return [p for p in parts or [] if isinstance(p, dict) and p.get("type") == "ByteLevel"]


def adds_prefix_space(spec: dict) -> bool:
    """Whether a ByteLevel pre-tokenizer of the spec prepends a space (add_prefix_space)."""
    return any(p.get("add_prefix_space") is True for p in byte_level_pre_tokenizers(spec))


def _check_prefix_space(spec: dict) -> None:
    """A ByteLevel pre-tokenizer with add_prefix_space prepends a space to every piece of text it sees, and HF
    hands it the text between added tokens piece by piece: after each non-special added token ("\t\t", a
    whitespace run) the ids hold a space the document does not ('a\t\tb' decodes to ' a\t\t b', measured).
    Alone it adds one space at the start, which `verify --inputs` accepts (verify_inputs.RoundTrip); with such
    added tokens it inserts text mid-document: refused (hostile review rv2, F4)."""
    if not adds_prefix_space(spec):
        return
    plain = [t.get("content") for t in spec.get("added_tokens") or [] if isinstance(t, dict) and not t.get("special")]
    if plain:
        raise FormatError(f"the tokenizer.json's ByteLevel pre-tokenizer has add_prefix_space = true and "
                          f"{len(plain)} non-special added token(s) ({_brief(plain[0])}, ...): a space would be "
                          f"added to the text after each of them; set add_prefix_space to false")


def _deleting_normalizer(node: dict) -> str:
    """What a normalizer deletes when all it does is delete text ("" for one that rewrites it): a `Replace` with
    empty `content` and a `Strip` that strips a side are the normalizer form of a Split with behavior "Removed"
    (hostile review rv2, F3: Replace "e" -> "" passed with a warning and verify called the result OK)."""
    kind = node.get("type")
    if kind == "Replace" and node.get("content") == "":
        return f"replaces {_brief(node.get('pattern'))} with nothing"
    if kind == "Strip" and (node.get("strip_left", True) or node.get("strip_right", True)):
        return "strips whitespace at the ends of every document"
    return ""


def normalizers(spec) -> tuple:
    """The lossy normalizer types of a tokenizer.json's spec (alone or in a Sequence), in order; () for none."""
    found = [n.get("type") for _w, n in _nodes((spec or {}).get("normalizer"), "normalizer")]
    return tuple(t for t in found if t in LOSSY_NORMALIZERS)


def warn_normalizer(spec: dict) -> None:
    """Once per process and normalizer: the ids stand for the normalized text, not the document's own."""
    names = normalizers(spec)
    if names and names not in _warned:
        _warned.add(names)
        LOG.warning("the tokenizer.json normalizes text (%s): its ids encode the text as normalized, which is how "
                    "the tokenizer was trained; `pileprep verify --inputs` checks them against that text",
                    ", ".join(names))
