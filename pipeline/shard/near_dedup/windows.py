"""A key range of the files shuffle, read a window of keys at a time: every unit's staged band rows in the
window (band_files.py) and, incrementally, the committed generations' band index rows in it (committed.py)."""
from __future__ import annotations

import numpy as np

from pipeline.errors import RunError
from pipeline.shard.near_dedup import band_files
from pipeline.shard.near_dedup.committed import committed_bound, committed_checked, unusable
from pipeline.shard.near_dedup.elements import CommittedBandFile
from pipeline.shard.near_dedup.manifest import BAND_INDEXES
from transforms.io import io_utils
from transforms.shard.near_dedup import band_index, paths


class RangeWindows:
    """Key range r of a files-shuffle task, cut into windows of at most ~WINDOW_ROWS band rows (band_files.py):
    `windows()` yields, in key order, [(unit name, its staged band rows in the window)] (name order) and
    [(band key, committed Node)] of the committed generations' band index files of range r in the window. Held
    at once: one window's rows, and per unit its window boundaries (units x windows offsets)."""

    def __init__(self, plan, r: int, unit_names, committed: tuple = (), num_perm: int = 0):
        self.plan, self.r, self.names = plan, r, sorted(unit_names)
        self.num_perm = num_perm
        self.committed = []
        try:
            for entry in committed:
                if entry.range == r:
                    self.committed.append((entry, committed_checked(entry, num_perm)))
        except (OSError, ValueError) as e:
            raise unusable(e) from None
        counts = np.zeros(band_files.WINDOW_GRAIN, dtype=np.int64)
        for name in self.names:
            counts += np.diff(band_files.unit_offsets(plan, name, r))
        for _entry, n in self.committed:  # not read yet: counted as spread evenly (uniform keys)
            counts += -(-n // band_files.WINDOW_GRAIN)
        self.cuts = band_files.window_cuts(counts, band_files.WINDOW_ROWS)
        self.offsets = [band_files.unit_offsets(plan, name, r)[self.cuts].astype(np.uint32) for name in self.names]
        bounds = band_files.fine_bounds()[r * band_files.WINDOW_GRAIN:(r + 1) * band_files.WINDOW_GRAIN + 1]
        self.keys = [int(k) for k in bounds[self.cuts]]  # window w: keys [keys[w], keys[w + 1])

    def __len__(self) -> int:
        return len(self.cuts) - 1

    def windows(self):
        committed_at = self._committed_bounds()
        for w in range(len(self)):
            lo, hi = self.keys[w], self.keys[w + 1]
            parts = []
            for name, off in zip(self.names, self.offsets):
                a = band_files.read_rows(paths.band_rows(self.plan.staging_dir, name, self.r), int(off[w]),
                                         int(off[w + 1]), band_files.BAND_ROW)
                if a.size and (int(a["key"][0]) < lo or int(a["key"][-1]) >= hi):
                    raise IOError(f"{name}: band rows of range {self.r} out of their window (staging damaged)")
                parts.append((name, a))
            yield parts, self._committed_rows(w, committed_at)

    def _committed_bounds(self) -> list:
        out = []
        row_size = band_index.row_dtype(self.num_perm).itemsize
        for entry, n in self.committed:
            try:
                with io_utils.open_read(entry.path) as f:
                    at = [committed_bound(f, n, row_size, k) for k in self.keys]
            except (OSError, ValueError) as e:
                raise unusable(f"{BAND_INDEXES} {entry.rel}: {e}") from None
            if at[0] != 0 or at[-1] != n:
                raise RunError(f"--incremental --near-dedup: {BAND_INDEXES} {entry.rel} holds keys outside its "
                               f"range {entry.range}")
            out.append(at)
        return out

    def _committed_rows(self, w: int, committed_at: list) -> list:
        out = []
        dtype = band_index.row_dtype(self.num_perm)
        for (entry, _n), at in zip(self.committed, committed_at):
            what = f"{BAND_INDEXES} {entry.rel}"
            try:
                data = band_files.read_rows(entry.path, at[w], at[w + 1], dtype).tobytes()
                rows = band_index.decode(data, self.num_perm, what)
                if rows.size and (int(rows["key"][0]) < self.keys[w] or int(rows["key"][-1]) >= self.keys[w + 1]):
                    raise ValueError(f"{what}: rows are not sorted by band key")
            except (OSError, ValueError) as e:
                raise unusable(e) from None
            out += band_index.committed_nodes(rows, entry.generation)
        return out


def committed_range_rows(entry: CommittedBandFile, num_perm: int):
    """(band key, committed Node) of one committed band index file (the runner shuffle's elements): checked
    first, streamed whole against its manifest row (size, sha256) and for keys outside its range (a RunError
    on the call), then read a window at a time (RangeWindows), so no process holds the whole file."""
    ranges = RangeWindows(None, entry.range, (), (entry,), num_perm)
    at = ranges._committed_bounds()
    return (row for w in range(len(ranges)) for row in ranges._committed_rows(w, at))
