"""A human summary of a chunk database + neighbour sidecar, with one decoded chunk and its neighbours."""
from __future__ import annotations

from model_contract import decode_example, load_manifest, resolve_shard_path
from model_contract.checked_reader import iter_checked_records
from model_contract.retrieval import check_sidecar, decode_sidecar
from pipeline.errors import ConfigError
from pipeline.ops.safe_text import terminal
from pipeline.retrieval import store
from transforms.retrieval import retrieval_chunks
from transforms.tokenize import tokenizer


def _clip(text: str, limit: int = 300) -> str:
    text = terminal(text.replace("\n", "⏎ "))  # the data's text: inert on a terminal (pipeline/ops/safe_text.py)
    return text if len(text) <= limit else text[:limit] + " …"


def _checked_record(root: str, shard, index: int) -> bytes:
    """Record `index` of a shard of `root`, through the checked reader every reader uses
    (model_contract/checked_reader.py): a file swapped on disk is refused by its manifest path, not shown as if it
    were the record the sidecar's neighbours belong to."""
    from pipeline.ops import commit  # noqa: PLC0415
    from transforms.io import io_utils  # noqa: PLC0415

    with io_utils.open_read(resolve_shard_path(commit.manifest_location(root), shard)) as stream:
        for i, record in enumerate(iter_checked_records(stream, shard)):
            if i == index:
                return record
    raise AssertionError("unreachable: the checked reader refuses a shard with fewer records than its entry")


def show(dataset: str, db: str, sidecar: str, example: int = 0, chunk=None) -> str:
    from pipeline.ops import commit  # noqa: PLC0415

    data = commit.require_dataset(load_manifest(dataset), f"--dataset {dataset}")
    side = load_manifest(sidecar)
    check_sidecar(data, side)
    dbm = store.read_manifest(db, store.DB_FORMAT)
    r = side.retrieval  # SidecarInfo (model_contract/retrieval.py); check_sidecar refused a manifest without it
    spec = side.contract.retrieval
    lines = [
        f"chunk database {db}: {dbm.counts['chunks']:,} chunks of {dbm.chunk_len} tokens from "
        f"{dbm.counts['documents']:,} documents ({dbm.counts['tokens']:,} tokens); encoder "
        f"{dbm.encoder['name']}, index {dbm.index.get('config', {}).get('spec', dbm.index['kind'])}",
        "  by source: " + ", ".join(f"{terminal(s)} {v['chunks']:,}" for s, v in sorted(dbm.sources.items())),
        f"neighbours {sidecar}: generation {side.generation} for dataset {r.dataset_generation}; "
        f"k={spec.num_neighbours}, neighbour_len={spec.neighbour_len}, fingerprint {spec.fingerprint}",
        f"  query chunks {r.counts['chunks']:,} (padding {r.counts['padding_chunks']:,}), neighbours "
        f"{r.counts['neighbours']:,}, missing {r.counts['missing']:,}",
        f"  storage: sidecar {r.storage['sidecar_bytes']:,} B = {r.storage['ratio_to_shards']:.2f}x the shards "
        f"({r.storage['token_dtype']} token ids)",
    ]
    sp = tokenizer.load_for_info(tokenizer.read_model_bytes(data.config["tokenizer"]), data.contract.tokenizer)
    shard, side_shard = data.shards[0], side.shards[0]
    if not 0 <= example < min(shard.examples, side_shard.examples):
        raise ConfigError(f"--example {example}: {shard.path} holds examples 0 to {shard.examples - 1}")
    rec = _checked_record(dataset, shard, example)
    srec = _checked_record(sidecar, side_shard, example)
    ex, nb = decode_example(rec), decode_sidecar(srec, side.contract)
    chunks = retrieval_chunks.query_chunks(ex, spec.chunk_len)
    if chunk is None:
        chunk = next((c.index for c in chunks if (nb["neighbour_doc_ids"][c.index] >= 0).any()), 0)
    q = chunks[chunk]
    lines.append(f"\n{terminal(shard.path)} example {example}, chunk {chunk} (documents "
                 f"{', '.join(f'{d:x}' for d in q.doc_ids)}):")
    lines.append("  " + _clip(sp.decode([int(t) for t in q.tokens])))
    pad = data.contract.tokenizer.pad_id
    for j in range(spec.num_neighbours):
        doc, idx = int(nb["neighbour_doc_ids"][chunk, j]), int(nb["neighbour_chunk_index"][chunk, j])
        if doc < 0:
            lines.append(f"neighbour {j + 1}: none")
            continue
        toks = [int(t) for t in nb["neighbour_tokens"][chunk, j] if int(t) != pad]
        lines.append(f"neighbour {j + 1}: document {doc:x} chunk {idx} (+ continuation):")
        lines.append("  " + _clip(sp.decode(toks)))
    return "\n".join(lines)
