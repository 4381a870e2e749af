"""docs/DESIGN.md's counts checked against the code they count (review29: the doc said `Job` has 15 methods, 7
abstract and 8 with defaults, all 15 overridden by the shard job; the code has 17, 7 + 10, and the shard job
overrides 15 of them). docs/DESIGN.md is another helper's file: this test fails until the sentence is fixed."""
from __future__ import annotations

import re

from tests.conftest import REPO

WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
         "ten": 10}


def job_counts() -> dict:
    """What the code has: Job's methods, its abstract ones, and how many each job overrides."""
    from pipeline import job
    from pipeline.retrieval.store_job import StoreJob
    from pipeline.shard.shard_pipeline import ShardJob

    methods = {n for n, v in vars(job.Job).items() if callable(v) and not n.startswith("__")}
    abstract = set(job.Job.__abstractmethods__)
    return {"methods": len(methods), "abstract": len(abstract), "defaults": len(methods - abstract),
            "shard": len(methods & set(vars(ShardJob))), "retrieval": len(methods & set(vars(StoreJob)))}


def design_counts(design: str) -> dict:
    """The same counts as docs/DESIGN.md states them ("`Job` has 15 methods ... 7 are abstract ..., 8 have
    defaults ... The shard job overrides all 15, the retrieval jobs (...) 10")."""
    text = " ".join(design.split())
    number = r"(\d+|" + "|".join(WORDS) + ")"

    def find(pattern: str) -> int:
        match = re.search(pattern, text)
        assert match, f"docs/DESIGN.md no longer says {pattern!r}: update this test with the sentence"
        value = match.group(1)
        return int(value) if value.isdigit() else WORDS[value]

    shard = re.search(r"The shard job overrides (all )?" + number, text)
    methods = find(r"`Job` has " + number + " methods")
    return {"methods": methods, "abstract": find(number + r" are abstract"),
            "defaults": find(number + r" have defaults"),
            "shard": methods if shard and shard.group(1) else find(r"The shard job overrides " + number),
            "retrieval": find(r"the retrieval jobs \([^)]*\) " + number)}


def test_design_counts_the_job_hooks_the_code_has():
    design = (REPO / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    assert design_counts(design) == job_counts()


def test_a_count_that_drifts_is_caught():
    said = design_counts("`Job` has 15 methods a job supplies: 7 are abstract (x), 8 have defaults (y). The shard "
                         "job overrides all 15, the retrieval jobs (`z.py`) 10; each")
    assert said == {"methods": 15, "abstract": 7, "defaults": 8, "shard": 15, "retrieval": 10}
    assert said != job_counts()


def functions_taking(parameter: str) -> set:
    """`module.function` of every function in transforms/ with a parameter of that name."""
    import ast

    found = set()
    for path in sorted((REPO / "transforms").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [a.arg for a in node.args.args + node.args.kwonlyargs]
                if parameter in names:
                    found.add(f"{path.stem}.{node.name}")
    return found


def test_design_names_every_stage_function_cancellation_reaches():
    """review29: DESIGN.md said cancellation reaches the stage functions "only as a callback the cutter calls
    before each chunk"; tokenize_unit.py's functions take the same callback and call it between batches
    (pipeline/shard/stage_dofn.py hands them cancel.check)."""
    design = " ".join((REPO / "docs" / "DESIGN.md").read_text(encoding="utf-8").split())
    takers = {name.split(".")[0] for name in functions_taking("check_cancelled")}
    assert "tokenize_unit" in takers and "cut" in takers, takers
    if "only as a callback the cutter calls" in design:
        assert takers == {"cut"}, f"DESIGN.md says only the cutter checks cancellation; these take it: {takers}"
