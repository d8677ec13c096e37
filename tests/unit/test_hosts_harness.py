"""The test-host harness's own logic: what it owns in iptables, mirrors, hashes, CI stages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hosts import ci, common, netstate
from tests.hosts.common import HarnessError, node_list, tree_digest
from tests.hosts.images import debian_mirror

NETAVARK_JUMP = '-A FORWARD -m comment --comment "netavark firewall plugin rules" -j NETAVARK_FORWARD'
DOCKER_MASQ = "-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE"
USER_RULE = "-A FORWARD -i eth1 -j ACCEPT"


def test_rules_are_owned_by_chain_target_or_interface() -> None:
    assert netstate.owned(netstate.PODMAN, NETAVARK_JUMP)
    assert netstate.owned(netstate.PODMAN, "-N NETAVARK-HOSTPORT-DNAT")
    assert not netstate.owned(netstate.DOCKER, NETAVARK_JUMP)
    assert netstate.owned(netstate.DOCKER, DOCKER_MASQ)
    assert netstate.owned(netstate.DOCKER, "-A DOCKER-ISOLATION-STAGE-1 -j RETURN")
    assert not netstate.owned(netstate.PODMAN, DOCKER_MASQ)
    assert not netstate.owned(netstate.DOCKER, USER_RULE) and not netstate.owned(netstate.PODMAN, USER_RULE)


def test_only_additions_are_undone_rules_before_chains() -> None:
    before = ["-P FORWARD ACCEPT", USER_RULE, "-N DOCKER-USER"]  # DOCKER-USER was there: keep it
    now = [*before, "-N NETAVARK_FORWARD", NETAVARK_JUMP, "-N DOCKER", DOCKER_MASQ]
    added = netstate.owned_additions(netstate.PODMAN, before, now)
    assert added == ["-N NETAVARK_FORWARD", NETAVARK_JUMP]
    commands = netstate.undo_commands("filter", added)
    assert commands == [
        ["-t", "filter", "-D", "FORWARD", "-m", "comment", "--comment", "netavark firewall plugin rules",
         "-j", "NETAVARK_FORWARD"],
        ["-t", "filter", "-F", "NETAVARK_FORWARD"],
        ["-t", "filter", "-X", "NETAVARK_FORWARD"],
    ]  # fmt: skip
    assert netstate.owned_additions(netstate.DOCKER, before, now) == ["-N DOCKER", DOCKER_MASQ]


def test_debian_mirror_from_deb822_and_one_line_sources(tmp_path: Path) -> None:
    deb822 = tmp_path / "debian.sources"
    deb822.write_text(
        "Types: deb\nURIs: http://security.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\n# a comment: with a colon\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
    )
    assert debian_mirror(deb822, tmp_path / "none") == "http://mirror.example/debian"
    legacy = tmp_path / "sources.list"
    legacy.write_text("deb [arch=amd64] http://old.example/debian bookworm main\n")
    assert debian_mirror(tmp_path / "none", legacy) == "http://old.example/debian"
    assert debian_mirror(tmp_path / "none", tmp_path / "none") == "http://deb.debian.org/debian"


def test_image_hash_follows_the_definition(tmp_path: Path) -> None:
    (tmp_path / "Containerfile").write_text("FROM base\n")
    first = tree_digest(tmp_path, "rootfs-a")
    assert tree_digest(tmp_path, "rootfs-a") == first
    assert tree_digest(tmp_path, "rootfs-b") != first
    (tmp_path / "pip.conf").write_text("[global]\n")
    assert tree_digest(tmp_path, "rootfs-a") != first


def test_nodes_get_fixed_addresses() -> None:
    nodes = node_list(3)
    assert [n.name for n in nodes] == ["node1", "node2", "node3"]
    assert nodes[0].address.endswith(".11") and nodes[2].container == "vf-node3"
    with pytest.raises(HarnessError, match="between 1 and 9"):
        node_list(0)


def test_a_second_lane_has_its_own_names_and_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "LANE", "b")
    nodes = node_list(3)
    # The same names (the scenarios' inventories say node1..node3), other containers and addresses.
    assert [n.name for n in nodes] == ["node1", "node2", "node3"]
    assert [n.address.rsplit(".", 1)[1] for n in nodes] == ["21", "22", "23"] and nodes[0].container == "vf-b-node1"
    monkeypatch.setattr(common, "LANE", "z")
    with pytest.raises(HarnessError, match="VLLM_FLEET_TEST_LANE"):
        node_list(3)


def test_the_second_lane_scenarios_are_rows_run_alongside(tmp_path: Path) -> None:
    run = ci.Run()
    run.step("hosts up", lambda: None)
    results = tmp_path / "lane-b.json"
    rows = [
        {"name": "molecule roles/a:default", "seconds": 30.0, "result": "ok", "excerpt": ""},
        {"name": "molecule roles/b:default", "seconds": 40.0, "result": "FAILED", "excerpt": "fatal: [node1]: boom"},
    ]
    lane = ci.Background("lane", lambda: results.write_text(json.dumps(rows)))
    run.join_lane(lane, ["molecule roles/a:default", "molecule roles/b:default", "molecule roles/c:default"], results)
    assert run.failures == ["molecule roles/b:default", "molecule roles/c:default"]
    assert "boom" in run.excerpts["molecule roles/b:default"]
    assert "did not run it" in run.excerpts["molecule roles/c:default"]
    table = run.table()
    row = next(line for line in table.splitlines() if line.startswith("molecule roles/a:default [lane b]"))
    assert row.split()[-2:] == ["ok", "30.0"], table
    # The lane's rows ran alongside: the total is the stages' wall time, without them.
    total = float(table.splitlines()[-1].split()[-1])
    assert total < 30.0, table


def test_the_slowest_host_test_steps_are_kept_from_pytest_output(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ci, "DURATIONS", [])
    output = [
        "============================= slowest 25 durations =============================",
        "809.51s setup    tests/system/test_containers_on_hosts.py::test_site_serves",
        "87.34s call     tests/system/test_multinode.py::test_kill",
        "0.50s call     tests/unit/test_plan.py::test_fast",
    ]
    ci._call(["printf", "%s\\n", *output], prefix="[lane b] ")
    assert ci.slowest_steps(limit=1) == "   809.5  setup     tests/system/test_containers_on_hosts.py::test_site_serves"
    assert len(ci.DURATIONS) == 2


def test_a_stage_run_alongside_that_fails_says_why() -> None:
    run = ci.Run()

    def failing() -> None:
        ci._call(["sh", "-c", "echo 'fatal: [localhost]: FAILED! => local boom'; exit 2"], prefix="[local] ")

    run.join("local default", ci.Background("local default", failing))
    assert run.failures == ["local default"] and "local boom" in run.excerpts["local default"]
    assert [(s.name, s.result, s.alongside) for s in run.stages][-1] == ("local default (alongside)", "FAILED", True)


def test_ci_records_failed_test_stages_and_goes_on() -> None:
    run = ci.Run()
    run.step("passes", lambda: None)

    def broken() -> None:
        raise HarnessError("exit 1")

    run.step("a scenario", broken, fatal=False)
    with pytest.raises(HarnessError):
        run.step("hosts up", broken)
    assert run.failures == ["a scenario"]
    table = run.table()
    assert "passes" in table and "a scenario  FAILED" in table and table.splitlines()[-1].startswith("total")


def test_the_self_test_scenario_is_found_first() -> None:
    scenarios = ci.molecule_scenarios()
    assert scenarios[0][1] == "selftest" and (scenarios[0][0] / "molecule/selftest/verify.yml").exists()


def test_the_extended_checks_name_real_scenarios_and_marked_tests() -> None:
    """make test leaves these out by name: a renamed scenario or a lost mark would put it back in CI
    (or drop it from make test-extended) without a word."""
    names = {f"{p.relative_to(common.REPO)}:{s}" for p, s in ci.molecule_scenarios()}
    assert not ci.EXTENDED_SCENARIOS - names, ci.EXTENDED_SCENARIOS - names
    # --extended only selects each by a stage name: every one must select something.
    stages = [ci._scenario_name(p, s) for p, s in ci.molecule_scenarios()] + [ci.CONTAINERS, "system tests"]
    assert all(any(text in stage for stage in stages) for text in ci.EXTENDED_STAGES), ci.EXTENDED_STAGES
    marked = sorted(
        path.name
        for path in (common.REPO / "tests/system").glob("test_*.py")
        if "@pytest.mark.extended" in path.read_text() or "pytestmark = pytest.mark.extended" in path.read_text()
    )
    assert marked == ["test_multinode.py", "test_ray_cluster.py"], marked
    with pytest.raises(HarnessError, match="extended is one of with, without, only"):
        ci.main(with_checks=False, keep=True, extended="some")


def test_a_failed_stage_keeps_the_lines_that_say_why() -> None:
    noise = [f"ok: [node{i % 3}] task {i}" for i in range(200)]
    lines = [
        *noise[:100],
        "TASK [Wait for node3 to rejoin] ***",
        '  │ fatal: [node3]: FAILED! => {"attempts": 30, "changed": false}',
        "  │ PLAY RECAP ***",
        *noise[100:],
    ]
    excerpt = ci.failure_excerpt(lines)
    assert "TASK [Wait for node3 to rejoin]" in excerpt and "fatal: [node3]" in excerpt
    assert "task 50" not in excerpt and len(excerpt.splitlines()) <= ci.EXCERPT_LINES + 1
    assert ci.failure_excerpt(noise) == ""


def test_the_stage_failure_quotes_the_command_output() -> None:
    run = ci.Run()

    def failing() -> None:
        ci._call(["sh", "-c", "echo 'fatal: [node1]: FAILED! => boom'; exit 2"])

    run.step("a scenario", failing, fatal=False)
    assert run.failures == ["a scenario"] and "boom" in run.excerpts["a scenario"]


def test_molecule_runs_once_more_only_when_it_did_not_find_ansible(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    outcomes = iter(
        [None, ci.CommandFailed("exit 1", "RuntimeError: ansible-playbook is not available. Please ..."), None, None]
    )

    def fake_call(argv: list[str], cwd: Path = ci.REPO, **_: object) -> None:
        calls.append(argv[1])
        outcome = next(outcomes)
        if outcome is not None:
            raise outcome

    monkeypatch.setattr(ci, "_call", fake_call)
    ci.run_molecule(ci.REPO, "default")
    assert calls == ["reset", "test", "reset", "test"]
    # Any other failure is the role's and fails the stage at once.
    calls.clear()
    outcomes = iter([None, ci.CommandFailed("exit 2", "fatal: [node1]: FAILED! => assertion")])
    with pytest.raises(ci.CommandFailed):
        ci.run_molecule(ci.REPO, "default")
    assert calls == ["reset", "test"]
