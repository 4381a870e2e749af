"""`pileprep gc DIR [--yes]`: remove the generations of a dataset that nobody keeps.

Dry by default: it lists what it would remove, why, and how many bytes that frees; `--yes` removes it. It
removes only directories of the generated form (`gen-<16 hex>`) that were committed (they have their
`generations/<gen>.manifest.json`), that the live manifest does not reference, that are older than the
`--keep-generations` newest previous generations and that no ref names (the rules: pipeline/ops/generations.py
plan_prune). A ref whose holder (an absolute local path) is gone is stale: it is reported, and removed only
with `--yes`; a ref that cannot be read is named and protects every generation. It holds the dataset's lock
(pipeline/ops/lock.py), so no shard run commits meanwhile. Everything read from the dataset is printed through
safe_text.terminal (a holder path is data).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from pipeline.errors import ConfigError
from pipeline.ops import commit, generations, lock
from pipeline.ops.safe_text import terminal
from pipeline.shard import integrity


@dataclass
class GcResult:
    dataset: str
    removed: bool  # --yes: the listed generations and stale refs were removed
    plan: generations.PrunePlan
    sizes: dict[str, int] = field(default_factory=dict)  # generation -> bytes

    @property
    def freed(self) -> int:
        return sum(self.sizes.get(g, 0) for g, _why in self.plan.remove)

    def render(self) -> str:
        verb = "removed" if self.removed else "would remove"
        lines = [f"gc {terminal(self.dataset)}" + ("" if self.removed else " (dry run: nothing removed; pass --yes "
                                                                            "to remove)")]
        for gen, why in self.plan.remove:
            lines.append(f"{verb} {gen}: {self.sizes.get(gen, 0):,} bytes; {terminal(why)}")
        for gen, why in self.plan.keep:
            lines.append(f"keep {gen}: {terminal(why)}")
        for gen in self.plan.uncommitted:
            lines.append(f"left alone {gen}: never committed (no generations/{gen}.manifest.json); the next shard "
                         f"run on this output resumes from it or removes it")
        for entry in self.plan.stale_refs:
            lines.append(f"{verb if entry in self._dropped else 'stale (kept)'} ref .refs/{terminal(entry.file)}: "
                         f"its holder {terminal(entry.ref.holder)} no longer exists")
        for entry in self.plan.damaged_refs:
            lines.append(f"damaged ref .refs/{terminal(entry.file)} ({terminal(entry.problem)}): kept, and it "
                         f"protects every generation; remove it by hand once you know what it was")
        lines.append(f"{'freed' if self.removed else 'would free'} {self.freed:,} bytes in "
                     f"{len(self.plan.remove)} generation(s)")
        return "\n".join(lines)

    @property
    def _dropped(self) -> list:
        return [e for e in self.plan.stale_refs if e.holder_gone]


def gc(dataset: str, keep_generations: int = 1, yes: bool = False, s3_options: Optional[dict] = None,
       break_lock: bool = False) -> GcResult:
    if keep_generations < 0:
        raise ConfigError(f"--keep-generations must be 0 or more, got {keep_generations}")
    kind = commit.committed_kind(dataset)
    if kind != commit.KIND_DATASET:
        found = "no manifest.json" if kind is None else f"it holds a {kind}"
        raise ConfigError(f"gc {dataset}: not a dataset ({found}); gc removes generations of a shard dataset only")
    with lock.OutputLock(dataset, s3_options).held(break_lock):
        manifest = commit.read_committed(dataset)  # validated: its generation names decide what stays
        state = generations.read_state(dataset, integrity.referenced_generations(manifest))
        plan = generations.plan_prune(state, keep_generations, drop_stale_refs=True)
        sizes = {gen: generations.generation_bytes(dataset, gen) for gen, _why in plan.remove}
        if yes:
            for gen, _why in plan.remove:
                generations.remove_generation(dataset, gen)
            for entry in plan.stale_refs:
                generations.remove_ref(dataset, entry)
    return GcResult(dataset, yes, plan, sizes)
