"""Which data a run trains on: the manifest (of the generation the run pinned) and its contract, checked
against the model before anything is allocated or any process group is started.

The contract sizes the model (embedding rows, positions): `open_dataset` refuses a contract beyond `MAX_VOCAB` /
`MAX_SEQ_LEN` and one that the first record of the split contradicts (its length is not seq_len, or it holds an
id >= the vocabulary). The generation is read once and pinned for the run's life (`pin_generation`): a commit
landing meanwhile does not move it.
"""
from __future__ import annotations

import hashlib
import os
import time
from typing import Optional

from model_contract import (INPUT_IDS, Expectation, Manifest, check_compatible, decode_example, load_manifest,
                            manifest_path)
from model_contract import refs
from model_contract.checked_reader import ShardMismatchError, count_problem, iter_checked_records
from trainer.config import DataConfig, ModelConfig
from trainer.shard_files import DataIntegrityError, shard_paths


def tokenizer_pin(value: Optional[str]) -> Optional[str]:
    """--tokenizer: a sha256 as given, or the sha256 of the tokenizer file it names (any format: SentencePiece
    .model, tiktoken file, tokenizer.json, or a directory holding one, as transforms/tokenize/tokenizer.py reads)."""
    if not value:
        return None
    if len(value) == 64 and all(c in "0123456789abcdef" for c in value.lower()):
        return value.lower()
    if os.path.isdir(value):
        value = os.path.join(value, "tokenizer.json")
    if not os.path.isfile(value):
        raise ValueError(f"--tokenizer {value}: neither a file nor a sha256")
    with open(value, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def read_manifest(cfg: DataConfig, generation: Optional[str] = None) -> tuple[Manifest, str]:
    """The manifest of `generation` (the one this run pinned, `pin_generation`; None: the live one): the live
    manifest while it is still that generation, else the generation's own copy that commits keep beside it
    (model_contract/refs.py), or FileNotFoundError naming the generation. Shards resolve from `mfile`, the
    dataset's manifest.json, either way."""
    mfile = manifest_path(cfg.path) if not cfg.path.endswith(".json") else cfg.path
    manifest = load_manifest(mfile)
    if generation is not None and manifest.generation != generation:
        manifest = refs.load_generation_manifest(refs.dataset_dir_of(cfg.path), generation)
    return manifest, mfile


def pin_generation(cfg: DataConfig, checkpoint_dir: Optional[str], resumed: Optional[str]) -> Optional[str]:
    """The generation this run reads for its whole life: the checkpoint's on a resume (refused, naming it, when
    the dataset no longer keeps it), else the live one. Rank 0 registers the run's ref (holder: the checkpoint
    directory) so no commit or `pileprep gc` removes the generation while its checkpoints need it; a run
    without --checkpoint-dir relies on the previous generation being kept (--keep-generations)."""
    dataset = refs.dataset_dir_of(cfg.path)
    holder = os.path.abspath(checkpoint_dir) if checkpoint_dir and int(os.environ.get("RANK", "0")) == 0 else None
    if resumed is None:
        if refs.live_generation(dataset) is None:
            return None  # a manifest written before generations were named
        return refs.pin_generation(dataset, holder) if holder else refs.live_generation(dataset)
    generation = refs.check_generation_name(resumed, "checkpoint meta.json generation")

    def check_kept() -> None:
        if refs.live_generation(dataset) != generation:
            refs.load_generation_manifest(dataset, generation)  # FileNotFoundError naming it when gone

    check_kept()
    if holder:
        refs.write_ref_local(dataset, refs.Ref(generation, "trainer", holder, round(time.time(), 3)))
        check_kept()  # a gc between the first check and the ref removed it: refuse now, not mid-run
    return generation


def check_same_generation(generation: Optional[str]) -> None:
    """After the rendezvous: every rank read the live manifest on its own, so a commit landing between two ranks'
    reads would give them different shard lists. Refuse, naming both, rather than train on a mix."""
    import torch.distributed as dist  # noqa: PLC0415

    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, generation)
    if len(set(gathered)) > 1:
        raise RuntimeError(f"ranks started on different generations ({', '.join(sorted(set(map(str, gathered))))}): "
                           f"a commit landed while they started; start the run again")


