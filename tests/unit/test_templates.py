"""Templates in the roles and playbooks say what ansible-core 2.19 does with them.

ansible-core 2.19 no longer unescapes string literals inside a template: in a block,
folded, plain or single-quoted YAML scalar, ``'\\n'`` reaches the template as a backslash
and an n, so ``split('\\n')`` splits nothing and ``join('\\n')`` joins with two characters
(a container's model build failed on it: the JSON line was never split from the
warnings around it). Only a double-quoted YAML scalar turns ``\\n`` into a newline before
the template sees it; elsewhere use ``.splitlines()`` or a variable holding ``"\\n"``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("playbooks", "roles", "inventories")
FILES = sorted({ROOT / "site.yml", *(p for d in FOLDERS for p in ROOT.glob(f"{d}/**/*.yml"))})
EXPRESSION = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.S)
# The literal '\n' alone (split, join, ~): inside a regular expression \n is the regex's own escape.
NEWLINE_LITERAL = re.compile(r"""(['"])\\n\1""")


class Loader(yaml.SafeLoader):
    """YAML as Ansible reads it: an ``!unsafe`` value is never templated, a ``!vault`` one is opaque."""


Loader.add_constructor("!unsafe", lambda loader, node: None)
Loader.add_constructor("!vault", lambda loader, node: None)


# Keys whose values are expressions without braces (Ansible templates them whole).
CONDITIONALS = {"when", "changed_when", "failed_when", "until", "that"}


def strings(node: object, bare: bool = False) -> Iterator[str]:
    """Every string Ansible may template; a conditional's bare expression comes wrapped in braces."""
    if isinstance(node, str):
        yield "{{ " + node + " }}" if bare else node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from strings(key)
            yield from strings(value, bare=key in CONDITIONALS)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item, bare)


def escaped_newlines(text: str) -> list[str]:
    """The template expressions in ``text`` holding the string literal '\\n' (a backslash and an n)."""
    return [m.group(0) for m in EXPRESSION.finditer(text) if NEWLINE_LITERAL.search(m.group(0))]


def test_the_check_sees_what_yaml_hands_the_template() -> None:
    folded = yaml.safe_load("a: >-\n  {{ x | split('\\n') }}\n")["a"]
    quoted = yaml.safe_load("a: \"{{ x | split('\\n') }}\"\n")["a"]
    regex = yaml.safe_load("a: >-\n  {{ x | regex_findall('a\\nb') }}\n")["a"]
    assert escaped_newlines(folded) and not escaped_newlines(quoted) and not escaped_newlines(regex)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_template_relies_on_an_escaped_newline(path: Path) -> None:
    docs = yaml.load_all(path.read_text(), Loader=Loader)
    found = [expr for doc in docs for text in strings(doc) for expr in escaped_newlines(text)]
    assert not found, f"{path.relative_to(ROOT)}: '\\n' in a template is a backslash and an n here: {found}"
