"""The report's figures (pipeline/tools/report.py): everything the page shows, gathered from the manifest (the
shard job computed the distributions, transforms/shard/corpus_stats.py), the dead-letter files (for excerpts),
the trainer's metrics JSON lines (trainer/metrics.py), a `--run-log` (wall time) and one record per split
decoded with the run's tokenizer. The data itself is never re-read beyond that one record per split.

Values returned here are data, not markup: the page (report.py) and the plots (report_plots.py) escape them.
"""
from __future__ import annotations

import hashlib
import json
import math
from typing import Optional

from transforms.shard import mixture as mixture_weights
from transforms.shard.documents import SPLITS

MAX_DEAD_LETTER_ROWS = 2000  # read at most this many dead-letter rows for excerpts (they can be many)


def num(v) -> float:
    """A count or size from the manifest as a number (0 for anything else), for arithmetic only: display goes
    through `report_html.cell`, which escapes whatever the value is."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else 0


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1024
    return ""


def bytes_on_disk(manifest: dict) -> int:
    """Shards, document-id indexes and dead-letter files the manifest lists (the manifest itself aside)."""
    listed = list(manifest.get("shards", [])) + list(manifest.get("doc_id_indexes", []) or []) + list(
        manifest.get("dead_letter_files", []) or [])
    return int(sum(num(f.get("bytes", 0)) for f in listed if isinstance(f, dict)))


def headline(manifest: dict, wall_s: Optional[float] = None) -> list:
    """(label, value) pairs for the page's first lines: what a data engineer asks first."""
    c = manifest["contract"]
    tok = c["tokenizer"]
    splits = manifest["splits"]
    backend = manifest.get("tokenizer_backend") or {}
    generations = manifest.get("generations") or []
    tokenizer_name = str(manifest.get("config", {}).get("tokenizer", "?")).rstrip("/").rsplit("/", 1)[-1]
    return [
        ("tokens", f"{int(sum(num(d.get('tokens', 0)) for d in splits.values())):,}"),
        ("documents", f"{int(sum(num(d.get('documents', 0)) for d in splits.values())):,}"),
        ("examples", f"{int(sum(num(d.get('examples', 0)) for d in splits.values())):,} of "
                     f"{c['seq_len']} tokens"),
        ("bytes on disk", _bytes(bytes_on_disk(manifest))),
        ("wall time", f"{wall_s:,.1f} s" if wall_s is not None else "not recorded (pass --run-log FILE of the run)"),
        ("tokenizer", f"{tokenizer_name} ({tok.get('kind', '?')}, vocab {tok.get('vocab_size', '?')}, sha256 "
                      f"{str(tok.get('model_sha256', '?'))[:16]})"),
        ("backend", f"{backend.get('name', 'sentencepiece')}"
                    + (f" ({backend['reason']})" if backend.get("reason") else "")),
        ("generation", f"{manifest.get('generation', '?')}"
                       + (f" ({len(generations)} generations)" if len(generations) > 1 else "")),
    ]


def split_shares(manifest: dict) -> dict:
    """{split: {source: % of that split's tokens}}: shares are comparable across sources and splits."""
    out = {}
    for split in (s for s in SPLITS if s in manifest["splits"]):
        tokens = {src: num(per.get(split, {}).get("tokens", 0)) for src, per in manifest["sources"].items()}
        total = sum(tokens.values())
        out[split] = {src: (100.0 * t / total if total else 0.0) for src, t in tokens.items()}
    return out



def mixture_rows(manifest: dict) -> list:
    """Per source: its share of the unique train tokens, the Pile paper's share (Gao et al. 2020, Table 1;
    transforms/shard/mixture.py) and the realised share of the train split as written (after weights)."""
    mix = (manifest.get("mixture") or {}).get("sources") or {}
    train = {src: num(per.get("train", {}).get("tokens", 0)) for src, per in manifest["sources"].items()}
    unique = {src: num(mix[src].get("unique_tokens", train.get(src, 0))) if src in mix else train.get(src, 0)
              for src in set(train) | set(mix)}
    total_unique = sum(unique.values())
    total_written = sum(train.values())
    rows = []
    for src in sorted(unique):
        paper = mixture_weights.PILE_PAPER_SHARES.get(src)
        rows.append({"source": src, "unique_tokens": unique[src], "weight": mix.get(src, {}).get("weight", 1.0),
                     "corpus_share": 100.0 * unique[src] / total_unique if total_unique else 0.0,
                     "paper_share": 100.0 * paper if paper is not None else None,
                     "realised_share": 100.0 * train.get(src, 0) / total_written if total_written else 0.0})
    return rows


