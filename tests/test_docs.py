"""The documentation holds together: a short README, and every relative link in it resolves.

Checked files: README.md, docs/**/*.md and experiments/README.md. A link is markdown's
`[text](target)` or `![alt](target)` (or a `[label]: target` definition); http(s): and mailto:
links are skipped, code (fenced blocks and `inline spans`) is not read. A relative target must
name an existing file (or folder); a `#anchor` on a .md file (or alone, for the same file) must
be one of its headings' slugs, made as GitHub makes them: lowercase, punctuation dropped except
hyphens, underscores and spaces, spaces to hyphens, "-1", "-2" ... for repeated headings.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 200
DOC_PAGES = ("configuration", "nothing-lost", "loss-scalers", "sweeps", "dashboards", "diagnose",
             "case-studies", "benchmarks", "mindspore-traps", "architecture", "tests", "metrics", "data-parallel")

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s)]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SKIPPED = ("http:", "https:", "mailto:")


def _prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code spans blanked."""
    lines, fenced = [], False
    for num, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((num, INLINE_CODE.sub("", line)))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link in a heading: its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading slug of a markdown file, repeated headings numbered as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            base = slug(m.group(2).replace("`", ""))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in a markdown file's prose."""
    out, after_blank, prev = [], True, 0
    for num, line in _prose(path.read_text(encoding="utf-8")):
        targets = [m.group(1) for m in LINK.finditer(line)]
        d = DEFINITION.match(line) if after_blank or num != prev + 1 else None
        if d:   # a definition cannot interrupt a paragraph: `[0.9-1.0]: met` inside one is prose
            targets.append(d.group(1))
        after_blank, prev = not line.strip() or bool(d), num
        out += [(num, t[1:-1] if t.startswith("<") else t) for t in targets]
    return out


def broken_links(path: Path) -> list[str]:
    """'file:line: target (why)' for every relative link of `path` that does not resolve."""
    problems = []
    for num, target in links(path):
        if target.lower().startswith(SKIPPED):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        where = f"{path}:{num}: {target}"
        if not dest.exists():
            problems.append(f"{where} (no such file: {dest})")
        elif anchor and dest.suffix.lower() == ".md" and dest.is_file():
            if unquote(anchor).lower() not in anchors(dest):
                problems.append(f"{where} (no heading '#{anchor}' in {dest.name})")
    return problems


def markdown_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md")), ROOT / "experiments" / "README.md"]


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines (at most {MAX_README_LINES})"


def test_every_relative_link_resolves():
    problems = [p for f in markdown_files() for p in broken_links(f)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_readme_links_every_docs_page():
    linked = {(README.parent / t.partition("#")[0]).resolve() for _, t in links(README)
              if not t.lower().startswith(SKIPPED) and not t.startswith("#")}
    missing = [p for p in DOC_PAGES if (ROOT / "docs" / f"{p}.md").resolve() not in linked]
    assert not missing, f"README.md does not link docs/ pages: {missing}"


def test_architecture_names_every_package_folder():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    folders = sorted(p.name for p in (ROOT / "ampgan").iterdir() if p.is_dir() and any(p.glob("*.py")))
    missing = [f for f in folders if f"{f}/" not in text]
    assert not missing, f"docs/architecture.md does not describe ampgan/ folders: {missing}"


def test_checker_reports_broken_links(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A section: with `code`, punctuation!\n")
    (tmp_path / "pic.png").write_bytes(b"")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Same heading\n\n## Same heading\n\n"
        "[ok](other.md) [ok](other.md#a-section-with-code-punctuation) ![ok](pic.png) [ok](#page)\n"
        "[ok](#same-heading-1) [web](https://example.com/missing.md) [mail](mailto:a@b.c)\n"
        "```\n[in code](missing-in-fence.md)\n```\n"
        "`[inline code](missing-inline.md)`\n"
        "[gone](missing.md) ![gone](img/missing.png)\n"
        "[bad anchor](other.md#no-such-section) [bad local](#nowhere)\n"
        "[0.98-1.00]: both met (<= 1.02), prose inside a paragraph\n\n"
        "[label]: missing-definition.md\n"
    )
    problems = broken_links(page)
    reported = " ".join(problems)
    assert len(problems) == 5, problems
    for target in ("missing.md", "img/missing.png", "other.md#no-such-section", "#nowhere", "missing-definition.md"):
        assert f": {target} (" in reported
    assert "missing-in-fence" not in reported and "missing-inline" not in reported
    assert slug("Is it float16's fault? `python -m ampgan.diagnose`") == "is-it-float16s-fault-python--m-ampgandiagnose"
