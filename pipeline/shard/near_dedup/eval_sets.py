"""--decontaminate's evaluation files: matched, read and hashed into one EvalSet per worker
(transforms/shard/decontaminate.py). Preflight (pipeline/shard/preflight.py) reads them with the same reader
before any work, so both accept the same files."""
from __future__ import annotations

from pipeline.errors import ConfigError, RunError
from pipeline.ops.input_checks import match_input
from transforms.io import io_utils, read_parquet
from transforms.io.read_records import RawRecord, compression_of, iter_raw_records
from transforms.shard import decontaminate


def eval_files(config) -> list:
    """The evaluation files --decontaminate names, sorted; a glob matching nothing is a configuration error."""
    files = set()
    for pattern in config.decontaminate_config.globs:
        matched = [m.path for m in match_input(pattern)]
        if not matched:
            raise ConfigError(f"--decontaminate: {pattern} matches no file")
        files.update(matched)
    return sorted(files)


def eval_texts(path: str, field: str):
    """The texts of one evaluation file; a damaged record fails the run, naming its line."""
    with io_utils.open_read(path) as f:
        items = (read_parquet.iter_parquet_records(f, field, (), 1 << 30) if read_parquet.is_parquet(path)
                 else iter_raw_records(f, compression_of(path), 1 << 30))
        for item in items:
            if not isinstance(item, RawRecord):
                raise RunError(f"--decontaminate: {path} line {item.line}: {item.reason}")
            yield from decontaminate.iter_eval_texts(path, item.data, field)


def load_eval_set(config, files: list) -> decontaminate.EvalSet:
    decon = config.decontaminate_config
    return decontaminate.build_eval_set([(p, list(eval_texts(p, decon.field))) for p in files], decon.ngram)


def name(path: str) -> str:
    """An evaluation file as the manifest records it: its base name (absolute paths say where it ran)."""
    return path.rstrip("/").rsplit("/", 1)[-1]
