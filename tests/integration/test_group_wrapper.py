"""vllm_server's group wrapper (the group agent, vllm_fleet/agents/group.py) as real processes on loopback.

Each rank's command is a stand-in that only stays alive (``sleep``): the wrapper never talks to
vLLM, it watches its child and the presence connection. On the test hosts the same paths run
with vLLM (tests/system/test_multinode.py's kill -9 check, the container test's crashed rank,
both in ``make test-extended``); these run in seconds, in CI.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import agent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Rank:
    """One group agent process; its child writes its pid to a file, then sleeps."""

    def __init__(self, state: Path, role: str, address: str, *extra: str) -> None:
        self.pidfile = state / f"{role}.child"
        where = ["--bind", address] if role == "head" else ["--head", address]
        child = ["sh", "-c", f"echo $$ > {self.pidfile}; exec sleep 600 >/dev/null 2>&1"]
        argv = [*agent("group"), "--role", role, *where, "--name", "tiny", "--state", str(state)]
        # The wrapper's lines go to a file: a pipe would also be held by a rank it failed to stop.
        self.logfile = state / f"{role}.{time.monotonic_ns()}.log"
        with self.logfile.open("w") as log:
            self.proc = subprocess.Popen([*argv, *extra, "--", *child], stderr=log, start_new_session=True)

    def child_pid(self, timeout: float = 20) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.pidfile.exists() and (text := self.pidfile.read_text().strip()):
                return int(text)
            assert self.proc.poll() is None, self.log()
            time.sleep(0.1)
        raise AssertionError(f"no child started: {self.log()}")

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)

    def log(self) -> str:
        return self.logfile.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.pidfile.exists() and (text := self.pidfile.read_text().strip()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(text), signal.SIGKILL)  # a rank the wrapper failed to stop


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose: its parent has not reaped it yet.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def _gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def group(tmp_path: Path) -> Iterator[tuple[Rank, Rank]]:
    address = f"127.0.0.1:{_free_port()}"
    head = Rank(tmp_path, "head", address)
    head.child_pid()
    member = Rank(tmp_path, "member", address, "--head-timeout", "20")
    member.child_pid()
    yield head, member
    for rank in (member, head):
        rank.stop()


def test_a_crashed_member_rank_stops_the_head_so_the_group_restarts_as_one(group: tuple[Rank, Rank]) -> None:
    head, member = group
    head_child = head.child_pid()
    os.kill(member.child_pid(), signal.SIGKILL)  # the rank crashed; its wrapper stays
    assert member.wait() == 1
    assert "this rank exited with -9; the group restarts" in member.log()
    assert head.wait() == 1
    # "it closed the connection", or a reset when heartbeats were still unread in the member's buffer.
    assert "left (" in head.log() and "stopping vLLM so the group restarts as one" in head.log()
    assert _gone(head_child), "the head's rank still runs: it would hold the port and the master store"


def test_a_head_that_dies_stops_every_member_rank(group: tuple[Rank, Rank]) -> None:
    head, member = group
    member_child = member.child_pid()
    os.killpg(head.proc.pid, signal.SIGKILL)  # the head's node went away: wrapper and rank
    head.proc.wait()
    assert member.wait() == 1
    # Killed with heartbeats unread in its buffer, the head's kernel may answer with a reset rather than a FIN.
    assert "the head left (" in member.log() and "stopping this rank so the group restarts as one" in member.log()
    assert _gone(member_child)


def test_a_stop_of_the_unit_stops_the_rank_and_exits_clean(group: tuple[Rank, Rank]) -> None:
    head, member = group
    member_child = member.child_pid()
    member.proc.send_signal(signal.SIGTERM)  # systemctl stop
    assert member.wait() == 0
    assert _gone(member_child)
    assert head.wait() == 1  # its member left: the head does not serve alone


def test_a_member_gone_silent_stops_the_head_after_its_silence(tmp_path: Path) -> None:
    """A member that vanishes without closing its connection (its node lost power or its network):
    here its wrapper is frozen (SIGSTOP), so its kernel keeps the connection open and sends
    nothing. The head hears no heartbeat for --silence seconds and stops, as for a member that left."""
    address = f"127.0.0.1:{_free_port()}"
    head = Rank(tmp_path, "head", address, "--silence", "3")
    member = Rank(tmp_path, "member", address, "--head-timeout", "20", "--silence", "3")
    try:
        head_child = head.child_pid()
        member.child_pid()
        time.sleep(2)  # heartbeats heard both ways
        assert head.proc.poll() is None and member.proc.poll() is None, head.log() + member.log()
        member.proc.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        assert head.wait(timeout=20) == 1, head.log()
        assert "left (nothing heard from it for 3 s); stopping vLLM so the group restarts as one" in head.log()
        assert time.monotonic() - frozen < 10, head.log()
        assert _gone(head_child)
    finally:
        with contextlib.suppress(ProcessLookupError):
            member.proc.send_signal(signal.SIGCONT)
        member.stop()
        head.stop()


def test_a_member_starts_its_rank_only_once_the_head_answers(tmp_path: Path) -> None:
    member = Rank(tmp_path, "member", f"127.0.0.1:{_free_port()}", "--head-timeout", "3")
    try:
        assert member.wait() == 1
        assert "did not answer in 3 s" in member.log()
        assert not member.pidfile.exists(), "the rank started before the head was up"
    finally:
        member.stop()


def test_too_many_restarts_leave_the_rank_stopped_with_exit_3(tmp_path: Path) -> None:
    """Each start is counted in the state folder; the third within the window (limit 1 restart)
    exits 3 before it starts anything: the unit's RestartPreventExitStatus=3 leaves it stopped."""
    address = f"127.0.0.1:{_free_port()}"
    codes = []
    for _ in range(3):
        (tmp_path / "head.child").unlink(missing_ok=True)
        rank = Rank(tmp_path, "head", address, "--max-restarts", "1")
        try:
            code = rank.wait(timeout=3)
        except subprocess.TimeoutExpired:
            os.kill(rank.child_pid(), signal.SIGKILL)  # its vLLM crashed: the wrapper exits 1
            code = rank.wait()
        codes.append((code, rank.log()))
    assert [c for c, _ in codes] == [1, 1, 3], codes
    assert "2 restarts in 600 s (limit 1): left stopped" in codes[2][1]
    assert not (tmp_path / "head.child").exists(), "the given-up start ran its rank"