def dedup_rows(stats: dict) -> list:
    """Per source: documents tokenized (before dedup), exact duplicates dropped, and their share."""
    rows = []
    for src, st in sorted(stats.items()):
        seen, dup = num(st.get("tokenized_documents", 0)), num(st.get("duplicates", 0))
        rows.append([src, seen, dup, f"{100 * dup / seen:.2f}%" if seen else "n/a"])
    return rows



def read_metrics(path: str) -> list:
    """Trainer metrics JSON lines (trainer/metrics.py); lines without a step and a finite loss are skipped."""
    from transforms.io import io_utils  # noqa: PLC0415

    out = []
    for line in io_utils.read_bytes(path).decode("utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "step" in rec and isinstance(rec.get("loss"), (int, float)) \
                and math.isfinite(rec["loss"]):
            out.append(rec)
    return sorted(out, key=lambda r: r["step"])


def read_dead_letter_rows(dataset: str, manifest: dict, limit: int = MAX_DEAD_LETTER_ROWS) -> list:
    from transforms.io import io_utils  # noqa: PLC0415

    rows: list = []
    for rel in manifest.get("dead_letters", []):
        if rel.startswith("/") or ".." in rel.split("/"):  # containment: only files inside the dataset
            continue
        for line in io_utils.read_bytes(io_utils.join(dataset, rel)).decode("utf-8", "replace").splitlines():
            if len(rows) >= limit:
                return rows
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def read_wall_time(run_log: str) -> Optional[float]:
    """The wall time of the last run in a `--run-log` file (its `summary` event), or None."""
    from transforms.io import io_utils  # noqa: PLC0415

    wall = None
    for line in io_utils.read_bytes(run_log).decode("utf-8", "replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and rec.get("event") == "summary" and isinstance(rec.get("wall_s"), (int, float)):
            wall = float(rec["wall_s"])
    return wall


def contract_tokenizer(path, info) -> tuple:
    """(the tokenizer at `path`, "") when the file has the contract's sha256, else (None, a one-line note: token
    ids are shown instead). Decoding with another file would show text the data does not hold; the report and
    `pileprep inspect` (pipeline/tools/inspect_dataset.py) both decode only through this check."""
    from transforms.tokenize import tokenizer  # noqa: PLC0415

    try:
        # a directory stands for its tokenizer.json, and the contract holds the options the file does not carry
        # (a tiktoken file's pattern and special tokens, --eos-token): as inspect and verify load it
        model = tokenizer.read_model_bytes(path) if isinstance(path, str) and path else None
        if model is None:
            return None, "token ids: no tokenizer file recorded or given"
        got = hashlib.sha256(model).hexdigest()
        if got != info.model_sha256:
            return None, (f"token ids: the tokenizer file's sha256 {got[:12]}… is not the contract's "
                          f"{str(info.model_sha256)[:12]}… (changed since the run, or another tokenizer)")
        return tokenizer.load_for_info(model, info, path), ""
    except (OSError, ValueError, RuntimeError) as e:
        return None, f"token ids: the tokenizer file cannot be read ({type(e).__name__})"


def decoded_examples(manifest_file: str, manifest) -> dict:
    """{split: {shard, text | ids, note}}: the first document piece of each split's first non-empty shard, decoded
    with the run's tokenizer when the file at the manifest's `config.tokenizer` still has the contract's sha256
    (token ids otherwise). Reads one record per split."""
    from model_contract import decode_example  # noqa: PLC0415
    from pipeline.tools.inspect_dataset import _records  # noqa: PLC0415

    sp, note = contract_tokenizer(manifest.config.get("tokenizer"), manifest.contract.tokenizer)
    out = {}
    for split in SPLITS:
        shard = next((s for s in manifest.shards_for(split) if s.examples), None)
        if shard is None:
            continue
        record = next(iter(_records(manifest_file, shard)), None)
        if record is None:
            continue
        ex = decode_example(record)
        ids = ex["input_ids"][ex["segment_ids"] == 1].tolist()
        text = sp.decode(ids) if sp is not None else None
        if text is not None and len(text) > 1200:
            text = text[:1200] + "…"
        out[split] = {"shard": shard.path, "text": text, "ids": ids[:64], "note": note}
    return out

