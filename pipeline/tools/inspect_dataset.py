"""`pileprep inspect`: a human summary of a manifest, and a few examples decoded back to text."""
from __future__ import annotations

import os
import re

from model_contract import decode_example, resolve_shard_path
from model_contract.checked_reader import iter_checked_records
from model_contract.dataset_paths import MANIFEST_NAME
from pipeline.ops.safe_text import terminal
from transforms.shard.documents import SPLITS


def summary_table(manifest: dict) -> str:
    """Every value from the manifest goes through `terminal` (pipeline/ops/safe_text.py) before it is placed in
    the table: a source or generation name is the data's and must not drive the terminal or add a line."""
    c = manifest["contract"]
    t = terminal
    rec = manifest["records"]
    lines = [
        f"pileprep {t(manifest.get('pileprep_version', '?'))}  generation {t(manifest.get('generation', '?'))}  "
        f"contract {t(c['version'])}  seq_len {t(c['seq_len'])}  vocab {t(c['tokenizer']['vocab_size'])}  "
        f"tokenizer sha256 {t(str(c['tokenizer']['model_sha256'])[:12])}",
        f"{'split':<6} {'shards':>6} {'examples':>10} {'documents':>10} {'tokens':>14} {'padding':>9}",
    ]
    splits = [name for name in SPLITS if name in manifest["splits"]]
    for split in splits:
        s = manifest["splits"][split]
        pad = s["padding_tokens"] / max(1, s["examples"] * c["seq_len"])
        lines.append(f"{split:<6} {s['shards']:>6} {s['examples']:>10} {s['documents']:>10} {s['tokens']:>14} "
                     f"{pad:>8.3%}")
    lines.append(f"{'source':<24} " + " ".join(f"{s + ' docs':>12} {s + ' tokens':>14}" for s in splits))
    for source, per in manifest["sources"].items():
        cells = " ".join(f"{per.get(s, {}).get('documents', 0):>12} {per.get(s, {}).get('tokens', 0):>14}"
                         for s in splits)
        lines.append(f"{t(source)[:24]:<24} {t(cells)}")
    lines.append(t(f"records: read {rec['read']} = written {rec['written']} + filtered "
                   f"{sum(rec['filtered'].values())} {rec['filtered'] or ''} + dead-lettered "
                   f"{sum(rec['dead_lettered'].values())} {rec['dead_lettered'] or ''}"))
    lines.append(f"padding fraction {manifest['padding_fraction']:.4%}; dead-letter files: "
                 f"{len(manifest['dead_letters'])}")
    if manifest.get("duplicates_by_source"):
        lines.append(t(f"exact duplicates removed, by source of the removed copy: {manifest['duplicates_by_source']}"))
    return "\n".join(lines)


def _load(dataset: str):
    """(manifest, manifest file) from a local directory or manifest.json, or any Beam filesystem (s3://)."""
    from pipeline.ops import commit, guards  # noqa: PLC0415

    if "://" not in dataset:
        manifest_file = dataset if dataset.endswith(".json") else os.path.join(dataset, MANIFEST_NAME)
        guards.check_no_links_inside(os.path.dirname(manifest_file) or ".", "inspect")  # before any read
        if not os.path.exists(manifest_file):
            raise FileNotFoundError(f"no manifest at {manifest_file}: the dataset is missing or was never committed")
        with open(manifest_file, encoding="utf-8") as f:
            return commit.require_dataset(commit.parse_manifest(f.read(), dataset), dataset), manifest_file

    directory = dataset.rsplit("/", 1)[0] if dataset.endswith(".json") else dataset
    manifest = commit.read_committed(directory)
    if manifest is None:
        raise FileNotFoundError(f"no manifest at {commit.manifest_location(directory)}: the dataset is missing or "
                                f"was never committed")
    return commit.require_dataset(manifest, dataset), commit.manifest_location(directory)


def _records(manifest_file: str, shard):
    from transforms.io import io_utils  # noqa: PLC0415

    with io_utils.open_read(resolve_shard_path(manifest_file, shard)) as f:
        yield from iter_checked_records(f, shard)  # size up front, refused by the shard's name