def open_dataset(cfg: DataConfig, model: ModelConfig, generation: Optional[str] = None) -> tuple[Manifest, str]:
    """Load the manifest (of `generation`, read_manifest) and check it against the model config; call before any
    process-group work.

    Raises ContractMismatchError listing every difference (seq_len, vocab, features, pinned tokenizer).
    """
    manifest, mfile = read_manifest(cfg, generation)
    check_contract_limits(manifest, mfile)
    check_compatible(manifest, Expectation(seq_len=model.seq_len, vocab_size=model.vocab_size,
                                           tokenizer_sha256=tokenizer_pin(cfg.tokenizer)))
    if not manifest.shards_for(cfg.split):
        raise ValueError(f"{mfile}: no shards for split {cfg.split!r} (--split)")
    check_first_record(manifest, mfile, cfg.split)
    return manifest, mfile


# The largest contract the trainer builds a model for. The model's embedding has vocab_size rows and its position
# table and attention masks grow with seq_len (trainer/model.py, costed in trainer/plan.py): a hand-edited
# `vocab_size` of 2e9 or `seq_len` of 1e8 would end in an allocation traceback, not a message. 2**24 ids is 64x
# the largest tokenizers in use (256k); 2**20 tokens per sequence is 8x the longest-context recipes.
MAX_VOCAB = 1 << 24
MAX_SEQ_LEN = 1 << 20


def check_contract_limits(manifest: Manifest, mfile: str) -> None:
    """Refuse (DataIntegrityError, one line) a contract whose sizes no model of this trainer can be built for."""
    c = manifest.contract
    for name, value, limit in (("seq_len", c.seq_len, MAX_SEQ_LEN), ("tokenizer.vocab_size",
                                                                     c.tokenizer.vocab_size, MAX_VOCAB)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= limit:
            raise DataIntegrityError(f"{mfile}: contract {name} {value!r} is outside 1..{limit}: a damaged or "
                                     f"hand-edited manifest; refusing before the model is built")


def check_first_record(manifest: Manifest, mfile: str, split: str) -> None:
    """The contract against the data itself: the split's first record must be seq_len tokens, every id below
    the vocabulary (a contract that lies about either would size the model wrongly or index past its
    embedding). Reads one record, through the checked reader (the shard's size is checked first)."""
    c = manifest.contract
    info = manifest.shards_for(split)[0]
    if info.examples == 0:
        return
    path = shard_paths(mfile, [info])[0]
    try:
        with open(path, "rb") as f:
            record = next(iter_checked_records(f, info, name=path), None)
    except ShardMismatchError as e:
        raise DataIntegrityError(str(e)) from None
    except OSError as e:
        raise DataIntegrityError(f"shard {info.path}: cannot open ({e.strerror})") from None
    if record is None:
        raise DataIntegrityError(count_problem(info, 0))
    ids = decode_example(record)[INPUT_IDS]
    if len(ids) != c.seq_len:
        raise DataIntegrityError(f"shard {info.path}: record 0 has {len(ids)} tokens, the contract's seq_len is "
                                 f"{c.seq_len}: a damaged or hand-edited manifest; refusing before the model is built")
    if len(ids) and (int(ids.max()) >= c.tokenizer.vocab_size or int(ids.min()) < 0):
        raise DataIntegrityError(f"shard {info.path}: record 0 holds token id {int(ids.max())}, outside the "
                                 f"contract's vocab_size {c.tokenizer.vocab_size}: a damaged or hand-edited "
                                 f"manifest; refusing before the model is built")
