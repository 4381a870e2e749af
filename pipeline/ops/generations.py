"""Which committed generations a dataset keeps, and removing the others (at a commit and by `pileprep gc`).

A dataset keeps, besides what its live manifest references, the `--keep-generations` newest previous
generations and every generation a ref names (model_contract/refs.py). Commit order is what the per-generation
manifests (`generations/<gen>.manifest.json`) record: their `commit_seq` (model_contract/manifest.py), set by
each commit to one more than any kept, never the files' mtimes (a `cp -r`, an `aws s3 sync` or a `touch`
rewrites those, and the order they gave removed the generation that was live just before the current one). A
copy without `commit_seq` (committed by an older pileprep, or damaged) is older than every copy with one, but
its order among the others like it is unknown: while fewer than `--keep-generations` previous generations
carry a sequence number, every such copy is kept (`plan_prune`), so an upgrade never removes the generation
that was live before it. A generation without a copy was never committed (an interrupted run's directory) and
is left to the shard run's own cleanup (pipeline/ops/guards.py: cleanup_abandoned).

`plan_prune` decides (a pure function over what `read_state` listed); `apply` deletes. A ref that cannot be
read is named and, since the generation it protects is unknown, protects every generation.

Since the order decides what is deleted, a `commit_seq` that cannot be a real commit's is refused (HistoryError,
exit 2, one line naming the file), never ordered (docs/wip/hostile-review-issue28.md F5): one of the wrong form
(-5, "9", 3.5, null, true, 1e400, >= 2^53: model_contract/manifest_check.py check_commit_seq), one that two copies
share, and a previous generation's that is not below the live manifest's (`check_order`: by `gc`, and at a
commit before anything is published or removed). A swap of two copies' valid values passes those checks, so each
commit also records the generation that was live before it (`previous_generation`, model_contract/manifest.py)
and `check_chain` refuses a copy whose predecessor is itself or a present copy with an equal or higher
commit_seq (rv2 review F6). A predecessor already removed, or a copy from before the field, is accepted.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Optional

from apache_beam.io.filesystems import FileSystems

from model_contract import MANIFEST_NAME, Manifest
from model_contract import refs as refs_mod
from model_contract.contract import ContractError
from model_contract.manifest_check import check_commit_seq
from model_contract.schema import is_generation_name
from pipeline.errors import ConfigError
from pipeline.shard import integrity
from transforms.io import io_utils


@dataclass(frozen=True)
class CommittedGeneration:
    """One `generations/<gen>.manifest.json`: its commit sequence number and what that manifest references."""
    name: str
    seq: Optional[int]  # the manifest's commit_seq; None: not recorded (an older pileprep's commit, or damaged)
    references: frozenset[str]  # the generations its manifest references (itself, and incremental parents)
    damaged: str = ""  # why the manifest copy could not be read ("" when it was)
    previous: Optional[str] = None  # its previous_generation (None: the first commit, or not recorded)


class HistoryError(ConfigError):
    """A generation manifest whose commit_seq cannot be trusted to order the generations; the message names it."""


_REMEDY = ("the generations' order decides what gc and each commit remove, so nothing was removed: restore the "
           "file from a backup, or remove that generation by hand")


@dataclass(frozen=True)
class RefEntry:
    file: str  # the name in .refs/
    ref: Optional[refs_mod.Ref]
    problem: str = ""  # why it is not a valid ref ("" when it is)
    holder_gone: Optional[bool] = None  # True: an absolute local holder path that no longer exists


@dataclass
class DatasetState:
    live: frozenset[str]  # what the live manifest references
    history: list[CommittedGeneration]  # newest first
    present: frozenset[str]  # generation directories on disk
    refs: list[RefEntry]


@dataclass
class PrunePlan:
    remove: list[tuple[str, str]] = field(default_factory=list)  # (generation, reason)
    keep: list[tuple[str, str]] = field(default_factory=list)  # (generation, reason)
    uncommitted: list[str] = field(default_factory=list)  # generation directories with no manifest of their own
    stale_refs: list[RefEntry] = field(default_factory=list)  # whose holder is gone (removed by gc --yes)
    damaged_refs: list[RefEntry] = field(default_factory=list)  # those that could not be read (kept)


def plan_prune(state: DatasetState, keep_generations: int, drop_stale_refs: bool) -> PrunePlan:
    """What to remove and why. `drop_stale_refs`: a ref whose holder is gone protects nothing (gc, which also
    removes it); at a commit every readable ref protects its generation."""
    plan = PrunePlan()
    by_name = {g.name: g for g in state.history}
    reasons: dict = {}

    def protect(gen: str, why: str) -> None:
        reasons.setdefault(gen, why)
        g = by_name.get(gen)
        if g is None:
            return
        if g.damaged:  # its parents are unknown: keep every committed generation rather than guess
            for other in by_name:
                reasons.setdefault(other, f"{gen}'s manifest copy is damaged ({g.damaged}): parents unknown")
        for parent in sorted(g.references - {gen}):
            reasons.setdefault(parent, f"{gen} (kept) builds on it")

    for gen in sorted(state.live):
        protect(gen, "the live manifest references it")
    previous = [g for g in state.history if g.name not in state.live]
    ordered = [g for g in previous if g.seq is not None]  # newest first (read_history)
    for g in ordered[:keep_generations]:
        protect(g.name, f"one of the {keep_generations} newest previous generation(s) (--keep-generations)")
    if len(ordered) < keep_generations:  # the newest previous ones may be among those of unknown order
        for g in previous:
            if g.seq is None:
                protect(g.name, "its manifest records no commit order (committed by an older pileprep"
                                + (", or damaged" if g.damaged else "") + f"): kept until {keep_generations} "
                                f"newer previous generation(s) exist (--keep-generations)")
    for entry in state.refs:
        if entry.ref is None:
            plan.damaged_refs.append(entry)
            for g in state.history:
                protect(g.name, f"{refs_mod.REFS_DIR}/{entry.file} cannot be read ({entry.problem}): kept")
        elif entry.holder_gone and drop_stale_refs:
            plan.stale_refs.append(entry)
        else:
            if entry.holder_gone:
                plan.stale_refs.append(entry)
            protect(entry.ref.generation, f"{refs_mod.REFS_DIR}/{entry.file} ({entry.ref.kind} "
                                          f"{entry.ref.holder}) names it")
    for g in state.history:
        if g.name in reasons:
            plan.keep.append((g.name, reasons[g.name]))
        else:
            plan.remove.append((g.name, f"not in the live manifest, older than the {keep_generations} newest "
                                        f"previous generation(s), no ref names it"))
    plan.uncommitted = sorted(state.present - set(by_name) - set(state.live))
    return plan


# ------------------------------------------------------------------------------------------ reading
def _match(pattern: str) -> list:
    try:
        return FileSystems.match([pattern])[0].metadata_list
    except Exception:  # noqa: BLE001 - nothing matches (Beam raises on an empty match for some filesystems)
        return []


def _base(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def read_history(output: str) -> list:
    """[CommittedGeneration], newest first by commit_seq, then those without one by name (the order never depends
    on listing order or on file times). HistoryError for a commit_seq of the wrong form or one two copies share."""
    out, paths = [], {}
    for m in _match(io_utils.join(output, refs_mod.GENERATIONS_DIR, "*.manifest.json")):
        name = refs_mod.generation_of_copy(_base(m.path))
        if name is None:
            continue
        paths[name] = m.path
        try:
            text = io_utils.read_bytes(m.path).decode("utf-8")
        except (UnicodeDecodeError, OSError) as e:
            out.append(CommittedGeneration(name, None, frozenset({name}), str(e)[:200]))
            continue
        _check_seq_field(text, m.path)
        try:
            manifest = Manifest.from_json(text)
            if manifest.generation != name:
                raise ContractError(f"it names generation {manifest.generation}")
            out.append(CommittedGeneration(name, manifest.commit_seq,
                                           frozenset(integrity.referenced_generations(manifest) | {name}),
                                           previous=manifest.previous_generation))
        except ContractError as e:
            out.append(CommittedGeneration(name, None, frozenset({name}), str(e)[:200]))
    by_seq: dict = {}
    for g in out:
        if g.seq is not None:
            by_seq.setdefault(g.seq, []).append(g.name)
    for seq, names in sorted(by_seq.items()):
        if len(names) > 1:
            a, b = sorted(names)[:2]
            raise HistoryError(f"{paths[b]}: commit_seq {seq} is also {paths[a]}'s; two commits never share one: "
                               f"{_REMEDY}")
    # newest first by commit_seq; those without one after every other (older by construction), by name
    return sorted(out, key=lambda g: (g.seq is None, -(g.seq or 0), g.name))


def _check_seq_field(text: str, path: str) -> None:
    """HistoryError when the copy records a commit_seq that is not one (a copy damaged otherwise, or without one,
    is ordered as before: see the module doc)."""
    try:
        d = json.loads(text)
    except (ValueError, RecursionError):
        return
    if isinstance(d, dict) and "commit_seq" in d:
        try:
            check_commit_seq(d["commit_seq"], f"{path} commit_seq")
        except ContractError as e:
            raise HistoryError(f"{e}; {_REMEDY}") from None


def live_commit(output: str) -> tuple:
    """(generation, commit_seq) of the live manifest, each None when absent or not of its form (the commit and
    `read_committed` refuse a damaged live manifest themselves)."""
    try:
        live = json.loads(io_utils.read_bytes(io_utils.join(output, MANIFEST_NAME)).decode("utf-8"))
    except (OSError, ValueError):  # none yet
        live = {}
    live = live if isinstance(live, dict) else {}
    try:
        seq = check_commit_seq(live.get("commit_seq"))
    except ContractError:
        seq = None
    gen = live.get("generation")
    return (gen if isinstance(gen, str) else None), seq


def check_order(output: str, history: list, committing: Optional[str] = None) -> None:
    """HistoryError when a previous generation's commit_seq is not below the live manifest's: a forged one would
    rank as the newest previous generation and the real one would be removed. `committing`: the generation this
    commit publishes, whose copy a commit killed before its publish may have left (it is rewritten)."""
    live_gen, live_seq = live_commit(output)
    if live_seq is None:
        return
    for g in history:
        if g.name not in (live_gen, committing) and g.seq is not None and g.seq >= live_seq:
            raise HistoryError(f"{copy_path(output, g.name)}: commit_seq {g.seq} is not below the live manifest's "
                               f"{live_seq} ({live_gen}): forged, or left by a commit killed before it published "
                               f"(then {g.name} was never live: remove that file); {_REMEDY}")


def check_chain(output: str, history: list) -> None:
    """HistoryError naming both copies when one's previous_generation contradicts the commit_seq order: it names
    itself, or a copy still present whose commit_seq is not below its own (two copies' values swapped). A
    predecessor no longer present (pruned) or of unknown order (a copy without commit_seq: older by construction)
    is accepted, and so is a lower one that is not the next lower: a commit killed before it published leaves a
    copy between the live one and the next commit's predecessor."""
    by_name = {g.name: g for g in history}
    for g in history:
        p = by_name.get(g.previous) if g.previous else None
        if g.seq is None or p is None or p.seq is None or (p.seq < g.seq and p.name != g.name):
            continue
        raise HistoryError(f"{copy_path(output, g.name)}: commit_seq {g.seq} with previous_generation {p.name}, "
                           f"but {copy_path(output, p.name)} has commit_seq {p.seq}: a generation is committed after "
                           f"the one it follows, so one of the two was changed; {_REMEDY}")


def previous_of_commit(output: str, new_gen: str) -> tuple:
    """(recorded, previous_generation) for a commit of `new_gen` into `output`: the live generation (None for the
    first commit); for the same commit again (a retried bundle) the live manifest's own value, unrecorded when it
    has none, so the retry publishes equal bytes."""
    live_gen, _seq = live_commit(output)
    if live_gen != new_gen:
        return True, live_gen
    try:
        live = json.loads(io_utils.read_bytes(io_utils.join(output, MANIFEST_NAME)).decode("utf-8"))
    except (OSError, ValueError):
        live = {}
    if not isinstance(live, dict) or "previous_generation" not in live:
        return False, None
    return True, live["previous_generation"]


def next_commit_seq(output: str, new_gen: str) -> int:
    """The commit_seq of a commit of `new_gen` into `output`: one more than any the live manifest and the kept
    copies record (1 for the first commit, and for the first over manifests that record none); the live one's own
    when it already is `new_gen` (the same commit again, e.g. a retried bundle: it publishes equal bytes).
    HistoryError (before anything is published) when the copies' order cannot be trusted or the next number would
    reach the cap."""
    live_gen, live_seq = live_commit(output)
    if live_seq is not None and live_gen == new_gen:
        return live_seq
    history = read_history(output)
    check_order(output, history, committing=new_gen)
    check_chain(output, history)
    seqs = [g.seq for g in history if g.seq is not None] + ([live_seq] if live_seq else [])
    try:
        return check_commit_seq(max(seqs, default=0) + 1, f"{output}: the next commit_seq")
    except ContractError as e:
        raise HistoryError(str(e)) from None


def read_refs(output: str) -> list:
    """Every entry of `.refs/` (in-flight temp files, `.<name>.<hex>.tmp`, aside), each validated."""
    out = []
    for m in _match(io_utils.join(output, refs_mod.REFS_DIR, "*")):
        name = _base(m.path)
        if name.startswith(".") and name.endswith(".tmp"):
            continue
        try:
            ref = refs_mod.parse_ref(name, io_utils.read_bytes(m.path)[: refs_mod.MAX_REF_BYTES + 1])
        except (ContractError, OSError) as e:
            out.append(RefEntry(name, None, str(e)[:200]))
            continue
        out.append(RefEntry(name, ref, "", refs_mod.holder_gone(ref.holder)))
    return sorted(out, key=lambda r: r.file)


def present_generations(output: str) -> frozenset:
    if io_utils.is_local(output):
        names = os.listdir(output) if os.path.isdir(output) else []
        return frozenset(n for n in names if is_generation_name(n) and os.path.isdir(os.path.join(output, n)))
    prefix = output.rstrip("/") + "/"
    heads = {m.path[len(prefix):].split("/", 1)[0] for m in _match(io_utils.join(output, "gen-*/*"))
             if m.path.startswith(prefix)}
    return frozenset(h for h in heads if is_generation_name(h))


def read_state(output: str, live: set) -> DatasetState:
    """What pruning and gc decide over; HistoryError when the generations' order cannot be trusted."""
    history = read_history(output)
    check_order(output, history)
    check_chain(output, history)
    return DatasetState(frozenset(live), history, present_generations(output), read_refs(output))


def retained(output: str) -> set:
    """Every generation that was committed and is still kept (a manifest copy exists): never garbage for a
    run's start-up cleanup, which removes only directories no commit produced."""
    return {g.name for g in read_history(output)}


def generation_bytes(output: str, gen: str) -> int:
    root = io_utils.join(output, gen)
    if io_utils.is_local(output):
        if os.path.islink(root):  # removing it removes the link only (io_utils.delete_tree): it frees nothing
            return 0
        total = 0
        for directory, _dirs, files in os.walk(root):
            for f in files:
                try:
                    total += os.lstat(os.path.join(directory, f)).st_size
                except OSError:
                    pass
        return total
    return sum(m.size_in_bytes for m in _match(root.rstrip("/") + "/**"))


# ------------------------------------------------------------------------------------------ writing
def copy_path(output: str, gen: str) -> str:
    return io_utils.join(output, refs_mod.generation_manifest_name(gen))


def write_generation_manifest(output: str, gen: str, manifest_json: str) -> str:
    """The generation's own manifest beside the live one, written before the live manifest names it."""
    path = copy_path(output, gen)
    io_utils.publish_bytes(path, manifest_json.encode("utf-8"))
    return path


def remove_generation(output: str, gen: str) -> None:
    """The directory first, its manifest copy last: a crash in between leaves the copy, so the generation is
    still listed and the next commit or gc finishes the job."""
    io_utils.delete_tree(io_utils.join(output, refs_mod.check_generation_name(gen)))
    _remove_file(copy_path(output, gen))


def _remove_file(path: str) -> None:
    """One file (a link: the link itself); missing is fine, any other failure raises."""
    if io_utils.is_local(path):
        io_utils.remove_local(path)
    elif io_utils.exists(path):
        FileSystems.delete([path])


def remove_ref(output: str, entry: RefEntry) -> None:
    if not refs_mod.is_ref_name(entry.file):  # only names of the ref form are ever deleted
        raise ValueError(f"{entry.file}: not a ref file name")
    _remove_file(io_utils.join(output, refs_mod.REFS_DIR, entry.file))


def write_ref(output: str, ref: refs_mod.Ref) -> str:
    """A holder's ref (call under the dataset's lock, pipeline/ops/lock.py): temp+rename locally, one PUT on S3."""
    path = io_utils.join(output, refs_mod.REFS_DIR, ref.file_name())
    io_utils.publish_bytes(path, ref.to_json().encode("utf-8"))
    return path
