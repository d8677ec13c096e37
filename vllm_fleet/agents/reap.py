"""Run a vLLM launch as the unit's main process's only child, and exit only once every
process it left behind has exited too.

    reap [--grace SECONDS] [--stop-grace SECONDS] [--backoff-state FILE] -- ARGV...

vLLM leaves processes behind when its API server exits (Python's multiprocessing resource
tracker, an engine core whose parent was killed). systemd's KillMode=mixed then kills them
and waits for the unit's cgroup to empty. Where systemd never hears that it emptied (the
legacy cgroup hierarchy in a container: no release notification), every stop and restart
waits TimeoutStopSec in full, twice, and the unit ends "failed". This wrapper becomes their
subreaper (PR_SET_CHILD_SUBREAPER): what vLLM leaves is re-parented here and reaped, so the
cgroup is empty when the main process exits and systemd has nothing left to wait for.

* SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 go to ARGV's process, as they
  went to vLLM when it was the main process.
* After ARGV's process exits, what it left gets --grace seconds (default 10) to exit on its
  own, then SIGKILL.
* Asked to stop (SIGTERM or SIGINT), ARGV's process gets --stop-grace seconds (default 30)
  to exit, then it and everything below it get SIGKILL from here. A vLLM that ignores the
  stop (an engine waiting for a Ray head that is gone) is then gone before systemd's own
  TimeoutStopSec, whose SIGKILL would reach reap too and leave systemd waiting once more
  for the cgroup-empty notification. reap then ends by SIGTERM, a clean stop for systemd.
* The exit status is ARGV's: the same code, or the same signal re-raised, so Restart= and
  RestartPreventExitStatus= see what they saw before.
* With --backoff-state, a launch that keeps failing backs off: each exit that is not a stop
  and comes within 120 s of its start counts one more failure in FILE, and the next start
  waits until 10 s x 2^(failures-1) (at most 300 s) have passed since that exit, systemd's
  own RestartSec included. A launch that ran longer, a stop, or another command line or
  environment (the next site.yml run's fix) starts the count again: a corrected launch
  starts at once. systemd's Restart= alone retries every RestartSec forever; its own
  RestartSteps= needs systemd 254, newer than Debian 12's and Ubuntu 22.04's.

Linux only (prctl).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from .common import children_by_parent, descendants, kill_all, write_atomic

PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
BACKOFF_FIRST, BACKOFF_MAX, QUICK_EXIT = 10.0, 300.0, 120.0
# What systemd sets per start: not part of what the launch is.
PER_START = ("INVOCATION_ID", "JOURNAL_STREAM", "SYSTEMD_EXEC_PID", "NOTIFY_SOCKET", "MANAGERPID", "LISTEN_PID")


def launch_key(argv: list[str], env: dict[str, str]) -> str:
    """What identifies a launch across starts: its command line and its environment."""
    kept = sorted((k, v) for k, v in env.items() if k not in PER_START)
    return hashlib.sha256(json.dumps([argv, kept]).encode()).hexdigest()[:16]


def backoff_wait(state: Path, key: str, now: float) -> tuple[float, int]:
    """Seconds this start waits, and the failures in a row it follows (0 for another launch)."""
    try:
        data = json.loads(state.read_text())
        failures, exited = int(data["failures"]), float(data["exited"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0, 0
    if data.get("key") != key or failures < 1:
        return 0.0, 0
    due = exited + backoff_delay(failures)
    return max(0.0, min(due - now, BACKOFF_MAX)), failures


def backoff_delay(failures: int) -> float:
    """Seconds from an exit to the next start after ``failures`` quick failures in a row."""
    return min(BACKOFF_FIRST * 2 ** (failures - 1), BACKOFF_MAX) if failures > 0 else 0.0


def record_exit(state: Path, key: str, failures: int, ran: float, failed: bool, now: float) -> None:
    """The exit, and (``due``) the earliest the next start of this launch runs: what
    ``vllm-fleet status`` shows of a launch that keeps failing (vllm_fleet/ops/why_node.py)."""
    count = failures + 1 if failed and ran < QUICK_EXIT else 0
    write_atomic(state, json.dumps({"key": key, "failures": count, "exited": now, "due": now + backoff_delay(count)}))


def _children() -> list[int]:
    """The PIDs whose parent is this process (what the launch left, re-parented here)."""
    return children_by_parent().get(os.getpid(), [])


def _reap(grace: float) -> None:
    """Wait up to ``grace`` seconds for the left-behind processes, then SIGKILL and reap them,
    and any that are re-parented here meanwhile (a killed engine core's workers), until none is left."""
    deadline = time.monotonic() + grace
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            continue
        if time.monotonic() >= deadline:
            kill_all(_children())
        time.sleep(0.05)


def _sleep_unless_stopped(seconds: float) -> int | None:
    """Sleep ``seconds``; a stop (SIGTERM, SIGINT) meanwhile ends it: the exit code to return, else None."""
    stopped: list[int] = []

    def stop(signum: int, _frame: FrameType | None) -> None:
        stopped.append(signum)

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGTERM, signal.SIGINT)}
    deadline = time.monotonic() + seconds
    while not stopped and time.monotonic() < deadline:
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    return 0 if stopped else None


