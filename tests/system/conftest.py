"""Fixtures for tests on real test hosts and a real Docker Engine (tests/hosts).

CI starts hosts and the engine before this stage and keeps them. Run alone
(`pytest tests/system`), the fixtures start what is missing and remove it at
the end.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.hosts import engine, nodes
from tests.hosts.common import DEFAULT_NODES, Node


@dataclass(frozen=True)
class Hosts:
    nodes: list[Node]
    key: str


def _running_hosts() -> list[Node] | None:
    if not nodes.STATE.exists():
        return None
    state = json.loads(nodes.STATE.read_text())
    listed = [Node(n["name"], n["address"]) for n in state["nodes"]]
    if sorted(n.container for n in listed) != nodes.our_containers():
        return None
    return listed


@pytest.fixture(scope="session")
def test_hosts() -> Iterator[Hosts]:
    listed = _running_hosts()
    started = listed is None
    if listed is None:
        listed = nodes.up(DEFAULT_NODES)
    yield Hosts(listed, str(nodes.KEY))
    if started:
        nodes.down()


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[str]:
    """The base image's name on a running test Docker Engine (DOCKER_HOST is set)."""
    started = not engine.running()
    image = engine.up()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCKER_HOST", engine.DOCKER_HOST)
        yield image
    if started:
        engine.down()
