"""Every relative link of README.md, CHANGELOG.md and docs/*.md points at a file of the
repository, and every ``#anchor`` at a heading of its target (GitHub's slugs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"```.*?```", re.S)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (``-`` and ``_``
    kept), spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6} (.*)", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            out.add(s if n == 0 else f"{s}-{n}")
            seen[s] = n + 1
    return out


def test_slug_follows_github():
    assert slug("Normalisations as speed regulators (1,368 cells)") == "normalisations-as-speed-regulators-1368-cells"
    assert slug("`--out` is a folder; the files in it have fixed names") == "--out-is-a-folder-the-files-in-it-have-fixed-names"
    assert slug("The temperature claims against sequence length (C06, C07 at N = 128, 1,024, 8,192)") == (
        "the-temperature-claims-against-sequence-length-c06-c07-at-n--128-1024-8192")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(doc):
    text = _FENCE.sub("", doc.read_text(encoding="utf-8"))
    bad = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with that anchor")
    assert not bad, bad
