"""The README and docs/ stand alone: every link points inside the repository
(to a file that exists), and no word of the project's own process leaks in."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
INTERNAL = re.compile(r"\bseed[- ]?\d|\bseeds?\b|\bissue\s*#?\d|#\d+\)|\bthis session\b|\bsession's\b", re.I)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_stay_inside_the_repository_and_exist(doc):
    text = doc.read_text()
    assert "../" not in text, f"{doc.name} refers to a path outside the repository"
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        assert not re.match(r"[a-z]+://", target), f"{doc.name} links outside the repository: {target}"
        path = (doc.parent / target.split("#")[0]).resolve()
        assert str(path).startswith(str(REPO)) and path.exists(), f"{doc.name}: {target} is not in the repository"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_no_internal_words(doc):
    found = [m.group(0) for m in INTERNAL.finditer(doc.read_text())]
    assert not found, f"{doc.name} uses internal words: {found}"


def test_license_is_the_apache_2_text():
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
