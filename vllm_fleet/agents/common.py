"""What the node agents share: the process table from /proc, stopping process groups,
signals that end a loop, HTTP checks, systemd and Docker state, and atomic writes."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import FrameType

# This folder: on a node, DIR/vllm_fleet_agents as the roles copy it.
HERE = Path(__file__).resolve().parent

# What a check treats as "did not answer": a refused or reset connection, a timeout, a bad
# URL, or something on the port that is not HTTP (BadStatusLine is no OSError).
HTTP_ERRORS = (urllib.error.URLError, OSError, ValueError, http.client.HTTPException)


class Say:
    """One prefixed line per event, flushed at once (the journal or the agent's log reads it)."""

    def __init__(self, prefix: str, *, stderr: bool = False) -> None:
        self.prefix, self.stderr = prefix, stderr

    def __call__(self, text: str) -> None:
        print(f"{self.prefix}: {text}", file=sys.stderr if self.stderr else sys.stdout, flush=True)


class StopFlag:
    """Set by SIGTERM or SIGINT: the agent's loop ends at its next round, not mid-write."""

    def __init__(self) -> None:
        self.stopping = False
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._set)

    def _set(self, _signum: int, _frame: FrameType | None) -> None:
        self.stopping = True

    def __bool__(self) -> bool:
        return self.stopping


def http_ok(url: str, timeout: float) -> bool:
    """Whether ``url`` answers 200 within ``timeout`` seconds."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except HTTP_ERRORS:
        return False


def http_text(url: str, timeout: float, limit: int = 4 << 20) -> str | None:
    """The body of ``url`` (at most ``limit`` bytes), or None when it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return str(resp.read(limit).decode("utf-8", "replace"))
    except HTTP_ERRORS:
        return None


def output(argv: list[str], timeout: float = 60) -> str:
    """A command's stdout, stripped ("" when it fails or is missing)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip()


def unit_props(unit: str, *names: str) -> dict[str, str]:
    """``systemctl show -p NAME...`` of a unit, as a dict."""
    argv = ["systemctl", "show", *(arg for name in names for arg in ("-p", name)), unit]
    return dict(line.split("=", 1) for line in output(argv).splitlines() if "=" in line)


def container_state(name: str, *fields: str) -> list[str]:
    """``docker inspect`` of ``fields`` (Go template expressions such as ``.State.Running``), one
    value each ([] when there is no such container); a value may hold spaces (Podman's dates)."""
    template = "|".join("{{" + f + "}}" for f in fields)
    found = output(["docker", "inspect", "-f", template, name])
    return found.split("|") if found else []


def _stat_fields(pid: str) -> list[str]:
    # /proc/PID/stat: "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses.
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2 :].split()


def children_by_parent() -> dict[int, list[int]]:
    """Every process's PID, by its parent's PID, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat_fields(entry.name)
        except OSError:
            continue
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (its children, theirs...)."""
    children, found, todo = children_by_parent(), [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def runs_agent(pid: int | str, agent: str) -> bool:
    """Whether process ``pid`` is ``python3 DIR AGENT ...`` with DIR this folder."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    # argv[0] is python3 (or the folder itself, were it run by a shebang): DIR is argv[0] or argv[1].
    return any(
        argv[i + 1] == agent.encode() and Path(os.fsdecode(argv[i])).resolve() == HERE
        for i in range(min(2, len(argv) - 1))
    )


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return _stat_fields(str(pid))[0] != "Z"
    except (OSError, IndexError):
        return False


def kill_all(pids: list[int], signum: int = signal.SIGKILL) -> None:
    """Send ``signum`` to each of ``pids`` that still exists."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def stop_group(group: int, grace: float, gone: Callable[[], bool] | None = None, *, kill_rest: bool = True) -> None:
    """SIGTERM to process group ``group``, ``grace`` seconds for ``gone()`` (default: the
    group's leader has exited), then SIGKILL to what is left of the group. With ``kill_rest``
    false, SIGKILL only when ``gone()`` did not come in time: what the leader left finishes its
    own shutdown (vLLM's engine cores and resource tracker free their shared memory)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGTERM)
    done = gone or (lambda: not alive(group))
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and not done():
        time.sleep(0.1)
    if kill_rest or not done():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text`` at once: a reader sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
