"""docs/DESIGN.md's claims checked against the code they describe (review29). The job hooks' counts are checked by
tests/unit/house/test_design_job_hooks.py."""
from __future__ import annotations


from tests.conftest import REPO

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
    section = design.split("### Resume, markers, cancellation", 1)[1].split("###", 1)[0]
    unnamed = {m for m in takers if f"transforms/shard/{m}.py" not in section}
    assert not unnamed, f"DESIGN.md's cancellation paragraph does not name these takers of check_cancelled: {unnamed}"