def inspect_json(dataset: str, examples: int = 2) -> dict:
    """For scripts: the manifest as committed plus the first `examples` examples of the first shard, decoded."""
    manifest, manifest_file = _load(dataset)
    out = {"manifest": manifest.to_dict(), "manifest_path": manifest_file, "examples": []}
    if examples > 0 and manifest.shards:
        shard = manifest.shards[0]
        for i, record in enumerate(_records(manifest_file, shard)):
            if i >= examples:
                break
            ex = decode_example(record)
            out["examples"].append({"shard": shard.path, "index": i,
                                    **{k: v.tolist() for k, v in sorted(ex.items())}})
    return out


def decoding_tokenizer(given: str | None, manifest):
    """(the tokenizer that decodes the examples, "") or (None, a one-line note: ids are shown instead).

    A note only where decoding is rightly impossible: no tokenizer recorded, the recorded file absent (a dataset
    inspected away from the machine that built it), or a file whose sha256 is not the contract's (never loaded:
    its text would not be the data's). A file that is there but is no usable tokenizer (a device, a FIFO, over
    the size bound, refused by the validator: dropout, truncation...) is a TokenizerError: exit 2 with the
    validator's own reason, as `verify --inputs` gives it (hostile review of issue 28, F7: inspect printed
    "cannot be read (TokenizerError)" and exited 0). The report keeps degrading instead (pipeline/tools/report.py
    contract_tokenizer): it must render whatever the dataset's state. Another tokenizer stays a note here, while
    `verify --inputs` refuses it (exit 2, rv2 F7): inspect is a viewer, and the raw ids it shows are still the
    data's; only an audit needs the tokenizer the ids came from."""
    import hashlib  # noqa: PLC0415

    from transforms.io import io_utils  # noqa: PLC0415
    from transforms.tokenize import tokenizer  # noqa: PLC0415

    path = given or manifest.config.get("tokenizer")
    if not (isinstance(path, str) and path):
        return None, "token ids: no tokenizer file recorded or given"
    if not given:  # a link or a special file is present: judged below, not called absent
        present = os.path.lexists(path) if "://" not in path else io_utils.exists(tokenizer.resolve_path(path))
        if not present:
            return None, f"token ids: no tokenizer file at {path} (the manifest's config.tokenizer); pass --tokenizer"
    info = manifest.contract.tokenizer
    try:
        model = tokenizer.read_model_bytes(path)  # regular file, size bound (the one tokenizer opener)
        got = hashlib.sha256(model).hexdigest()
        if got != info.model_sha256:
            return None, (f"token ids: the tokenizer file's sha256 {got[:12]}… is not the contract's "
                          f"{str(info.model_sha256)[:12]}… (changed since the run, or another tokenizer); the raw ids below "
                          f"are still the data's (verify --inputs needs the right file: pass --tokenizer)")
        return tokenizer.load_for_info(model, info, path), ""
    except tokenizer.TokenizerError as e:
        if given:
            raise
        reason = re.sub(r"^--tokenizer(?: \S+)?: ", "", str(e))  # the file came from the manifest, not an option
        raise tokenizer.TokenizerError(f"the manifest's config.tokenizer {path} is not a usable tokenizer: "
                                       f"{reason}") from None


def inspect(dataset: str, examples: int = 2, tokenizer_path: str | None = None) -> str:
    manifest, manifest_file = _load(dataset)
    out = [summary_table(manifest.to_dict())]
    if examples <= 0 or not manifest.shards:
        return "\n".join(out)
    sp, note = decoding_tokenizer(tokenizer_path, manifest)
    if note:
        out.append(terminal(note))
    shard = manifest.shards[0]
    for i, record in enumerate(_records(manifest_file, shard)):
        if i >= examples:
            break
        ex = decode_example(record)
        seg = ex["segment_ids"]
        out.append(f"--- {terminal(shard.path)} example {i}: {int((seg > 0).sum())} tokens in {int(seg.max())} "
                   f"pieces, docs {[hex(d) for d in ex['piece_doc_ids'][:4]]}")
        first = ex["input_ids"][seg == 1].tolist()
        text = terminal(sp.decode(first) if sp else str(first[:64]))  # the excerpt is the document's text
        out.append(text[:400] + ("…" if len(text) > 400 else ""))
    return "\n".join(out)
