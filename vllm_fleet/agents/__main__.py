"""Run one node agent: ``python3 DIR AGENT [ARGS...]`` where DIR is this package's folder
as the roles copy it to a node (``python -m vllm_fleet.agents AGENT`` from a checkout)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _package() -> str:
    if __package__:
        return __package__
    # Run as a folder: Python put the folder itself first on sys.path. Import it as a
    # package from its parent instead, under its folder's name (vllm_fleet_agents on nodes).
    sys.path[0] = str(HERE.parent)
    return HERE.name


def main() -> int:
    package = _package()
    agents = importlib.import_module(package).AGENTS
    if len(sys.argv) < 2 or sys.argv[1] not in agents:
        print(f"usage: python3 {HERE} {{{'|'.join(agents)}}} [ARGS...]", file=sys.stderr)
        return 2
    agent = importlib.import_module(f"{package}.{sys.argv[1]}")
    return int(agent.main(sys.argv[2:]))


if __name__ == "__main__":
    sys.exit(main())
