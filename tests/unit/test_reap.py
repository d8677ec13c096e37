"""The reap agent (vllm_fleet/agents/reap.py), the main process of every vLLM unit: it exits with its launch's
status, hands the stop signal on, and only once nothing the launch left behind still runs
(the processes vLLM leaves when it exits: systemd would otherwise wait for them)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import agent
from vllm_fleet.agents import reap

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_CHILD_SUBREAPER is Linux's")


def _launch(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "launch.py"
    script.write_text(textwrap.dedent(body))
    return script


def _read_pid(path: Path, within: float = 20) -> int:
    """The PID the launch wrote: the file exists before its text is written (open, then write), so wait
    for the text, not for the file."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text.strip():
            return int(text)
        time.sleep(0.02)
    raise AssertionError(f"{path.name} was not written within {within:.0f} s")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# The launch starts a child that outlives it (vLLM's resource tracker after the API server
# exits), writes that child's PID, and exits with code 7.
LEAVES_A_CHILD = """
    import subprocess, sys, time
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep({sleep})"])
    open({pidfile!r}, "w").write(str(orphan.pid))
    sys.exit(7)
"""


def test_it_exits_with_the_launch_code_only_after_what_the_launch_left_exited(tmp_path: Path) -> None:
    pidfile = tmp_path / "orphan.pid"
    script = _launch(tmp_path, LEAVES_A_CHILD.format(sleep=1.0, pidfile=str(pidfile)))
    start = time.monotonic()
    done = subprocess.run([*agent("reap"), "--", sys.executable, str(script)], timeout=30, check=False)
    took = time.monotonic() - start
    assert done.returncode == 7
    assert not _alive(int(pidfile.read_text()))
    assert took >= 0.9, f"returned after {took:.2f} s, before the left-behind child's 1 s"


def test_a_left_behind_process_that_does_not_exit_is_killed_after_the_grace(tmp_path: Path) -> None:
    pidfile = tmp_path / "orphan.pid"
    script = _launch(tmp_path, LEAVES_A_CHILD.format(sleep=600, pidfile=str(pidfile)))
    start = time.monotonic()
    argv = [*agent("reap"), "--grace", "1", "--", sys.executable, str(script)]
    done = subprocess.run(argv, timeout=30, check=False)
    assert done.returncode == 7 and time.monotonic() - start < 10
    assert not _alive(int(pidfile.read_text()))


