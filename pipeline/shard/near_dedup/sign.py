"""The stage's first step: one unit's distinct documents signed (or read as the tokenize stage signed them),
checked against the evaluation sets, and their band rows staged (band_files.py)."""
from __future__ import annotations

from typing import NamedTuple

import apache_beam as beam
import numpy as np

from pipeline.shard.near_dedup import band_files, eval_sets, unit_docs
from pipeline.shard.near_dedup.elements import BandMember, DocRef, Removal, UnitBands
from pipeline.shard.near_dedup.settings import tokenize_signing
from transforms.io import io_utils
from transforms.shard import decontaminate
from transforms.shard.near_dedup import clusters, minhash, paths, removals, shingling

SIGN_BATCH_CHARS = 1 << 20  # documents are shingled and signed together in batches of ~1 MB of text


class SignedBatch(NamedTuple):
    """Documents signed together: their refs, signatures and 63-bit band keys (row for row)."""
    docs: list
    sigs: np.ndarray
    keys: np.ndarray


def band_keys(sigs: np.ndarray, params: minhash.MinHashParams) -> np.ndarray:
    return minhash.band_keys(sigs, params) >> np.uint64(1)  # 63 bits: Beam's int coder is signed


class SignUnit(beam.DoFn):
    """One unit → UnitBands once its band rows are staged (and, runner shuffle, a BandMember per band of each
    document), and a Removal per contaminated document."""

    def __init__(self, plan, eval_paths: tuple, shuffle: str = "runner"):
        self.plan = plan
        self.eval_paths = eval_paths
        self.shuffle = shuffle

    def setup(self):
        self.plan.setup_worker()
        cfg = self.plan.config
        self.near = cfg.near_dedup_config
        self.params = self.near.params
        self.coefficients = self.params.coefficients()
        self.eval_set = eval_sets.load_eval_set(cfg, list(self.eval_paths)) if self.eval_paths else None
        self.checked_splits = cfg.decontaminate_config.checked_splits

    def process(self, unit):
        # files: the band rows go to staged files and only the unit's name travels on (FnApiRunner holds a
        # stage's whole output in memory, and with worker threads or processes failed to decode a bundle's
        # output above ~10 MB: "Invalid PaneInfoEncoding", measured on 1,925 documents). Both shuffles stage
        # them: the generation's band index is written from them once the removals are known. The rows stay
        # numpy arrays (one per unit, not ten Python elements per document): pickling a Node per band row
        # and sorting them in Python was most of the stage's cost on distinct text (docs/NEAR_DEDUP.md "Cost").
        docs, sigs, keys, found = [], [], [], []
        for e in self._process(unit):
            if isinstance(e, SignedBatch):
                docs += e.docs
                sigs.append(e.sigs)
                keys.append(e.keys)
            else:
                found.append(e)
        if self.near.enabled:
            num_perm, bands = self.params.num_perm, self.params.bands
            sigs = np.concatenate(sigs) if sigs else np.zeros((0, num_perm), dtype=minhash.SIGNATURE_DTYPE)
            keys = np.concatenate(keys) if keys else np.zeros((0, bands), dtype=np.uint64)
            band_files.write_band_files(self.plan.staging_dir, unit.name, docs, sigs, keys)
            yield UnitBands(unit.name)
            if self.shuffle != "files":
                for (doc_id, split, source, loc), sig, ks in zip(docs, sigs, keys):
                    node = clusters.Node(clusters.rank(split, doc_id), doc_id, split, sig.tobytes(), source, loc)
                    for k in ks.tolist():
                        yield BandMember(k, node)
        yield from found

    def _process(self, unit):
        """SignedBatch and Removal elements of one unit's documents."""
        cfg = self.plan.config
        batch: list = []
        chars = 0
        shingle_file = None
        if self.near.enabled and self.near.verify:
            shingle_file = io_utils.open_write(paths.shingles(self.plan.staging_dir, unit.name)).__enter__()
        staged = [shingle_file, 0]  # the unit's shingle file and the shingles written to it so far
        try:
            staged_sigs = (unit_docs.staged_signatures(self.plan, unit, self.params.num_perm)
                           if tokenize_signing(cfg) is not None else None)
            if staged_sigs is not None:  # signed by the tokenize stage: no text to read here
                docs, sigs = staged_sigs
                if docs:
                    yield SignedBatch(docs, sigs, band_keys(sigs, self.params))
                return
            tokens = self.near.enabled and self.params.shingles == "tokens"
            # token shingles need no text; decontamination still does (word n-grams of the text)
            text_docs = (unit_docs.unit_documents(self.plan, unit) if self.eval_set is not None or not tokens
                         else None)
            id_docs = unit_docs.unit_documents(self.plan, unit, text=False) if tokens else None
            # `is not None`: a unit whose documents are all exact copies of committed ones (or a unit without a
            # document) has an empty list here, which `or` turned into None (TypeError)
            documents = text_docs if text_docs is not None else id_docs
            for k, doc in enumerate(documents):
                if self.eval_set is not None and doc.split in self.checked_splits:
                    hit = decontaminate.find(doc.content, self.eval_set)
                    if hit is not None:
                        yield Removal(doc.doc_id, {"id": doc.doc_id, "reason": removals.CONTAMINATED,
                                                   "source": doc.source, "eval_file": hit.eval_file,
                                                   "ngram": hit.ngram})
                        continue
                if not self.near.enabled:
                    continue
                if tokens:  # the same documents in the same order either way
                    doc = doc._replace(content=id_docs[k].content)
                batch.append(doc)
                chars += len(doc.content) * (4 if tokens else 1)  # batches of ~ the same text either way
                if chars >= SIGN_BATCH_CHARS:
                    yield from self._sign(unit, batch, staged)
                    batch, chars = [], 0
            yield from self._sign(unit, batch, staged)
        finally:
            if shingle_file is not None:
                shingle_file.__exit__(None, None, None)

    def _sign(self, unit, batch: list, staged: list):
        """The SignedBatch of a batch of UnitDocuments; their shingles are computed together
        (shingling.shingles_batch) and, for --near-dedup-verify, staged."""
        if not batch:
            return
        contents = [d.content for d in batch]
        if self.params.shingles == "tokens":  # unsorted windows suffice for signatures (minhash.py)
            sets = shingling.token_shingles_batch(contents, shingling.SHINGLE_TOKENS, unique=staged[0] is not None)
        elif staged[0] is None:  # nothing to stage: signatures straight from the texts (C when built, no sort)
            sigs = minhash.word_signatures(contents, self.params, self.coefficients)
            docs = [DocRef(d.doc_id, d.split, d.source, (unit.name, d.line)) for d in batch]
            yield SignedBatch(docs, sigs, band_keys(sigs, self.params))
            return
        else:
            sets = shingling.shingles_batch(contents, self.params.shingle_words)
        docs = []
        for d, sh in zip(batch, sets):
            loc = (unit.name, d.line)
            if staged[0] is not None:
                staged[0].write(sh.astype("<u8").tobytes())
                loc = (unit.name, d.line, staged[1], int(sh.size))
                staged[1] += int(sh.size)
            docs.append(DocRef(d.doc_id, d.split, d.source, loc))
        sigs = minhash.signatures(sets, self.params, self.coefficients)
        yield SignedBatch(docs, sigs, band_keys(sigs, self.params))