def main(argv: list[str]) -> int:
    grace, stop_grace = 10.0, 30.0
    state: Path | None = None
    while argv[:1] in (["--grace"], ["--stop-grace"], ["--backoff-state"]) and len(argv) > 1:
        if argv[0] == "--grace":
            grace = float(argv[1])
        elif argv[0] == "--stop-grace":
            stop_grace = float(argv[1])
        else:
            state = Path(argv[1])
        argv = argv[2:]
    if argv[:1] != ["--"] or len(argv) < 2:
        print("usage: reap [--grace SECONDS] [--stop-grace SECONDS] [--backoff-state FILE] -- ARGV...", file=sys.stderr)
        return 2
    argv = argv[1:]
    key = launch_key(argv, dict(os.environ))
    failures = 0
    if state is not None:
        wait, failures = backoff_wait(state, key, time.time())
        if wait > 0:
            print(
                f"reap: this launch failed {failures} time(s) in a row, each within {QUICK_EXIT:g} s of its start: "
                f"starting it again in {wait:.0f} s (each failure doubles the wait, up to {BACKOFF_MAX:g} s; "
                "a changed launch starts at once)",
                file=sys.stderr,
                flush=True,
            )
            stopped = _sleep_unless_stopped(wait)
            if stopped is not None:
                # A stop (an operator's restart after a fix elsewhere) starts the count again.
                with contextlib.suppress(OSError):
                    record_exit(state, key, failures, ran=QUICK_EXIT, failed=False, now=time.time())
                return stopped
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"reap: PR_SET_CHILD_SUBREAPER failed (errno {ctypes.get_errno()})", file=sys.stderr)
    pending: list[int] = []
    child: subprocess.Popen[bytes] | None = None
    stop_by: list[float] = []  # when a stop that is not done by then gets SIGKILL

    def forward(signum: int, _frame: FrameType | None) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT) and not stop_by:
            stop_by.append(time.monotonic() + stop_grace)
        if child is None:  # before the launch started: delivered right after
            pending.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    started = time.monotonic()
    child = subprocess.Popen(argv)  # inherits the unit's environment, stdout and stderr
    for queued in pending:
        child.send_signal(queued)
    while True:
        try:
            code = child.wait(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            pass
        if stop_by and time.monotonic() >= stop_by[0]:
            print(f"reap: the launch did not stop within {stop_grace:g} s of SIGTERM; killing it", file=sys.stderr)
            kill_all(descendants(os.getpid()))
            stop_by[0] = float("inf")
    if stop_by and stop_by[0] == float("inf"):
        code = -signal.SIGTERM  # stopped as asked, if late: systemd counts the stop clean
    if state is not None:
        with contextlib.suppress(OSError):
            record_exit(state, key, failures, time.monotonic() - started, code != 0 and not stop_by, time.time())
    _reap(grace)
    if code < 0:  # killed by a signal: end the same way
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)
        return 128 - code
    return code
