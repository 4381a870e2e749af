"""docs/DESIGN.md "The shard job, read → commit" states how many methods the job runner's `Job` has (abstract,
with defaults) and how many the shard job and the retrieval jobs override, by name. It said 15 methods and "the
shard job overrides all 15" while pipeline/job.py had 17 and ShardJob overrode 15 of them (issue 29's review).
Counted here from the class bodies (ast, nothing imported): pipeline/job.py `Job`,
pipeline/shard/shard_pipeline.py `ShardJob`, pipeline/retrieval/store_job.py `StoreJob`.
"""
from __future__ import annotations

import ast
import re

from tests.conftest import REPO


def _methods(path: str, cls: str) -> list:
    """(name, abstract) of the methods defined in `cls`'s body, in order (nested functions are not methods)."""
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    return [(n.name, any(ast.unparse(d).endswith("abstractmethod") for d in n.decorator_list))
            for n in body if isinstance(n, ast.FunctionDef) and not n.name.startswith("__")]


def _names(names: list) -> str:
    quoted = [f"`{n}`" for n in names]
    return ", ".join(quoted[:-1]) + " and " + quoted[-1] if len(quoted) > 1 else "".join(quoted)


def design_fragments() -> list:
    """What docs/DESIGN.md must say about the hooks, from the code."""
    job = _methods("pipeline/job.py", "Job")
    names = [n for n, _ in job]
    abstract = [n for n, a in job if a]
    defaults = [n for n, a in job if not a]
    shard = {n for n, _ in _methods("pipeline/shard/shard_pipeline.py", "ShardJob")} & set(names)
    store = {n for n, _ in _methods("pipeline/retrieval/store_job.py", "StoreJob")} & set(names)
    return [f"`Job` (`pipeline/job.py`) has {len(names)} methods a job supplies",
            f"{len(abstract)} are abstract ({_names(abstract)})",
            f"{len(defaults)} have defaults ({_names(defaults)})",
            f"`ShardJob`) overrides {len(shard)} of them, all but {_names([n for n in names if n not in shard])}",
            f"`StoreJob`) override {len(store)}, keeping the defaults of {_names([n for n in names if n not in store])}"]


def test_the_code_has_the_hooks_the_fragments_count():
    assert len(_methods("pipeline/job.py", "Job")) > 10 and any(a for _, a in _methods("pipeline/job.py", "Job"))
    assert "`ShardJob`) overrides 0 " not in " ".join(design_fragments())


def test_design_md_states_the_job_hooks_as_the_code_has_them():
    text = re.sub(r"\s+", " ", (REPO / "docs" / "DESIGN.md").read_text(encoding="utf-8"))
    missing = [f for f in design_fragments() if f not in text]
    assert not missing, f"docs/DESIGN.md (the shard job, read → commit) must say, as the code has it: {missing}"
