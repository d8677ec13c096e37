"""The planner's import graph: one direction (no cycle, top-level imports only: ruff's PLC0415
is on for vllm_fleet/), and the modules it holds stay small (issue: the planner as packages)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "vllm_fleet"
MAX_LINES = 800
# Modules still over MAX_LINES, each at its size when the cap was set: they may shrink, not grow,
# and leave this list once split (memory.py left it: 2,076 lines, now 734 beside vllm_fleet/accounting/;
# model_spec.py 1,768 -> 758 beside vllm_fleet/model/; strategy.py 1,041 -> 798 beside
# vllm_fleet/planning/; catalog_2026.py's configs are data in vllm_fleet/model/catalog_2026.yaml).
OVER: dict[str, int] = {}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        for node in tree.body:  # runtime imports (a TYPE_CHECKING block is an `if`, left out)
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vllm_fleet"):
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("vllm_fleet")]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def test_the_import_graph_has_no_cycle() -> None:
    graph = _graph()
    assert "vllm_fleet.accounting.kv" in graph and "vllm_fleet.accounting.memory" in graph
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for nxt in sorted(graph[name]):
            if state.get(nxt) == 1:
                cycle = [*path[path.index(nxt) :], nxt] if nxt in path else [name, nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


# The layers, lowest first: a package imports only from its own layer and those below it.
# (vllm_fleet's top-level modules, the cli and the filters, sit above them all.)
LAYERS = ("model", "accounting", "performance", "planning", "deploy|ops|inventory")


def test_the_packages_import_downwards_only() -> None:
    """model, then accounting, then performance, then planning, then deploy/ops: a module of a
    lower layer never imports a higher one (the model's files are read in model/, what they cost
    is accounting's)."""
    rank = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer.split("|")}

    def layer(module: str) -> int | None:
        parts = module.split(".")
        return rank.get(parts[1]) if len(parts) > 2 else None

    upward = sorted(
        f"{name} -> {target}"
        for name, targets in _graph().items()
        for target in targets
        if (a := layer(name)) is not None and (b := layer(target)) is not None and b > a
    )
    assert not upward, f"imports against the layers {LAYERS}: {upward}"


def test_no_module_grows_past_its_cap() -> None:
    sizes = {p.relative_to(PACKAGE).as_posix(): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    over = {name: n for name, n in sizes.items() if n > OVER.get(name, MAX_LINES)}
    assert not over, f"over {MAX_LINES} lines (or past their cap in OVER): {over}; split them"
    assert set(OVER) <= set(sizes)


def test_the_node_agents_import_the_stdlib_and_each_other_only() -> None:
    """vllm_fleet/agents runs with a node's own python3 (and inside serving containers): nothing
    from PyPI, nothing from the planner; its modules import each other relatively."""
    agents = PACKAGE / "agents"
    found: dict[str, set[str]] = {}
    for path in sorted(agents.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = {node.module.split(".")[0]}
            else:
                continue
            outside = names - set(sys.stdlib_module_names) - {"__future__"}
            if outside:
                found[path.name] = found.get(path.name, set()) | outside
    assert not found, f"the node agents import outside the stdlib: {found}"
    assert {p.stem for p in agents.glob("*.py")} >= {"common", "supervise", "group", "reap", "watchdog"}


def test_the_planners_commands_do_not_load_the_status_reader() -> None:
    """prometheus_client (about 35 ms to import) loads for `vllm-fleet status` alone."""
    probe = "import sys, vllm_fleet.cli; print(sorted(m for m in sys.modules if 'prometheus' in m))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout.strip() == "[]"
    probe = "import sys, vllm_fleet.ops.status; print('prometheus_client.parser' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout.strip() == "True"
