"""The reference encoder of each tokenizer format: that format's own library, behind SentencePiece's API.

The job, `verify`'s audit, `inspect` and `retrieval show` call `encode(texts, out_type=int, num_threads=1)`,
`decode(ids)`, `get_piece_size()`, `eos_id()`... as on a `sentencepiece.SentencePieceProcessor`; a SentencePiece
model is served by sentencepiece itself, an HF tokenizer.json by HF `tokenizers`, a tiktoken file by
`tiktoken.Encoding`. Every fast backend (transforms/tokenize/tokenizer_backends.py) is judged against these.

Text is text in all three: sentencepiece's `encode` never matches control pieces in text; HF runs with
`encode_special_tokens = True` (its `special: true` added tokens are not matched; non-special added tokens, such
as whitespace runs, are vocabulary and still are) and without the post-processor's BOS/EOS; tiktoken encodes with
`encode_ordinary`. The job appends the end-of-document id itself.
"""
from __future__ import annotations

import json

import numpy as np

from transforms.tokenize import file_checks, formats, native

TOKENIZER_DROPS_TEXT = "tokenizer_drops_text"  # the dead-letter reason of a document whose ids lost text


class HFReference:
    """HF `tokenizers` over a tokenizer.json, one document per call on the calling thread (Beam's workers are
    the parallelism; `encode_batch` would start its own thread pool)."""
    format = formats.HF_JSON

    def __init__(self, data: bytes, options: formats.TokenizerOptions):
        from tokenizers import Tokenizer  # noqa: PLC0415 - only for this format

        try:
            spec = json.loads(data)
        except ValueError:  # formats.detect parsed it already; bytes given directly may not be JSON
            raise formats.FormatError("an HF tokenizer.json that is not valid JSON") from None
        file_checks.check_hf(spec)  # before the library: what would panic, abort or sample is refused here
        try:
            with native.load_guard("HF tokenizers"):
                self._tok = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception on a malformed file
            if isinstance(e, formats.FormatError):
                raise
            raise formats.FormatError(f"an HF tokenizer.json that HF tokenizers cannot load: {str(e)[:200]}") from None
        self._tok.encode_special_tokens = True
        # HF numbers an added token that is not in the model's vocabulary after the vocabulary, whatever id the file
        # gives it (an id past a gap is renumbered); gigatoken keeps the file's: refuse the file rather than have
        # the two read different ids
        read = {t.content: i for i, t in self._tok.get_added_tokens_decoder().items()}
        for entry in spec.get("added_tokens") or []:
            if read.get(entry["content"]) != entry["id"]:
                raise formats.FormatError(f"added token {entry['content'][:40]!r} has id {entry['id']} in the file "
                                          f"but HF tokenizers reads id {read.get(entry['content'])} (ids of added "
                                          f"tokens outside the vocabulary must follow it without gaps)")
        # what transforms/tokenize/long_documents.py checks before cutting a document, and the added tokens a cut
        # must not split (content, lstrip, rstrip)
        self.spec = {"normalizer": spec.get("normalizer"), "pre_tokenizer": spec.get("pre_tokenizer")}
        self.added = tuple((t.content, bool(t.lstrip), bool(t.rstrip))
                           for _i, t in sorted(self._tok.get_added_tokens_decoder().items()))
        self.special = {t.content: i for i, t in sorted(self._tok.get_added_tokens_decoder().items()) if t.special}
        self.eos_token, self._eos = formats.pick_eos(self.special, options.eos_token, self._tok.token_to_id)
        self.pattern = ""
        self._pad = next((self.special[t] for t in ("<|padding|>", "<pad>", "[PAD]") if t in self.special), -1)
        self._bos = next((self.special[t] for t in ("<s>", "<|begin_of_text|>", "<bos>") if t in self.special), -1)
        unk = self._tok.model.unk_token if hasattr(self._tok.model, "unk_token") else None
        self._unk = self._tok.token_to_id(unk) if unk else None

    def encode(self, texts, out_type=int, num_threads=1):  # noqa: ARG002 - SentencePiece's signature
        if isinstance(texts, str):
            return self._tok.encode(texts, add_special_tokens=False).ids
        if num_threads > 1:  # the driver's parity sample: HF's own thread pool, the same ids
            return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]
        return [self._tok.encode(t, add_special_tokens=False).ids for t in texts]

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def normalize(self, text: str) -> str:
        """The text as the file's normalizer rewrites it before encoding (the text itself without one)."""
        normalizer = self._tok.normalizer
        return normalizer.normalize_str(text) if normalizer is not None else text

    def get_piece_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    GetPieceSize = get_piece_size

    def IsByte(self, _i: int) -> bool:  # noqa: N802 - SentencePiece's name; byte-level BPE has no fallback pieces
        return False

    def id_to_piece(self, i: int) -> str:
        return self._tok.id_to_token(int(i)) or ""

    def eos_id(self) -> int:
        return self._eos

    def bos_id(self) -> int:
        return self._bos

    def pad_id(self) -> int:
        return self._pad

    def unk_id(self) -> int:
        return -1 if self._unk is None else self._unk


