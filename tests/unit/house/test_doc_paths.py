"""Every Python file the docs name exists (issue 29: docs/DESIGN.md pointed at where code used to live).

docs/*.md and README.md are scanned for `something.py`. A name with a folder (`pipeline/shard/plan.py`) must be
that file under the repository root, or the end of one (`retrieval/build.py`); a bare name (`export_hf.py`, read
beside the folder the sentence names) must be some file's name in the repository. Where a doc pairs a file
with a name in backticks (`` `model_contract/hashing.py` `hash64` ``), the file must define that name (a def, a
class or a module-level assignment), so a function moved to another module fails here too. Links
(`https://...`) and paths outside the repository (`../shared/...`) are not checked; a file of another project,
or one a doc names as removed, is listed in NOT_HERE with why.

Sections are cited the same way from code, tests and docs (`docs/DESIGN.md#rooms`, `docs/OPERATIONS.md
"Resume"`): the doc must have that heading's anchor, or a heading or bold paragraph title starting with the
quoted words.
"""
from __future__ import annotations

import pathlib
import re

from tests.conftest import REPO

# path -> why it is named although it is not in this repository
NOT_HERE = {
    "tools/preprocess_data.py": "Megatron-LM's preprocessing script, run beside pileprep by bench/",
    "pipeline/shard/warm_workers.py": "docs/BENCHMARKS.md records its removal by issue 29 and what that cost",
    "stages.py": "transforms/shard/stages.py, split by stage by issue 29: BENCHMARKS.md's byte-identity table "
                 "names the commit that did it",
}
THIS = pathlib.Path(__file__).name  # its own examples of broken citations are not citations
SKIP_DIRS = {".git", ".venv", ".venv-airflow", "out", "node_modules", "__pycache__"}
URL = re.compile(r"\w+://\S+")
PY_PATH = re.compile(r"(?<![\w./-])((?:\.{1,2}/)?[A-Za-z0-9_][\w./-]*\.py)\b(?![\w/])")
# `path.py` `name` or `path.py` `Class.method` (the pairing DESIGN.md uses to say which file carries what)
PAIR = re.compile(r"`([\w./-]+\.py)`\s+`([A-Za-z_][\w.]*)`")


def doc_files(root: pathlib.Path) -> list:
    return sorted(root.glob("docs/*.md")) + [root / "README.md"]


def repo_py_names(root: pathlib.Path) -> set:
    """Every tail of every .py file's path: `pipeline/retrieval/build.py`, `retrieval/build.py`, `build.py`."""
    names = set()
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        if not SKIP_DIRS.intersection(parts):
            names.update("/".join(parts[i:]) for i in range(len(parts)))
    return names


