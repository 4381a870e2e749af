"""A human summary of a chunk database + neighbour sidecar, with one decoded chunk and its neighbours."""
from __future__ import annotations

from model_contract import decode_example, load_manifest, read_records
from model_contract.retrieval import check_sidecar, decode_sidecar
from pipeline.ops.safe_text import terminal
from pipeline.retrieval import store
from transforms.retrieval import retrieval_chunks
from transforms.tokenize import tokenizer


def _clip(text: str, limit: int = 300) -> str:
    text = terminal(text.replace("\n", "⏎ "))  # the data's text: inert on a terminal (pipeline/ops/safe_text.py)
    return text if len(text) <= limit else text[:limit] + " …"


def show(dataset: str, db: str, sidecar: str, example: int = 0, chunk=None) -> str:
    data = load_manifest(dataset)
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
    base_d, base_s = dataset.rstrip("/"), sidecar.rstrip("/")
    rec = next(x for i, x in enumerate(read_records(f"{base_d}/{shard.path}")) if i == example)
    srec = next(x for i, x in enumerate(read_records(f"{base_s}/{side_shard.path}")) if i == example)
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