class TiktokenReference:
    """tiktoken's `Encoding` over the file's ranks, the pattern and special tokens given by options (the file
    holds ranks only); `encode_ordinary`, so a special token's text stays text."""
    format = formats.TIKTOKEN

    def __init__(self, data: bytes, options: formats.TokenizerOptions):
        import tiktoken  # noqa: PLC0415 - only for this format

        ranks = formats.tiktoken_ranks(data)
        self.pattern = formats.tiktoken_pattern(options.pattern)
        self.special = formats.parse_special_tokens(options.special_tokens)
        clash = sorted(set(self.special.values()) & set(ranks.values()))
        if clash:
            raise formats.FormatError(f"--special-tokens: id {clash[0]} is already a token of the tiktoken file")
        try:
            with native.load_guard("tiktoken"):
                self._enc = tiktoken.Encoding("pileprep", pat_str=self.pattern, mergeable_ranks=ranks,
                                              special_tokens=self.special)
                if self.pattern not in formats.PATTERNS.values():
                    self._check_round_trip()
        except Exception as e:  # noqa: BLE001 - tiktoken raises ValueError on a bad file
            if isinstance(e, formats.FormatError):
                raise
            raise formats.FormatError(f"tiktoken cannot build an encoding from this file: {str(e)[:200]}") from None

        def lookup(text):
            if text in self.special:
                return self.special[text]
            return ranks.get(text.encode("utf-8"))

        self.eos_token, self._eos = formats.pick_eos(self.special, options.eos_token, lookup)
        # each rank's byte length, for `lost_text` (encode_ordinary gives ranks only, never a special id)
        self._byte_lengths = np.zeros(max(ranks.values(), default=-1) + 1, dtype=np.int64)
        self._byte_lengths[np.fromiter(ranks.values(), dtype=np.int64, count=len(ranks))] = \
            np.fromiter(map(len, ranks), dtype=np.int64, count=len(ranks))

    def lost_text(self, text: str, ids) -> str:
        """Why `ids` (this encoder's, of `text`) do not hold all of the text, or "". tiktoken's encode_ordinary
        concatenates the bytes of the pattern's matches, so the ids lost text exactly when their byte lengths
        do not add up to the text's UTF-8 size: a pattern can leave text unmatched only in some contexts
        (`(?:(?!abcxyz).)+|\\s+` skips the "a" of "abcxyz"), which `_check_round_trip`'s probe of every code
        point cannot see. A take and a sum per document (transforms/tokenize/tokenizer.py encode_batch)."""
        got = int(self._byte_lengths.take(np.asarray(ids, dtype=np.int64)).sum())
        want = len(text.encode("utf-8", "surrogatepass"))
        if got == want:
            return ""
        decoded = self._enc.decode_bytes([int(i) for i in ids])
        at = next((i for i, (a, b) in enumerate(zip(decoded, text.encode("utf-8", "surrogatepass"))) if a != b),
                  min(len(decoded), want))
        return (f"the ids hold {got:,} of the text's {want:,} UTF-8 bytes, the first lost at byte {at:,}: "
                f"--tokenizer-pattern {self.pattern[:40]!r} leaves it unmatched")

    def _check_round_trip(self) -> None:
        """A custom pattern, judged by tiktoken itself: every probe text decodes back to itself (what the pattern
        does not match, tiktoken drops; file_checks.check_pattern judged the same with `regex`)."""
        for text in file_checks.probe_texts():
            got = self._enc.decode_bytes(self._enc.encode_ordinary(text))
            if got != text.encode("utf-8"):
                raise formats.FormatError(f"--tokenizer-pattern {self.pattern[:40]!r}: tiktoken does not give "
                                          f"{text[:30]!r} back (the pattern leaves part of it unmatched)")

    def encode(self, texts, out_type=int, num_threads=1):  # noqa: ARG002 - SentencePiece's signature
        if isinstance(texts, str):
            return self._enc.encode_ordinary(texts)
        if num_threads > 1:
            return self._enc.encode_ordinary_batch(list(texts), num_threads=num_threads)
        return [self._enc.encode_ordinary(t) for t in texts]

    def decode(self, ids) -> str:
        return self._enc.decode([int(i) for i in ids], errors="replace")

    def get_piece_size(self) -> int:
        return self._enc.n_vocab

    GetPieceSize = get_piece_size

    def IsByte(self, _i: int) -> bool:  # noqa: N802 - SentencePiece's name
        return False

    def id_to_piece(self, i: int) -> str:
        return self._enc.decode_single_token_bytes(int(i)).decode("utf-8", "replace")

    def eos_id(self) -> int:
        return self._eos

    def bos_id(self) -> int:
        return -1

    def pad_id(self) -> int:
        return -1

    def unk_id(self) -> int:
        return -1


def format_of(processor) -> str:
    return getattr(processor, "format", formats.SENTENCEPIECE)


def special_tokens_of(processor) -> dict:
    """{text: id} of the vocabulary's control tokens (SentencePiece: its control and unknown pieces)."""
    if hasattr(processor, "special"):
        return dict(processor.special)
    return {processor.id_to_piece(i): i for i in range(processor.get_piece_size())
            if processor.is_control(i) or processor.is_unknown(i)}