def named_paths(text: str) -> list:
    """(line number, path) for every `.py` path in `text`, links left out."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in PY_PATH.finditer(URL.sub(" ", line)):
            out.append((number, match.group(1)))
    return out


def missing_paths(doc: pathlib.Path, root: pathlib.Path, names: set) -> list:
    bad = []
    for number, path in named_paths(doc.read_text(encoding="utf-8")):
        if path.startswith("../") or path in NOT_HERE:
            continue
        if path.removeprefix("./") not in names:
            bad.append(f"{doc.relative_to(root)}:{number}: {path}")
    return bad


def defines(source: str, name: str) -> bool:
    """`name` is a def or class of `source`, or a module-level assignment; `Class.member` may be a method or an
    (indented) field of the class."""
    *owner, last = [re.escape(part) for part in name.split(".")]
    indent = r"\s*" if owner else ""
    member = rf"^\s*(?:async\s+)?(?:def|class)\s+{last}\b|^{indent}{last}\s*(?::[^=\n]*)?="
    found = re.search(member, source, re.M) is not None
    return found and all(re.search(rf"^\s*class\s+{o}\b", source, re.M) for o in owner)


def missing_names(doc: pathlib.Path, root: pathlib.Path) -> list:
    """A pair may wrap: the name on the line after its file."""
    text, bad = doc.read_text(encoding="utf-8"), []
    for match in PAIR.finditer(text):
        path, name = match.groups()
        file = root / path
        if "/" in path and file.is_file() and not defines(file.read_text(encoding="utf-8"), name):
            number = text.count("\n", 0, match.start()) + 1
            bad.append(f"{doc.relative_to(root)}:{number}: {path} does not define {name}")
    return bad


# `docs/DESIGN.md#rooms`, `[x](DESIGN.md#rooms)`, `docs/OPERATIONS.md "Resume"`, `docs/DESIGN.md, "Rooms"`
CITATION = re.compile(r'((?:[\w.-]+/)*[A-Z][A-Z_]*\.md)(?:#([\w-]+)|,? "([^"\n]+)")')
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*$", re.M)
# `DESIGN §9`, `docs/OPERATIONS.md §3a`: a numbered section ("## 3a. Generations") of one of this repo's docs
NUMBERED = re.compile(r"((?:[\w.-]+/)*[A-Z][A-Z_]*)(?:\.md)?\s+§\s?(\d+[a-z]?)\b")
RUN_IN = re.compile(r"^\s*(?:[-*]\s+|\d+\.\s+)?\*\*([^*\n]+)\*\*", re.M)  # a bold paragraph title


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def titles(text: str) -> list:
    """Section titles as prose cites them: headings without their number ('3. ', '3a. ') and bold run-ins."""
    found = [re.sub(r"^\d+[a-z]?\.\s+", "", h) for h in HEADING.findall(text)] + RUN_IN.findall(text)
    return [re.sub(r"[`*_]", "", t).strip() for t in found]


def citing_files(root: pathlib.Path) -> list:
    out = []
    for pattern in ("*.py", "*.md", "*.sh", "Makefile"):
        for path in root.rglob(pattern):
            parts = path.relative_to(root).parts
            if not SKIP_DIRS.intersection(parts) and parts[:2] != ("docs", "wip") and path.name != THIS:
                out.append(path)
    return sorted(out)


def broken_citations(path: pathlib.Path, root: pathlib.Path) -> list:
    """Every citation of a doc's section in `path` whose doc, anchor or title is not there."""
    # positions are counted in the text with its links blanked out (a link is one space there, never a line)
    text, bad = URL.sub(" ", path.read_text(encoding="utf-8", errors="replace")), []
    for match in CITATION.finditer(text):
        name, anchor, title = match.groups()
        candidates = [root / name, root / "docs" / name, path.parent / name]
        doc = next((c for c in candidates if c.is_file()), None)
        where = f"{path.relative_to(root)}:{text.count(chr(10), 0, match.start()) + 1}"
        if doc is None:
            bad.append(f"{where}: {name} does not exist")
            continue
        cited = doc.read_text(encoding="utf-8")
        if anchor and anchor not in {slug(h) for h in HEADING.findall(cited)}:
            bad.append(f"{where}: {name} has no heading #{anchor}")
        if title and not any(t.casefold().startswith(title.rstrip(".").casefold()) for t in titles(cited)):
            bad.append(f'{where}: {name} has no section "{title}"')
    for match in NUMBERED.finditer(text):
        name, number = match.group(1) + ".md", match.group(2)
        doc = next((c for c in (root / name, root / "docs" / name, path.parent / name) if c.is_file()), None)
        if doc is None:
            continue  # RFC 8878 §3, a paper's §2.4: not a doc of this repository
        if not any(re.match(rf"{number}\.\s", h) for h in HEADING.findall(doc.read_text(encoding="utf-8"))):
            where = f"{path.relative_to(root)}:{text.count(chr(10), 0, match.start()) + 1}"
            bad.append(f"{where}: {doc.name} has no section §{number}")
    return bad


def test_every_cited_doc_section_exists():
    """Code and docs cite sections by anchor or title; a renamed or removed section fails here by citation."""
    root = pathlib.Path(REPO)
    bad = [line for path in citing_files(root) for line in broken_citations(path, root)]
    assert bad == [], "citations of doc sections that do not exist:\n" + "\n".join(bad)