def test_sigterm_reaches_the_launch_and_the_wrapper_ends_by_the_same_signal(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    script = _launch(
        tmp_path,
        f"""
        import os, signal, time
        got = []
        signal.signal(signal.SIGTERM, lambda *_: got.append(1))
        open({str(ready)!r}, "w").write(str(os.getpid()))
        while not got:
            time.sleep(0.02)
        # vLLM's way: it stops on SIGTERM; here it ends by the signal's default action.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        """,
    )
    wrapper = subprocess.Popen([*agent("reap"), "--", sys.executable, str(script)])
    launch = _read_pid(ready)
    assert launch != wrapper.pid
    os.kill(wrapper.pid, signal.SIGTERM)
    assert wrapper.wait(timeout=20) == -signal.SIGTERM
    assert not _alive(launch)


def test_without_a_launch_it_says_how_to_call_it(tmp_path: Path) -> None:
    done = subprocess.run([*agent("reap")], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2 and "usage: reap " in done.stderr


def test_processes_re_parented_here_after_the_grace_are_killed_too(tmp_path: Path) -> None:
    """The launch leaves a child that has a child of its own: once the first is killed, the second is
    re-parented here (an engine core's workers); it is killed as well and the wrapper exits."""
    pids = tmp_path / "pids"
    script = _launch(
        tmp_path,
        f"""
        import subprocess, sys
        inner = "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        inner += "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        inner += "open({str(pids)!r}, 'w').write(str(g.pid)); time.sleep(600)"
        child = subprocess.Popen([sys.executable, "-c", inner])
        import time
        while True:
            try:
                if open({str(pids)!r}).read():
                    break
            except OSError:
                pass
            time.sleep(0.02)
        open({str(pids)!r}, "a").write(" " + str(child.pid))
        sys.exit(0)
        """,
    )
    argv = [*agent("reap"), "--grace", "0.5", "--", sys.executable, str(script)]
    done = subprocess.run(argv, timeout=30, check=False)
    assert done.returncode == 0
    grandchild, child = (int(p) for p in pids.read_text().split())
    assert not _alive(child) and not _alive(grandchild)


def test_a_launch_that_ignores_the_stop_is_killed_after_the_stop_grace(tmp_path: Path) -> None:
    """vLLM whose engine waits on a Ray head that is gone ignores SIGTERM: after --stop-grace
    reap kills it and what it started, and ends by SIGTERM (a clean stop for systemd)."""
    ready, pidfile = tmp_path / "ready", tmp_path / "child.pid"
    script = _launch(
        tmp_path,
        f"""
        import os, signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                  "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
        open({str(pidfile)!r}, "w").write(str(child.pid))
        open({str(ready)!r}, "w").write(str(os.getpid()))
        time.sleep(600)
        """,
    )
    wrapper = subprocess.Popen(
        [*agent("reap"), "--stop-grace", "1", "--", sys.executable, str(script)], stderr=subprocess.PIPE
    )
    launch, child = _read_pid(ready), _read_pid(pidfile)
    start = time.monotonic()
    os.kill(wrapper.pid, signal.SIGTERM)
    assert wrapper.wait(timeout=20) == -signal.SIGTERM
    took = time.monotonic() - start
    assert 0.9 <= took < 8, f"stopped after {took:.1f} s with a 1 s stop grace"
    assert not _alive(launch) and not _alive(child)
    assert wrapper.stderr is not None and b"did not stop within 1 s of SIGTERM" in wrapper.stderr.read()


# -- backoff (--backoff-state): a launch that keeps failing waits longer before each start --


@pytest.mark.parametrize(
    ("failures", "since", "wait"),
    [
        (0, 0.0, 0.0),  # nothing failed: start at once
        (1, 10.0, 0.0),  # the first failure: systemd's RestartSec (10 s) was the wait
        (2, 10.0, 10.0),  # 20 s after the exit, 10 of them already passed
        (3, 10.0, 30.0),
        (9, 10.0, 290.0),  # at most 300 s after the exit
        (9, 400.0, 0.0),
    ],
)
def test_the_wait_doubles_with_each_quick_failure_up_to_300_s(
    tmp_path: Path, failures: int, since: float, wait: float
) -> None:
    state = tmp_path / "launch.backoff"
    state.write_text(f'{{"key": "k", "failures": {failures}, "exited": 1000.0}}')
    assert reap.backoff_wait(state, "k", 1000.0 + since) == pytest.approx((wait, failures))


def test_another_launch_or_a_long_run_or_a_stop_starts_the_count_again(tmp_path: Path) -> None:
    state = tmp_path / "launch.backoff"
    reap.record_exit(state, "k", 3, ran=5.0, failed=True, now=1000.0)
    assert reap.backoff_wait(state, "k", 1010.0) == pytest.approx((70.0, 4))
    assert reap.backoff_wait(state, "other", 1010.0) == (0.0, 0), "a changed launch waits for nothing"
    reap.record_exit(state, "k", 4, ran=600.0, failed=True, now=2000.0)  # it served 10 minutes first
    assert reap.backoff_wait(state, "k", 2010.0) == (0.0, 0)
    reap.record_exit(state, "k", 4, ran=5.0, failed=False, now=3000.0)  # stopped, or exited 0
    assert reap.backoff_wait(state, "k", 3010.0) == (0.0, 0)
    assert reap.launch_key(["vllm"], {"A": "1", "INVOCATION_ID": "x"}) == reap.launch_key(["vllm"], {"A": "1"})
    assert reap.launch_key(["vllm"], {"A": "1"}) != reap.launch_key(["vllm"], {"A": "2"})


def test_a_failing_launch_waits_before_it_starts_and_a_stop_ends_the_wait(tmp_path: Path) -> None:
    """As systemd runs it: the launch (a flag vLLM refuses: exit 2 at once) failed before; this
    start waits out the rest of its backoff, says so, fails again and counts it. A stop during
    the wait ends it at once, cleanly, without starting the launch."""
    state, marker = tmp_path / "launch.backoff", tmp_path / "started"
    argv = [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x'); raise SystemExit(2)"]
    env = dict(os.environ)
    key = reap.launch_key(argv, env)
    state.write_text(f'{{"key": "{key}", "failures": 1, "exited": {time.time() - 8.5}}}')  # 1.5 s left of 10 s
    start = time.monotonic()
    done = subprocess.run(
        [*agent("reap"), "--backoff-state", str(state), "--", *argv],
        capture_output=True, text=True, timeout=30, check=False, env=env,
    )  # fmt: skip
    took = time.monotonic() - start
    assert done.returncode == 2 and marker.read_text() == "x"
    assert 1.2 <= took < 10, took
    assert re.search(r"failed 1 time\(s\) in a row, .* starting it again in [12] s", done.stderr), done.stderr
    assert reap.backoff_wait(state, key, time.time())[1] == 2  # the next start waits 20 s after this exit

    waiting = subprocess.Popen(
        [*agent("reap"), "--backoff-state", str(state), "--", *argv], stderr=subprocess.PIPE, env=env
    )
    time.sleep(1.0)
    waiting.send_signal(signal.SIGTERM)  # systemctl stop, or the next site.yml run's restart
    assert waiting.wait(timeout=10) == 0
    assert marker.read_text() == "x", "the launch started although the unit was stopped during its wait"
    assert reap.backoff_wait(state, key, time.time()) == (0.0, 0), "a stop starts the count again"
