"""The roles, playbooks and filters as an Ansible collection (``vllm_fleet.core``).

    python -m vllm_fleet.collection OUT      # lays the collection out in OUT
    ansible-galaxy collection build OUT      # vllm_fleet-core-<version>.tar.gz

The collection keeps the checkout's layout, so every path the code takes relative to its own
file still holds: ``roles/``, ``plugins/`` (filters and the ``vllm_fleet_applied`` module),
``playbooks/`` (``site.yml`` among them, run as ``ansible-playbook vllm_fleet.core.site``) and
the planner's Python package ``vllm_fleet/`` at the collection's root, where the filters look
for it first (so the collection runs without ``pip install vllm-fleet``). Symlinks are copied as
the files they point to (the roles' ``files/vllm_fleet_agents``). In the playbooks, filter
names become fully qualified (``vllm_fleet.core.vllm_fleet_plan``): Ansible resolves a
collection's filters by their FQCN only.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import yaml

from vllm_fleet import __version__

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE, NAME = "vllm_fleet", "core"
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "molecule", ".pytest_cache")
_FILTER = re.compile(r"(?<![\w.])(vllm_fleet_[a-z_]+)(?=\s*\()|(?<=\|)(\s*)(vllm_fleet_[a-z_]+)\b")


def version() -> str:
    return __version__


def galaxy() -> dict[str, object]:
    needs = yaml.safe_load((ROOT / "requirements.yml").read_text())["collections"]
    return {
        "namespace": NAMESPACE,
        "name": NAME,
        "version": version(),
        "readme": "README.md",
        "authors": ["vllm-fleet developers"],
        "description": "Plan, provision and serve LLMs with vLLM and Ray on GPU clusters",
        "license": ["Apache-2.0"],
        "tags": ["vllm", "llm", "gpu", "ray", "inference"],
        "dependencies": {c["name"]: c["version"] for c in needs},
        "repository": "https://github.com/vllm-fleet/vllm-fleet",
        "build_ignore": ["*.pyc", "__pycache__"],
    }


def qualified(text: str, filters: set[str]) -> str:
    """``text`` with every call of one of ``filters`` (``| name`` or ``| name(``) fully qualified."""

    def swap(match: re.Match[str]) -> str:
        if match.group(1):
            name = match.group(1)
            return f"{NAMESPACE}.{NAME}.{name}" if name in filters else name
        name = match.group(3)
        return f"{match.group(2)}{NAMESPACE}.{NAME}.{name}" if name in filters else match.group(0)

    return _FILTER.sub(swap, text)


def build(out: Path) -> Path:
    """Lay the collection out in ``out`` (emptied first); returns ``out``."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    filters = {p.stem for p in (ROOT / "plugins/filter").glob("vllm_fleet_*.py")}
    shutil.copytree(ROOT / "plugins", out / "plugins", ignore=IGNORED)
    shutil.copytree(ROOT / "vllm_fleet", out / "vllm_fleet", ignore=IGNORED)
    shutil.copytree(ROOT / "roles", out / "roles", ignore=IGNORED)  # symlinks copied as their files
    shutil.copytree(ROOT / "playbooks", out / "playbooks", ignore=IGNORED)
    site = (ROOT / "site.yml").read_text().replace("import_playbook: playbooks/", "import_playbook: ")
    (out / "playbooks/site.yml").write_text(site)
    for path in [*(out / "playbooks").rglob("*.yml"), *(out / "roles").rglob("*.yml"), *(out / "roles").rglob("*.j2")]:
        text = path.read_text()
        new = qualified(text, filters)
        if new != text:
            path.write_text(new)
    (out / "meta").mkdir()
    (out / "meta/runtime.yml").write_text("---\nrequires_ansible: '>=2.17.0'\n")
    (out / "galaxy.yml").write_text(yaml.safe_dump(galaxy(), sort_keys=False))
    shutil.copy(ROOT / "CHANGELOG.md", out / "CHANGELOG.md")
    (out / "README.md").write_text(
        f"# {NAMESPACE}.{NAME}\n\nvllm-fleet's roles, playbooks and filters "
        f"(version {version()}). Run the whole deployment with\n\n"
        f"    ansible-playbook {NAMESPACE}.{NAME}.site -i INVENTORY\n\n"
        f"and read a filter's documentation with `ansible-doc -t filter {NAMESPACE}.{NAME}.vllm_fleet_plan`.\n"
        "The planner's Python package travels inside (`vllm_fleet/`); the roles need the collections\n"
        "that galaxy.yml lists (bundled in the `ansible` PyPI package).\n"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m vllm_fleet.collection OUT", file=sys.stderr)
        return 2
    print(build(Path(args[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
