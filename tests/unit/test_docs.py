"""The documentation holds together: the README stays an operator's page (at most 500 lines, no
CI history), the docs it points at exist, and no file of the project names a document or a make
target that is not there."""

from __future__ import annotations

import re
import subprocess

from tests.conftest import ROOT

README_MAX_LINES = 500
DOCS = ("docs/architecture.md", "docs/planner.md", "docs/testing.md", "docs/benchmarks.md", "docs/kubernetes.md")
_MD = re.compile(r"(?<![\w/.:-])((?:[\w.-]+/)*[\w-]+\.md)\b")
# What a run writes under its artifacts folder (playbooks/tasks/plan_layout.yml, playbooks/verify.yml).
ARTIFACTS = {"plan.md", "verify.md"}
_LINK = re.compile(r"\]\(((?:[\w.-]+/)*[\w.-]+\.md)#([\w-]+)\)")
_MAKE = re.compile(r"`make ([a-z][a-z0-9-]*)")


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return [p for p in out.splitlines() if (ROOT / p).is_file()]


def test_the_readme_is_an_operators_page() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    assert not re.search(r"\bstop \d+\b|landed in \d+ s|lane \"b\"", text), "CI history belongs in docs/testing.md"
    for doc in DOCS:
        assert (ROOT / doc).is_file() and doc in text, f"the README does not point at {doc}"


def test_every_named_document_exists() -> None:
    files = _tracked()
    names = set(files)
    missing = []
    for path in files:
        if path.startswith(("tests/unit/data/", "tests/datasets/")) or not path.endswith(
            (".md", ".py", ".yml", ".yaml", ".j2", ".cfg", ".toml", ".sh", "Makefile")
        ):
            continue
        for ref in _MD.findall((ROOT / path).read_text(errors="replace")):
            here = (ROOT / path).parent / ref
            if ref in ARTIFACTS or here.is_file() or ref in names or any(n.endswith("/" + ref) for n in names):
                continue
            missing.append(f"{path}: {ref}")
    assert missing == []


def test_every_make_target_the_docs_name_exists() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", makefile, re.M))
    named = {t for doc in ("README.md", *DOCS) for t in _MAKE.findall((ROOT / doc).read_text())}
    assert named - targets == set()


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_anchor_the_docs_link_to_exists() -> None:
    broken = []
    for doc in ("README.md", *DOCS):
        for target, anchor in _LINK.findall((ROOT / doc).read_text()):
            path = (ROOT / doc).parent / target
            headings = re.findall(r"^#+ (.*)$", path.read_text(), re.M) if path.is_file() else []
            if anchor not in {_slug(h) for h in headings}:
                broken.append(f"{doc}: {target}#{anchor}")
    assert broken == []
