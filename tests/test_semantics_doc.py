"""docs/SEMANTICS.md is the op contract the code cites: every citation of it must name a section it has.

A citation is the text "SEMANTICS.md" in a .py or .md file of the repository (results/ and golden/ excepted). The
one form is `docs/SEMANTICS.md §N`, with several sections `docs/SEMANTICS.md §2 and §4` or
`docs/SEMANTICS.md §2, §5 and §6`; `docs/SEMANTICS.md` with no section cites the whole document, and a markdown link
target (`](docs/SEMANTICS.md#1-routing)`) is allowed where its anchor is a heading of the document. Section numbers
are read leniently (`section 2`, `sections 2 and 4`, `2, 5 and 6`, `§3`, `2-4`), so a citation in another spelling
is still checked for its sections, and then reported for its form.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "SEMANTICS.md"
THIS = Path(__file__).resolve()
#: directories never scanned, at any depth (besides hidden ones and *.egg-info)
SKIPPED_DIRS = {"results", "golden", "__pycache__", "build", "dist", "node_modules"}

NAME = "SEMANTICS.md"
_WORD = r"(?:§+|sections?\b|sec\.)"
#: what may follow the name: the cited section numbers, in any of the spellings the code has used
_NUMBERS = re.compile(rf"(?:'s)?[ \t]*(?:{_WORD}[ \t]*)?"
                      rf"(?P<nums>\d+(?:[ \t]*(?:,|and|&|or|-|–|to)[ \t]*{_WORD}?[ \t]*\d+)*)?", re.IGNORECASE)
#: the one form of a citation (from its "docs/" on)
_CANONICAL = re.compile(r"docs/SEMANTICS\.md(?: §\d+(?:(?:, §\d+)* and §\d+)?)?")
#: after a citation without a section: nothing that looks like one
_DANGLING = re.compile(rf"[ \t]*(?:{_WORD}|\d)", re.IGNORECASE)
_LINK_BEFORE = re.compile(r"\]\((?:\.{1,2}/)*(?:docs/)?$")
_LINK_AFTER = re.compile(r"(?:#(?P<anchor>[\w-]+))?\)")


@dataclass(frozen=True)
class Citation:
    line: int
    text: str  # the citation as written, with what follows it on its line
    sections: tuple[int, ...]  # the section numbers it names (empty: the whole document)
    canonical: bool  # in the one form
    anchor: str | None = None  # a markdown link target's anchor


def _numbers(spec: str) -> tuple[int, ...]:
    """'2, 5 and 6' -> (2, 5, 6); '§2-4' -> (2, 3, 4)."""
    found: list[int] = []
    parts = re.split(r"[ \t]*(,|and|&|or|-|–|to)[ \t]*", re.sub(_WORD, "", spec, flags=re.IGNORECASE).strip(),
                     flags=re.IGNORECASE)
    pending_range = False
    for p in parts:
        if p.lower() in ("-", "–", "to"):
            pending_range = True
        elif p.strip().isdigit():
            n = int(p)
            if pending_range and found:
                found += range(found[-1] + 1, n + 1)
            else:
                found.append(n)
            pending_range = False
    return tuple(found)


def citations(text: str) -> list[Citation]:
    """Every citation of the document in `text`."""
    found = []
    for m in re.finditer(re.escape(NAME), text):
        p, end = m.start(), m.end()
        line = text.count("\n", 0, p) + 1
        link = _LINK_BEFORE.search(text, max(0, p - 16), p)
        after = _LINK_AFTER.match(text, end)
        if link is not None and after is not None:
            found.append(Citation(line, text[p:after.end()], (), True, after.group("anchor")))
            continue
        nums = _NUMBERS.match(text, end)
        spec = nums.group("nums") if nums else None
        sections = _numbers(spec) if spec else ()
        start = p - len("docs/")
        prefixed = text[start:p] == "docs/" and (start == 0 or not re.match(r"[\w./-]", text[start - 1]))
        snippet = text[start if prefixed else p:].split("\n", 1)[0][:60]
        canonical = False
        if prefixed:
            form = _CANONICAL.match(text, start)
            assert form is not None  # the prefix and the name are there
            if spec:
                canonical = form.end() == nums.end("nums")  # the whole section list in the one form
            else:
                canonical = form.end() == end and not _DANGLING.match(text, end)
        found.append(Citation(line, snippet, sections, canonical))
    return found


def _slug(heading: str) -> str:
    """A markdown heading's anchor as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def doc_sections() -> dict[int, str]:
    """The numbered sections of the document: `## N. Title`."""
    return {int(n): title for n, title in re.findall(r"^## (\d+)\. (.+?)[ \t]*$", DOC.read_text(), re.MULTILINE)}


def doc_anchors() -> set[str]:
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+?)[ \t]*$", DOC.read_text(), re.MULTILINE)}


