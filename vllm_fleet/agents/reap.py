"""Run a vLLM launch as the unit's main process's only child, and exit only once every
process it left behind has exited too.

    reap [--grace SECONDS] [--stop-grace SECONDS] -- ARGV...

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

Linux only (prctl).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from types import FrameType

from .common import children_by_parent, descendants, kill_all

PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


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


def main(argv: list[str]) -> int:
    grace, stop_grace = 10.0, 30.0
    while argv[:1] in (["--grace"], ["--stop-grace"]) and len(argv) > 1:
        if argv[0] == "--grace":
            grace = float(argv[1])
        else:
            stop_grace = float(argv[1])
        argv = argv[2:]
    if argv[:1] != ["--"] or len(argv) < 2:
        print("usage: reap [--grace SECONDS] [--stop-grace SECONDS] -- ARGV...", file=sys.stderr)
        return 2
    argv = argv[1:]
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
    _reap(grace)
    if code < 0:  # killed by a signal: end the same way
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)
        return 128 - code
    return code