def test_every_python_path_the_docs_name_exists():
    root = pathlib.Path(REPO)
    names = repo_py_names(root)
    bad = [line for doc in doc_files(root) for line in missing_paths(doc, root, names)]
    assert bad == [], "docs name files that do not exist:\n" + "\n".join(bad)


def test_every_name_the_docs_pair_with_a_file_is_defined_there():
    root = pathlib.Path(REPO)
    bad = [line for doc in doc_files(root) for line in missing_names(doc, root)]
    assert bad == [], "docs name functions or classes a file does not define:\n" + "\n".join(bad)


def test_a_stale_path_or_name_is_caught(tmp_path):
    """The check itself can fail: a moved module, a bare name nothing has, a function that moved away."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "here.py").write_text("def kept():\n    pass\nLIMIT: int = 3\nclass C:\n    field: int = 0\n",
                                              encoding="utf-8")
    doc = tmp_path / "README.md"
    doc.write_text("`pkg/here.py` `kept`, `pkg/here.py` `LIMIT`, `pkg/here.py` `C.field`, ../shared/x.py, "
                   "./pkg/here.py, https://x.org/a/b.py, `pkg/here.py` `field`, `pkg/here.py` `D.field`\n"
                   "`pkg/gone.py` and gone.py; `pkg/here.py` `moved`; here.py, `pkg/here.py`\n`wrapped`\n"
                   "ere.py, kg/here.py\n",
                   encoding="utf-8")
    names = repo_py_names(tmp_path)
    assert missing_paths(doc, tmp_path, names) == ["README.md:2: pkg/gone.py", "README.md:2: gone.py",
                                                   "README.md:4: ere.py", "README.md:4: kg/here.py"]
    assert missing_names(doc, tmp_path) == ["README.md:1: pkg/here.py does not define field",
                                            "README.md:1: pkg/here.py does not define D.field",
                                            "README.md:2: pkg/here.py does not define moved",
                                            "README.md:2: pkg/here.py does not define wrapped"]


def test_a_citation_of_a_missing_section_is_caught(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "DESIGN.md").write_text("# T\n## 3. The commit protocol (crash safety)\n"
                                                 "**Failures and interrupts.** x\n### `make bench`: two runs\n",
                                                 encoding="utf-8")
    code = tmp_path / "m.py"
    code.write_text('# docs/DESIGN.md "The commit protocol", DESIGN.md#make-bench-two-runs, DESIGN.md#3-the-commit\n'
                    '# docs/DESIGN.md, "Failures and interrupts"; docs/DESIGN.md "Rooms"; docs/GONE.md#x\n',
                    encoding="utf-8")
    assert broken_citations(code, tmp_path) == ["m.py:1: DESIGN.md has no heading #3-the-commit",
                                                'm.py:2: docs/DESIGN.md has no section "Rooms"',
                                                "m.py:2: docs/GONE.md does not exist"]


def test_a_citation_of_a_missing_numbered_section_is_caught(tmp_path):
    """review29: `DESIGN §9` (pipeline/ops/engines/submit.py, pipeline/retrieval/build_index.py,
    docs/OPERATIONS.md) cites a numbered section docs/DESIGN.md does not have; the `§` form was not checked.
    A `§` after a name that is no doc of this repository (RFC 8878 §3) is someone else's."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "DESIGN.md").write_text("# T\n## Rooms\n", encoding="utf-8")
    (tmp_path / "docs" / "OPERATIONS.md").write_text("# O\n## 3. The commit\n## 3a. Generations\n", encoding="utf-8")
    code = tmp_path / "m.py"
    code.write_text("# DESIGN §9 \"Engines\"; docs/OPERATIONS.md §3; OPERATIONS §3a; OPERATIONS.md §4\n"
                    "# RFC 8878 §3\n", encoding="utf-8")
    assert broken_citations(code, tmp_path) == ["m.py:1: DESIGN.md has no section §9",
                                                "m.py:1: OPERATIONS.md has no section §4"]