def citing_files() -> list[Path]:
    """Every .py and .md file of the repository but this one, outside results/, golden/ and hidden folders."""
    found = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = sorted(d for d in dirnames
                             if not (d.startswith(".") or d in SKIPPED_DIRS or d.endswith(".egg-info")))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if name.endswith((".py", ".md")) and path.resolve() != THIS:
                found.append(path)
    return found


def problems_in(text: str, where: str, sections: dict[int, str], anchors: set[str]) -> list[str]:
    """What is wrong with the citations in `text` (`where`: the file, for the messages)."""
    found = []
    for c in citations(text):
        at = f"{where}:{c.line}: {c.text!r}"
        missing = [n for n in c.sections if n not in sections]
        if missing:
            found.append(f"{at} cites section(s) {missing}, which docs/SEMANTICS.md does not have "
                         f"(it has {sorted(sections)})")
        if c.anchor is not None and c.anchor not in anchors:
            found.append(f"{at} links to #{c.anchor}, which is no heading of docs/SEMANTICS.md")
        if not c.canonical:
            found.append(f"{at} is not in the one citation form: `docs/SEMANTICS.md §N` "
                         "(several: `§2 and §4`, `§2, §5 and §6`), or `docs/SEMANTICS.md` for the whole document")
    return found


def _all_problems() -> tuple[list[str], int]:
    sections, anchors = doc_sections(), doc_anchors()
    found, count = [], 0
    for path in citing_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        if NAME not in text:
            continue
        count += len(citations(text))
        found += problems_in(text, str(path.relative_to(ROOT)), sections, anchors)
    return found, count


def test_the_document_numbers_its_sections_one_to_seven_at_least() -> None:
    sections = doc_sections()
    assert sorted(sections) == list(range(1, len(sections) + 1)) and len(sections) >= 7, sections


def test_every_citation_names_an_existing_section_in_the_one_form() -> None:
    found, count = _all_problems()
    assert count >= 30, f"only {count} citations found: is the scan looking at the repository?"
    assert not found, "\n".join(found)


def test_the_documents_own_references_resolve() -> None:
    text, sections, anchors = DOC.read_text(), doc_sections(), doc_anchors()
    bad = sorted({int(n) for n in re.findall(r"§(\d+)", text)} - set(sections))
    assert not bad, f"docs/SEMANTICS.md refers to §{bad}, which it does not have"
    dead = sorted(set(re.findall(r"\]\(#([\w-]+)\)", text)) - anchors)
    assert not dead, f"docs/SEMANTICS.md links to anchors it does not have: {dead}"


def test_every_convention_key_and_value_is_explained() -> None:
    """A kernel author reads the document to choose conventions: each key and each choice value is named in it."""
    from harness.core import conventions as conv

    text = DOC.read_text()
    entries = [*conv.RECIPE_FIELDS.values(), *(c for cs in conv.BY_OP.values() for c in cs)]
    missing = sorted({f"{c.key}" for c in entries if f"`{c.key}`" not in text}
                     | {f"{c.key}={v}" for c in entries if c.kind == "choice" for v in c.values
                        if f"`{v}`" not in text})
    assert not missing, f"docs/SEMANTICS.md does not name these convention keys / values: {missing}"


def test_the_citation_reader() -> None:
    sections = {n: "" for n in range(1, 8)}
    assert not citations("no citation here")
    cases = {
        "see docs/SEMANTICS.md §3.": ((3,), True),
        "(docs/SEMANTICS.md §2 and §4)": ((2, 4), True),
        "(docs/SEMANTICS.md §2, §5 and §6)": ((2, 5, 6), True),
        "(see docs/SEMANTICS.md).": ((), True),
        "(SEMANTICS.md sections 2 and 4)": ((2, 4), False),
        "(SEMANTICS.md 2, 5 and 6)": ((2, 5, 6), False),
        "SEMANTICS.md section 7": ((7,), False),
        "SEMANTICS.md §2-4": ((2, 3, 4), False),
        "docs/SEMANTICS.md 3": ((3,), False),
        "docs/SEMANTICS.md §2 and 4": ((2, 4), False),
        "SEMANTICS.md's note": ((), False),
        "see other/docs/SEMANTICS.md §1": ((1,), False),
    }
    for text, (want, canonical) in cases.items():
        (c,) = citations(text)
        assert (c.sections, c.canonical) == (want, canonical), (text, c)
    # a missing section is reported, whatever the spelling
    assert any("[9]" in p for p in problems_in("x (docs/SEMANTICS.md §9)", "f.py", sections, set()))
    assert any("[8, 9]" in p for p in problems_in("SEMANTICS.md sections 2, 8 and 9", "f.py", sections, set()))
    assert not problems_in("# docs/SEMANTICS.md §7\n", "f.py", sections, set())
    # markdown link targets: allowed, their anchor checked
    (link,) = citations("[the contract](docs/SEMANTICS.md#1-routing)")
    assert link.canonical and link.anchor == "1-routing"
    assert problems_in("[x](SEMANTICS.md#nowhere)", "f.md", sections, {"1-routing"})
